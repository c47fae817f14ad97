//! The test bed's image registries: Debian's `docker-registry` (the CNCF distribution
//! registry) on loopback, so image pulls in end-to-end tests are real pulls.
//!
//! `cargo xtask registry up|down|status`, and `testbed up|down|check-clean` do the same.
//! `up` starts two registries, each pushed the test bed's local images with `skopeo`:
//! - **plain**: HTTP, no authentication, `127.0.0.1:5001` (not 5000: the node
//!   conformance suite runs agnhost's fake registry on the node's port 5000);
//! - **tls**: HTTPS with a certificate for `127.0.0.1` and `localhost` from a CA generated
//!   here, and htpasswd (bcrypt) basic authentication, `127.0.0.1:5443`. A random
//!   password per test bed; an anonymous pull is refused (checked by `up`).
//!
//! The images keep their path without `localhost/`: `localhost/busybox:latest` becomes
//! `127.0.0.1:5001/busybox:latest` and `127.0.0.1:5443/busybox:latest`.
//!
//! containerd learns how to reach them from `hosts.toml` files (one directory per
//! `host:port`) under the CRI plugin's registry `config_path`, which the test bed's
//! containerd config sets (see `containerd::config_toml`); containerd reads them on every
//! pull, so they need no restart. With `config_path` set, containerd 1.6 speaks HTTPS to
//! every registry without a `hosts.toml`, loopback included (its old "localhost is plain
//! HTTP" default applies only without `config_path`), so the plain registry gets a
//! `hosts.toml` with an `http://` server too. containerd 1.6 also refuses a `hosts.toml`
//! without a `[host]` table ("invalid `host` tree"), hence one in each.
//!
//! Where things live: `<root>/registry` (`pki/`, and per registry `config.yml`, `storage/`
//! and `registry.log`), `<root>/certs.d` (containerd's `config_path`), and
//! `<state>/registry.json`: the record `down` works from and that tests read (endpoints,
//! username, password, CA). Processes are found by their command line
//! (`docker-registry serve <our config.yml>`), never by name alone.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use crate::{
    Ctx, apt, containerd,
    images::{self, BuiltImage},
    testbed::{Layout, require_root},
};

/// The Debian packages the registries need.
pub const PACKAGES: &[&str] = &["docker-registry", "skopeo"];
/// The user of the authenticated registry.
pub const USERNAME: &str = "swiftlet";
/// The htpasswd realm (shown in `WWW-Authenticate`).
const REALM: &str = "swiftlet-testbed";

/// The loopback ports of the two registries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ports {
    pub plain: u16,
    pub tls: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Self { plain: 5001, tls: 5443 }
    }
}

/// Registries that pods of the node conformance suite serve on the node's loopback, plain
/// HTTP: agnhost's `fake-registry-server` (host network, port 5000; the private-registry
/// specs pull `localhost:5000/pause:testing` from it). A node's containerd without
/// `config_path`, or 1.7 and later, speaks plain HTTP to loopback by itself; containerd 1.6
/// with `config_path` (the test bed's) needs a `hosts.toml` saying so.
const NODE_LOCAL_PLAIN: [&str; 2] = ["localhost:5000", "127.0.0.1:5000"];

/// One of the two registries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Plain,
    Tls,
}

impl Kind {
    pub const ALL: [Self; 2] = [Self::Plain, Self::Tls];

    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Tls => "tls",
        }
    }

    fn dir(self, layout: &Layout) -> PathBuf {
        layout.registry_dir().join(self.name())
    }

    fn config(self, layout: &Layout) -> PathBuf {
        self.dir(layout).join("config.yml")
    }

    fn port(self, ports: Ports) -> u16 {
        match self {
            Self::Plain => ports.plain,
            Self::Tls => ports.tls,
        }
    }
}

/// Files of the generated PKI and the htpasswd file.
#[derive(Debug, Clone)]
struct Pki {
    ca_cert: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    /// A directory holding only `ca.crt`: what skopeo's `--cert-dir` expects (it would
    /// take any `.key` there for a client key).
    trust_dir: PathBuf,
    htpasswd: PathBuf,
}

