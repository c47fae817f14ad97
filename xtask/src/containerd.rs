//! The test bed's own containerd: its config, its CNI network, starting it as a daemon
//! and stopping it, and finding its processes (the daemon and its shims) by pid.
//!
//! Facts about containerd 1.6 (Debian 1.6.20) learned on these machines:
//! - `restrict_oom_score_adj = true` is required: root here lacks `CAP_SYS_RESOURCE`, and
//!   without it every sandbox fails with "can't get final child's PID from pipe: EOF".
//! - `SystemdCgroup = false` (there is no systemd), snapshotter `overlayfs`.
//! - Shim sockets do not follow the configured `state` dir: they are always
//!   `/run/containerd/s/<sha256(address/namespace/id)>`, so a test bed also writes
//!   under `/run/containerd` (down removes only what it created there).
//! - runc's state follows the runtime's `Root` option (`<Root>/<namespace>`); without it
//!   runc writes to `/run/containerd/runc/<namespace>`. After containerd dies,
//!   `runc --root <Root>/k8s.io delete --force <id>` is what stops the pods it left.
//! - containerd and its shims, once orphaned, are reaped lazily by this VM's init: a dead
//!   one shows as a zombie for a while, so "alive" must mean "exists and is not `Z`".
//! - CNI results are cached in `/var/lib/cni/results` (libcni's default; containerd 1.6
//!   has no setting for it), as `<network>-<sandbox id>-eth0` and
//!   `cni-loopback-<sandbox id>-lo`. The bridge plugin (`isGateway`) sets
//!   `net.ipv4.ip_forward = 1`. portmap creates `CNI-HOSTPORT-{DNAT,MASQ,SETMARK}` and one
//!   `CNI-DN-<hash>` per pod in the nat table, jumped to from PREROUTING, OUTPUT and
//!   POSTROUTING, and makes hostPorts answer on 127.0.0.1 too.
//! - Shims (`containerd-shim-runc-v2 -namespace k8s.io -id <id> -address <sock>`) outlive
//!   containerd; so do the pods they run. The only sure way to "our" shims is the
//!   `-address` argument of their command line.
//! - The CRI streaming server listens on 10010 by default: port 0 picks a free port, so a
//!   test bed does not collide with another containerd on the machine.
//! - The `opt` plugin creates `/opt/containerd` unless its `path` is set.
//! - `io.containerd.runtime.v1.linux` cannot be disabled even though CRI uses the v2 runc
//!   shim: the tasks service requires it, and without the tasks service the CRI plugin
//!   fails to load (the socket then answers "unknown service runtime.v1.RuntimeService").
//! - `netns_mounts_under_state_dir = true` (1.6 has it) moves pod network namespaces from
//!   `/run/netns/cni-*` to `<state>/io.containerd.grpc.v1.cri/netns/cni-*`, inside the test
//!   bed's own dirs.

use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{cri::CriClient, images::PAUSE_IMAGE, testbed::Layout};

/// The CNI network name; also the prefix of its cached results in `/var/lib/cni/results`.
pub const CNI_NETWORK: &str = "swiftlet-testbed";
/// The bridge the CNI `bridge` plugin creates on first pod start.
pub const BRIDGE: &str = "swiftlet0";
/// The pod subnet (host-local IPAM): a /22, addresses for 1,021 pods, so one node can
/// be measured at 500 pods (`cargo xtask bench density`) and well past upstream's 110.
pub const POD_SUBNET: &str = "10.217.0.0/22";

/// The containerd config (format version 2) for `layout`.
pub fn config_toml(layout: &Layout) -> String {
    let p = |p: PathBuf| p.display().to_string();
    format!(
        r#"# Written by `cargo xtask testbed up`; removed by `cargo xtask testbed down`.
version = 2
root = "{root}"
state = "{state}"
# Plugins this machine cannot use or the test bed does not need: disabling them keeps
# the log free of start-up errors that would hide real ones.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{socket}"

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # Pod network namespaces under our state dir instead of the host's /run/netns.
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc_root}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_conf}"
    max_conf_num = 1

  # Per-registry `<host:port>/hosts.toml` (the test registries' CA and schemes), read on
  # every pull: `cargo xtask registry up` can add them while containerd runs.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{registry_hosts}"
"#,
        root = p(layout.containerd_root()),
        state = p(layout.containerd_state()),
        socket = p(layout.socket()),
        opt = p(layout.opt_dir()),
        pause = PAUSE_IMAGE,
        runc_root = p(layout.runc_root()),
        cni_conf = p(layout.cni_conf_dir()),
        registry_hosts = p(layout.registry_hosts_dir()),
    )
}

