use std::io::Read as _;

use super::*;
use crate::container::fake::FakeRuntime;

struct Env {
    rt: Arc<FakeRuntime>,
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self { rt: Arc::new(FakeRuntime::default()), dir: tempfile::tempdir().unwrap() }
    }

    fn manager(&self, max_size: u64, max_files: usize) -> ContainerLogManager {
        ContainerLogManager::new(
            self.rt.clone(),
            RotationPolicy { max_size, max_files, max_workers: 2, monitor_interval: Duration::from_secs(10) },
        )
    }

    /// A running container whose log is `<dir>/<name>/0.log` holding `content`.
    async fn container(&self, name: &str, content: &str) -> (String, PathBuf) {
        let log = self.dir.path().join(name).join("0.log");
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        std::fs::write(&log, content).unwrap();
        let sandbox = self.rt.run_pod_sandbox(api::PodSandboxConfig::default(), String::new()).await.unwrap();
        let config = api::ContainerConfig { log_path: log.display().to_string(), ..Default::default() };
        let id = self.rt.create_container(&sandbox, config, api::PodSandboxConfig::default()).await.unwrap();
        self.rt.start_container(&id).await.unwrap();
        (id, log)
    }
}

/// The names in `log`'s directory, sorted.
fn names(log: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(log.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn gunzip(path: &Path) -> String {
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()).read_to_string(&mut s).unwrap();
    s
}

#[tokio::test]
async fn a_log_below_the_size_is_left_alone_and_one_at_the_size_is_rotated() {
    let e = Env::new();
    let (_, small) = e.container("small", "short\n").await;
    let (id, big) = e.container("big", &"x".repeat(100)).await;
    let m = e.manager(100, 5);
    assert_eq!(m.rotate_logs().await, 1);
    assert_eq!(names(&small), vec!["0.log"]);
    let after = names(&big);
    assert_eq!(after.len(), 2, "{after:?}");
    assert_eq!(after[0], "0.log", "the runtime reopened a fresh file");
    assert!(after[1].starts_with("0.log.") && after[1].len() == "0.log.20261130-101010".len(), "{after:?}");
    assert_eq!(std::fs::read_to_string(&big).unwrap(), "");
    assert_eq!(std::fs::read_to_string(big.with_file_name(&after[1])).unwrap(), "x".repeat(100));
    assert!(e.rt.calls().iter().filter(|c| *c == "reopen_container_log").count() == 1);
    let _ = id;
}

#[tokio::test]
async fn older_rotations_are_compressed_and_the_oldest_removed_to_keep_max_files() {
    let e = Env::new();
    let (id, log) = e.container("c", &"new\n".repeat(50)).await;
    let dir = log.parent().unwrap();
    // Earlier rotations: two compressed, one plain (the newest), and leftovers of an
    // interrupted rotation.
    for (name, body) in [
        ("0.log.20261130-100000.gz", "oldest"),
        ("0.log.20261130-100100.gz", "older"),
        ("0.log.20261130-100200", "previous\n"),
        ("0.log.20261130-100300.gz.tmp", "half-written"),
    ] {
        if Path::new(name).extension().is_some_and(|x| x == "gz") {
            let mut enc = flate2::write::GzEncoder::new(
                std::fs::File::create(dir.join(name)).unwrap(),
                flate2::Compression::fast(),
            );
            std::io::Write::write_all(&mut enc, body.as_bytes()).unwrap();
            enc.finish().unwrap();
        } else {
            std::fs::write(dir.join(name), body).unwrap();
        }
    }
    let m = e.manager(100, 4);
    assert!(m.rotate_if_needed(&id, &log).await.unwrap());
    let after = names(&log);
    // max 4 files: current + newest rotation + 2 compressed.
    assert_eq!(after.len(), 4, "{after:?}");
    assert_eq!(after[0], "0.log");
    assert_eq!(after[1], "0.log.20261130-100100.gz", "the oldest went: {after:?}");
    assert_eq!(after[2], "0.log.20261130-100200.gz", "the previous rotation is compressed: {after:?}");
    assert!(Path::new(&after[3]).extension().is_none_or(|x| x != "gz"), "the newest rotation stays plain: {after:?}");
    assert_eq!(gunzip(&dir.join(&after[2])), "previous\n");
    assert_eq!(std::fs::read_to_string(dir.join(&after[3])).unwrap(), "new\n".repeat(50));
}

#[tokio::test]
async fn a_failed_reopen_undoes_the_rename() {
    let e = Env::new();
    let (id, log) = e.container("c", &"y".repeat(200)).await;
    e.rt.fail_reopen_log(Some("no such task"));
    let m = e.manager(100, 5);
    let err = m.rotate_if_needed(&id, &log).await.unwrap_err();
    assert!(err.to_string().contains("no such task"), "{err}");
    assert_eq!(names(&log), vec!["0.log"]);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "y".repeat(200));
    // And the next pass rotates it.
    e.rt.fail_reopen_log(None);
    assert_eq!(m.rotate_logs().await, 1);
}

#[tokio::test]
async fn a_missing_log_is_reopened() {
    let e = Env::new();
    let (id, log) = e.container("c", "").await;
    std::fs::remove_file(&log).unwrap();
    let m = e.manager(100, 5);
    assert!(!m.rotate_if_needed(&id, &log).await.unwrap());
    assert!(log.exists(), "the runtime recreated it");
}

#[tokio::test]
async fn stopped_containers_are_not_rotated() {
    let e = Env::new();
    let (id, log) = e.container("c", &"z".repeat(200)).await;
    e.rt.exit_container(&id, 0);
    assert_eq!(e.manager(100, 5).rotate_logs().await, 0);
    assert_eq!(names(&log), vec!["0.log"]);
}

#[test]
fn in_use_follows_upstream() {
    let all: Vec<PathBuf> =
        ["a.log.1", "a.log.1.gz", "a.log.2", "a.log.3.gz", "a.log.4.tmp"].iter().map(PathBuf::from).collect();
    let used: Vec<&str> = all.iter().filter(|f| is_in_use(f, &all)).map(|f| f.to_str().unwrap()).collect();
    assert_eq!(used, vec!["a.log.1.gz", "a.log.2", "a.log.3.gz"]);
}
