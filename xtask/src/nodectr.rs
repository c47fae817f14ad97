//! `cargo xtask testbed up --node-container`: a node in a container, as production runs
//! nodes: a Debian root filesystem with **systemd as its PID 1** and containerd under it
//! (`SystemdCgroup = true`), on its own network address. This machine has no systemd as
//! PID 1; the node container gives the systemd cgroup driver a real systemd.
//!
//! - **Root filesystem**: Debian bookworm made by `mmdebstrap` (minbase, with systemd,
//!   dbus, containerd, runc, the CNI plugins, iptables, iproute2), cached as a tarball in
//!   `target/xtask/node-container/` (about 45 s and 320 MB, once) and unpacked afresh into
//!   the test bed's root dir at every `up`.
//! - **Boot**: systemd runs as PID 1 of new PID, mount, UTS, IPC, network and cgroup
//!   namespaces (`unshare`), the way container managers start one (`container=other`):
//!   a private `/proc`, `/sys` read-only, every cgroup hierarchy mounted at the node
//!   container's own cgroup (`swiftlet-node-container`, under the launching process's
//!   cgroup in each hierarchy) so that systemd and the runtime can make cgroups there, a
//!   `/dev` of bind-mounted device nodes, `/run` on tmpfs. systemd-nspawn works too here,
//!   but mounts the v1 controllers read-only on this cgroup v1 host and its seccomp
//!   filter refuses runc's session keyring; the plain namespaces need no workaround.
//!   Units that would act on the host's kernel from inside (`systemd-sysctl`,
//!   `systemd-modules-load`, `systemd-binfmt`) are masked, as is the console getty.
//! - **Network**: a veth pair, `host0` inside with [`NODE_ADDR`], the other end on the
//!   bridge `swl-nodes` ([`BRIDGE_ADDR`]); the node's pods on a bridge of its own
//!   ([`NODE_POD_SUBNET`], the CNI plugins of the node's root filesystem).
//! - **Check**: `up` waits for `systemctl is-system-running` to say `running`, for
//!   containerd to be active, then imports the test bed's pause and busybox images and
//!   runs a pod through CRI with a systemd slice as its cgroup parent: the container must
//!   land in `kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice`
//!   as a `cri-containerd-<id>.scope`, made by systemd.
//! - **Down** (`testbed down` too): `systemctl poweroff` inside (SIGKILL to its PID 1
//!   after a timeout: the kernel then ends every process of the namespace), then the
//!   cgroups, the bridge and the root filesystem go. The node's mounts lived in its own
//!   mount namespace and end with it.
//! - **Several**: `cargo xtask bench cluster` runs up to [`MAX_BENCH_NODES`] more beside
//!   the test bed's ([`Spec::bench`]): each with its own cgroup, host name, address, veth,
//!   pod subnet, root filesystem (unpacked from the same cached tarball), state file and
//!   console, and Debian's containerd alone. They share the bridge; the last one down
//!   removes it. `testbed down` stops any a killed bench left. Every node container's
//!   `/dev` has `/dev/kmsg` too: the upstream kubelet's OOM watcher refuses to start
//!   without it.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::{
    Ctx, apt, cleanup, containerd,
    cri::{self, CriClient},
    images,
    testbed::Layout,
};

/// The node container's cgroup (under the launcher's own cgroup in each hierarchy), and
/// its host name.
pub const NAME: &str = "swiftlet-node-container";
const HOSTNAME: &str = "swiftlet-node";
/// The bridge the node containers' veths are on.
pub const BRIDGE: &str = "swl-nodes";
const BRIDGE_ADDR: &str = "10.231.77.1";
const NODE_ADDR: &str = "10.231.77.2";
const PREFIX_LEN: u8 = 24;
const HOST_VETH: &str = "swl-nc0";

const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";
/// The node's packages beyond minbase.
const PACKAGES: [&str; 10] = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "iproute2",
    "iputils-ping",
    "procps",
];
/// Part of the root filesystem's cache key (bump when [`rootfs_tar`] changes).
const ROOTFS_RECIPE: &str = "node rootfs 1: mmdebstrap minbase";

/// Units masked in the node: they would write the host's kernel settings (the node shares
/// the kernel and sees a writable `/proc/sys`), or have no terminal to serve.
const MASKED_UNITS: [&str; 5] = [
    "systemd-sysctl.service",
    "systemd-modules-load.service",
    "systemd-binfmt.service",
    "console-getty.service",
    "getty@tty1.service",
];

/// The node's containerd: the CRI plugin with the systemd cgroup driver, the test bed's
/// pause image, and no `oom_score_adj` below the caller's (root here lacks
/// `CAP_SYS_RESOURCE`, see ENVIRONMENT.md).
const CONTAINERD_CONFIG: &str = r#"# Written by `cargo xtask testbed up --node-container`.
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:3.10"
  restrict_oom_score_adj = true

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"
  max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"
"#;

/// Where containerd 2.x and its runc live in the node ([`crate::containerd2`]).
pub const CONTAINERD2_DIR: &str = "/usr/local/lib/containerd2";
/// containerd 2.x's socket in the node.
pub const CONTAINERD2_SOCKET: &str = "/run/containerd2/containerd.sock";

/// The node's second runtime: containerd 2.x (config version 3) beside Debian's 1.6, with
/// its own root, state and socket, runc 1.5 with the systemd cgroup driver, the same CNI
/// network.
const CONTAINERD2_CONFIG: &str = r#"# Written by `cargo xtask testbed up --node-container`.
version = 3
root = "/var/lib/containerd2"
state = "/run/containerd2"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "/run/containerd2/containerd.sock"

[ttrpc]
  address = "/run/containerd2/containerd.sock.ttrpc"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "localhost/pause:3.10"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  SystemdCgroup = true
  BinaryName = "/usr/local/lib/containerd2/runc"

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "/etc/cni/net.d"
  max_conf_num = 1

