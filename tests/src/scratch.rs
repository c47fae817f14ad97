//! Small filesystems and a private containerd for tests that need a disk of their own:
//! image GC on an image filesystem that GC may empty, disk pressure on a node filesystem
//! that a pod can fill.
//!
//! - [`LoopFs`]: an ext4 filesystem in a file, loop-mounted (`mount -o loop`, so the loop
//!   device goes with the unmount).
//! - [`ScratchContainerd`]: a second containerd with its root (images, snapshots) on a
//!   [`LoopFs`], its state, socket and runc root in a temporary directory, the test bed's
//!   registry configuration (so it pulls from the test registries) and no CNI network
//!   (pods must use `hostNetwork`). Removing images there never touches the shared test
//!   bed's images, which cannot be pulled back.
//!
//! Both clean up after themselves, also when a test fails: [`ScratchContainerd::stop`]
//! (and its `Drop`) removes every sandbox, stops its containerd and the shims serving it
//! (found by their `-address` argument, never by name), then unmounts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};

use crate::Cri;

/// Runs a command to completion; fails with its output.
fn run(program: &str, args: &[&std::ffi::OsStr]) -> Result<()> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    ensure!(
        out.status.success(),
        "{program} {:?}: {}: {}",
        args,
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// An ext4 filesystem in a file under a temporary directory, loop-mounted.
#[derive(Debug)]
pub struct LoopFs {
    dir: Option<tempfile::TempDir>,
    /// Where it is mounted, as the host reaches it (through `/proc/<pid>/root` of the
    /// node container's init when mounted there).
    pub mountpoint: PathBuf,
    mounted: bool,
    /// Mounted in the node container (see [`crate::node::node_target`]): the node and the
    /// loop device the host set up for it.
    in_node: Option<(&'static crate::node::Node, String)>,
}

impl LoopFs {
    /// Creates a `size_mib` MiB ext4 filesystem (no blocks reserved for root, so that
    /// free and available space agree) and mounts it: on the host, or in the node
    /// container's mount namespace when the end-to-end agents run there.
    pub fn create(size_mib: u64) -> Result<Self> {
        let dir = crate::agent_tempdir("swiftlet-e2e-loop-")?;
        let image = dir.path().join("fs.img");
        std::fs::File::create(&image)?.set_len(size_mib << 20)?;
        run("mkfs.ext4", &["-q".as_ref(), "-F".as_ref(), "-m".as_ref(), "0".as_ref(), image.as_os_str()])?;
        let mountpoint = dir.path().join("mnt");
        std::fs::create_dir(&mountpoint)?;
        let Some((node, _)) = crate::node::node_target()? else {
            run("mount", &["-o".as_ref(), "loop".as_ref(), image.as_os_str(), mountpoint.as_os_str()])?;
            return Ok(Self { dir: Some(dir), mountpoint, mounted: true, in_node: None });
        };
        // The node's /dev has no loop devices: the host sets one up, and the node mounts
        // it through a device node of its own made for the mount.
        let out = Command::new("losetup").arg("--find").arg("--show").arg(&image).output()?;
        ensure!(out.status.success(), "losetup {}: {}", image.display(), String::from_utf8_lossy(&out.stderr));
        let device = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let minor = device.trim_start_matches("/dev/loop").to_owned();
        let inside = node.inside(&mountpoint)?.display().to_string();
        let script = format!(
            "mknod /dev/swl-{minor} b 7 {minor} && mount /dev/swl-{minor} {inside}; r=$?; rm -f /dev/swl-{minor}; exit $r"
        );
        let mounted = Command::new("nsenter")
            .arg("-t")
            .arg(node.init_pid.to_string())
            .args(["-m", "sh", "-c", &script])
            .output()?;
        if !mounted.status.success() {
            let _ = run("losetup", &["-d".as_ref(), device.as_ref()]);
            bail!("mounting {device} at {inside} in the node: {}", String::from_utf8_lossy(&mounted.stderr));
        }
        let mountpoint = PathBuf::from(format!("/proc/{}/root{inside}", node.init_pid));
        Ok(Self { dir: Some(dir), mountpoint, mounted: true, in_node: Some((node, device)) })
    }

    /// Unmounts (retrying while busy for a few seconds) and removes the file.
    pub fn remove(&mut self) -> Result<()> {
        if self.mounted {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let unmounted = match self.in_node {
                    Some((node, _)) => {
                        let inside = node.inside(&self.mountpoint)?.display().to_string();
                        node.ok(&["umount", &inside]).map(drop)
                    }
                    None => run("umount", &[self.mountpoint.as_os_str()]),
                };
                match unmounted {
                    Ok(()) => break,
                    Err(e) if Instant::now() > deadline => return Err(e),
                    Err(_) => std::thread::sleep(Duration::from_millis(200)),
                }
            }
            self.mounted = false;
            if let Some((_, device)) = &self.in_node {
                run("losetup", &["-d".as_ref(), device.as_ref()])?;
            }
        }
        if let Some(dir) = self.dir.take() {
            dir.close()?;
        }
        Ok(())
    }

    /// `(capacity, available)` bytes, from statvfs(2).
    pub fn space(&self) -> Result<(u64, u64)> {
        let c = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes())?;
        // SAFETY: statvfs writes into the zeroed struct we own; the path is NUL-terminated.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        ensure!(unsafe { libc::statvfs(c.as_ptr(), &raw mut st) } == 0, "statvfs {}", self.mountpoint.display());
        Ok((st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize))
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("cannot remove the loop filesystem at {}: {e:#}", self.mountpoint.display());
        }
    }
}