impl Pki {
    fn new(layout: &Layout) -> Self {
        let pki = layout.registry_dir().join("pki");
        Self {
            ca_cert: pki.join("ca.crt"),
            server_cert: pki.join("server.crt"),
            server_key: pki.join("server.key"),
            trust_dir: pki.join("trust"),
            htpasswd: pki.join("htpasswd"),
        }
    }
}

/// One running registry, as recorded in `registry.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// `host:port`, what image references start with.
    pub endpoint: String,
    pub scheme: String,
    pub pid: Option<i32>,
    pub config: PathBuf,
    pub log: PathBuf,
    pub storage: PathBuf,
}

/// `registry.json`: what `up` made; the tests read it (see `swiftlet_tests::TestRegistry`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// HTTP, anonymous.
    pub plain: Instance,
    /// HTTPS (CA below) with basic authentication.
    pub tls: Instance,
    pub username: String,
    /// The test bed's throw-away password for `tls`.
    pub password: String,
    /// The CA that signed `tls`'s certificate (PEM).
    pub ca_cert: PathBuf,
    /// A directory with only `ca.crt`, for `skopeo --cert-dir` and docker-style clients.
    pub cert_dir: PathBuf,
    /// containerd's registry `config_path`.
    pub hosts_dir: PathBuf,
    /// Local image name -> `repository:tag` pushed to both registries.
    pub images: BTreeMap<String, String>,
    pub docker_registry_version: String,
    pub skopeo_version: String,
}

impl State {
    pub fn load(layout: &Layout) -> Result<Option<Self>> {
        images::read_json(&layout.registry_state_file())
    }

    fn save(&self, layout: &Layout) -> Result<()> {
        fs::create_dir_all(&layout.state).with_context(|| format!("creating {}", layout.state.display()))?;
        let path = layout.registry_state_file();
        images::write_atomic(&path, &serde_json::to_vec_pretty(self)?)?;
        // It holds a password.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod {}", path.display()))
    }

    fn instance(&self, kind: Kind) -> &Instance {
        match kind {
            Kind::Plain => &self.plain,
            Kind::Tls => &self.tls,
        }
    }
}

/// The registry's `config.yml` (distribution 2.8 format).
fn config_yml(kind: Kind, port: u16, storage: &Path, pki: &Pki, http_secret: &str) -> String {
    let mut yml = format!(
        r"# Written by `cargo xtask registry up`; removed by `registry down` / `testbed down`.
version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:{port}
  secret: {http_secret}
",
        storage = storage.display(),
    );
    if kind == Kind::Tls {
        // Writing to a String cannot fail.
        let _ = write!(
            yml,
            r"  tls:
    certificate: {cert}
    key: {key}
auth:
  htpasswd:
    realm: {REALM}
    path: {htpasswd}
",
            cert = pki.server_cert.display(),
            key = pki.server_key.display(),
            htpasswd = pki.htpasswd.display(),
        );
    }
    yml
}