[plugins."io.containerd.cri.v1.images".registry]
  config_path = "/etc/containerd/certs.d"
"#;

/// containerd 2.x's unit; its shim is found on `PATH`, ahead of Debian's.
const CONTAINERD2_UNIT: &str = r"# Written by `cargo xtask testbed up --node-container`.
[Unit]
Description=containerd 2.x (built from the Go modules)
After=network.target local-fs.target

[Service]
Environment=PATH=/usr/local/lib/containerd2:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ExecStart=/usr/local/lib/containerd2/containerd --config /etc/containerd2/config.toml
Type=notify
Delegate=yes
KillMode=process
Restart=always
LimitNOFILE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
";

/// The node's pod network: a bridge of its own, pods in [`NODE_POD_SUBNET`], masqueraded
/// when they leave the node.
const NODE_CNI: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "swiftlet-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "10.232.0.0/24" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
"#;

/// The test bed's node's pod subnet (in [`NODE_CNI`]).
pub const NODE_POD_SUBNET: &str = "10.232.0.0/24";

/// [`NODE_CNI`] with the pods in `subnet`.
fn node_cni(subnet: &str) -> String {
    NODE_CNI.replace(NODE_POD_SUBNET, subnet)
}

/// `node-container.json`: what `down` needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// `unshare`, the node's parent on the host.
    pub launcher_pid: i32,
    /// The node's PID 1 (systemd), as the host sees it.
    pub init_pid: i32,
    /// The node's cgroup in each hierarchy.
    pub cgroups: Vec<PathBuf>,
    pub rootfs: PathBuf,
    pub address: String,
}

fn rootfs_dir(layout: &Layout) -> PathBuf {
    layout.root.join("node-container/rootfs")
}

/// Where `up` records the node container (the end-to-end suite reads it).
pub fn state_file(layout: &Layout) -> PathBuf {
    layout.state.join("node-container.json")
}

/// The node's console (systemd logs there).
pub fn console_log(layout: &Layout) -> PathBuf {
    layout.state.join("node-container-console.log")
}

/// What tells one node container from another: the test bed's own ([`Spec::testbed`]) or
/// one of `cargo xtask bench cluster`'s ([`Spec::bench`]), which run beside it on the same
/// bridge, each with its own cgroup, host name, address, veth, pod subnet, root filesystem
/// (unpacked from the one cached tarball) and state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Its cgroup's name (under the launcher's own cgroup in each hierarchy).
    pub name: String,
    pub hostname: String,
    /// Its address on [`BRIDGE`].
    pub address: String,
    /// The host's end of its veth.
    pub host_veth: String,
    /// Its pods' subnet (`10.232.0.0/24`), on a bridge of its own in its network namespace.
    pub pod_subnet: String,
    /// Where its root filesystem, state and logs live.
    pub rootfs: PathBuf,
    pub state_file: PathBuf,
    pub console: PathBuf,
    /// The boot script and the launcher's log.
    pub boot_script: PathBuf,
    pub launcher_log: PathBuf,
    /// Whether containerd 2.x runs beside Debian's 1.6 (the test bed's node; the bench
    /// nodes run Debian's containerd alone).
    pub containerd2: bool,
}

/// The most bench nodes [`Spec::bench`] makes: addresses and veth names are numbered.
pub const MAX_BENCH_NODES: usize = 9;

impl Spec {
    /// The test bed's node container (`testbed up --node-container`).
    pub fn testbed(layout: &Layout) -> Self {
        Self {
            name: NAME.to_owned(),
            hostname: HOSTNAME.to_owned(),
            address: NODE_ADDR.to_owned(),
            host_veth: HOST_VETH.to_owned(),
            pod_subnet: NODE_POD_SUBNET.to_owned(),
            rootfs: rootfs_dir(layout),
            state_file: state_file(layout),
            console: console_log(layout),
            boot_script: layout.state.join("node-container-boot.sh"),
            launcher_log: layout.state.join("node-container-launcher.log"),
            containerd2: true,
        }
    }

    /// Bench node `index` (1 to [`MAX_BENCH_NODES`]): `swiftlet-bench-node-<index>` at
    /// `10.231.77.<10 + index>`, pods in `10.232.<index>.0/24`.
    pub fn bench(layout: &Layout, index: usize) -> Result<Self> {
        ensure!((1..=MAX_BENCH_NODES).contains(&index), "bench node {index}: expected 1 to {MAX_BENCH_NODES}");
        let name = format!("swiftlet-bench-node-{index}");
        let dir = layout.root.join("bench-nodes").join(index.to_string());
        Ok(Self {
            hostname: name.clone(),
            address: format!("10.231.77.{}", 10 + index),
            host_veth: format!("swl-nb{index}"),
            pod_subnet: format!("10.232.{index}.0/24"),
            rootfs: dir.join("rootfs"),
            state_file: layout.state.join(format!("bench-node-{index}.json")),
            console: layout.state.join(format!("bench-node-{index}-console.log")),
            boot_script: layout.state.join(format!("bench-node-{index}-boot.sh")),
            launcher_log: layout.state.join(format!("bench-node-{index}-launcher.log")),
            containerd2: false,
            name,
        })
    }

    /// The recorded container of this spec, if any.
    pub fn load(&self) -> Result<Option<State>> {
        images::read_json(&self.state_file)
    }

    fn save(&self, state: &State) -> Result<()> {
        images::write_atomic(&self.state_file, &serde_json::to_vec_pretty(state)?)
    }
}

/// Starts the test bed's node container (the test bed must be up: its images are imported).
pub async fn up(ctx: &Ctx, layout: &Layout) -> Result<State> {
    up_spec(ctx, &Spec::testbed(layout)).await
}

