//! The node container of `cargo xtask testbed up --node-container`: a Debian node with
//! systemd as its PID 1, Debian's containerd 1.6 and containerd 2.x (both with
//! `SystemdCgroup = true`), its own network address and cgroup namespace.
//!
//! Two kinds of tests use it: `systemd_node.rs` installs swiftlet there as the README's
//! unit and looks at it, and the end-to-end suites run their [`crate::Agent`] there when
//! `SWIFTLET_E2E_NODE` names one of its runtimes ([`node_target`]): the agent is then a
//! transient systemd unit of the node with `cgroupDriver: systemd`, and the harness
//! translates what the tests look at from the host (files through the node's root
//! filesystem, cgroups through the node's cgroup in each hierarchy, process ids through
//! `NSpid`, the agent's ports through the node's address).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

use crate::Cri;

/// Where `testbed up --node-container` records the node (or `SWIFTLET_NODE_CONTAINER_STATE`).
pub const STATE: &str = "/run/swiftlet-testbed/node-container.json";

/// The node's two containerds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// Debian's containerd 1.6: no CRI `RuntimeConfig`.
    Containerd16,
    /// containerd 2.x built from the Go modules: answers `RuntimeConfig`.
    Containerd2,
}

impl Runtime {
    /// The runtime's CRI socket in the node.
    #[must_use]
    pub const fn socket(self) -> &'static str {
        match self {
            Self::Containerd16 => "/run/containerd/containerd.sock",
            Self::Containerd2 => "/run/containerd2/containerd.sock",
        }
    }

    /// The node's `ctr` for this runtime (containerd 2.x's own, built beside it).
    #[must_use]
    pub const fn ctr(self) -> &'static str {
        match self {
            Self::Containerd16 => "ctr",
            Self::Containerd2 => "/usr/local/lib/containerd2/ctr",
        }
    }

    /// `containerd1.6` or `containerd2`, as `SWIFTLET_E2E_NODE` names them.
    fn parse(s: &str) -> Result<Self> {
        match s {
            "containerd2" => Ok(Self::Containerd2),
            "containerd1.6" => Ok(Self::Containerd16),
            other => bail!("SWIFTLET_E2E_NODE={other:?}: expected containerd2 or containerd1.6"),
        }
    }
}

/// The node container as `testbed up --node-container` recorded it.
#[derive(Debug, Clone)]
pub struct Node {
    /// The node's PID 1 (systemd), in the host's pid namespace.
    pub init_pid: i32,
    /// The node's root filesystem on the host.
    pub rootfs: PathBuf,
    /// The node's address on the test bed's bridge.
    pub address: String,
    /// The node's cgroup namespace root in each hierarchy, on the host.
    pub cgroups: Vec<PathBuf>,
}