/// containerd's `hosts.toml` for a registry at `endpoint` (`host:port`).
pub fn hosts_toml(scheme: &str, endpoint: &str, ca: Option<&Path>) -> String {
    let mut toml = format!(
        "# Written by `cargo xtask registry up`.\nserver = \"{scheme}://{endpoint}\"\n\n\
         [host.\"{scheme}://{endpoint}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    );
    if let Some(ca) = ca {
        let _ = writeln!(toml, "  ca = \"{}\"", ca.display());
    }
    toml
}

/// One htpasswd line with a bcrypt (`$2y$`) hash, the only kind docker-registry accepts.
pub fn htpasswd_line(user: &str, password: &str) -> Result<String> {
    let hash = bcrypt::hash_with_result(password, bcrypt::DEFAULT_COST).context("bcrypt")?;
    Ok(format!("{user}:{}\n", hash.format_for_version(bcrypt::Version::TwoY)))
}

/// Whether `args` is a docker-registry serving `config`.
pub fn is_our_registry(args: &[String], config: &Path) -> bool {
    let config = config.display().to_string();
    args.first().is_some_and(|a| a.ends_with("docker-registry"))
        && args.get(1).is_some_and(|a| a == "serve")
        && args.get(2).is_some_and(|a| *a == config)
}

/// Live registry processes of `layout` (either kind).
pub fn our_processes(layout: &Layout) -> Vec<(Kind, i32)> {
    Kind::ALL
        .into_iter()
        .flat_map(|kind| {
            let config = kind.config(layout);
            containerd::find_processes(|a| is_our_registry(a, &config)).into_iter().map(move |pid| (kind, pid))
        })
        .collect()
}

/// `<dir>/<repository:tag>` for a local image name: `localhost/busybox:latest` -> `busybox:latest`.
pub fn repository_tag(local_name: &str) -> String {
    local_name.strip_prefix("localhost/").unwrap_or(local_name).to_owned()
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0; bytes];
    fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).context("reading /dev/urandom")?;
    Ok(hex::encode(buf))
}

/// Writes `contents` to `path` (making its directory) with permission bits `mode`.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).with_context(|| format!("chmod {}", path.display()))
}

/// The parameters of a self-signed CA named `common_name` that may sign certificates.
pub fn ca_params(common_name: &str) -> Result<rcgen::CertificateParams> {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, common_name);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    Ok(ca)
}

/// Generates the CA and the server certificate (for `127.0.0.1` and `localhost`) unless
/// they exist.
fn ensure_pki(pki: &Pki) -> Result<()> {
    if pki.ca_cert.is_file() && pki.server_cert.is_file() && pki.server_key.is_file() {
        return Ok(());
    }
    let ca_key = rcgen::KeyPair::generate()?;
    let ca_params = ca_params("swiftlet test registry CA")?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
    params.distinguished_name.push(rcgen::DnType::CommonName, "swiftlet test registry");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer)?;

    write_file(&pki.server_key, key.serialize_pem().as_bytes(), 0o600)?;
    write_file(&pki.server_cert, cert.pem().as_bytes(), 0o644)?;
    write_file(&pki.ca_cert, ca_cert.pem().as_bytes(), 0o644)?;
    write_file(&pki.trust_dir.join("ca.crt"), ca_cert.pem().as_bytes(), 0o644)?;
    Ok(())
}

/// First line of `<program> --version`.
fn version(program: &str) -> Result<String> {
    let out = Command::new(program).arg("--version").output().with_context(|| format!("running {program}"))?;
    ensure!(out.status.success(), "{program} --version failed");
    Ok(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().trim().to_owned())
}

/// Starts `docker-registry serve <config>` detached, output to `log`; returns its pid.
fn spawn(config: &Path, log_path: &Path) -> Result<i32> {
    let mut cmd = Command::new("docker-registry");
    cmd.arg("serve").arg(config);
    containerd::spawn_detached(cmd, log_path, "starting docker-registry (apt package docker-registry)")
}

/// Waits until the registry answers on its port (for plain HTTP: `GET /v2/` is 200).
fn wait_ready(kind: Kind, port: u16, pid: i32, log: &Path, timeout: Duration) -> Result<()> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + timeout;
    let mut last = String::from("not tried");
    while Instant::now() < deadline {
        if !containerd::is_alive(pid) {
            bail!(
                "docker-registry {} (pid {pid}) exited during start-up; its log {}:\n{}",
                kind.name(),
                log.display(),
                containerd::log_tail(log, 30)
            );
        }
        match probe(kind, addr) {
            Ok(()) => return Ok(()),
            Err(e) => last = format!("{e:#}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "docker-registry {} (pid {pid}) did not answer on {addr} within {timeout:?} ({last}); its log {}:\n{}",
        kind.name(),
        log.display(),
        containerd::log_tail(log, 30)
    )
}

/// One readiness check: a TCP connection, and for plain HTTP the API's `GET /v2/`.
fn probe(kind: Kind, addr: SocketAddr) -> Result<()> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    if kind == Kind::Tls {
        // The TLS handshake and authentication are checked with skopeo once images are pushed.
        return Ok(());
    }
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let status = reply.lines().next().unwrap_or_default();
    ensure!(status.split_whitespace().nth(1) == Some("200"), "GET /v2/ answered {status:?}");
    Ok(())
}

