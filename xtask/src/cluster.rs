//! The test bed's real Kubernetes control plane: `cargo xtask testbed up --cluster`.
//!
//! etcd, kube-apiserver, kube-controller-manager and kube-scheduler at
//! [`upstream::VERSION`] (built by `cargo xtask upstream build`), all on loopback, as a
//! kubeadm control plane is set up where it matters to a node agent:
//! - kube-apiserver with `--authorization-mode=Node,RBAC`, the default admission plugins
//!   plus `NodeRestriction`, bootstrap-token authentication, client certificates from the
//!   cluster CA, service-account tokens signed by a key of the test bed, and a client
//!   certificate (group `system:masters`) for its calls to kubelets (logs, exec,
//!   port-forward). Loopback cannot be the `kubernetes` Service's endpoint, so
//!   `--endpoint-reconciler-type=none`; node names do not resolve, so the kubelet is
//!   reached by its `InternalIP`.
//! - kube-controller-manager with every default controller plus `bootstrapsigner` and
//!   `tokencleaner` (kubeadm's set), CSR approving and signing with the cluster CA (TLS
//!   bootstrap), service-account credentials per controller, no leader election.
//! - kube-scheduler, no leader election.
//! - kubeadm's RBAC for TLS bootstrap: the bootstrap token's group may create node CSRs and
//!   has them approved (`nodeclient`), nodes have their renewals approved
//!   (`selfnodeclient`).
//!
//! Files: `<testbed root>/cluster` (PKI, kubeconfigs, etcd's data, logs); the record
//! `<testbed state>/cluster.json` ([`State`]), which the end-to-end tests read
//! (`swiftlet_tests::cluster`), with each component's command line so that a test can stop
//! and restart one. Components are found again by their command line (the binary of this
//! workspace and a path under the cluster dir), never by name alone.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use crate::{
    containerd, images,
    registry::{self, write_file},
    testbed::Layout,
    upstream::Upstream,
};

/// kube-apiserver's secure port on 127.0.0.1.
pub const APISERVER_PORT: u16 = 6443;
/// etcd's client and peer ports on 127.0.0.1 (not etcd's defaults: a developer's own etcd
/// may hold those).
const ETCD_CLIENT_PORT: u16 = 23790;
const ETCD_PEER_PORT: u16 = 23800;
const CONTROLLER_MANAGER_PORT: u16 = 10257;
const SCHEDULER_PORT: u16 = 10259;
/// The Service range; its first address is the `kubernetes` Service's.
const SERVICE_CIDR: &str = "10.96.0.0/16";
const SERVICE_IP: &str = "10.96.0.1";
/// The cluster DNS service's address a node is configured with (kubeadm's choice in the
/// service range; the test bed runs no DNS server there).
pub const CLUSTER_DNS: &str = "10.96.0.10";
/// The group kubeadm gives its default bootstrap token.
pub const BOOTSTRAP_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// The components in start order (stopped in reverse).
pub const COMPONENTS: [&str; 4] = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"];

/// One running component, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    pub pid: Option<i32>,
    /// The full command line (`argv[0]` is the binary), to restart it as it was.
    pub argv: Vec<String>,
    pub log: PathBuf,
}

/// `cluster.json`: what `up` made; the tests read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub version: String,
    /// `https://127.0.0.1:6443`.
    pub server: String,
    pub dir: PathBuf,
    pub bin_dir: PathBuf,
    pub kubectl: PathBuf,
    /// The cluster CA (PEM), which signs the API server's certificate and every client's,
    /// and with which the controller-manager signs kubelet CSRs.
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    /// A cluster admin (group `system:masters`).
    pub admin_kubeconfig: PathBuf,
    /// A kubeconfig with the bootstrap token, for a node's `--bootstrap-kubeconfig`.
    pub bootstrap_kubeconfig: PathBuf,
    /// `<id>.<secret>`.
    pub bootstrap_token: String,
    /// The service-account issuer (for token audiences).
    pub service_account_issuer: String,
    pub components: BTreeMap<String, Component>,
}

impl State {
    pub fn load(layout: &Layout) -> Result<Option<Self>> {
        images::read_json(&state_file(layout))
    }

    fn save(&self, layout: &Layout) -> Result<()> {
        fs::create_dir_all(&layout.state).with_context(|| format!("creating {}", layout.state.display()))?;
        let path = state_file(layout);
        images::write_atomic(&path, &serde_json::to_vec_pretty(self)?)?;
        // It names the bootstrap token.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod {}", path.display()))
    }
}

