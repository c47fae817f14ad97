//! TLS bootstrap: a client certificate requested with the bootstrap kubeconfig's
//! credentials, and the kubeconfig written to use it (upstream's `LoadClientCert`).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};

use super::csr::{self, BOOTSTRAP_WAIT, CLIENT_USAGES, KUBELET_CLIENT_SIGNER};
use super::store::{FileStore, Pair, write_private};
use super::{Error, Result};

/// The prefix of the client pair's files in the cert dir.
pub const CLIENT_PREFIX: &str = "kubelet-client";
/// Where the key of a pending bootstrap request waits (upstream's name).
pub const TMP_KEY_FILE: &str = "kubelet-client.key.tmp";

/// How long bootstrap waits for the API server's `/healthz` before it asks anyway.
const SERVER_WAIT: Duration = Duration::from_mins(1);

/// The client store of `cert_dir`.
#[must_use]
pub fn client_store(cert_dir: &Path, fallback: Option<(PathBuf, PathBuf)>) -> FileStore {
    FileStore::new(cert_dir, CLIENT_PREFIX, fallback)
}

/// Makes sure `kubeconfig` holds a client certificate that has not expired; if it does
/// not (missing, unreadable, no certificate, expired), requests one with the credentials
/// of `bootstrap` for `node`, stores it in `cert_dir` and writes `kubeconfig` to use it.
pub async fn load_client_cert(kubeconfig: &Path, bootstrap: &Path, cert_dir: &Path, node: &str) -> Result<()> {
    match kubeconfig_client_cert(kubeconfig) {
        Ok(pair) if !pair.expired_at(SystemTime::now()) => {
            tracing::info!(path = %kubeconfig.display(), "the kubeconfig's client certificate is valid; no bootstrap");
            return Ok(());
        }
        Ok(_) => tracing::warn!(path = %kubeconfig.display(), "the kubeconfig's client certificate has expired"),
        Err(e) if kubeconfig.exists() => tracing::warn!(error = %e, "bootstrapping a new client certificate"),
        Err(_) => {}
    }
    tracing::info!(bootstrap = %bootstrap.display(), "requesting a client certificate with the bootstrap kubeconfig");
    let kube_err = |message: String| Error::Kubeconfig { path: bootstrap.display().to_string(), message };
    let boot = Kubeconfig::read_from(bootstrap).map_err(|e| kube_err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(boot.clone(), &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| kube_err(e.to_string()))?;
    let client = kube::Client::try_from(config).map_err(|e| kube_err(e.to_string()))?;

    let store = client_store(cert_dir, None);
    let tmp_key = cert_dir.join(TMP_KEY_FILE);
    let key = bootstrap_key(&store, &tmp_key)?;
    wait_for_server(&client).await;

    let request = csr::node_request(&key, node, &[])?;
    let name = csr::digested_name(&key, node, CLIENT_USAGES);
    let (name, uid) = csr::submit(&client, Some(&name), &request, KUBELET_CLIENT_SIGNER, CLIENT_USAGES).await?;
    tracing::info!(csr = %name, "waiting for the client certificate to be approved and issued");
    let cert = csr::wait_for_certificate(&client, &name, &uid, BOOTSTRAP_WAIT).await?;
    let pair = store.update(&cert, &key.serialize_pem())?;
    if let Err(e) = std::fs::remove_file(&tmp_key)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %tmp_key.display(), error = %e, "could not remove the bootstrap key");
    }
    write_kubeconfig(&boot, bootstrap, kubeconfig, &store.current_path())?;
    tracing::info!(
        csr = %name,
        subject = %pair.common_name,
        kubeconfig = %kubeconfig.display(),
        "client certificate issued; kubeconfig written"
    );
    Ok(())
}

/// The key to request with: the current pair's (a certificate that expired keeps its
/// key, as upstream), else the one a pending bootstrap left, else a new one, written
/// first so that a restart asks again for the same key.
fn bootstrap_key(store: &FileStore, tmp_key: &Path) -> Result<rcgen::KeyPair> {
    if let Ok(Some(pair)) = store.current()
        && let Ok(key) = rcgen::KeyPair::from_pem(&pair.key_pem)
    {
        return Ok(key);
    }
    if let Ok(pem) = std::fs::read_to_string(tmp_key)
        && let Ok(key) = rcgen::KeyPair::from_pem(&pem)
    {
        return Ok(key);
    }
    let key = csr::generate_key()?;
    write_private(tmp_key, key.serialize_pem().as_bytes())?;
    Ok(key)
}

