//! The test API server (`swiftlet-test-apiserver`, the in-memory double of the tests
//! crate) as a process the bench starts, and a minimal client for it.
//!
//! xtask must not depend on the agent's crates (see its `Cargo.toml`), so the server is
//! run as the tests crate's binary, over plain HTTP (`--insecure-http`): the agent's kube
//! client follows the kubeconfig it writes, and the bench speaks HTTP/1.1 on one kept-alive
//! connection with the kubeconfig's bearer token. Pods created here are API pods, not
//! static ones: the agent treats them as a cluster's (not critical, so evictable; status
//! written back to the API).

use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncWriteExt as _, BufReader},
    net::TcpStream,
};

use crate::{
    bench::{agent::NAMESPACE, https},
    containerd,
};

/// The bearer token the bench gives the server (and so the kubeconfig).
pub const TOKEN: &str = "swiftlet-bench-token";
/// The longest one API request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A running test API server.
#[derive(Debug)]
pub struct ApiServer {
    child: Option<Child>,
    pub port: u16,
    pub kubeconfig: PathBuf,
}

impl ApiServer {
    /// Starts `binary` on a free port, writing its kubeconfig into `dir`, and waits until
    /// it answers.
    pub async fn start(binary: &Path, dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let kubeconfig = dir.join("kubeconfig");
        let log = fs::File::create(dir.join("apiserver.log"))?;
        let mut cmd = Command::new(binary);
        cmd.arg("--port")
            .arg(port.to_string())
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .arg("--insecure-http")
            .arg("--token")
            .arg(TOKEN)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Ctrl-C reaches only xtask, which deletes the pods through it first.
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent: should
        // xtask die without cleaning up, the server gets SIGTERM instead of running on.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("starting {}", binary.display()))?;
        eprintln!("bench: started the test API server pid {} on 127.0.0.1:{port}", child.id());
        let mut server = Self { child: Some(child), port, kubeconfig };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(c) = server.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                server.child = None;
                bail!(
                    "swiftlet-test-apiserver exited at start with {status}; see {}",
                    dir.join("apiserver.log").display()
                );
            }
            if server.kubeconfig.exists()
                && let Ok(mut api) = server.client().await
                && api.request("GET", "/api/v1/namespaces/default", None).await.is_ok_and(|(code, _)| code == 200)
            {
                return Ok(server);
            }
            ensure!(Instant::now() < deadline, "the test API server did not answer within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub async fn client(&self) -> Result<ApiClient> {
        ApiClient::connect(&self.addr(), TOKEN).await
    }

    /// SIGTERM, then SIGKILL after 5 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        if let Ok(pid) = i32::try_from(child.id()) {
            containerd::signal(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.wait();
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An HTTP/1.1 client of the test API server on one kept-alive connection.
#[derive(Debug)]
pub struct ApiClient {
    addr: String,
    token: String,
    conn: Option<BufReader<TcpStream>>,
}

/// A request's bytes.
pub fn request_bytes(addr: &str, token: &str, method: &str, path: &str, body: Option<&Value>) -> Vec<u8> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut out = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nAccept: application/json\r\n\
         User-Agent: swiftlet-xtask-bench\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        out.push_str("Content-Type: application/json\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    out.into_bytes()
}

impl ApiClient {
    pub async fn connect(addr: &str, token: &str) -> Result<Self> {
        let mut c = Self { addr: addr.to_owned(), token: token.to_owned(), conn: None };
        c.reconnect().await?;
        Ok(c)
    }

    async fn reconnect(&mut self) -> Result<()> {
        let stream = TcpStream::connect(&self.addr).await.with_context(|| format!("connecting to {}", self.addr))?;
        stream.set_nodelay(true)?;
        self.conn = Some(BufReader::new(stream));
        Ok(())
    }

    async fn once(&mut self, bytes: &[u8]) -> Result<Option<https::Response>> {
        if self.conn.is_none() {
            self.reconnect().await?;
        }
        let conn = self.conn.as_mut().context("no connection")?;
        if conn.get_mut().write_all(bytes).await.is_err() {
            self.conn = None;
            return Ok(None);
        }
        let response = https::read_response(conn).await;
        match &response {
            Ok(Some(r)) if !r.closes => {}
            _ => self.conn = None,
        }
        response
    }

    /// `method path` with a JSON body: (status, JSON body or `null`). A connection the
    /// server had closed is reopened once.
    pub async fn request(&mut self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let bytes = request_bytes(&self.addr, &self.token, method, path, body);
        let call = async {
            match self.once(&bytes).await? {
                Some(r) => Ok(r),
                None => self.once(&bytes).await?.context("the API server closed the connection twice"),
            }
        };
        let r = tokio::time::timeout(REQUEST_TIMEOUT, call)
            .await
            .map_err(|_| anyhow::anyhow!("{method} {path}: no answer within {REQUEST_TIMEOUT:?}"))?
            .with_context(|| format!("{method} {path}"))?;
        let value =
            if r.body.is_empty() { Value::Null } else { serde_json::from_slice(&r.body).unwrap_or(Value::Null) };
        Ok((r.status, value))
    }

    /// Creates the bench namespace (it may exist already).
    pub async fn ensure_namespace(&mut self) -> Result<()> {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
        let (code, body) = self.request("POST", "/api/v1/namespaces", Some(&ns)).await?;
        ensure!(code == 201 || code == 409, "creating namespace {NAMESPACE}: {code}: {body}");
        Ok(())
    }

    /// Creates a pod in the bench namespace; returns its uid.
    pub async fn create_pod(&mut self, pod: &Value) -> Result<String> {
        let path = format!("/api/v1/namespaces/{NAMESPACE}/pods");
        let (code, body) = self.request("POST", &path, Some(pod)).await?;
        ensure!(code == 201, "creating pod {}: {code}: {body}", pod["metadata"]["name"]);
        Ok(body["metadata"]["uid"].as_str().unwrap_or_default().to_owned())
    }

    /// Deletes a pod of the bench namespace at once (`gracePeriodSeconds=0`: gone from the
    /// API; the agent stops it when it sees the deletion). An absent pod is fine.
    pub async fn delete_pod(&mut self, name: &str) -> Result<()> {
        let path = format!("/api/v1/namespaces/{NAMESPACE}/pods/{name}");
        let options = json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0});
        let (code, body) = self.request("DELETE", &path, Some(&options)).await?;
        ensure!(code == 200 || code == 202 || code == 404, "deleting pod {name}: {code}: {body}");
        Ok(())
    }

