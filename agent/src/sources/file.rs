//! The static pod file source (`pkg/kubelet/config/file.go`): every regular file in
//! `staticPodPath` holds one pod (YAML or JSON). The directory is re-read every
//! `fileCheckFrequency` and at once when inotify says something changed. A file that
//! does not parse or validate is reported (log + a `Warning` event on the node) and
//! skipped; the other pods are unaffected.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use notify::Watcher as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{PodUpdate, defaults};
use crate::events::{EventRecorder, EventType, node_ref};
use crate::types::pod::FILE_SOURCE;

/// Why one manifest file was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: cannot read: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}: not a valid YAML or JSON document: {reason}")]
    Parse { path: String, reason: String },
    #[error("{path}: expected apiVersion v1 and kind Pod, got apiVersion {api_version:?} kind {kind:?}")]
    Kind { path: String, api_version: String, kind: String },
    #[error("{path}: invalid pod: {}", errors.join("; "))]
    Invalid { path: String, errors: Vec<String> },
}

/// Parses one manifest's text into a validated, defaulted static pod.
pub fn parse_manifest(text: &str, path: &str, node_name: &str) -> Result<Pod, ManifestError> {
    let trimmed = text.trim_start();
    let value: serde_json::Value = if trimmed.starts_with('{') {
        serde_json::from_str(text).map_err(|e| ManifestError::Parse { path: path.into(), reason: e.to_string() })?
    } else {
        serde_saphyr::from_str(text).map_err(|e| ManifestError::Parse { path: path.into(), reason: e.to_string() })?
    };
    if !value.is_object() {
        return Err(ManifestError::Parse { path: path.into(), reason: "the document is not a mapping".into() });
    }
    let api_version = value.get("apiVersion").and_then(|v| v.as_str()).unwrap_or_default();
    let kind = value.get("kind").and_then(|v| v.as_str()).unwrap_or_default();
    if api_version != "v1" || kind != "Pod" {
        return Err(ManifestError::Kind { path: path.into(), api_version: api_version.into(), kind: kind.into() });
    }
    let pod: Pod =
        serde_json::from_value(value).map_err(|e| ManifestError::Parse { path: path.into(), reason: e.to_string() })?;
    defaults::static_pod(pod, node_name, path).map_err(|errs| ManifestError::Invalid {
        path: path.into(),
        errors: errs.iter().map(ToString::to_string).collect(),
    })
}

/// Reads static pod manifests from a directory.
#[derive(Debug, Clone)]
pub struct FileSource {
    dir: PathBuf,
    node_name: String,
    period: Duration,
    recorder: Arc<dyn EventRecorder>,
}

/// Result of one directory scan.
#[derive(Debug, Default)]
pub struct Scan {
    pub pods: Vec<Pod>,
    pub errors: Vec<ManifestError>,
}

impl FileSource {
    #[must_use]
    pub fn new(dir: PathBuf, node_name: String, period: Duration, recorder: Arc<dyn EventRecorder>) -> Self {
        Self { dir, node_name, period, recorder }
    }