/// Starts the node container `spec` (the test bed must be up: its images are imported).
pub async fn up_spec(ctx: &Ctx, spec: &Spec) -> Result<State> {
    if let Some(state) = spec.load()? {
        if containerd::is_alive(state.init_pid) {
            eprintln!("node container {}: already up (PID 1 is host pid {})", spec.name, state.init_pid);
            return Ok(state);
        }
        eprintln!("node container {}: removing the remains of a stopped one", spec.name);
        down_spec(spec)?;
    }
    let containerd2 = crate::containerd2::Containerd2::new(ctx);
    if spec.containerd2 {
        containerd2.build()?;
    }
    let tar = rootfs_tar(ctx)?;
    let rootfs = spec.rootfs.clone();
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs).with_context(|| format!("removing {}", rootfs.display()))?;
    }
    fs::create_dir_all(&rootfs)?;
    containerd::run_checked(
        Command::new("tar").arg("--numeric-owner").arg("-xpf").arg(&tar).arg("-C").arg(&rootfs),
        "tar",
    )?;
    prepare_rootfs(&rootfs, spec)?;
    if spec.containerd2 {
        let dir = rootfs.join(CONTAINERD2_DIR.trim_start_matches('/'));
        fs::create_dir_all(&dir)?;
        for name in crate::containerd2::Containerd2::names() {
            fs::copy(containerd2.bin(name), dir.join(name))
                .with_context(|| format!("installing {name} in the node"))?;
        }
    }

    let cgroups = node_cgroups(&spec.name)?;
    let mut state = State {
        launcher_pid: 0,
        init_pid: 0,
        cgroups: cgroups.clone(),
        rootfs: rootfs.clone(),
        address: spec.address.clone(),
    };
    // Recorded before anything is made, so that `down` finds all of it.
    if let Some(parent) = spec.state_file.parent() {
        fs::create_dir_all(parent)?;
    }
    spec.save(&state)?;
    for dir in &cgroups {
        fs::create_dir_all(dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
        if dir.starts_with("/sys/fs/cgroup/cpuset") {
            // A v1 cpuset cgroup holds no task until it has cpus and mems.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let parent = dir.parent().context("cpuset cgroup without parent")?;
                let value = fs::read_to_string(parent.join(file))?;
                fs::write(dir.join(file), value.trim()).with_context(|| format!("writing {file}"))?;
            }
        }
    }
    let console = spec.console.clone();
    fs::write(&console, b"")?;
    let script = spec.boot_script.clone();
    fs::write(&script, boot_script(&cleanup::cgroup_hierarchies(), &cgroups, &rootfs, &console, &spec.hostname))?;
    let outer_log = spec.launcher_log.clone();
    let log = fs::File::create(&outer_log)?;
    let child = Command::new("setsid")
        .arg("sh")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the node container (setsid, unshare: util-linux)")?;
    let launcher_pid = i32::try_from(child.id())?;
    state.launcher_pid = launcher_pid;
    spec.save(&state)?;
    // Not waited for: it lives until `down`.
    drop(child);

    let result = async {
        state.init_pid = wait_for_init(launcher_pid, &outer_log)?;
        spec.save(&state)?;
        eprintln!("node container {}: systemd is host pid {}", spec.name, state.init_pid);
        network(state.init_pid, spec)?;
        spec.save(&state)?;
        wait_running(state.init_pid, &console)?;
        wait_active(state.init_pid, "containerd.service")?;
        let built = images::build_all(&ctx.workspace, &images::cache_dir(ctx))?;
        check_systemd_cgroups(&state, spec, &built, Runtime::Debian).await?;
        if spec.containerd2 {
            wait_active(state.init_pid, "containerd2.service")?;
            check_systemd_cgroups(&state, spec, &built, Runtime::Containerd2).await?;
        }
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = result {
        let tail = containerd::log_tail(&console, 30);
        eprintln!("node container: the last lines of its console:\n{tail}");
        if containerd::is_alive(state.init_pid)
            && let Ok(out) = in_node(state.init_pid, &["journalctl", "-b", "--no-pager", "-n", "40"])
        {
            eprintln!("node container: its journal:\n{}", String::from_utf8_lossy(&out.stdout));
        }
        if let Err(down_error) = down_spec(spec) {
            eprintln!("node container: removing it failed too: {down_error:#}");
        }
        return Err(e);
    }
    eprintln!(
        "node container {}: up, systemd running, containerd with SystemdCgroup; address {}",
        spec.name, spec.address
    );
    Ok(state)
}

/// The cached root filesystem tarball, made with `mmdebstrap` when missing.
fn rootfs_tar(ctx: &Ctx) -> Result<PathBuf> {
    let mut h = Sha256::new();
    for part in [ROOTFS_RECIPE, SUITE, MIRROR, &PACKAGES.join(",")] {
        h.update(part);
        h.update([0]);
    }
    let key = hex::encode(h.finalize());
    let dir = ctx.target_dir.join("xtask/node-container");
    let path = dir.join(format!("rootfs-{}.tar", &key[..16]));
    if path.is_file() {
        return Ok(path);
    }
    apt::ensure(&["mmdebstrap"])?;
    fs::create_dir_all(&dir)?;
    for entry in fs::read_dir(&dir)?.flatten() {
        if entry.file_name().to_string_lossy().starts_with("rootfs-") {
            fs::remove_file(entry.path()).ok();
        }
    }
    let tmp = dir.join("rootfs.tmp.tar");
    eprintln!("node container: making the root filesystem (mmdebstrap {SUITE}, about a minute)");
    containerd::run_checked(
        Command::new("mmdebstrap")
            .args(["--variant=minbase", "--quiet"])
            .arg(format!("--include={}", PACKAGES.join(",")))
            .arg(SUITE)
            .arg(&tmp)
            .arg(MIRROR),
        "mmdebstrap",
    )?;
    fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The node's own files: host name, hosts, masked units, containerd's configuration.
fn prepare_rootfs(rootfs: &Path, spec: &Spec) -> Result<()> {
    let write = |rel: &str, data: &str| -> Result<()> {
        let path = rootfs.join(rel);
        fs::create_dir_all(path.parent().context("a file without a directory")?)?;
        fs::write(&path, data).with_context(|| format!("writing {}", path.display()))
    };
    let (hostname, address) = (&spec.hostname, &spec.address);
    write("etc/hostname", &format!("{hostname}\n"))?;
    write("etc/hosts", &format!("127.0.0.1 localhost\n{address} {hostname}\n"))?;
    write("etc/containerd/config.toml", CONTAINERD_CONFIG)?;
    if spec.containerd2 {
        write("etc/containerd2/config.toml", CONTAINERD2_CONFIG)?;
        write("etc/systemd/system/containerd2.service", CONTAINERD2_UNIT)?;
        let wants = rootfs.join("etc/systemd/system/multi-user.target.wants");
        fs::create_dir_all(&wants)?;
        let link = wants.join("containerd2.service");
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink("/etc/systemd/system/containerd2.service", &link)?;
        }
    }
    write("etc/cni/net.d/10-swiftlet-node.conflist", &node_cni(&spec.pod_subnet))?;
    let units = rootfs.join("etc/systemd/system");
    fs::create_dir_all(&units)?;
    for unit in MASKED_UNITS {
        let link = units.join(unit);
        if link.symlink_metadata().is_ok() {
            fs::remove_file(&link)?;
        }
        std::os::unix::fs::symlink("/dev/null", &link).with_context(|| format!("masking {unit}"))?;
    }
    Ok(())
}