pub fn state_file(layout: &Layout) -> PathBuf {
    layout.state.join("cluster.json")
}

pub fn cluster_dir(layout: &Layout) -> PathBuf {
    layout.root.join("cluster")
}

/// The files of the PKI and the kubeconfigs.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn pki(&self, name: &str) -> PathBuf {
        self.dir.join("pki").join(name)
    }

    fn kubeconfig(&self, who: &str) -> PathBuf {
        self.dir.join(format!("{who}.kubeconfig"))
    }

    fn log(&self, component: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{component}.log"))
    }
}

/// Whether `args` is one of our components: our binary, and some argument naming a path
/// under our cluster dir.
pub fn is_ours(args: &[String], bin_dir: &Path, dir: &Path) -> bool {
    let dir = dir.display().to_string();
    args.first().is_some_and(|a| Path::new(a).parent() == Some(bin_dir))
        && args.iter().skip(1).any(|a| a.contains(&dir))
}

/// Live processes of our control plane, any component.
pub fn our_processes(layout: &Layout, bin_dir: &Path) -> Vec<i32> {
    let dir = cluster_dir(layout);
    containerd::find_processes(|a| is_ours(a, bin_dir, &dir))
}

/// `testbed up --cluster`'s part: builds the upstream binaries if needed and starts (or
/// finds running) the control plane.
pub fn up(upstream: &Upstream, layout: &Layout) -> Result<State> {
    upstream.build()?;
    let files = Files { dir: cluster_dir(layout) };
    if let Some(state) = State::load(layout)?
        && healthy(&state)
    {
        eprintln!("cluster: control plane already up ({})", state.server);
        return Ok(state);
    }
    // Never two of a component on one data dir: stop any leftover first.
    stop(layout, &upstream.bin_dir)?;
    for sub in ["pki", "logs"] {
        fs::create_dir_all(files.dir.join(sub)).with_context(|| format!("creating {}", files.dir.display()))?;
    }
    ensure_pki(&files)?;
    let token = bootstrap_token(&files)?;
    let server = format!("https://127.0.0.1:{APISERVER_PORT}");
    write_kubeconfigs(&files, &server, &token)?;

    let mut state = State {
        version: crate::upstream::VERSION.to_owned(),
        server: server.clone(),
        dir: files.dir.clone(),
        bin_dir: upstream.bin_dir.clone(),
        kubectl: upstream.bin("kubectl"),
        ca_cert: files.pki("ca.crt"),
        ca_key: files.pki("ca.key"),
        admin_kubeconfig: files.kubeconfig("admin"),
        bootstrap_kubeconfig: files.kubeconfig("bootstrap"),
        bootstrap_token: token.clone(),
        service_account_issuer: "https://kubernetes.default.svc.cluster.local".to_owned(),
        components: BTreeMap::new(),
    };
    for name in COMPONENTS {
        let argv = command_line(upstream, &files, name, &state.service_account_issuer);
        let log = files.log(name);
        let pid = spawn(&argv, &log)?;
        state.components.insert(name.to_owned(), Component { pid: Some(pid), argv, log: log.clone() });
        state.save(layout)?;
        eprintln!("cluster: started {name} (pid {pid}, log {})", log.display());
        match name {
            "etcd" => wait_until(name, pid, &log, Duration::from_mins(1), etcd_healthy)?,
            "kube-apiserver" => {
                wait_until(name, pid, &log, Duration::from_mins(2), || {
                    kubectl_ok(&state, &["get", "--raw", "/readyz"])
                })?;
                apply(&state, &bootstrap_manifests(&token))?;
            }
            "kube-controller-manager" => {
                wait_until(name, pid, &log, Duration::from_mins(1), || https_healthz(CONTROLLER_MANAGER_PORT))?;
            }
            _ => wait_until(name, pid, &log, Duration::from_mins(1), || https_healthz(SCHEDULER_PORT))?,
        }
    }
    // The controller-manager is really working once it has made the default service
    // account and published the root CA: pods need both.
    let pid = state.components["kube-controller-manager"].pid.unwrap_or_default();
    wait_until("kube-controller-manager", pid, &files.log("kube-controller-manager"), Duration::from_mins(1), || {
        kubectl_ok(&state, &["-n", "default", "get", "serviceaccount/default", "configmap/kube-root-ca.crt"])
    })?;
    eprintln!(
        "cluster: {} control plane up at {server}; admin kubeconfig {}",
        state.version,
        state.admin_kubeconfig.display()
    );
    Ok(state)
}