fn tcp_answers(port: u16) -> bool {
    TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(2)).is_ok()
}

/// Runs skopeo with `args`; on failure, its stderr in the error.
fn skopeo(args: &[&str]) -> Result<()> {
    let out = Command::new("skopeo").args(args).output().context("running skopeo (apt package skopeo)")?;
    if !out.status.success() {
        bail!("skopeo {} failed: {}", args.first().unwrap_or(&""), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Pushes `image` (the registry copy of the local image `local`) into both registries,
/// under `local`'s repository and tag.
fn push(state: &State, local: &str, image: &BuiltImage) -> Result<()> {
    let src = format!("oci-archive:{}", image.tar_path.display());
    let target = repository_tag(local);
    let plain = push_plain(state, image, &target)?;
    let tls = format!("docker://{}/{target}", state.tls.endpoint);
    let cert_dir = state.cert_dir.display().to_string();
    let creds = format!("{}:{}", state.username, state.password);
    skopeo(&["copy", "--quiet", "--insecure-policy", "--dest-cert-dir", &cert_dir, "--dest-creds", &creds, &src, &tls])
        .with_context(|| format!("pushing {} to {tls}", image.name))?;
    eprintln!("registry: pushed {} as {plain} and {tls}", image.name);
    Ok(())
}

/// Pushes `image` to the plain registry as `target` (`repository:tag`); its reference.
pub fn push_plain(state: &State, image: &BuiltImage, target: &str) -> Result<String> {
    let src = format!("oci-archive:{}", image.tar_path.display());
    let plain = format!("docker://{}/{target}", state.plain.endpoint);
    // `--insecure-policy`: no signature policy applies to our own images (and Debian's
    // /etc/containers/policy.json need not exist).
    skopeo(&["copy", "--quiet", "--insecure-policy", "--dest-tls-verify=false", &src, &plain])
        .with_context(|| format!("pushing {} to {plain}", image.name))?;
    Ok(plain)
}

/// Checks what tests rely on: the plain registry serves anonymously; the TLS one verifies
/// against our CA, refuses anonymous pulls and serves with the password.
fn verify(state: &State, target: &str) -> Result<()> {
    let cert_dir = state.cert_dir.display().to_string();
    let plain = format!("docker://{}/{target}", state.plain.endpoint);
    skopeo(&["inspect", "--raw", "--tls-verify=false", &plain]).context("anonymous pull from the plain registry")?;
    let tls = format!("docker://{}/{target}", state.tls.endpoint);
    let creds = format!("{}:{}", state.username, state.password);
    skopeo(&["inspect", "--raw", "--cert-dir", &cert_dir, "--creds", &creds, &tls])
        .context("authenticated pull from the TLS registry")?;
    match skopeo(&["inspect", "--raw", "--cert-dir", &cert_dir, "--no-creds", &tls]) {
        Ok(()) => bail!("the TLS registry served {tls} without credentials"),
        Err(e) if format!("{e:#}").contains("unauthorized") || format!("{e:#}").contains("authentication required") => {
            Ok(())
        }
        Err(e) => Err(e.context("an anonymous pull from the TLS registry failed, but not for lack of credentials")),
    }
}

/// Stops our registry processes (recorded or found), keeping their logs in
/// `<target>/xtask/registry-<kind>-last.log`.
pub fn stop(ctx: &Ctx, layout: &Layout) -> Result<()> {
    let mut pids = our_processes(layout);
    if let Ok(Some(state)) = State::load(layout) {
        for kind in Kind::ALL {
            if let Some(pid) = state.instance(kind).pid
                && !pids.contains(&(kind, pid))
                && containerd::cmdline(pid).is_some_and(|a| is_our_registry(&a, &kind.config(layout)))
                && containerd::is_alive(pid)
            {
                pids.push((kind, pid));
            }
        }
    }
    let mut errors = Vec::new();
    for (kind, pid) in pids {
        eprintln!("registry: stopping {} pid {pid}", kind.name());
        if let Err(e) = containerd::terminate(pid, Duration::from_secs(10)) {
            errors.push(format!("{e:#}"));
        }
    }
    for kind in Kind::ALL {
        let log = kind.dir(layout).join("registry.log");
        if log.exists() {
            let keep = ctx.target_dir.join(format!("xtask/registry-{}-last.log", kind.name()));
            if fs::create_dir_all(keep.parent().unwrap_or(Path::new("/"))).is_ok() && fs::copy(&log, &keep).is_ok() {
                eprintln!("registry: {} log kept at {}", kind.name(), keep.display());
            }
        }
    }
    if !errors.is_empty() {
        bail!("stopping registries: {}", errors.join("; "));
    }
    Ok(())
}

/// `registry down`: stops the registries and removes their files (storage, PKI,
/// containerd's `hosts.toml` files, `registry.json`). The rest of the test bed stays.
pub fn down(ctx: &Ctx, layout: &Layout) -> Result<()> {
    require_root()?;
    stop(ctx, layout)?;
    for dir in [layout.registry_dir(), layout.registry_hosts_dir()] {
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
    }
    let state = layout.registry_state_file();
    if state.exists() {
        fs::remove_file(&state).with_context(|| format!("removing {}", state.display()))?;
    }
    let left = leftovers(layout);
    ensure!(left.is_empty(), "registry down incomplete: {}", left.join(", "));
    eprintln!("registry: down");
    Ok(())
}

/// What of the registries is still on the host (processes); their files live in the
/// test bed's dirs, which `testbed check-clean` checks as a whole.
pub fn leftovers(layout: &Layout) -> Vec<String> {
    our_processes(layout)
        .into_iter()
        .map(|(kind, pid)| format!("docker-registry ({}) process {pid}", kind.name()))
        .collect()
}

/// Whether the recorded registry `kind` is ours, alive, on `port` and serving `config`
/// as it would be written now.
fn healthy(layout: &Layout, state: Option<&State>, kind: Kind, port: u16, config: &str) -> Option<i32> {
    let instance = state?.instance(kind);
    let pid = instance.pid?;
    let ours = containerd::cmdline(pid).is_some_and(|a| is_our_registry(&a, &kind.config(layout)));
    let same_config = fs::read_to_string(kind.config(layout)).is_ok_and(|c| c == config);
    (ours && containerd::is_alive(pid) && same_config && tcp_answers(port)).then_some(pid)
}

/// `registry up` (also run by `testbed up`): see the module docs. `copies` are the
/// registry copies of the test bed's images ([`images::build_registry_copies`], built by
/// the caller): distinct image ids, so removing a pulled copy never removes a local image. Idempotent: running registries with the same
/// configuration are kept, and pushes of unchanged images are no-ops.
pub fn up(layout: &Layout, ports: Ports, copies: &[(String, BuiltImage)]) -> Result<State> {
    require_root()?;
    apt::ensure(PACKAGES)?;
    let previous = State::load(layout).unwrap_or_else(|e| {
        eprintln!("registry: ignoring unreadable state: {e:#}");
        None
    });
    let pki = Pki::new(layout);
    ensure_pki(&pki)?;
    // Keep the password (and htpasswd) of a previous `up`: running tests may hold it.
    let password = match previous.as_ref() {
        Some(s) if pki.htpasswd.is_file() => s.password.clone(),
        _ => {
            let password = random_hex(12)?;
            write_file(&pki.htpasswd, htpasswd_line(USERNAME, &password)?.as_bytes(), 0o644)?;
            password
        }
    };
    let http_secret = match previous.as_ref().and_then(|s| fs::read_to_string(&s.plain.config).ok()) {
        Some(cfg) => cfg.lines().find_map(|l| l.trim().strip_prefix("secret: ").map(str::to_owned)),
        None => None,
    }
    .map_or_else(|| random_hex(16), Ok)?;

    let mut instances = BTreeMap::new();
    for kind in Kind::ALL {
        let port = kind.port(ports);
        let dir = kind.dir(layout);
        let storage = dir.join("storage");
        let log = dir.join("registry.log");
        fs::create_dir_all(&storage).with_context(|| format!("creating {}", storage.display()))?;
        let config = config_yml(kind, port, &storage, &pki, &http_secret);
        let pid = if let Some(pid) = healthy(layout, previous.as_ref(), kind, port, &config) {
            eprintln!("registry: {} already up (pid {pid}, 127.0.0.1:{port})", kind.name());
            pid
        } else {
            let config_path = kind.config(layout);
            for pid in containerd::find_processes(|a| is_our_registry(a, &config_path)) {
                eprintln!("registry: stopping stale {} pid {pid}", kind.name());
                containerd::terminate(pid, Duration::from_secs(10))?;
            }
            if tcp_answers(port) {
                bail!("127.0.0.1:{port} is in use by another process: cannot start the {} registry", kind.name());
            }
            write_file(&config_path, config.as_bytes(), 0o644)?;
            let pid = spawn(&config_path, &log)?;
            wait_ready(kind, port, pid, &log, Duration::from_secs(30))?;
            eprintln!("registry: {} started (pid {pid}, 127.0.0.1:{port}, log {})", kind.name(), log.display());
            pid
        };
        instances.insert(
            kind.name(),
            Instance {
                endpoint: format!("127.0.0.1:{port}"),
                scheme: if kind == Kind::Tls { "https" } else { "http" }.to_owned(),
                pid: Some(pid),
                config: kind.config(layout),
                log,
                storage,
            },
        );
    }
    let mut state = State {
        plain: instances.remove("plain").context("plain instance")?,
        tls: instances.remove("tls").context("tls instance")?,
        username: USERNAME.to_owned(),
        password,
        ca_cert: pki.ca_cert.clone(),
        cert_dir: pki.trust_dir.clone(),
        hosts_dir: layout.registry_hosts_dir(),
        images: BTreeMap::new(),
        docker_registry_version: version("docker-registry")?,
        skopeo_version: version("skopeo")?,
    };
    // Record the processes before pushing: a failed push must still leave `down` a record.
    state.save(layout)?;

    // containerd's view: both loopback names of each registry.
    let hosts = layout.registry_hosts_dir();
    if hosts.exists() {
        fs::remove_dir_all(&hosts).with_context(|| format!("removing {}", hosts.display()))?;
    }
    for (kind, instance) in [(Kind::Plain, &state.plain), (Kind::Tls, &state.tls)] {
        let port = kind.port(ports);
        let ca = (kind == Kind::Tls).then_some(pki.ca_cert.as_path());
        for host in ["127.0.0.1", "localhost"] {
            let endpoint = format!("{host}:{port}");
            write_file(
                &hosts.join(&endpoint).join("hosts.toml"),
                hosts_toml(&instance.scheme, &endpoint, ca).as_bytes(),
                0o644,
            )?;
        }
    }
    for endpoint in NODE_LOCAL_PLAIN {
        write_file(&hosts.join(endpoint).join("hosts.toml"), hosts_toml("http", endpoint, None).as_bytes(), 0o644)?;
    }

    for (local, image) in copies {
        push(&state, local, image)?;
        state.images.insert(local.clone(), repository_tag(local));
    }
    if let Some(first) = state.images.values().next() {
        verify(&state, first)?;
        eprintln!(
            "registry: checked: anonymous pull from plain, TLS verified, anonymous pull refused, password accepted"
        );
    }
    state.save(layout)?;
    eprintln!("registry: up; state in {}", layout.registry_state_file().display());
    Ok(state)
}

/// `registry up` on its own: builds the images, then [`up`]; prints the endpoints.
pub fn up_cmd(ctx: &Ctx, layout: &Layout, ports: Ports) -> Result<()> {
    require_root()?;
    apt::ensure(&["gcc", "libc6-dev", "busybox-static"])?;
    let copies = images::build_registry_copies(&ctx.workspace, &images::cache_dir(ctx))?;
    let state = up(layout, ports, &copies)?;
    println!("plain: http://{}", state.plain.endpoint);
    println!("tls:   https://{} (user {}, CA {})", state.tls.endpoint, state.username, state.ca_cert.display());
    println!("state: {}", layout.registry_state_file().display());
    Ok(())
}

/// `registry status`. Errors (exit 1) unless both registries run and answer.
pub fn status(layout: &Layout) -> Result<()> {
    let Some(state) = State::load(layout)? else {
        println!("registry: down (no {})", layout.registry_state_file().display());
        bail!("registry is down");
    };
    let mut down = Vec::new();
    for kind in Kind::ALL {
        let i = state.instance(kind);
        let pid = i.pid.unwrap_or_default();
        let alive = pid > 0
            && containerd::is_alive(pid)
            && containerd::cmdline(pid).is_some_and(|a| is_our_registry(&a, &i.config));
        let port = i.endpoint.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or_default();
        let answers = alive && tcp_answers(port);
        println!(
            "{:<6} {}://{} pid {pid} {}",
            kind.name(),
            i.scheme,
            i.endpoint,
            match (alive, answers) {
                (true, true) => "running",
                (true, false) => "running, NOT answering",
                _ => "NOT running",
            }
        );
        if !answers {
            down.push(kind.name());
        }
    }
    println!("user:   {} (password in {})", state.username, layout.registry_state_file().display());
    println!("CA:     {}", state.ca_cert.display());
    println!("images: {}", state.images.values().cloned().collect::<Vec<_>>().join(" "));
    println!("tools:  {}; {}", state.docker_registry_version, state.skopeo_version);
    ensure!(down.is_empty(), "registry {} is down", down.join(" and "));
    println!("registry: up");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testbed::argv;

    #[test]
    fn configs_point_inside_the_layout() {
        let layout = Layout::under_x();
        let pki = Pki::new(&layout);
        let plain = config_yml(Kind::Plain, 5001, &Kind::Plain.dir(&layout).join("storage"), &pki, "s3");
        assert!(plain.contains("  addr: 127.0.0.1:5001\n"), "{plain}");
        assert!(plain.contains("    rootdirectory: /x/root/registry/plain/storage\n"));
        assert!(!plain.contains("tls:") && !plain.contains("htpasswd"));
        let tls = config_yml(Kind::Tls, 5443, &Kind::Tls.dir(&layout).join("storage"), &pki, "s3");
        assert!(tls.contains("  addr: 127.0.0.1:5443\n"));
        assert!(tls.contains("    certificate: /x/root/registry/pki/server.crt\n"));
        assert!(tls.contains("    key: /x/root/registry/pki/server.key\n"));
        assert!(tls.contains("    path: /x/root/registry/pki/htpasswd\n"));
        // Every mapping key is indented by two spaces per level; no tabs.
        assert!(!tls.contains('\t'));
        assert_eq!(layout.registry_hosts_dir(), Path::new("/x/root/certs.d"));
        assert_eq!(layout.registry_state_file(), Path::new("/x/state/registry.json"));
    }

    #[test]
    fn hosts_toml_has_a_host_table() {
        let plain = hosts_toml("http", "127.0.0.1:5000", None);
        assert_eq!(
            plain,
            "# Written by `cargo xtask registry up`.\nserver = \"http://127.0.0.1:5000\"\n\n\
             [host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
        let tls = hosts_toml("https", "localhost:5443", Some(Path::new("/r/ca.crt")));
        assert!(tls.contains("[host.\"https://localhost:5443\"]\n"));
        assert!(tls.ends_with("  ca = \"/r/ca.crt\"\n"));
    }

    #[test]
    fn htpasswd_is_bcrypt_2y_and_verifies() {
        let line = htpasswd_line("swiftlet", "pw").unwrap();
        let (user, hash) = line.trim_end().split_once(':').unwrap();
        assert_eq!(user, "swiftlet");
        assert!(hash.starts_with("$2y$"), "{hash}");
        assert!(bcrypt::verify("pw", hash).unwrap());
        assert!(!bcrypt::verify("other", hash).unwrap());
    }

    #[test]
    fn recognises_our_registries_only() {
        let cfg = Path::new("/x/root/registry/tls/config.yml");
        assert!(is_our_registry(&argv("/usr/bin/docker-registry serve /x/root/registry/tls/config.yml"), cfg));
        assert!(is_our_registry(&argv("docker-registry serve /x/root/registry/tls/config.yml"), cfg));
        assert!(!is_our_registry(&argv("docker-registry serve /etc/docker/registry/config.yml"), cfg));
        assert!(!is_our_registry(&argv("less /x/root/registry/tls/config.yml"), cfg));
        assert!(!is_our_registry(&argv("docker-registry garbage-collect /x/root/registry/tls/config.yml"), cfg));
    }

    #[test]
    fn repository_tags_drop_localhost() {
        assert_eq!(repository_tag("localhost/busybox:latest"), "busybox:latest");
        assert_eq!(repository_tag("localhost/pause:3.10"), "pause:3.10");
        assert_eq!(repository_tag("quay.io/x:1"), "quay.io/x:1");
    }

    #[test]
    fn pki_is_generated_once_with_the_right_names() {
        let dir = std::env::temp_dir().join(format!("xtask-registry-pki-{}", std::process::id()));
        let layout = Layout::new(dir.join("root"), dir.join("state"));
        let pki = Pki::new(&layout);
        ensure_pki(&pki).unwrap();
        let ca = fs::read_to_string(&pki.ca_cert).unwrap();
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(fs::read_to_string(pki.trust_dir.join("ca.crt")).unwrap(), ca);
        assert_eq!(fs::metadata(&pki.server_key).unwrap().permissions().mode() & 0o777, 0o600);
        // The trust dir holds only the CA (skopeo would take a `.key` for a client key).
        let names: Vec<_> = fs::read_dir(&pki.trust_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["ca.crt"]);
        // A second run keeps what exists.
        ensure_pki(&pki).unwrap();
        assert_eq!(fs::read_to_string(&pki.ca_cert).unwrap(), ca);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn state_round_trips() {
        let dir = std::env::temp_dir().join(format!("xtask-registry-state-{}", std::process::id()));
        let layout = Layout::new(dir.join("root"), dir.join("state"));
        assert!(State::load(&layout).unwrap().is_none());
        let instance = |kind: Kind, port: u16| Instance {
            endpoint: format!("127.0.0.1:{port}"),
            scheme: "http".into(),
            pid: Some(7),
            config: kind.config(&layout),
            log: kind.dir(&layout).join("registry.log"),
            storage: kind.dir(&layout).join("storage"),
        };
        let state = State {
            plain: instance(Kind::Plain, 5001),
            tls: instance(Kind::Tls, 5443),
            username: USERNAME.into(),
            password: "pw".into(),
            ca_cert: "/ca.crt".into(),
            cert_dir: "/trust".into(),
            hosts_dir: layout.registry_hosts_dir(),
            images: BTreeMap::from([("localhost/busybox:latest".into(), "busybox:latest".into())]),
            docker_registry_version: "v".into(),
            skopeo_version: "s".into(),
        };
        state.save(&layout).unwrap();
        assert_eq!(State::load(&layout).unwrap().unwrap(), state);
        let mode = fs::metadata(layout.registry_state_file()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        fs::remove_dir_all(&dir).unwrap();
    }
}