/// The CNI network: a bridge with host-local IPAM, plus portmap for hostPort.
///
/// `ipMasq` is off so the bridge plugin creates no NAT chains: the test bed needs no
/// internet access from pods, and fewer iptables rules means less to clean up. portmap's
/// own chains (`CNI-HOSTPORT-*`, `CNI-DN-*`) are cleaned up by `down`. Loopback inside the
/// pod is set up by containerd itself.
pub fn cni_conflist(layout: &Layout) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": POD_SUBNET }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": layout.cni_ipam_dir(),
                }
            },
            { "type": "portmap", "capabilities": { "portMappings": true } }
        ]
    })
}

/// Writes the containerd config and the CNI conflist.
pub fn write_config(layout: &Layout) -> Result<()> {
    for dir in
        [layout.root.clone(), layout.state.clone(), layout.cni_conf_dir(), layout.cni_ipam_dir(), layout.pod_logs_dir()]
    {
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let config = layout.containerd_config();
    fs::write(&config, config_toml(layout)).with_context(|| format!("writing {}", config.display()))?;
    let conflist = layout.cni_conf_dir().join("10-swiftlet-testbed.conflist");
    fs::write(&conflist, serde_json::to_vec_pretty(&cni_conflist(layout))?)
        .with_context(|| format!("writing {}", conflist.display()))
}

/// Starts containerd detached (own session, output to the log file) and returns its pid.
pub fn spawn(layout: &Layout) -> Result<i32> {
    let mut cmd = Command::new("containerd");
    cmd.arg("--config").arg(layout.containerd_config());
    spawn_detached(cmd, &layout.log_file(), "starting containerd (apt package containerd)")
}

/// Starts `cmd` detached, in a session of its own, with no stdin and its output appended
/// to `log_path`, and returns its pid; `starting` names it when it does not start.
pub fn spawn_detached(mut cmd: Command, log_path: &Path, starting: &str) -> Result<i32> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let log_err = log.try_clone()?;
    cmd.stdin(Stdio::null()).stdout(log).stderr(log_err);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent. A new
    // session keeps the daemon out of the terminal's process group (Ctrl-C in `cargo xtask
    // test` must not kill it half-way) and free of the terminal's SIGHUP.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().context(starting.to_owned())?;
    i32::try_from(child.id()).context("pid out of range")
}