impl Node {
    /// The running node container.
    pub fn load() -> Result<Self> {
        let path = std::env::var("SWIFTLET_NODE_CONTAINER_STATE").unwrap_or_else(|_| STATE.to_owned());
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("no node container: run `cargo xtask testbed up --node-container` ({path})"))?;
        let v: Value = serde_json::from_str(&text)?;
        let node = Self {
            init_pid: v["init_pid"].as_i64().and_then(|p| i32::try_from(p).ok()).context("no init_pid")?,
            rootfs: PathBuf::from(v["rootfs"].as_str().context("no rootfs")?),
            address: v["address"].as_str().context("no address")?.to_owned(),
            cgroups: v["cgroups"]
                .as_array()
                .context("no cgroups")?
                .iter()
                .filter_map(|c| c.as_str().map(PathBuf::from))
                .collect(),
        };
        ensure!(Path::new(&format!("/proc/{}", node.init_pid)).exists(), "the node container is not running");
        Ok(node)
    }

    /// `args` run in every namespace of the node.
    pub fn run(&self, args: &[&str]) -> Result<Output> {
        Command::new("nsenter")
            .arg("-t")
            .arg(self.init_pid.to_string())
            .args(["-m", "-u", "-i", "-n", "-p", "-C"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("nsenter {}", args.join(" ")))
    }

    /// Stdout of `args` in the node, which must succeed.
    pub fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.run(args)?;
        ensure!(
            out.status.success(),
            "in the node, {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// `systemctl show -p <property> --value <unit>`.
    pub fn unit_property(&self, unit: &str, property: &str) -> Result<String> {
        self.ok(&["systemctl", "show", "-p", property, "--value", unit])
    }

    /// A path of the node's root filesystem, from the host.
    #[must_use]
    pub fn file(&self, path: &str) -> PathBuf {
        self.rootfs.join(path.trim_start_matches('/'))
    }

    /// [`Self::file`], following the symbolic links of the last component as the node
    /// would (an absolute target names a node path: `kubelet-client-current.pem`).
    #[must_use]
    pub fn resolved_file(&self, path: &str) -> PathBuf {
        let mut at = self.file(path);
        for _ in 0..8 {
            let Ok(target) = std::fs::read_link(&at) else { break };
            at = if target.is_absolute() {
                self.file(&target.display().to_string())
            } else {
                at.parent().map_or(target.clone(), |dir| dir.join(&target))
            };
        }
        at
    }

    /// The node's path of a host path inside its root filesystem, or of a path through
    /// `/proc/<init>/root` (which reaches the node's own mounts too).
    pub fn inside(&self, host: &Path) -> Result<PathBuf> {
        let through_proc = PathBuf::from(format!("/proc/{}/root", self.init_pid));
        let rel = host
            .strip_prefix(&self.rootfs)
            .or_else(|_| host.strip_prefix(&through_proc))
            .with_context(|| format!("{} is not in the node's root filesystem", host.display()))?;
        Ok(Path::new("/").join(rel))
    }

    /// Writes a file of the node (parents made).
    pub fn write(&self, path: &str, content: &str) -> Result<()> {
        let file = self.file(path);
        std::fs::create_dir_all(file.parent().context("a parent")?)?;
        std::fs::write(&file, content).with_context(|| format!("writing {}", file.display()))
    }

    /// Imports the image archive `tar` (host path) into `runtime`'s `k8s.io` namespace with
    /// the node's own `ctr` (the archive copied into the node's `/tmp` for it).
    ///
    /// # Errors
    /// The copy or `ctr` failed.
    pub fn import_image(&self, runtime: Runtime, tar: &Path) -> Result<()> {
        let name = tar.file_name().context("an image archive without a file name")?.to_string_lossy();
        let inside = format!("/tmp/{name}");
        std::fs::copy(tar, self.file(&inside)).with_context(|| format!("copying {} into the node", tar.display()))?;
        let out =
            self.run(&[runtime.ctr(), "--address", runtime.socket(), "-n", "k8s.io", "images", "import", &inside]);
        let _ = std::fs::remove_file(self.file(&inside));
        let out = out?;
        ensure!(out.status.success(), "ctr images import in the node: {}", String::from_utf8_lossy(&out.stderr).trim());
        Ok(())
    }

    /// A CRI client of one of the node's runtimes (its socket through the node's root).
    pub fn cri(&self, runtime: Runtime) -> Result<Cri> {
        Cri::connect(&self.cri_endpoint(runtime))
    }

    /// The host's endpoint of a runtime's socket in the node.
    #[must_use]
    pub fn cri_endpoint(&self, runtime: Runtime) -> String {
        format!("unix:///proc/{}/root{}", self.init_pid, runtime.socket())
    }

    /// The last lines of a unit's journal.
    #[must_use]
    pub fn journal(&self, unit: &str) -> String {
        self.run(&["journalctl", "-u", unit, "--no-pager", "-n", "60", "-o", "cat"])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The node's cgroup hierarchies on the host, each the root of the node's cgroup
    /// namespace there, by their directory names under `/sys/fs/cgroup` (`memory`,
    /// `unified`, ...).
    fn hierarchies(&self) -> impl Iterator<Item = (&str, &PathBuf)> {
        self.cgroups.iter().filter_map(|c| {
            let name = c.strip_prefix("/sys/fs/cgroup").ok()?.components().next()?.as_os_str().to_str()?;
            Some((name, c))
        })
    }

    /// The host directory of the node's cgroup `relative` (a path of the node's cgroup
    /// namespace) in the hierarchy mounted as `/sys/fs/cgroup/<hierarchy>`.
    #[must_use]
    pub fn cgroup_dir(&self, hierarchy: &str, relative: &str) -> Option<PathBuf> {
        let rel = relative.trim_start_matches('/');
        self.hierarchies().find(|(name, _)| *name == hierarchy).map(|(_, root)| root.join(rel))
    }

    /// The host directories of the node's cgroup `relative` in every hierarchy.
    #[must_use]
    pub fn cgroup_dirs(&self, relative: &str) -> Vec<PathBuf> {
        let rel = relative.trim_start_matches('/');
        self.hierarchies().map(|(_, root)| root.join(rel)).collect()
    }

    /// The host's pid of the node's process `pid` (a pid of the node's pid namespace): the
    /// process under the node's cgroup whose `NSpid` names `pid` at the node's level.
    pub fn host_pid(&self, pid: i32) -> Result<i32> {
        let node_cgroup = self
            .hierarchies()
            .find(|(name, _)| *name == "memory")
            .and_then(|(_, root)| root.strip_prefix("/sys/fs/cgroup/memory").ok().map(|rel| Path::new("/").join(rel)))
            .context("the node has no memory cgroup")?;
        let mut found = Vec::new();
        let mut near = Vec::new();
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let Some(host) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
            let Some(ns) = status.lines().find_map(|l| l.strip_prefix("NSpid:")) else { continue };
            if ns.split_whitespace().nth(1).and_then(|p| p.parse::<i32>().ok()) != Some(pid) {
                continue;
            }
            let Ok(cgroup) = std::fs::read_to_string(entry.path().join("cgroup")) else { continue };
            near.push(format!("{host} (NSpid{ns}, {})", cgroup.lines().find(|l| l.contains(":memory:")).unwrap_or("")));
            let in_node = cgroup.lines().any(|l| {
                l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory"))
                    && l.split(':').nth(2).is_some_and(|p| Path::new(p).starts_with(&node_cgroup))
            });
            if in_node {
                found.push(host);
            }
        }
        match found.as_slice() {
            [one] => Ok(*one),
            [] => bail!(
                "no process of the node has pid {pid} there (the node's memory cgroup is {}; same pid elsewhere: {near:?})",
                node_cgroup.display()
            ),
            many => bail!("node pid {pid} matches several host processes: {many:?}"),
        }
    }

    /// The node's mount points below `dir` (a node path), deepest first.
    #[must_use]
    pub fn mounts_under(&self, dir: &Path) -> Vec<PathBuf> {
        let Ok(info) = std::fs::read_to_string(format!("/proc/{}/mountinfo", self.init_pid)) else {
            return Vec::new();
        };
        crate::mount_points_under(&info, &[dir])
    }
}

/// Where the end-to-end agents run: `SWIFTLET_E2E_NODE=containerd2` (or `containerd1.6`)
/// runs them in the node container on that runtime with the systemd cgroup driver;
/// unset, on the host with the test bed's containerd and cgroupfs.
pub fn node_target() -> Result<Option<&'static (Node, Runtime)>> {
    static TARGET: OnceLock<Option<(Node, Runtime)>> = OnceLock::new();
    if let Some(t) = TARGET.get() {
        return Ok(t.as_ref());
    }
    let target = match std::env::var("SWIFTLET_E2E_NODE") {
        Ok(r) if !r.is_empty() => Some((Node::load()?, Runtime::parse(&r)?)),
        _ => None,
    };
    Ok(TARGET.get_or_init(|| target).as_ref())
}