/// The node's cgroup in every hierarchy, under this process's own cgroup there.
fn node_cgroups(name: &str) -> Result<Vec<PathBuf>> {
    let own = fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    let mut dirs = Vec::new();
    for mount in cleanup::cgroup_hierarchies() {
        let hierarchy = mount.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let cgroup2 = mount == Path::new("/sys/fs/cgroup/unified") || mount == Path::new("/sys/fs/cgroup");
        let path = own_cgroup_in(&own, &hierarchy, cgroup2)
            .with_context(|| format!("no line for {} in /proc/self/cgroup", mount.display()))?;
        dirs.push(mount.join(path.trim_start_matches('/')).join(name));
    }
    ensure!(!dirs.is_empty(), "no cgroup hierarchy is mounted under /sys/fs/cgroup");
    Ok(dirs)
}

/// This process's cgroup path in the hierarchy mounted as `/sys/fs/cgroup/<name>`, from
/// `/proc/self/cgroup` (`4:memory:/a/b`, `1:name=systemd:/x`, `0::/y` for cgroup2).
fn own_cgroup_in(proc_self_cgroup: &str, name: &str, cgroup2: bool) -> Option<String> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if cgroup2 {
            controllers.is_empty()
        } else {
            // A joint hierarchy is mounted under its controllers' names (`cpu,cpuacct`).
            let wanted: Vec<&str> = name.split(',').collect();
            controllers.split(',').any(|c| wanted.contains(&c) || c.strip_prefix("name=").is_some_and(|n| n == name))
        };
        matches.then(|| path.to_owned())
    })
}

/// The launcher: moves itself into the node's cgroups, then starts systemd as PID 1 of
/// new namespaces with its root in `rootfs`, the cgroup hierarchies mounted at `mounts`
/// mounted alike in it, and its console in `console`.
fn boot_script(mounts: &[PathBuf], cgroups: &[PathBuf], rootfs: &Path, console: &Path, hostname: &str) -> String {
    let mut s = String::from("#!/bin/sh\n# Written by `cargo xtask testbed up --node-container`.\nset -e\n");
    for dir in cgroups {
        let _ = writeln!(s, "echo $$ > '{}/cgroup.procs'", dir.display());
    }
    // The hierarchies by name: `memory`, `systemd`, `unified`; none on a host with only
    // cgroup v2 (mounted at /sys/fs/cgroup itself).
    let hierarchies: Vec<String> = mounts
        .iter()
        .filter_map(|m| Some(m.strip_prefix("/sys/fs/cgroup").ok()?.to_str()?.to_owned()))
        .filter(|name| !name.is_empty())
        .collect();
    let mut inner = format!("set -e\nR='{}'\n", rootfs.display());
    inner.push_str(
        "mount --bind \"$R\" \"$R\"\n\
         mount -t proc proc \"$R/proc\"\n\
         mount -t sysfs -o ro,nosuid,nodev,noexec sysfs \"$R/sys\"\n",
    );
    if hierarchies.is_empty() {
        inner.push_str("mount -t cgroup2 -o nosuid,nodev,noexec cgroup \"$R/sys/fs/cgroup\"\n");
    } else {
        inner.push_str("mount -t tmpfs -o mode=755,nosuid,nodev,noexec tmpfs \"$R/sys/fs/cgroup\"\n");
    }
    for h in &hierarchies {
        let (fs_type, options) = match h.as_str() {
            "unified" => ("cgroup2", "nosuid,nodev,noexec".to_owned()),
            "systemd" => ("cgroup", "nosuid,nodev,noexec,none,name=systemd".to_owned()),
            other => ("cgroup", format!("nosuid,nodev,noexec,{other}")),
        };
        let _ = writeln!(
            inner,
            "mkdir \"$R/sys/fs/cgroup/{h}\"
mount -t {fs_type} -o {options} cgroup \"$R/sys/fs/cgroup/{h}\""
        );
    }
    let _ = write!(
        inner,
        "mount -t tmpfs -o mode=755,nosuid tmpfs \"$R/dev\"\n\
         for n in null zero full random urandom tty kmsg; do touch \"$R/dev/$n\"; mount --bind \"/dev/$n\" \"$R/dev/$n\"; done\n\
         mkdir \"$R/dev/pts\" \"$R/dev/shm\"\n\
         mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts \"$R/dev/pts\"\n\
         ln -s pts/ptmx \"$R/dev/ptmx\"\n\
         touch \"$R/dev/console\"; mount --bind '{console}' \"$R/dev/console\"\n\
         mount -t tmpfs -o mode=755,nosuid,nodev tmpfs \"$R/run\"\n\
         hostname {hostname}\n\
         cd \"$R\"; mkdir -p .oldroot; pivot_root . .oldroot; umount -l /.oldroot; rmdir /.oldroot\n\
         export container=other\n\
         exec /lib/systemd/systemd --log-target=console\n",
        console = console.display(),
    );
    let _ = writeln!(
        s,
        "exec unshare --pid --mount --uts --ipc --net --cgroup --fork --propagation private sh -c '{}'",
        inner.replace('\'', "'\\''")
    );
    s
}

