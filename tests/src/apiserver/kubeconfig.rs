//! The kubeconfig a client (the agent under test, `kubectl`, `kube::Client`) uses to
//! reach the server: one cluster, one user with the bearer token, one context.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// Renders a kubeconfig for `server` (with the CA when the server speaks HTTPS).
pub(crate) fn render(server: &str, ca_pem: Option<&str>, token: &str) -> String {
    let ca =
        ca_pem.map(|pem| format!("    certificate-authority-data: {}\n", STANDARD.encode(pem))).unwrap_or_default();
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: swiftlet-test
  cluster:
    server: {server}
{ca}contexts:
- name: swiftlet-test
  context:
    cluster: swiftlet-test
    user: swiftlet-test
    namespace: default
current-context: swiftlet-test
preferences: {{}}
users:
- name: swiftlet-test
  user:
    token: {token}
"
    )
}

/// Writes `<dir>/kubeconfig` (mode 0600, as credentials should be) and returns its path.
pub(crate) fn write(dir: &Path, contents: &str) -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("kubeconfig");
    let tmp = dir.join(".kubeconfig.tmp");
    let mut f = std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}
