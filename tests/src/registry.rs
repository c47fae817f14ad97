//! The test bed's image registries (`cargo xtask registry up`, also part of `testbed up`):
//! where they are and how to log in, read from the record the xtask writes.
//!
//! - `plain`: HTTP, anonymous pulls;
//! - `tls`: HTTPS with a certificate from the test bed's own CA (containerd trusts it
//!   through its registry `hosts.toml`), and basic authentication: pulls need the
//!   credentials, e.g. from an `imagePullSecret` made by [`TestRegistry::pull_secret`].
//!
//! Both hold the test bed's local images without their `localhost/` prefix
//! (`localhost/busybox:latest` is `<endpoint>/busybox:latest`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use base64::Engine as _;
use serde_json::{Value, json};

/// The node container's containerd `config_path` (`cargo xtask testbed up
/// --node-container` sets it for both runtimes).
pub const NODE_CERTS_DIR: &str = "/etc/containerd/certs.d";

/// Where `cargo xtask registry up` records the registries.
pub const REGISTRY_STATE: &str = "/run/swiftlet-testbed/registry.json";

/// The test bed's registries. `Debug` does not show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct TestRegistry {
    /// `host:port` of the plain HTTP registry (`127.0.0.1:5000`).
    pub plain: String,
    /// `host:port` of the HTTPS + basic auth registry (`127.0.0.1:5443`).
    pub tls: String,
    pub username: String,
    pub password: String,
    /// The CA of `tls`'s certificate (PEM file).
    pub ca_cert: PathBuf,
    /// containerd's registry `config_path`: one `<host:port>/hosts.toml` per registry.
    pub hosts_dir: PathBuf,
    /// Local image name -> `repository:tag` in both registries.
    pub images: BTreeMap<String, String>,
}

impl fmt::Debug for TestRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestRegistry")
            .field("plain", &self.plain)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("ca_cert", &self.ca_cert)
            .field("hosts_dir", &self.hosts_dir)
            .field("images", &self.images)
            .finish()
    }
}

impl TestRegistry {
    /// Reads `SWIFTLET_REGISTRY_STATE`, else [`REGISTRY_STATE`]. For an agent in the node
    /// container (`SWIFTLET_E2E_NODE`) the registries are made reachable there too
    /// ([`Self::reach_from_node`]).
    pub fn load() -> Result<Self> {
        let path =
            std::env::var_os("SWIFTLET_REGISTRY_STATE").map_or_else(|| PathBuf::from(REGISTRY_STATE), PathBuf::from);
        let reg = Self::from_file(&path)?;
        if let Some((node, _)) = crate::node::node_target()? {
            reg.reach_from_node(node)?;
        }
        Ok(reg)
    }