/// Whether every recorded component is ours, alive, and the API server ready.
fn healthy(state: &State) -> bool {
    COMPONENTS.iter().all(|name| {
        state.components.get(*name).and_then(|c| c.pid).is_some_and(|pid| {
            containerd::is_alive(pid)
                && containerd::cmdline(pid).is_some_and(|a| is_ours(&a, &state.bin_dir, &state.dir))
        })
    }) && kubectl_ok(state, &["get", "--raw", "/readyz"])
}

/// Stops every component of ours (scheduler first, etcd last).
pub fn stop(layout: &Layout, bin_dir: &Path) -> Result<()> {
    let state = State::load(layout).ok().flatten();
    let dir = cluster_dir(layout);
    for name in COMPONENTS.iter().rev() {
        let bin = bin_dir.join(name);
        let mut pids = containerd::find_processes(|a| is_ours(a, bin_dir, &dir) && a[0] == bin.display().to_string());
        // A test may have restarted it from the recorded command line: same binary, same
        // paths, so the search above finds it; the recorded pid is only a fallback.
        if let Some(pid) = state.as_ref().and_then(|s| s.components.get(*name)).and_then(|c| c.pid)
            && !pids.contains(&pid)
            && containerd::cmdline(pid).is_some_and(|a| is_ours(&a, bin_dir, &dir))
        {
            pids.push(pid);
        }
        for pid in pids {
            eprintln!("cluster: stopping {name} pid {pid}");
            containerd::terminate(pid, Duration::from_secs(15))?;
        }
    }
    Ok(())
}

/// `testbed down`'s part: stop the components; the test bed removes the directories.
pub fn down(layout: &Layout, bin_dir: &Path) -> Result<()> {
    stop(layout, bin_dir)?;
    let state = state_file(layout);
    if state.exists() {
        fs::remove_file(&state).with_context(|| format!("removing {}", state.display()))?;
    }
    Ok(())
}

/// What `check-clean` reports of the control plane.
pub fn leftovers(layout: &Layout, bin_dir: &Path) -> Vec<String> {
    our_processes(layout, bin_dir).into_iter().map(|pid| format!("control-plane process {pid}")).collect()
}

fn command_line(upstream: &Upstream, f: &Files, name: &str, issuer: &str) -> Vec<String> {
    let bin = upstream.bin(name).display().to_string();
    let p = |n: &str| f.pki(n).display().to_string();
    // The controller-manager's and the scheduler's: their credentials (for the API and
    // for checking who calls them) and their secure port on loopback.
    let serving = |component: &str, port: u16| -> Vec<String> {
        let kubeconfig = f.kubeconfig(component).display().to_string();
        vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", f.dir.join(component).display()),
        ]
    };
    let mut argv = vec![bin];
    let flags: Vec<String> = match name {
        "etcd" => vec![
            "--name=swiftlet-testbed".into(),
            format!("--data-dir={}", f.dir.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}"),
            format!("--advertise-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}"),
            format!("--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}"),
            format!("--initial-cluster=swiftlet-testbed=http://127.0.0.1:{ETCD_PEER_PORT}"),
            "--listen-metrics-urls=".into(),
            // A test bed's data is thrown away: no fsync (etcd's own test setting).
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ],
        "kube-apiserver" => vec![
            "--advertise-address=127.0.0.1".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={APISERVER_PORT}"),
            format!("--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}"),
            "--endpoint-reconciler-type=none".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            "--enable-bootstrap-token-auth=true".into(),
            "--allow-privileged=true".into(),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--kubelet-client-certificate={}", p("apiserver-kubelet-client.crt")),
            format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            format!("--service-account-issuer={issuer}"),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--profiling=false".into(),
            "--v=1".into(),
        ],
        "kube-controller-manager" => [
            serving("controller-manager", CONTROLLER_MANAGER_PORT),
            vec![
                "--controllers=*,bootstrapsigner,tokencleaner".into(),
                format!("--cluster-signing-cert-file={}", p("ca.crt")),
                format!("--cluster-signing-key-file={}", p("ca.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                format!("--service-account-private-key-file={}", p("sa.key")),
                "--use-service-account-credentials=true".into(),
                "--leader-elect=false".into(),
                "--profiling=false".into(),
                "--v=1".into(),
            ],
        ]
        .concat(),
        _ => [
            serving("scheduler", SCHEDULER_PORT),
            vec!["--leader-elect=false".into(), "--profiling=false".into(), "--v=1".into()],
        ]
        .concat(),
    };
    argv.extend(flags);
    argv
}

/// Starts `argv` detached in a session of its own, output appended to `log`.
pub fn spawn(argv: &[String], log_path: &Path) -> Result<i32> {
    let (program, rest) = argv.split_first().context("empty command line")?;
    let mut cmd = Command::new(program);
    cmd.args(rest);
    containerd::spawn_detached(cmd, log_path, &format!("starting {program}"))
}

fn wait_until(name: &str, pid: i32, log: &Path, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !containerd::is_alive(pid) {
            bail!(
                "{name} (pid {pid}) exited during start-up; its log {}:\n{}",
                log.display(),
                containerd::log_tail(log, 40)
            );
        }
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!(
        "{name} (pid {pid}) not ready within {timeout:?}; its log {}:\n{}",
        log.display(),
        containerd::log_tail(log, 40)
    )
}

/// etcd's `/health` over plain HTTP says `"health":"true"`.
fn etcd_healthy() -> bool {
    http_get(SocketAddr::from(([127, 0, 0, 1], ETCD_CLIENT_PORT)), "/health")
        .is_some_and(|body| body.contains("\"health\":\"true\""))
}

fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.").then_some(out)
}