/// Waits up to a minute for the server's `/healthz` (every 2 s); a server that does not
/// answer is asked anyway, and the request's error tells.
async fn wait_for_server(client: &kube::Client) {
    let deadline = tokio::time::Instant::now() + SERVER_WAIT;
    loop {
        let request = http::Request::get("/healthz").body(Vec::new()).unwrap_or_default();
        match client.request_text(request).await {
            Ok(_) => return,
            Err(e) if tokio::time::Instant::now() >= deadline => {
                tracing::warn!(error = %e, "the API server did not answer /healthz within a minute");
                return;
            }
            Err(e) => tracing::info!(error = %e, "waiting for the API server"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The client certificate (with its key) of the current context's user in `path`.
pub fn kubeconfig_client_cert(path: &Path) -> Result<Pair> {
    let (cert, key) = kubeconfig_client_files(path)?;
    Pair::parse(&cert, &key, path)
}

/// The PEM texts of the current user's client certificate and key in kubeconfig `path`
/// (the `-data` fields or the files named).
fn kubeconfig_client_files(path: &Path) -> Result<(String, String)> {
    let err = |message: String| Error::Kubeconfig { path: path.display().to_string(), message };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let user = current_user(&kubeconfig).ok_or_else(|| err("no user in the current context".into()))?;
    let data = |inline: Option<String>, file: &Option<String>, what: &str| -> Result<String> {
        if let Some(b64) = inline {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| err(format!("{what}-data: {e}")))?;
            return String::from_utf8(bytes).map_err(|e| err(format!("{what}-data: {e}")));
        }
        let file = file.as_ref().ok_or_else(|| err(format!("the user has no {what}")))?;
        std::fs::read_to_string(file).map_err(|source| Error::Io { what: format!("reading {file}"), source })
    };
    let key_data = user.client_key_data.as_ref().map(|s| secrecy::ExposeSecret::expose_secret(s).to_owned());
    let cert = data(user.client_certificate_data.clone(), &user.client_certificate, "client-certificate")?;
    let key = data(key_data, &user.client_key, "client-key")?;
    Ok((cert, key))
}

/// The current context's user.
fn current_user(kubeconfig: &Kubeconfig) -> Option<&AuthInfo> {
    let context_name = kubeconfig.current_context.as_deref()?;
    let context = kubeconfig.contexts.iter().find(|c| c.name == context_name)?.context.as_ref()?;
    kubeconfig.auth_infos.iter().find(|a| a.name == context.user.as_deref().unwrap_or_default())?.auth_info.as_ref()
}

/// The client certificate and key files of kubeconfig `path`'s current user, when it
/// names files (not inline data): the store's fallback.
#[must_use]
pub fn kubeconfig_cert_files(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let kubeconfig = Kubeconfig::read_from(path).ok()?;
    let user = current_user(&kubeconfig)?;
    Some((PathBuf::from(user.client_certificate.as_ref()?), PathBuf::from(user.client_key.as_ref()?)))
}

/// Writes `kubeconfig`: the bootstrap kubeconfig's cluster, and a user whose certificate
/// and key are the store's current pair (upstream's `writeKubeconfigFromBootstrapping`).
fn write_kubeconfig(boot: &Kubeconfig, boot_path: &Path, kubeconfig: &Path, pem: &Path) -> Result<()> {
    let err = |message: String| Error::Kubeconfig { path: boot_path.display().to_string(), message };
    let context_name = boot.current_context.as_deref().ok_or_else(|| err("no current-context".into()))?;
    let cluster_name = boot
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .ok_or_else(|| err(format!("no context {context_name:?}")))?;
    let cluster = boot
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| err(format!("no cluster {cluster_name:?}")))?;
    let pem = pem.display().to_string();
    let written = Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        clusters: vec![NamedCluster {
            name: "default-cluster".into(),
            cluster: Some(cluster),
            other: std::collections::BTreeMap::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "default-auth".into(),
            auth_info: Some(AuthInfo {
                client_certificate: Some(pem.clone()),
                client_key: Some(pem),
                ..Default::default()
            }),
            other: std::collections::BTreeMap::default(),
        }],
        contexts: vec![NamedContext {
            name: "default-context".into(),
            context: Some(Context {
                cluster: "default-cluster".into(),
                user: Some("default-auth".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            other: std::collections::BTreeMap::default(),
        }],
        current_context: Some("default-context".into()),
        ..Default::default()
    };
    let text = serde_saphyr::to_string(&written)
        .map_err(|e| Error::Kubeconfig { path: kubeconfig.display().to_string(), message: e.to_string() })?;
    write_private(kubeconfig, text.as_bytes())
}
