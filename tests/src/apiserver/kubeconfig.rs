//! The kubeconfig a client (the agent under test, `kubectl`, `kube::Client`) uses to
//! reach the server: one cluster, one user (a bearer token or a client certificate), one
//! context.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// Renders a kubeconfig for `server` (with the CA when the server speaks HTTPS) whose
/// user has a bearer token.
pub(crate) fn render(server: &str, ca_pem: Option<&str>, token: &str) -> String {
    render_user(server, ca_pem, &format!("    token: {token}\n"))
}

/// Renders a kubeconfig whose user authenticates with a client certificate.
pub(crate) fn render_cert(server: &str, ca_pem: Option<&str>, cert_pem: &str, key_pem: &str) -> String {
    render_user(
        server,
        ca_pem,
        &format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            STANDARD.encode(cert_pem),
            STANDARD.encode(key_pem)
        ),
    )
}

fn render_user(server: &str, ca_pem: Option<&str>, user: &str) -> String {
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
{user}"
    )
}

/// Writes `<dir>/kubeconfig` (mode 0600, as credentials should be) and returns its path.
pub(crate) fn write(dir: &Path, contents: &str) -> std::io::Result<PathBuf> {
    write_named(dir, "kubeconfig", contents)
}

/// Writes `<dir>/<file_name>` (mode 0600) and returns its path.
pub(crate) fn write_named(dir: &Path, file_name: &str, contents: &str) -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::create_dir_all(dir)?;
    let path = dir.join(file_name);
    let tmp = dir.join(format!(".{file_name}.tmp"));
    let mut f = std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}