/// A component's `/healthz` on its secure port (self-signed; always allowed anonymously).
fn https_healthz(port: u16) -> bool {
    Command::new("curl")
        .args(["-sfk", "--max-time", "2", &format!("https://127.0.0.1:{port}/healthz")])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout == b"ok")
}

fn kubectl(state: &State) -> Command {
    let mut cmd = Command::new(&state.kubectl);
    cmd.arg("--kubeconfig").arg(&state.admin_kubeconfig).arg("--request-timeout=5s");
    cmd
}

fn kubectl_ok(state: &State, args: &[&str]) -> bool {
    kubectl(state).args(args).output().is_ok_and(|o| o.status.success())
}

/// `kubectl apply -f -` of `manifest`.
fn apply(state: &State, manifest: &str) -> Result<()> {
    let mut child = kubectl(state)
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running kubectl apply")?;
    child.stdin.take().context("kubectl stdin")?.write_all(manifest.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// The bootstrap token's Secret and kubeadm's RBAC for TLS bootstrap.
fn bootstrap_manifests(token: &str) -> String {
    let (id, secret) = token.split_once('.').unwrap_or_default();
    let mut m = format!(
        "apiVersion: v1
kind: Secret
metadata:
  name: bootstrap-token-{id}
  namespace: kube-system
type: bootstrap.kubernetes.io/token
stringData:
  description: swiftlet test bed
  token-id: {id}
  token-secret: {secret}
  usage-bootstrap-authentication: \"true\"
  usage-bootstrap-signing: \"true\"
  auth-extra-groups: {BOOTSTRAP_GROUP}
"
    );
    for (name, role, group) in [
        ("kubeadm:kubelet-bootstrap", "system:node-bootstrapper", BOOTSTRAP_GROUP),
        (
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            BOOTSTRAP_GROUP,
        ),
        (
            "kubeadm:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
    ] {
        let _ = write!(
            m,
            "---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {name}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {role}
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: Group
  name: {group}
"
        );
    }
    m
}

/// The bootstrap token (`[a-z0-9]{6}.[a-z0-9]{16}`), made once per cluster dir.
fn bootstrap_token(f: &Files) -> Result<String> {
    let path = f.pki("bootstrap-token");
    if let Ok(t) = fs::read_to_string(&path) {
        return Ok(t.trim().to_owned());
    }
    let mut raw = [0u8; 22];
    fs::File::open("/dev/urandom").and_then(|mut r| r.read_exact(&mut raw)).context("reading /dev/urandom")?;
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let chars: String = raw.iter().map(|b| char::from(alphabet[usize::from(*b) % alphabet.len()])).collect();
    let token = format!("{}.{}", &chars[..6], &chars[6..]);
    write_file(&path, token.as_bytes(), 0o600)?;
    Ok(token)
}

/// The cluster CA and every certificate signed by it, unless the CA exists already.
fn ensure_pki(f: &Files) -> Result<()> {
    if f.pki("ca.crt").is_file() && f.pki("sa.key").is_file() {
        return Ok(());
    }
    let ca_key = rcgen::KeyPair::generate()?;
    let ca = registry::ca_params("kubernetes")?;
    let ca_cert = ca.self_signed(&ca_key)?;
    write_file(&f.pki("ca.crt"), ca_cert.pem().as_bytes(), 0o644)?;
    write_file(&f.pki("ca.key"), ca_key.serialize_pem().as_bytes(), 0o600)?;
    let issuer = rcgen::Issuer::new(ca, ca_key);

    let server_names = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "localhost",
        "127.0.0.1",
        SERVICE_IP,
    ];
    let certs: [(&str, &str, Option<&str>, &[&str]); 5] = [
        ("apiserver", "kube-apiserver", None, &server_names),
        ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", Some("system:masters"), &[]),
        ("admin", "kubernetes-admin", Some("system:masters"), &[]),
        ("controller-manager", "system:kube-controller-manager", None, &[]),
        ("scheduler", "system:kube-scheduler", None, &[]),
    ];
    for (file, cn, org, names) in certs {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        if let Some(o) = org {
            params.distinguished_name.push(rcgen::DnType::OrganizationName, o);
        }
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature, rcgen::KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = if names.is_empty() {
            vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth]
        } else {
            vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth]
        };
        let cert = params.signed_by(&key, &issuer)?;
        write_file(&f.pki(&format!("{file}.crt")), cert.pem().as_bytes(), 0o644)?;
        write_file(&f.pki(&format!("{file}.key")), key.serialize_pem().as_bytes(), 0o600)?;
    }
    // The service-account token key pair (ES256).
    let sa = rcgen::KeyPair::generate()?;
    write_file(&f.pki("sa.pub"), sa.public_key_pem().as_bytes(), 0o644)?;
    write_file(&f.pki("sa.key"), sa.serialize_pem().as_bytes(), 0o600)?;
    Ok(())
}