/// What a [`ScratchContainerd`] needs from the test bed.
#[derive(Debug, Clone)]
pub struct ScratchOptions {
    /// Size of the loop filesystem of its root.
    pub root_size_mib: u64,
    /// The CRI sandbox (pause) image; pulled on the first sandbox.
    pub sandbox_image: String,
    /// containerd's registry `config_path` (the test bed's `hosts.toml` per registry).
    pub registry_hosts_dir: PathBuf,
}

/// A private containerd (see the module docs).
#[derive(Debug)]
pub struct ScratchContainerd {
    child: Option<Child>,
    dir: Option<tempfile::TempDir>,
    pub root: LoopFs,
    pub socket: PathBuf,
    pub endpoint: String,
}

impl ScratchContainerd {
    /// Starts it and waits until it answers CRI.
    pub async fn start(opts: &ScratchOptions) -> Result<Self> {
        let root = LoopFs::create(opts.root_size_mib)?;
        let dir = tempfile::Builder::new().prefix("swiftlet-e2e-ctrd-").tempdir()?;
        let socket = dir.path().join("containerd.sock");
        let endpoint = format!("unix://{}", socket.display());
        let cni = dir.path().join("net.d");
        std::fs::create_dir_all(&cni)?;
        let config = dir.path().join("containerd.toml");
        std::fs::write(&config, config_toml(&root.mountpoint, dir.path(), &socket, &cni, opts))?;
        let log = std::fs::File::create(dir.path().join("containerd.log"))?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting containerd")?;
        let mut me = Self { child: Some(child), dir: Some(dir), root, socket, endpoint };
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            if let Some(c) = me.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                bail!("the scratch containerd exited during start-up ({status}):\n{}", me.log_tail(30));
            }
            if me.socket.exists() && Cri::connect(&me.endpoint)?.version().await.is_ok() {
                return Ok(me);
            }
            if Instant::now() > deadline {
                bail!("the scratch containerd did not answer CRI within a minute:\n{}", me.log_tail(30));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The last `n` lines of its log.
    #[must_use]
    pub fn log_tail(&self, n: usize) -> String {
        self.dir
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.path().join("containerd.log")).ok())
            .map(|l| crate::tail(&l, n))
            .unwrap_or_default()
    }

    /// Removes every sandbox, stops containerd and its shims, unmounts its root.
    pub async fn stop(&mut self) -> Result<()> {
        let mut problems = Vec::new();
        if self.child.is_some()
            && let Err(e) = Cri::connect(&self.endpoint)?.remove_all().await
        {
            problems.push(format!("removing its sandboxes: {e:#}"));
        }
        self.kill_daemon_and_shims();
        if let Err(e) = self.root.remove() {
            problems.push(format!("unmounting its root: {e:#}"));
        }
        if let Some(dir) = self.dir.take()
            && let Err(e) = dir.close()
        {
            problems.push(format!("removing its directory: {e}"));
        }
        ensure!(problems.is_empty(), "scratch containerd clean-up: {}", problems.join("; "));
        Ok(())
    }

    fn kill_daemon_and_shims(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(pid) = i32::try_from(c.id()) {
                // SAFETY: kill(2) on the child we spawned.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
            let deadline = Instant::now() + Duration::from_secs(15);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // Shims outlive containerd by design; ours name our socket as their address.
        for pid in shims_of(&self.socket) {
            // SAFETY: kill(2) on a shim serving our own containerd.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for ScratchContainerd {
    fn drop(&mut self) {
        if self.child.is_some() {
            // Best effort without a runtime: sandboxes cannot be removed here, so the shims
            // (and their containers) are killed.
            self.kill_daemon_and_shims();
        }
    }
}

/// Pids of containerd shims whose `-address` is `socket`.
fn shims_of(socket: &Path) -> Vec<i32> {
    let want = socket.display().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
            let args: Vec<String> = raw.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            args.first().is_some_and(|a| a.contains("containerd-shim"))
                && args.windows(2).any(|w| w[0] == "-address" && w[1] == want)
        })
        .collect()
}

fn config_toml(root: &Path, dir: &Path, socket: &Path, cni: &Path, opts: &ScratchOptions) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
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

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{hosts}"
"#,
        root = root.join("root").display(),
        state = dir.join("state").display(),
        socket = socket.display(),
        opt = dir.join("opt").display(),
        pause = opts.sandbox_image,
        runc = dir.join("runc").display(),
        cni = cni.display(),
        hosts = opts.registry_hosts_dir.display(),
    )
}