/// The host pid of the launcher's child (the node's PID 1).
fn wait_for_init(launcher: i32, log: &Path) -> Result<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let children = fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children")).unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next().and_then(|p| p.parse().ok()) {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "systemd" {
                return Ok(pid);
            }
        }
        if !containerd::is_alive(launcher) || Instant::now() > deadline {
            bail!("the node container did not start systemd: {}", containerd::log_tail(log, 20));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `nsenter` into every namespace of the node's PID 1.
fn nsenter(init: i32) -> Command {
    let mut c = Command::new("nsenter");
    c.arg("-t").arg(init.to_string()).args(["-m", "-u", "-i", "-n", "-p", "-C"]);
    c
}

/// Output of `args` run in the node.
fn in_node(init: i32, args: &[&str]) -> Result<std::process::Output> {
    nsenter(init).args(args).stdin(Stdio::null()).output().with_context(|| format!("nsenter {}", args.join(" ")))
}

/// The veth pair, and the bridge if no other node container made it yet.
fn network(init: i32, spec: &Spec) -> Result<()> {
    if !cleanup::link_exists(BRIDGE) {
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{BRIDGE_ADDR}/{PREFIX_LEN}"), "dev", BRIDGE])?;
        ip(&["link", "set", BRIDGE, "up"])?;
    }
    let veth = spec.host_veth.as_str();
    ip(&["link", "add", veth, "type", "veth", "peer", "name", "host0", "netns", &init.to_string()])?;
    ip(&["link", "set", veth, "master", BRIDGE, "up"])?;
    let node_ip = |args: &[&str]| -> Result<()> {
        let mut full = vec!["ip"];
        full.extend_from_slice(args);
        let out = in_node(init, &full)?;
        ensure!(out.status.success(), "in the node, ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        Ok(())
    };
    node_ip(&["link", "set", "lo", "up"])?;
    node_ip(&["addr", "add", &format!("{}/{PREFIX_LEN}", spec.address), "dev", "host0"])?;
    node_ip(&["link", "set", "host0", "up"])?;
    node_ip(&["route", "add", "default", "via", BRIDGE_ADDR])?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = in_node(init, &["ping", "-c1", "-W1", BRIDGE_ADDR])?;
        if out.status.success() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the node cannot reach the bridge {BRIDGE_ADDR}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn ip(args: &[&str]) -> Result<()> {
    containerd::run_checked(Command::new("ip").args(args), &format!("ip {}", args.join(" ")))
}

/// Deletes link `name` if it is there. A node's host veth goes away by itself when the
/// kernel frees the node's network namespace, which it does a moment after the node's last
/// process: a failed delete of a link that is gone since is a success.
fn remove_link(name: &str) -> Result<()> {
    if !cleanup::link_exists(name) {
        return Ok(());
    }
    match ip(&["link", "del", name]) {
        Err(_) if !cleanup::link_exists(name) => Ok(()),
        result => result,
    }
}

/// The bench's node containers (`bench cluster`), 1 to [`MAX_BENCH_NODES`].
fn bench_specs(layout: &Layout) -> impl Iterator<Item = Spec> + '_ {
    (1..=MAX_BENCH_NODES).filter_map(|i| Spec::bench(layout, i).ok())
}

/// Every node container a test bed can have: its own and the bench's.
fn all_specs(layout: &Layout) -> Vec<Spec> {
    std::iter::once(Spec::testbed(layout)).chain(bench_specs(layout)).collect()
}

/// `bridge` when it exists while no node container is recorded in `layout`: the node
/// containers share it, and the last one down removes it.
fn orphan_bridge(layout: &Layout, bridge: &str) -> Option<String> {
    let recorded = all_specs(layout).iter().any(|s| s.state_file.exists());
    (!recorded && cleanup::link_exists(bridge)).then(|| format!("bridge {bridge} with no node container on the host"))
}

/// Waits until systemd says the node is `running` (every unit started, none failed).
fn wait_running(init: i32, console: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = in_node(init, &["systemctl", "is-system-running"])?;
        let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        match said.as_str() {
            "running" => return Ok(()),
            "degraded" => {
                let failed = in_node(init, &["systemctl", "--failed", "--no-legend", "--plain"])?;
                bail!("systemd in the node is degraded; failed units:\n{}", String::from_utf8_lossy(&failed.stdout));
            }
            _ if Instant::now() > deadline => {
                bail!("systemd in the node is {said:?} after 90 s: {}", containerd::log_tail(console, 20))
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn wait_active(init: i32, unit: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        let out = in_node(init, &["systemctl", "is-active", unit])?;
        let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if said == "active" {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{unit} in the node is {said:?} after 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A pod through the node's containerd with a systemd slice as its cgroup parent: the
/// container must be a scope systemd made in the pod's slice.
/// The node's two containerds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runtime {
    /// Debian's containerd 1.6, `/run/containerd/containerd.sock`.
    Debian,
    /// containerd 2.x built from the Go modules, [`CONTAINERD2_SOCKET`].
    Containerd2,
}

/// Imports `built` into `runtime` of the node and runs a pod there through CRI (see the
/// module docs' "Check").
async fn check_systemd_cgroups(
    state: &State,
    spec: &Spec,
    built: &[images::BuiltImage],
    runtime: Runtime,
) -> Result<()> {
    let (ctr, socket) = match runtime {
        Runtime::Debian => ("ctr".to_owned(), "/run/containerd/containerd.sock"),
        Runtime::Containerd2 => (format!("{CONTAINERD2_DIR}/ctr"), CONTAINERD2_SOCKET),
    };
    for image in built {
        let inside = Path::new("/tmp").join(image.tar_path.file_name().context("image tar without name")?);
        fs::copy(&image.tar_path, state.rootfs.join(inside.strip_prefix("/")?))?;
        let inside = inside.display().to_string();
        let out = in_node(state.init_pid, &[&ctr, "--address", socket, "-n", "k8s.io", "images", "import", &inside])?;
        ensure!(out.status.success(), "importing {} in the node: {}", image.name, String::from_utf8_lossy(&out.stderr));
        fs::remove_file(state.rootfs.join(inside.trim_start_matches('/'))).ok();
    }
    let mut cri = connect(&PathBuf::from(format!("/proc/{}/root{socket}", state.init_pid))).await?;
    let version = cri.version().await?;
    eprintln!("node container: {} {} answers CRI on {socket}", version.runtime_name, version.runtime_version);
    let uid = match runtime {
        Runtime::Debian => "0b1c-node-container-check",
        Runtime::Containerd2 => "0b1c-node-container-check-2",
    };
    let slice = format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_"));
    let parent = format!("/kubepods.slice/kubepods-besteffort.slice/{slice}");
    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "node-container-check".into(),
            uid: uid.into(),
            namespace: "xtask".into(),
            attempt: 0,
        }),
        hostname: "check".into(),
        log_directory: "/tmp/node-container-check".into(),
        port_mappings: Vec::new(),
        labels: [("swiftlet.io/xtask".to_owned(), "node-container".to_owned())].into(),
        linux: Some(cri::LinuxPodSandboxConfig { cgroup_parent: parent.clone(), security_context: None }),
    };
    let sandbox = cri.run_pod_sandbox(sandbox_config.clone()).await?;
    let result = async {
        let ip = cri.pod_sandbox_status(&sandbox).await?.network.map(|n| n.ip).unwrap_or_default();
        let subnet = spec.pod_subnet.as_str();
        let prefix = subnet.trim_end_matches("0/24");
        ensure!(ip.starts_with(prefix), "the pod's address {ip:?} is not in the node's pod subnet {subnet}");
        let container = cri
            .create_container(
                &sandbox,
                cri::ContainerConfig {
                    metadata: Some(cri::ContainerMetadata { name: "sleep".into(), attempt: 0 }),
                    image: Some(cri::ImageSpec { image: images::BUSYBOX_IMAGE.into() }),
                    command: vec!["sleep".into(), "3600".into()],
                    args: Vec::new(),
                    mounts: Vec::new(),
                    log_path: "sleep.log".into(),
                },
                sandbox_config,
            )
            .await?;
        cri.start_container(&container).await?;
        let status = cri.container_status_verbose(&container).await?;
        let info: serde_json::Value = serde_json::from_str(status.info.get("info").map_or("{}", String::as_str))?;
        let pid = info["pid"].as_i64().context("no pid in the container's verbose status")?;
        let out = in_node(state.init_pid, &["cat", &format!("/proc/{pid}/cgroup")])?;
        let cgroup = String::from_utf8_lossy(&out.stdout).into_owned();
        let want = format!("{parent}/cri-containerd-{container}.scope");
        ensure!(
            cgroup.lines().any(|l| l.ends_with(&format!(":memory:{want}"))),
            "the container is not in the systemd scope {want}:\n{cgroup}"
        );
        let unit = format!("cri-containerd-{container}.scope");
        let shown = in_node(state.init_pid, &["systemctl", "show", "-p", "Slice", "--value", &unit])?;
        ensure!(
            String::from_utf8_lossy(&shown.stdout).trim() == slice,
            "systemd does not know {unit} in {slice}: {}",
            String::from_utf8_lossy(&shown.stdout)
        );
        eprintln!("node container: a CRI pod at {ip} runs in {want}, a scope of systemd's");
        anyhow::Ok(())
    }
    .await;
    cri.stop_pod_sandbox(&sandbox).await?;
    cri.remove_pod_sandbox(&sandbox).await?;
    result
}

/// CRI over the node's socket, once containerd has made it.
async fn connect(socket: &Path) -> Result<CriClient> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let error = match CriClient::connect(socket).await {
            Ok(mut c) => match c.version().await {
                Ok(_) => return Ok(c),
                Err(e) => e,
            },
            Err(e) => e,
        };
        if Instant::now() > deadline {
            return Err(error.context("the node's containerd does not answer CRI Version"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Stops the test bed's node container and removes all it left (see [`down_spec`]).
pub fn down(layout: &Layout) -> Result<()> {
    down_spec(&Spec::testbed(layout))?;
    // Also when the test bed's node was not up: a bridge an earlier run lost track of.
    remove_orphan_bridge(layout)
}

/// Several node containers share [`BRIDGE`]: the last one down removes it, whichever made
/// it.
fn remove_orphan_bridge(layout: &Layout) -> Result<()> {
    if orphan_bridge(layout, BRIDGE).is_some() && bridge_ports().is_empty() {
        eprintln!("ip link del {BRIDGE}");
        remove_link(BRIDGE)?;
    }
    Ok(())
}

/// Stops the node container `spec` and removes all it left: processes, cgroups, veth,
/// the bridge once no node container is on it, root filesystem, state.
pub fn down_spec(spec: &Spec) -> Result<()> {
    let Some(state) = spec.load()? else {
        let rootfs = &spec.rootfs;
        if rootfs.exists() {
            fs::remove_dir_all(rootfs).with_context(|| format!("removing {}", rootfs.display()))?;
        }
        return Ok(());
    };
    if containerd::is_alive(state.init_pid) && is_our_init(&state) {
        eprintln!("node container {}: powering off (PID 1 is host pid {})", spec.name, state.init_pid);
        let _ = in_node(state.init_pid, &["systemctl", "poweroff", "--no-block"]);
        if !wait_gone(state.launcher_pid, Duration::from_secs(30)) {
            eprintln!("node container {}: still up after 30 s; SIGKILL to its PID 1", spec.name);
            containerd::signal(state.init_pid, libc::SIGKILL);
        }
    } else if containerd::is_alive(state.launcher_pid) && is_our_launcher(state.launcher_pid, &state.rootfs) {
        containerd::signal(state.launcher_pid, libc::SIGKILL);
    }
    ensure!(
        wait_gone(state.launcher_pid, Duration::from_secs(10)),
        "the node container's launcher {} stays",
        state.launcher_pid
    );
    let mut deepest_first: Vec<PathBuf> =
        state.cgroups.iter().filter(|d| d.exists()).flat_map(|d| cleanup::cgroup_tree(d)).collect();
    deepest_first.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for dir in deepest_first {
        // The kernel frees a cgroup a moment after its last task exits.
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(e) = fs::remove_dir(&dir) {
            if Instant::now() > deadline {
                return Err(e).with_context(|| format!("removing cgroup {}", dir.display()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    remove_link(&spec.host_veth)?;
    let mounts = cleanup::mounts()?;
    let held = cleanup::mounts_under(&mounts, std::slice::from_ref(&state.rootfs));
    ensure!(held.is_empty(), "mounts under the node's root filesystem remain: {held:?}");
    if state.rootfs.exists() {
        fs::remove_dir_all(&state.rootfs).with_context(|| format!("removing {}", state.rootfs.display()))?;
    }
    // The directories that held only the root filesystem (a bench node's `bench-nodes/<i>`
    // and, once the last is gone, `bench-nodes`): removing a non-empty one fails, harmlessly.
    if let Some(parent) = state.rootfs.parent() {
        let _ = fs::remove_dir(parent);
        if let Some(grand) = parent.parent().filter(|g| g.ends_with("bench-nodes")) {
            let _ = fs::remove_dir(grand);
        }
    }
    for file in [&spec.boot_script, &spec.launcher_log] {
        fs::remove_file(file).ok();
    }
    fs::remove_file(&spec.state_file).ok();
    // The state files of the others sit beside this one's.
    if let Some(state_dir) = spec.state_file.parent() {
        remove_orphan_bridge(&Layout::new(PathBuf::new(), state_dir))?;
    }
    eprintln!("node container {}: down", spec.name);
    Ok(())
}

/// The interfaces on [`BRIDGE`].
fn bridge_ports() -> Vec<String> {
    fs::read_dir(format!("/sys/class/net/{BRIDGE}/brif"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// Stops every bench node container (`bench cluster`) a killed bench left.
pub fn down_bench(layout: &Layout) -> Result<()> {
    let mut failures = Vec::new();
    for spec in bench_specs(layout) {
        if (spec.state_file.exists() || spec.rootfs.exists())
            && let Err(e) = down_spec(&spec)
        {
            failures.push(format!("{}: {e:#}", spec.name));
        }
    }
    if failures.is_empty() { Ok(()) } else { bail!("{}", failures.join("; ")) }
}

/// What the bench node containers (`bench cluster`) left on the host.
pub fn bench_leftovers(layout: &Layout) -> Vec<String> {
    bench_specs(layout).flat_map(|s| spec_leftovers(&s)).collect()
}

/// What the test bed's node container left on the host, the shared bridge included.
pub fn leftovers(layout: &Layout) -> Vec<String> {
    let mut left = spec_leftovers(&Spec::testbed(layout));
    left.extend(orphan_bridge(layout, BRIDGE));
    left
}

/// What node container `spec` left on the host.
fn spec_leftovers(spec: &Spec) -> Vec<String> {
    let mut left = Vec::new();
    if let Ok(Some(state)) = spec.load() {
        if containerd::is_alive(state.launcher_pid) && is_our_launcher(state.launcher_pid, &state.rootfs) {
            left.push(format!("node container launcher process {}", state.launcher_pid));
        }
        for cg in state.cgroups.iter().filter(|d| d.exists()) {
            left.push(format!("node container cgroup {}", cg.display()));
        }
    }
    if cleanup::link_exists(&spec.host_veth) {
        left.push(format!("veth {}", spec.host_veth));
    }
    if spec.rootfs.exists() {
        left.push(format!("node container root filesystem {}", spec.rootfs.display()));
    }
    left
}

/// Whether the recorded PID 1 is still the node's: the child of our launcher (a pid is
/// signalled only when it is provably ours).
fn is_our_init(state: &State) -> bool {
    let stat = fs::read_to_string(format!("/proc/{}/stat", state.init_pid)).unwrap_or_default();
    // `pid (comm) state ppid ...`: the parent follows the state after the last `)`.
    let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
    ppid == Some(state.launcher_pid) && is_our_launcher(state.launcher_pid, &state.rootfs)
}

/// Whether `pid` is the `unshare` that started a node container on `rootfs`.
fn is_our_launcher(pid: i32, rootfs: &Path) -> bool {
    let rootfs = rootfs.to_string_lossy();
    containerd::cmdline(pid)
        .is_some_and(|args| args.first().is_some_and(|a| a == "unshare") && args.iter().any(|a| a.contains(&*rootfs)))
}

fn wait_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while containerd::is_alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cgroups_are_read_per_hierarchy() {
        let own = "12:pids:/p\n5:cpu:/c\n4:cpuacct:/a\n3:memory:/process_api/7\n1:name=systemd:/s\n0::/u\n";
        assert_eq!(own_cgroup_in(own, "memory", false).as_deref(), Some("/process_api/7"));
        assert_eq!(own_cgroup_in(own, "cpu", false).as_deref(), Some("/c"));
        assert_eq!(own_cgroup_in(own, "systemd", false).as_deref(), Some("/s"));
        assert_eq!(own_cgroup_in(own, "unified", true).as_deref(), Some("/u"));
        assert_eq!(own_cgroup_in(own, "blkio", false), None);
        let joint = "6:cpu,cpuacct:/j\n";
        assert_eq!(own_cgroup_in(joint, "cpuacct", false).as_deref(), Some("/j"));
    }

    #[test]
    fn the_boot_script_enters_the_cgroups_and_mounts_each_hierarchy() {
        let cgroups = [
            PathBuf::from("/sys/fs/cgroup/memory/p/swiftlet-node-container"),
            PathBuf::from("/sys/fs/cgroup/systemd/swiftlet-node-container"),
            PathBuf::from("/sys/fs/cgroup/unified/swiftlet-node-container"),
        ];
        let mounts = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"].map(PathBuf::from);
        let s = boot_script(&mounts, &cgroups, Path::new("/r/rootfs"), Path::new("/s/console.log"), "n1");
        assert!(s.contains("echo $$ > '/sys/fs/cgroup/memory/p/swiftlet-node-container/cgroup.procs'\n"));
        assert!(s.contains("mount -t cgroup -o nosuid,nodev,noexec,memory cgroup \"$R/sys/fs/cgroup/memory\""));
        assert!(s.contains("-o nosuid,nodev,noexec,none,name=systemd cgroup"));
        assert!(s.contains("mount -t cgroup2 -o nosuid,nodev,noexec cgroup \"$R/sys/fs/cgroup/unified\""));
        assert!(s.contains("exec unshare --pid --mount --uts --ipc --net --cgroup --fork"));
        assert!(s.contains("exec /lib/systemd/systemd --log-target=console"));
        // The inner script is one single-quoted argument: no stray quote ends it early.
        let inner = s.split_once("sh -c '").unwrap().1;
        assert!(inner.trim_end().ends_with('\''));
        assert!(inner.contains("R='\\''/r/rootfs'\\''"));
        // Only cgroup v2, at /sys/fs/cgroup: mounted there, no tmpfs.
        let v2 = boot_script(&[PathBuf::from("/sys/fs/cgroup")], &cgroups[..1], Path::new("/r"), Path::new("/c"), "n1");
        assert!(v2.contains("mount -t cgroup2 -o nosuid,nodev,noexec cgroup \"$R/sys/fs/cgroup\"\n"));
        assert!(!v2.contains("tmpfs tmpfs \"$R/sys/fs/cgroup\""));
        assert!(s.contains("\nhostname n1\n") && s.contains(" tty kmsg; do"), "{s}");
    }

    /// A host veth the kernel removed by itself (the node's network namespace went away
    /// with its last process) counts as removed: `testbed down` once failed on that race
    /// and skipped the bridge, which stayed on the host unseen.
    #[test]
    fn removing_a_link_that_is_gone_succeeds() {
        remove_link("swl-gone-test").unwrap();
    }

    /// The shared bridge with no node container left is a leftover, even once the state
    /// files are gone; while a node container is recorded it is not.
    #[test]
    fn a_bridge_without_node_containers_is_left_behind() {
        let dir = std::env::temp_dir().join(format!("xtask-orphan-bridge-{}", std::process::id()));
        let layout = Layout::new(dir.join("root"), dir.join("state"));
        // `lo` stands in for the bridge: a link every host has.
        assert_eq!(orphan_bridge(&layout, "lo"), Some("bridge lo with no node container on the host".to_owned()));
        assert_eq!(orphan_bridge(&layout, "swl-gone-test"), None);
        let third = Spec::bench(&layout, 3).unwrap();
        fs::create_dir_all(third.state_file.parent().unwrap()).unwrap();
        fs::write(&third.state_file, "{}").unwrap();
        assert_eq!(orphan_bridge(&layout, "lo"), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The bench's node containers differ from each other and from the test bed's in every
    /// name, address and path; only the bridge is shared.
    #[test]
    fn bench_node_specs_share_nothing_but_the_bridge() {
        let layout = Layout::new(Path::new("/x/root"), Path::new("/x/state"));
        let mut specs = vec![Spec::testbed(&layout)];
        specs.extend((1..=MAX_BENCH_NODES).map(|i| Spec::bench(&layout, i).unwrap()));
        for field in [
            |s: &Spec| s.name.clone(),
            |s: &Spec| s.hostname.clone(),
            |s: &Spec| s.address.clone(),
            |s: &Spec| s.host_veth.clone(),
            |s: &Spec| s.pod_subnet.clone(),
            |s: &Spec| s.rootfs.display().to_string(),
            |s: &Spec| s.state_file.display().to_string(),
            |s: &Spec| s.console.display().to_string(),
        ] {
            let values: std::collections::BTreeSet<String> = specs.iter().map(field).collect();
            assert_eq!(values.len(), specs.len(), "{values:?}");
        }
        // Interface names are at most 15 bytes.
        assert!(specs.iter().all(|s| s.host_veth.len() <= 15));
        let third = Spec::bench(&layout, 3).unwrap();
        assert_eq!((third.address.as_str(), third.pod_subnet.as_str()), ("10.231.77.13", "10.232.3.0/24"));
        assert!(!third.containerd2 && Spec::testbed(&layout).containerd2);
        assert!(Spec::bench(&layout, 0).is_err() && Spec::bench(&layout, MAX_BENCH_NODES + 1).is_err());
        assert!(node_cni(&third.pod_subnet).contains("\"subnet\": \"10.232.3.0/24\""));
        assert_eq!(node_cni(NODE_POD_SUBNET), NODE_CNI);
    }
}