fn write_kubeconfigs(f: &Files, server: &str, token: &str) -> Result<()> {
    let ca = f.pki("ca.crt");
    for (who, cert) in [("admin", "admin"), ("controller-manager", "controller-manager"), ("scheduler", "scheduler")] {
        let user = format!(
            "    client-certificate: {}\n    client-key: {}\n",
            f.pki(&format!("{cert}.crt")).display(),
            f.pki(&format!("{cert}.key")).display()
        );
        write_file(&f.kubeconfig(who), kubeconfig(server, &ca, who, &user).as_bytes(), 0o600)?;
    }
    write_file(
        &f.kubeconfig("bootstrap"),
        kubeconfig(server, &ca, "tls-bootstrap-token-user", &format!("    token: {token}\n")).as_bytes(),
        0o600,
    )
}

/// A kubeconfig for `server` with one user whose credentials are `user` (indented YAML).
pub fn kubeconfig(server: &str, ca: &Path, name: &str, user: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: swiftlet-testbed
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {name}
  user:
{user}contexts:
- name: {name}@swiftlet-testbed
  context:
    cluster: swiftlet-testbed
    user: {name}
current-context: {name}@swiftlet-testbed
",
        ca = ca.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_recognised_by_binary_and_dir_only() {
        let bin = Path::new("/w/target/upstream");
        let dir = Path::new("/var/lib/swiftlet-testbed/cluster");
        let ours: Vec<String> =
            ["/w/target/upstream/etcd", "--data-dir=/var/lib/swiftlet-testbed/cluster/etcd"].map(String::from).into();
        assert!(is_ours(&ours, bin, dir));
        let other_etcd: Vec<String> =
            ["/usr/bin/etcd", "--data-dir=/var/lib/swiftlet-testbed/cluster/etcd"].map(String::from).into();
        assert!(!is_ours(&other_etcd, bin, dir));
        let other_dir: Vec<String> = ["/w/target/upstream/etcd", "--data-dir=/var/lib/etcd"].map(String::from).into();
        assert!(!is_ours(&other_dir, bin, dir));
    }

    #[test]
    fn bootstrap_manifests_bind_kubeadms_roles() {
        let m = bootstrap_manifests("abcdef.0123456789abcdef");
        assert!(m.contains("name: bootstrap-token-abcdef"));
        assert!(m.contains("token-secret: 0123456789abcdef"));
        assert!(m.contains("name: system:certificates.k8s.io:certificatesigningrequests:nodeclient"));
        assert!(m.contains("name: system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"));
        assert_eq!(m.matches("kind: ClusterRoleBinding").count(), 3);
    }
}