/// The node target, for harness code that already knows one is set.
#[must_use]
pub fn in_node() -> Option<&'static (Node, Runtime)> {
    node_target().ok().flatten()
}

impl Node {
    /// Makes the API server at `server` (`https://127.0.0.1:6443`, the host's loopback)
    /// answer at the same address inside the node (see [`Node::forward_loopback`]): the
    /// agent in the node then uses the test bed's kubeconfigs as they are (the server's
    /// certificate names 127.0.0.1).
    pub fn forward_api_server(&self, server: &str) -> Result<()> {
        let addr: std::net::SocketAddr = server
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .parse()
            .with_context(|| format!("the API server {server} is not an ip:port address"))?;
        self.forward_loopback(addr)
    }

    /// Makes a server on the host's loopback (`addr`) answer at the same address inside
    /// the node: a listener in the node's network namespace whose connections are
    /// forwarded to the host's. Once per address and test process; its threads end with
    /// the process.
    pub fn forward_loopback(&self, addr: std::net::SocketAddr) -> Result<()> {
        static FORWARDED: std::sync::Mutex<Vec<std::net::SocketAddr>> = std::sync::Mutex::new(Vec::new());
        let mut forwarded = FORWARDED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !forwarded.contains(&addr) {
            self.forward(addr)?;
            forwarded.push(addr);
        }
        Ok(())
    }

    fn forward(&self, addr: std::net::SocketAddr) -> Result<()> {
        use std::os::fd::AsRawFd as _;
        let netns = std::fs::File::open(format!("/proc/{}/ns/net", self.init_pid))?;
        // A socket stays in the network namespace it was made in: a thread of its own
        // enters the node's, binds, and ends; the accepting thread stays in the host's,
        // where the forwarded connections go.
        let listener = std::thread::spawn(move || -> Result<std::net::TcpListener> {
            // SAFETY: setns(2) on this short-lived thread only, with a namespace fd it owns.
            let rc = unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) };
            ensure!(rc == 0, "entering the node's network namespace: {}", std::io::Error::last_os_error());
            Ok(std::net::TcpListener::bind(addr)?)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the namespace thread panicked"))?
        .with_context(|| format!("listening on {addr} in the node"))?;
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(upstream) = std::net::TcpStream::connect(addr) else { continue };
                let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else { continue };
                let pipe = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                };
                pipe(client, upstream);
                pipe(upstream2, client2);
            }
        });
        Ok(())
    }
}
