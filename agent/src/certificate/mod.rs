//! The agent's client certificate for the API server: TLS bootstrap
//! (`--bootstrap-kubeconfig`) and rotation (`rotateCertificates`), as upstream's
//! `pkg/kubelet/certificate/bootstrap` and client-go's `util/certificate`.
//!
//! - [`bootstrap::load_client_cert`]: when the `--kubeconfig` file is missing or its
//!   client certificate has expired, the bootstrap kubeconfig's credentials (a bootstrap
//!   token, usually) ask the API server for a certificate through a
//!   `CertificateSigningRequest` of signer `kubernetes.io/kube-apiserver-client-kubelet`
//!   (subject `system:node:<node>` in `system:nodes`); once a controller approved and
//!   signed it, the pair is stored in the cert dir and the kubeconfig is written pointing
//!   at it.
//! - [`rotation::CertManager`] of kind [`rotation::CLIENT`]: with `rotateCertificates`, a new key and certificate
//!   are requested at a random point between 70 and 90 % of the current certificate's
//!   lifetime (at once if it does not name the node), with the agent's own credentials;
//!   after a failure it retries after 2, 4, 8, 16 and 32 s, then every 32 s. The agent's
//!   API clients take the new pair for every request from then on
//!   ([`rotation::RotatingClient`]).
//!
//! # Files (upstream's `certificate.NewFileStore`)
//! Each pair is one PEM file in the cert dir, certificate(s) then key, named
//! `kubelet-client-<UTC time>.pem` (mode 0600); `kubelet-client-current.pem` is a symlink
//! to the newest, swapped by a rename so readers never see a half-written pair. Without a
//! current pair the store falls back to the kubeconfig's `client-certificate` and
//! `client-key` files. While a bootstrap request is pending its key waits in
//! `kubelet-client.key.tmp`, so a restart asks again for the same key.
//!
//! # The serving certificate
//! With `serverTLSBootstrap` a [`rotation::CertManager`] of kind [`rotation::SERVING`]
//! requests the HTTPS API's certificate (signer `kubernetes.io/kubelet-serving`, the
//! node's name and IP as names, files `kubelet-server-*.pem`) with the agent's API
//! credentials and rotates it as the client's; the server takes each pair through a
//! [`crate::server::ServingSlot`].

pub mod bootstrap;
pub mod csr;
pub mod rotation;
pub mod store;

/// Errors of bootstrap, rotation and the certificate store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A pair that does not parse, has no key, or whose key is not the certificate's.
    #[error("{path}: {message}")]
    BadPair { path: String, message: String },
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("generating a key and certificate request: {0}")]
    Generate(String),
    /// The API server refused or failed a request.
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The CSR was denied or failed, or was replaced while waiting.
    #[error("certificate signing request {name}: {message}")]
    Refused { name: String, message: String },
    #[error("certificate signing request {name}: no certificate issued within {secs} s")]
    Timeout { name: String, secs: u64 },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `system:nodes`: the group of every node's certificate.
pub const NODES_GROUP: &str = "system:nodes";

/// The common name of `node`'s certificates.
#[must_use]
pub fn node_common_name(node: &str) -> String {
    format!("system:node:{node}")
}
