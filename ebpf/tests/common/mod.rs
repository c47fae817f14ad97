//! Test bed for the real-kernel tests: private cgroup roots in the v1 memory hierarchy
//! and in cgroup2, processes started inside them, and cleanup that runs even when a
//! test fails (drop guards kill what the test started and remove what it created).

use std::{
    fs, io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use swiftlet_ebpf::{CgroupId, SensorConfig, SensorEvent, Sensors};
use tokio::sync::mpsc;

pub const MEMORY_MOUNT: &str = "/sys/fs/cgroup/memory";
pub const UNIFIED_MOUNT: &str = "/sys/fs/cgroup/unified";
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Fails (not skips) without root: these tests are the proof that the sensors work.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "the swiftlet-ebpf kernel tests must run as root (they load eBPF programs and create cgroups); \
         run `sudo -E cargo test -p swiftlet-ebpf` or use the CI test bed"
    );
}

pub fn load(cfg: &SensorConfig) -> Sensors {
    require_root();
    match Sensors::load(cfg) {
        Ok(sensors) => sensors,
        Err(error) => panic!("loading the sensors failed: {}", error_chain(&error)),
    }
}

pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// The hierarchy id of a v1 controller, straight from /proc/cgroups.
pub fn v1_hierarchy_of(controller: &str) -> u32 {
    let text = fs::read_to_string("/proc/cgroups").unwrap();
    text.lines()
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next()? == controller).then(|| fields.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("{controller} not in /proc/cgroups"))
}

pub fn inode(dir: &Path) -> u64 {
    fs::metadata(dir).unwrap_or_else(|e| panic!("stat {}: {e}", dir.display())).ino()
}

/// One cgroup that exists in both the memory hierarchy and cgroup2.
#[derive(Clone, Debug)]
pub struct DualCgroup {
    pub memory: PathBuf,
    pub unified: PathBuf,
    /// Path below the hierarchy roots, e.g. `/swiftlet-ebpf-test-12-oom/victim`.
    pub rel: String,
}

impl DualCgroup {
    pub fn memcg_id(&self) -> CgroupId {
        CgroupId { hierarchy_id: v1_hierarchy_of("memory"), id: inode(&self.memory) }
    }

    pub fn cgroup2_id(&self) -> CgroupId {
        CgroupId::unified(inode(&self.unified))
    }

    /// Removes both directories, waiting for exiting tasks to leave.
    pub fn remove(&self) {
        for dir in [&self.memory, &self.unified] {
            rmdir_retrying(dir).unwrap_or_else(|e| panic!("rmdir {}: {e}", dir.display()));
        }
    }
}

/// A private test root `swiftlet-ebpf-test-<pid>-<name>` in both hierarchies.
#[derive(Debug)]
pub struct TestRoot {
    pub root: DualCgroup,
    children: Mutex<Vec<Child>>,
}

impl TestRoot {
    pub fn new(name: &str) -> Self {
        require_root();
        let rel = format!("/swiftlet-ebpf-test-{}-{name}", std::process::id());
        let root = DualCgroup {
            memory: PathBuf::from(format!("{MEMORY_MOUNT}{rel}")),
            unified: PathBuf::from(format!("{UNIFIED_MOUNT}{rel}")),
            rel,
        };
        // A leftover from a crashed run with the same pid would hold stale state.
        for dir in [&root.memory, &root.unified] {
            if dir.exists() {
                remove_tree(dir);
            }
            fs::create_dir(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        }
        Self { root, children: Mutex::new(Vec::new()) }
    }

    /// Creates `<root>/<name>` in both hierarchies.
    pub fn child(&self, name: &str) -> DualCgroup {
        let child = self.child_path(name);
        fs::create_dir(&child.memory).unwrap();
        fs::create_dir(&child.unified).unwrap();
        child
    }

    /// The paths of `<root>/<name>` without creating them.
    pub fn child_path(&self, name: &str) -> DualCgroup {
        DualCgroup {
            memory: self.root.memory.join(name),
            unified: self.root.unified.join(name),
            rel: format!("{}/{name}", self.root.rel),
        }
    }

    /// Starts `/bin/sh -c` that moves itself into `cgroup` (memory and cgroup2) and then
    /// execs `command`; the sh itself runs outside, so the first exec inside is `command`.
    pub fn spawn_in(&self, cgroup: &DualCgroup, command: &str) -> u32 {
        let script = format!(
            "echo 0 > {}/cgroup.procs && echo 0 > {}/cgroup.procs && exec {command}",
            cgroup.memory.display(),
            cgroup.unified.display()
        );
        self.spawn(Command::new("/bin/sh").arg("-c").arg(script))
    }

    /// Starts a process that the guard kills and reaps on drop.
    pub fn spawn(&self, command: &mut Command) -> u32 {
        let child = command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let pid = child.id();
        self.children.lock().unwrap().push(child);
        pid
    }

    /// Waits for every started process to exit.
    pub fn wait_all(&self) {
        for child in self.children.lock().unwrap().iter_mut() {
            child.wait().unwrap();
        }
    }

    /// Kills a started process with SIGKILL.
    pub fn kill(&self, pid: u32) {
        let mut children = self.children.lock().unwrap();
        let child = children.iter_mut().find(|c| c.id() == pid).expect("not a child of this test");
        child.kill().unwrap();
    }
}

impl Drop for TestRoot {
    fn drop(&mut self) {
        let children = std::mem::take(&mut *self.children.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for mut child in children {
            // Our own unreaped child: its pid cannot have been reused.
            let _ = child.kill();
            let _ = child.wait();
        }
        remove_tree(&self.root.memory);
        remove_tree(&self.root.unified);
    }
}

/// Removes a cgroup directory and everything below it, killing any process left inside
/// (only tests put processes there).
pub fn remove_tree(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path());
        }
    }
    if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    if let Err(error) = rmdir_retrying(dir) {
        eprintln!("warning: cannot remove test cgroup {}: {error}", dir.display());
    }
}

/// rmdir, retrying while tasks finish exiting (EBUSY) for up to 5 s.
pub fn rmdir_retrying(dir: &Path) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() < deadline && e.raw_os_error() == Some(libc::EBUSY) => {
                thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The next event matching `pred`, collecting the others; panics with everything seen
/// on timeout.
pub async fn expect_event(
    rx: &mut mpsc::Receiver<SensorEvent>,
    what: &str,
    pred: impl Fn(&SensorEvent) -> bool,
) -> (SensorEvent, Vec<SensorEvent>) {
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    let mut others = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(event)) if pred(&event) => return (event, others),
            Ok(Some(event)) => others.push(event),
            Ok(None) => panic!("event stream ended while waiting for {what}; other events: {others:#?}"),
            Err(tokio::time::error::Elapsed { .. }) => {
                panic!("no {what} within {EVENT_TIMEOUT:?}; other events: {others:#?}")
            }
        }
    }
}

/// Every event that arrives until the stream is quiet for `quiet`.
pub async fn collect_until_quiet(rx: &mut mpsc::Receiver<SensorEvent>, quiet: Duration) -> Vec<SensorEvent> {
    let mut events = Vec::new();
    while let Ok(Some(event)) = tokio::time::timeout(quiet, rx.recv()).await {
        events.push(event);
    }
    events
}

/// Runs a command to completion in the test's own cgroup (outside every test root).
pub fn run_outside(command: &str) {
    let status = Command::new("/bin/sh").arg("-c").arg(command).status().unwrap();
    assert!(status.success(), "{command}: {status}");
}
