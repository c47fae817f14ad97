//! Serving certificates: a throw-away CA and a server certificate for `localhost` and
//! `127.0.0.1` signed by it. The kubeconfig carries the CA, so the client verifies the
//! server as it would a real cluster's.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The CA (for clients) and the server's TLS configuration.
#[derive(Debug)]
pub(crate) struct TlsMaterial {
    pub ca_pem: String,
    pub config: Arc<ServerConfig>,
}

pub(crate) fn generate() -> Result<TlsMaterial, String> {
    let err = |e: rcgen::Error| e.to_string();
    let ca_key = rcgen::KeyPair::generate().map_err(err)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "swiftlet-test-apiserver-ca");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(err)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let key = rcgen::KeyPair::generate().map_err(err)?;
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).map_err(err)?;
    params.distinguished_name.push(rcgen::DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).map_err(err)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsMaterial { ca_pem: ca_cert.pem(), config: Arc::new(config) })
}