/// Waits until containerd answers CRI `Version`, or fails with the log's tail.
pub async fn wait_ready(layout: &Layout, pid: i32, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    while Instant::now() < deadline {
        if !is_alive(pid) {
            bail!(
                "containerd (pid {pid}) exited during start-up; its log {}:\n{}",
                layout.log_file().display(),
                log_tail(&layout.log_file(), 30)
            );
        }
        if layout.socket().exists() {
            match CriClient::connect(&layout.socket()).await {
                Ok(mut c) => match c.version().await {
                    Ok(v) => {
                        return Ok(format!("{} {} (CRI {})", v.runtime_name, v.runtime_version, v.runtime_api_version));
                    }
                    Err(e) => last_err = Some(e),
                },
                Err(e) => last_err = Some(e),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!(
        "containerd (pid {pid}) did not answer CRI Version within {timeout:?} (last error: {}); \
         its log {}:\n{}",
        last_err.map_or_else(|| "socket never appeared".to_owned(), |e| format!("{e:#}")),
        layout.log_file().display(),
        log_tail(&layout.log_file(), 30)
    )
}

/// Runs `cmd` (no stdin, output captured) and fails unless it succeeds, with the last
/// lines of its stderr in the error.
pub fn run_checked(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        bail!("{what} failed ({}): {}", out.status, lines[lines.len().saturating_sub(20)..].join("\n"));
    }
    Ok(())
}

pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The NUL-separated arguments of a process, or `None` once it is gone.
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
}

/// Whether `pid` is a live process (not a zombie). Reaps it first if it is our own child,
/// because `cargo xtask test` is containerd's parent and would otherwise see a zombie as
/// "alive" forever.
pub fn is_alive(pid: i32) -> bool {
    // waitpid(0 or negative) would wait for a whole process group.
    if pid <= 0 {
        return false;
    }
    // SAFETY: waitpid with WNOHANG on a pid that is not our child just fails with ECHILD.
    unsafe {
        libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Whether `args` is a containerd daemon started with our config file.
pub fn is_our_containerd(args: &[String], config: &Path) -> bool {
    let config = config.display().to_string();
    args.first().is_some_and(|a| a.ends_with("containerd"))
        && args.windows(2).any(|w| w[0] == "--config" && w[1] == config)
}

/// Whether `args` is a containerd shim serving the containerd at `socket`: its
/// `-address` argument names our socket. Never match by process name alone.
pub fn is_our_shim(args: &[String], socket: &Path) -> bool {
    let socket = socket.display().to_string();
    args.first().is_some_and(|a| a.contains("containerd-shim"))
        && args.windows(2).any(|w| w[0] == "-address" && w[1] == socket)
}

/// Value of a shim's `-flag` argument.
pub fn shim_arg<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.windows(2).find(|w| w[0] == flag).map(|w| w[1].as_str())
}

/// All pids whose command line satisfies `pred`.
pub fn find_processes(pred: impl Fn(&[String]) -> bool) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid: &i32| *pid != std::process::id() as i32 && cmdline(*pid).is_some_and(|a| pred(&a)))
        .filter(|pid| is_alive(*pid))
        .collect();
    pids.sort_unstable();
    pids
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: plain syscall; callers check the pid's command line first.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// SIGTERM, wait up to `grace`, then SIGKILL; returns once the process is gone.
pub fn terminate(pid: i32, grace: Duration) -> Result<()> {
    signal(pid, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !is_alive(pid) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("pid {pid} still alive after {grace:?}: SIGKILL");
    signal(pid, libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !is_alive(pid) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("pid {pid} survived SIGKILL")
}

/// Where a shim's socket lives: containerd 1.6 puts it in `/run/containerd/s` named by
/// `sha256(<containerd address>/<namespace>/<id>)`, whatever its state dir.
pub fn shim_socket_path(address: &str, namespace: &str, id: &str) -> PathBuf {
    use sha2::Digest as _;
    let joined = Path::new(address).join(namespace).join(id);
    let hash = sha2::Sha256::digest(joined.as_os_str().as_encoded_bytes());
    Path::new("/run/containerd/s").join(hex::encode(hash))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testbed::argv;

    #[test]
    fn config_points_everything_inside_the_layout() {
        let layout = Layout::under_x();
        let toml = config_toml(&layout);
        assert!(toml.contains(r#"address = "/x/state/containerd.sock""#));
        assert!(toml.contains(r#"Root = "/x/state/runc""#));
        assert!(toml.contains(r#"conf_dir = "/x/root/cni/net.d""#));
        assert!(toml.contains("restrict_oom_score_adj = true"));
        assert!(toml.contains("SystemdCgroup = false"));
        assert!(toml.contains(r#"sandbox_image = "localhost/pause:3.10""#));
        assert!(toml.contains(r#"config_path = "/x/root/certs.d""#));
        assert!(toml.starts_with("# ") && toml.contains("\nversion = 2\n"));
    }

    #[test]
    fn conflist_has_no_masquerade_and_own_ipam_dir() {
        let layout = Layout::under_x();
        let c = cni_conflist(&layout);
        assert_eq!(c["plugins"][0]["bridge"], BRIDGE);
        assert_eq!(c["plugins"][0]["ipMasq"], false);
        assert_eq!(c["plugins"][0]["ipam"]["dataDir"], "/x/root/cni/ipam");
        assert_eq!(c["plugins"][1]["capabilities"]["portMappings"], true);
    }

    #[test]
    fn recognises_our_processes_only() {
        let sock = Path::new("/run/t/containerd.sock");
        let shim = argv("/usr/bin/containerd-shim-runc-v2 -namespace k8s.io -id abc -address /run/t/containerd.sock");
        assert!(is_our_shim(&shim, sock));
        assert_eq!(shim_arg(&shim, "-id"), Some("abc"));
        let other =
            argv("/usr/bin/containerd-shim-runc-v2 -namespace k8s.io -id abc -address /run/containerd/containerd.sock");
        assert!(!is_our_shim(&other, sock));
        // A process merely mentioning the socket is not a shim.
        assert!(!is_our_shim(&argv("less -address /run/t/containerd.sock"), sock));

        let cfg = Path::new("/v/containerd.toml");
        assert!(is_our_containerd(&argv("containerd --config /v/containerd.toml"), cfg));
        assert!(!is_our_containerd(&argv("containerd"), cfg));
        assert!(!is_our_containerd(&argv("vim --config /v/containerd.toml"), cfg));
    }

    #[test]
    fn shim_socket_is_hash_of_address_namespace_id() {
        let p = shim_socket_path("/run/t/containerd.sock", "k8s.io", "abc");
        assert!(p.starts_with("/run/containerd/s"));
        assert_eq!(p.file_name().unwrap().len(), 64);
        assert_ne!(p, shim_socket_path("/run/t/containerd.sock", "k8s.io", "abd"));
    }
}