    /// Makes the registries answer at their loopback addresses inside the node (forwarded
    /// into its network namespace) and gives the node's runtimes their `hosts.toml`s: the
    /// files of [`Self::hosts_dir`] in the node's `/etc/containerd/certs.d` (both its
    /// containerds' `config_path`), the CA beside them.
    pub fn reach_from_node(&self, node: &crate::node::Node) -> Result<()> {
        for endpoint in [&self.plain, &self.tls] {
            let addr: std::net::SocketAddr =
                endpoint.parse().with_context(|| format!("registry endpoint {endpoint:?}"))?;
            node.forward_loopback(addr)?;
        }
        let certs = node.file(NODE_CERTS_DIR);
        std::fs::create_dir_all(&certs)?;
        let ca = certs.join("registry-ca.crt");
        std::fs::copy(&self.ca_cert, &ca).with_context(|| format!("copying {}", self.ca_cert.display()))?;
        let ca_in_node = format!("{NODE_CERTS_DIR}/registry-ca.crt");
        for entry in std::fs::read_dir(&self.hosts_dir)? {
            let entry = entry?;
            let hosts = entry.path().join("hosts.toml");
            let Ok(text) = std::fs::read_to_string(&hosts) else { continue };
            let dir = certs.join(entry.file_name());
            std::fs::create_dir_all(&dir)?;
            let text = text.replace(&self.ca_cert.display().to_string(), &ca_in_node);
            std::fs::write(dir.join("hosts.toml"), text)?;
        }
        Ok(())
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!(
                "no test registry: run `cargo xtask testbed up` (or `registry up`) first (reading {})",
                path.display()
            )
        })?;
        let v: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let s = |ptr: &str| {
            v.pointer(ptr)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .with_context(|| format!("{}: no {ptr}", path.display()))
        };
        let images = v["images"]
            .as_object()
            .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
            .unwrap_or_default();
        Ok(Self {
            plain: s("/plain/endpoint")?,
            tls: s("/tls/endpoint")?,
            username: s("/username")?,
            password: s("/password")?,
            ca_cert: PathBuf::from(s("/ca_cert")?),
            hosts_dir: PathBuf::from(s("/hosts_dir")?),
            images,
        })
    }

    /// `<plain>/<repository:tag>`, e.g. `127.0.0.1:5000/busybox:latest`.
    #[must_use]
    pub fn plain_image(&self, repository_tag: &str) -> String {
        format!("{}/{repository_tag}", self.plain)
    }

    /// `<tls>/<repository:tag>`, e.g. `127.0.0.1:5443/busybox:latest`.
    #[must_use]
    pub fn tls_image(&self, repository_tag: &str) -> String {
        format!("{}/{repository_tag}", self.tls)
    }

    /// A `.dockerconfigjson` for the TLS registry with `username` / `password` (pass
    /// [`Self::username`] and [`Self::password`], or wrong ones to test a refused pull).
    #[must_use]
    pub fn docker_config_json(&self, username: &str, password: &str) -> String {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
        json!({ "auths": { self.tls.as_str(): { "auth": auth } } }).to_string()
    }

    /// A `kubernetes.io/dockerconfigjson` Secret (JSON, for the API server or a manifest)
    /// holding this registry's real credentials.
    #[must_use]
    pub fn pull_secret(&self, namespace: &str, name: &str) -> Value {
        let config = self.docker_config_json(&self.username, &self.password);
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "namespace": namespace, "name": name },
            "type": "kubernetes.io/dockerconfigjson",
            "data": { ".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(config) },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_xtask_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registry.json");
        std::fs::write(
            &path,
            r#"{
              "plain": {"endpoint": "127.0.0.1:5000", "scheme": "http", "pid": 1},
              "tls": {"endpoint": "127.0.0.1:5443", "scheme": "https", "pid": 2},
              "username": "swiftlet", "password": "s3cret", "ca_cert": "/r/ca.crt", "hosts_dir": "/r/certs.d",
              "images": {"localhost/busybox:latest": "busybox:latest"}
            }"#,
        )
        .unwrap();
        let r = TestRegistry::from_file(&path).unwrap();
        assert_eq!(r.tls_image("busybox:latest"), "127.0.0.1:5443/busybox:latest");
        assert_eq!(r.plain_image(&r.images["localhost/busybox:latest"]), "127.0.0.1:5000/busybox:latest");
        assert_eq!(r.ca_cert, Path::new("/r/ca.crt"));
        assert!(!format!("{r:?}").contains("s3cret"));

        let secret = r.pull_secret("default", "regcred");
        assert_eq!(secret["type"], "kubernetes.io/dockerconfigjson");
        let data = secret["data"][".dockerconfigjson"].as_str().unwrap();
        let config: Value =
            serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(data).unwrap()).unwrap();
        let auth = config["auths"]["127.0.0.1:5443"]["auth"].as_str().unwrap();
        assert_eq!(base64::engine::general_purpose::STANDARD.decode(auth).unwrap(), b"swiftlet:s3cret");

        assert!(
            TestRegistry::from_file(&dir.path().join("missing.json")).unwrap_err().to_string().contains("registry up")
        );
    }
}