    /// Reads every manifest in the directory (not recursing, skipping dot files, as upstream).
    #[must_use]
    pub fn scan(&self) -> Scan {
        let mut scan = Scan::default();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return scan,
            Err(e) => {
                scan.errors.push(ManifestError::Read { path: self.dir.display().to_string(), reason: e.to_string() });
                return scan;
            }
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        let mut by_name: HashMap<(String, String), String> = HashMap::new();
        for path in paths {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with('.') || !path.is_file() {
                continue;
            }
            let display = path.display().to_string();
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    scan.errors.push(ManifestError::Read { path: display, reason: e.to_string() });
                    continue;
                }
            };
            match parse_manifest(&text, &display, &self.node_name) {
                Ok(pod) => {
                    let key = (
                        pod.metadata.namespace.clone().unwrap_or_default(),
                        pod.metadata.name.clone().unwrap_or_default(),
                    );
                    // Two files for one pod name: the first (by file name) wins, as the
                    // kubelet's config merge keeps one pod per full name.
                    if let Some(first) = by_name.get(&key) {
                        scan.errors.push(ManifestError::Invalid {
                            path: display,
                            errors: vec![format!(
                                "metadata.name: Duplicate value: pod {}/{} is already defined in {first}",
                                key.0, key.1
                            )],
                        });
                        continue;
                    }
                    by_name.insert(key, display);
                    scan.pods.push(pod);
                }
                Err(e) => scan.errors.push(e),
            }
        }
        scan
    }

    /// Watches the directory until shutdown, sending a snapshot whenever it changes
    /// (and once at start, which marks the source as ready).
    pub async fn run(self, tx: mpsc::Sender<PodUpdate>, shutdown: CancellationToken) {
        let (wake_tx, mut wake_rx) = mpsc::unbounded_channel::<()>();
        let watcher = self.watch(wake_tx);
        let mut last_sent: Option<BTreeMap<String, Arc<Pod>>> = None;
        let mut reported: HashMap<String, String> = HashMap::new();
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let scan = self.scan();
            self.report(&scan.errors, &mut reported);
            let previous = last_sent.as_ref();
            // A manifest that did not change is handed over as the same shared pod, which
            // the pod manager skips.
            let snapshot: BTreeMap<String, Arc<Pod>> = scan
                .pods
                .into_iter()
                .map(|p| {
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    let same = previous.and_then(|last| last.get(&uid)).filter(|last| ***last == p);
                    (uid, same.cloned().unwrap_or_else(|| Arc::new(p)))
                })
                .collect();
            if last_sent.as_ref() != Some(&snapshot) {
                let pods = snapshot.values().cloned().collect();
                if tx.send(PodUpdate::Set { source: FILE_SOURCE, pods }).await.is_err() {
                    return;
                }
                last_sent = Some(snapshot);
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
                Some(()) = wake_rx.recv() => {
                    // Let an editor finish writing (several events per save).
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    while wake_rx.try_recv().is_ok() {}
                }
            }
        }
        drop(watcher);
    }

    fn watch(&self, wake: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
        let dir = self.dir.clone();
        let mut w = match notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            // Our own scan opens and reads every manifest: those access events must not
            // wake another scan, or the source rereads the directory forever.
            if res.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
                let _ = wake.send(());
            }
        }) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "inotify unavailable; static pods are re-read every fileCheckFrequency only");
                return None;
            }
        };
        if let Err(e) = w.watch(&dir, notify::RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch static pod directory; re-reading every fileCheckFrequency");
            return None;
        }
        Some(w)
    }

    /// Logs and records each manifest error once per distinct error text.
    fn report(&self, errors: &[ManifestError], reported: &mut HashMap<String, String>) {
        let mut seen = HashMap::new();
        for e in errors {
            let path = match e {
                ManifestError::Read { path, .. }
                | ManifestError::Parse { path, .. }
                | ManifestError::Kind { path, .. }
                | ManifestError::Invalid { path, .. } => path.clone(),
            };
            let text = e.to_string();
            if reported.get(&path) != Some(&text) {
                tracing::error!(error = %text, "skipping static pod manifest");
                self.recorder.record(
                    node_ref(&self.node_name),
                    EventType::Warning,
                    "FailedToCreateStaticPod",
                    text.clone(),
                );
            }
            seen.insert(path, text);
        }
        *reported = seen;
    }

    /// The watched directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::MemoryRecorder;

    const GOOD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: localhost/busybox:latest\n";

    /// The README's demo runs `examples/static-pods`: every one must be accepted.
    #[test]
    fn example_static_pods_are_valid() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/static-pods");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let pod = parse_manifest(&text, &path.to_string_lossy(), "node-1")
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!pod.spec.unwrap().containers.is_empty());
            n += 1;
        }
        assert!(n >= 3, "the examples are there");
    }

    #[test]
    fn yaml_and_json_manifests_and_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), GOOD).unwrap();
        std::fs::write(
            dir.path().join("b.json"),
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"db"},"spec":{"containers":[{"name":"c","image":"x:1"}]}}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("c.yaml"), "apiVersion: v1\nkind: Pod\nmetadata: [unclosed\n").unwrap();
        std::fs::write(dir.path().join("d.yaml"), "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n")
            .unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), GOOD).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let rec = Arc::new(MemoryRecorder::new("node"));
        let src = FileSource::new(dir.path().into(), "node".into(), Duration::from_secs(20), rec.clone());
        let scan = src.scan();
        let names: Vec<_> = scan.pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, vec!["web-node", "db-node"]);
        assert_eq!(scan.errors.len(), 2, "{:?}", scan.errors);
        assert!(matches!(&scan.errors[0], ManifestError::Parse { path, .. } if path.ends_with("c.yaml")));
        assert!(scan.errors[1].to_string().contains("kind \"Deployment\""));
        let mut reported = HashMap::new();
        src.report(&scan.errors, &mut reported);
        src.report(&scan.errors, &mut reported);
        assert_eq!(rec.list().len(), 2, "each error is recorded once");
    }

    #[test]
    fn duplicate_names_keep_the_first() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("1.yaml"), GOOD).unwrap();
        std::fs::write(dir.path().join("2.yaml"), GOOD.replace("name: c", "name: d")).unwrap();
        let src =
            FileSource::new(dir.path().into(), "n".into(), Duration::from_secs(20), Arc::new(MemoryRecorder::new("n")));
        let scan = src.scan();
        assert_eq!(scan.pods.len(), 1);
        assert!(scan.errors[0].to_string().contains("Duplicate"));
    }

    #[tokio::test]
    async fn inotify_delivers_changes_quickly() {
        let dir = tempfile::tempdir().unwrap();
        // A long period: only inotify can deliver the second snapshot in time.
        let src =
            FileSource::new(dir.path().into(), "n".into(), Duration::from_hours(1), Arc::new(MemoryRecorder::new("n")));
        let (tx, mut rx) = mpsc::channel(8);
        let stop = CancellationToken::new();
        let task = tokio::spawn(src.run(tx, stop.clone()));
        let PodUpdate::Set { pods, .. } = rx.recv().await.unwrap();
        assert!(pods.is_empty());
        std::fs::write(dir.path().join("a.yaml"), GOOD).unwrap();
        let PodUpdate::Set { pods, .. } =
            tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
        assert_eq!(pods.len(), 1);
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        let PodUpdate::Set { pods, .. } =
            tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
        assert!(pods.is_empty());
        stop.cancel();
        task.await.unwrap();
    }
}
