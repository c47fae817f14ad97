//! Real kernel interfaces (root, cgroup v1 memory controller, PSI): the CI machines have
//! all three.

use std::process::Command;

use super::*;

/// A v1 memory cgroup for one test, removed on drop (with the tmpfs file its process
/// wrote, whose pages are charged to it).
struct TestCgroup {
    dir: PathBuf,
    shm: PathBuf,
}

impl TestCgroup {
    fn new(name: &str) -> Self {
        let dir = PathBuf::from(format!("/sys/fs/cgroup/memory/swiftlet-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir, shm: PathBuf::from(format!("/dev/shm/swiftlet-test-{name}-{}", std::process::id())) }
    }

    fn usage(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.usage_in_bytes")).unwrap().trim().parse().unwrap()
    }

    /// Runs `script` inside the cgroup (`$SHM` is the tmpfs file) and waits for it.
    fn run(&self, script: &str) {
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("echo $$ > {}/cgroup.procs && {script}", self.dir.display()))
            .env("SHM", &self.shm)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.shm);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[tokio::test]
async fn a_memcg_threshold_fires_when_usage_crosses_it() {
    let cg = TestCgroup::new("threshold");
    let threshold = cg.usage() + 8 * 1024 * 1024;
    let notifier = MemcgThreshold::new(&cg.dir, threshold).unwrap();
    assert_eq!(notifier.threshold(), threshold);
    let (signals, mut rx) = PressureSignals::channel();
    let shutdown = CancellationToken::new();
    let forward = async { notifier.forward(&signals, &shutdown).await };
    let check = async {
        // Below the threshold: nothing.
        cg.run("dd if=/dev/zero of=$SHM bs=1M count=2 2>/dev/null");
        assert!(tokio::time::timeout(Duration::from_millis(300), rx.recv()).await.is_err(), "fired below");
        // 16 MiB of tmpfs charged to the cgroup crosses it.
        cg.run("dd if=/dev/zero of=$SHM bs=1M count=16 2>/dev/null");
        let signal = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("no notification");
        assert_eq!(signal.unwrap().source, PressureSource::MemcgThreshold);
        shutdown.cancel();
    };
    tokio::join!(forward, check);
}

#[tokio::test]
async fn a_memcg_threshold_on_a_missing_cgroup_names_it() {
    let err = MemcgThreshold::new(Path::new("/sys/fs/cgroup/memory/swiftlet-no-such-cgroup"), 1).unwrap_err();
    assert!(err.to_string().contains("swiftlet-no-such-cgroup/memory.usage_in_bytes"), "{err}");
}

#[tokio::test]
async fn a_psi_trigger_fires_when_a_cgroup_thrashes() {
    let cg = TestCgroup::new("psi");
    // A 96 MiB file written, then read over and over, from a 24 MiB cgroup: its page
    // cache is charged to the cgroup, and every step reclaims the cgroup's own pages,
    // which the kernel counts as memory stall.
    std::fs::write(cg.dir.join("memory.limit_in_bytes"), (24 * 1024 * 1024).to_string()).unwrap();
    let file = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
    let trigger =
        PsiTrigger::new(Path::new("/proc/pressure/memory"), Duration::from_millis(5), Duration::from_secs(2)).unwrap();
    let (signals, mut rx) = PressureSignals::channel();
    let shutdown = CancellationToken::new();
    let forward = tokio::spawn(trigger.forward(signals, shutdown.clone()));
    let path = file.path().display().to_string();
    let thrash = tokio::task::spawn_blocking({
        let dir = cg.dir.clone();
        move || {
            Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "echo $$ > {}/cgroup.procs && dd if=/dev/zero of={path} bs=1M count=96 2>/dev/null && for i in 1 2 3 4 5 6 7 8 9 10; do cat {path} > /dev/null; done",
                    dir.display()
                ))
                .status()
                .unwrap()
        }
    });
    let signal = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await;
    shutdown.cancel();
    let _ = thrash.await;
    let _ = forward.await;
    assert_eq!(signal.expect("no PSI trigger within 20 s").unwrap().source, PressureSource::Psi);
}

#[tokio::test]
async fn psi_triggers_are_checked() {
    let err = PsiTrigger::new(Path::new("/proc/pressure/memory"), Duration::from_secs(2), Duration::from_secs(1))
        .unwrap_err();
    assert!(err.to_string().contains("must be within the window"), "{err}");
    // The kernel refuses a window above 10 s.
    let err = PsiTrigger::new(Path::new("/proc/pressure/memory"), Duration::from_millis(10), Duration::from_secs(12))
        .unwrap_err();
    assert!(err.to_string().contains("/proc/pressure/memory"), "{err}");
}

#[test]
fn the_memcg_threshold_is_upstreams() {
    // 1 GiB capacity, 100 MiB threshold, 50 MiB inactive file.
    let mib = 1024 * 1024;
    assert_eq!(memcg_usage_threshold(1024 * mib, 100 * mib, 50 * mib), 974 * mib);
    assert_eq!(memcg_usage_threshold(10, 20, 0), 0);
}

#[tokio::test]
async fn signals_coalesce_when_the_manager_is_busy() {
    let (signals, mut rx) = PressureSignals::channel();
    for _ in 0..100 {
        signals.send(PressureSource::KernelReclaim);
    }
    let mut n = 0;
    while rx.try_recv().is_ok() {
        n += 1;
    }
    assert!((1..=8).contains(&n), "{n}");
}