    /// The names of the bench namespace's pods and the list's resourceVersion.
    pub async fn list_pods(&mut self) -> Result<(Vec<String>, String)> {
        let path = format!("/api/v1/namespaces/{NAMESPACE}/pods");
        let (code, body) = self.request("GET", &path, None).await?;
        ensure!(code == 200, "listing pods: {code}: {body}");
        let names = body["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        Ok((names, body["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_owned()))
    }

    /// Deletes every pod of the bench namespace; returns how many there were.
    pub async fn delete_all_pods(&mut self) -> Result<usize> {
        let (names, _) = self.list_pods().await?;
        for name in &names {
            self.delete_pod(name).await?;
        }
        Ok(names.len())
    }

    /// Waits until the node `name` is registered.
    pub async fn wait_node(&mut self, name: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let (code, _) = self.request("GET", &format!("/api/v1/nodes/{name}"), None).await?;
            if code == 200 {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "node {name} did not register within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// An API pod for node `node` in the bench namespace: one busybox container `c0` running
/// `script`, `BestEffort` unless `resources` say otherwise, with optional memory-backed
/// emptyDir at `/mem` (what is written there is charged to the pod's memory cgroup).
pub fn pod(name: &str, node: &str, script: &str, memory_volume: bool) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "c0",
                "image": crate::images::BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
            }],
        },
    });
    if memory_volume {
        pod["spec"]["volumes"] = json!([{ "name": "mem", "emptyDir": { "medium": "Memory" } }]);
        pod["spec"]["containers"][0]["volumeMounts"] = json!([{ "name": "mem", "mountPath": "/mem" }]);
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_token_length_and_type() {
        let body = json!({"a": 1});
        let r = String::from_utf8(request_bytes("127.0.0.1:1", "t", "POST", "/api/v1/x", Some(&body))).unwrap();
        assert!(r.starts_with("POST /api/v1/x HTTP/1.1\r\nHost: 127.0.0.1:1\r\nAuthorization: Bearer t\r\n"), "{r}");
        assert!(r.contains("\r\nContent-Length: 7\r\nContent-Type: application/json\r\n\r\n{\"a\":1}"), "{r}");
        let get = String::from_utf8(request_bytes("h", "t", "GET", "/", None)).unwrap();
        assert!(get.ends_with("Content-Length: 0\r\n\r\n") && !get.contains("Content-Type"), "{get}");
    }

    #[test]
    fn pods_are_api_pods_for_the_node() {
        let p = pod("hog-00", "bench", "sleep 1", true);
        assert_eq!(p["metadata"]["namespace"], NAMESPACE);
        assert_eq!(p["spec"]["nodeName"], "bench");
        assert_eq!(p["spec"]["volumes"][0]["emptyDir"]["medium"], "Memory");
        assert_eq!(p["spec"]["containers"][0]["volumeMounts"][0]["mountPath"], "/mem");
        assert!(p["spec"]["containers"][0]["resources"].is_null(), "BestEffort");
        assert!(pod("p", "n", "x", false)["spec"]["volumes"].is_null());
    }
}
