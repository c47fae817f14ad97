//! Pods from the API server (`pkg/kubelet/config/apiserver.go`): a watch of the pods
//! bound to this node (`fieldSelector=spec.nodeName=<node>`), through kube-runtime's
//! watcher (relists on 410 Gone and reconnects with back-off). Each change sends the
//! full set as a snapshot, like the file source; the pod manager diffs.
//!
//! Until the first complete listing arrives the source is not "ready", so housekeeping
//! does not mistake the node's API pods for orphans after an agent restart.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::PodUpdate;
use crate::types::pod::{API_SOURCE, CONFIG_SOURCE_ANNOTATION, is_mirror_pod};

fn tag(mut pod: Pod) -> Pod {
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_SOURCE_ANNOTATION.into(), API_SOURCE.into());
    pod
}

/// `pod` without `metadata.managedFields`. The agent never reads them, and every copy
/// of a pod it keeps (the source's, the pod manager's, the pod worker's) would carry
/// them. The upstream kubelet keeps them; the scheduler, the controller-manager and
/// kube-proxy trim them from their informers the same way.
fn strip_managed_fields(mut pod: Pod) -> Pod {
    pod.metadata.managed_fields = None;
    pod
}

/// The longest the pod watch may stay silent: the API server sends a bookmark about
/// every minute to watches that ask for them (the watcher does), so a watch that has
/// heard nothing for longer is on a dead connection and is started again.
pub const WATCH_SILENCE: std::time::Duration = std::time::Duration::from_secs(90);

/// Watches this node's pods until shutdown. The watch starts again (a new connection,
/// a fresh list) after [`WATCH_SILENCE`] without a word, and when `connections` moves on
/// (the agent left every connection after a failed heartbeat, as upstream's
/// `closeAllConns`).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: kube::Client,
    node_name: String,
    tx: mpsc::Sender<PodUpdate>,
    mirrors: crate::mirror::MirrorStore,
    startup: Arc<crate::pod_startup::PodStartupTracker>,
    metrics: Arc<super::metrics::SourceMetrics>,
    mut connections: tokio::sync::watch::Receiver<u64>,
    shutdown: CancellationToken,
) {
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut stream = watcher(api.clone(), cfg.clone()).boxed();
    // Non-mirror pods tagged with their source once, as they arrive, and shared: a watch
    // event replaces one entry, and the snapshot hands the others over as they were (see
    // `PodUpdate`), so an event costs one pod's work, not one per pod on the node.
    let mut pods: BTreeMap<String, Arc<Pod>> = BTreeMap::new();
    let mut init: Option<BTreeMap<String, Arc<Pod>>> = None;
    // Field managers are the API server's business: no part of the agent reads them, and
    // at 500 pods they were kilobytes per pod in every copy (see `strip_managed_fields`).
    let shared = |p: Pod| {
        let p = strip_managed_fields(p);
        Arc::new(if is_mirror_pod(&p) { p } else { tag(p) })
    };
    loop {
        let ev = tokio::select! {
            () = shutdown.cancelled() => return,
            Ok(()) = connections.changed() => {
                tracing::warn!("starting the pod watch again on a new connection");
                stream = watcher(api.clone(), cfg.clone()).boxed();
                continue;
            }
            ev = tokio::time::timeout(WATCH_SILENCE, stream.next()) => {
                let Ok(ev) = ev else {
                    tracing::warn!(silent = ?WATCH_SILENCE, "the pod watch heard nothing, not even a bookmark; starting it again");
                    stream = watcher(api.clone(), cfg.clone()).boxed();
                    continue;
                };
                ev
            }
        };
        let Some(ev) = ev else { return };
        // Whether the snapshot changed, and whether a mirror pod did (the mirror store is
        // rebuilt only then).
        let (changed, mirror_changed) = match ev {
            Ok(watcher::Event::Init) => {
                init = Some(BTreeMap::new());
                (false, false)
            }
            Ok(watcher::Event::InitApply(p)) => {
                if !is_mirror_pod(&p) {
                    startup.observed_on_watch(&p, std::time::SystemTime::now());
                }
                if let (Some(m), Some(uid)) = (init.as_mut(), p.metadata.uid.clone()) {
                    m.insert(uid, shared(p));
                }
                (false, false)
            }
            Ok(watcher::Event::InitDone) => {
                pods = init.take().unwrap_or_default();
                (true, true)
            }
            Ok(watcher::Event::Apply(p)) => {
                let mirror = is_mirror_pod(&p);
                if !mirror {
                    startup.observed_on_watch(&p, std::time::SystemTime::now());
                }
                if let Some(uid) = p.metadata.uid.clone() {
                    pods.insert(uid, shared(p));
                }
                (true, mirror)
            }
            Ok(watcher::Event::Delete(p)) => {
                if let Some(uid) = &p.metadata.uid {
                    pods.remove(uid);
                }
                (true, is_mirror_pod(&p))
            }
            Err(e) => {
                // kube-runtime retries by itself; say so without flooding the log.
                tracing::warn!(error = %e, "pod watch error; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                (false, false)
            }
        };
        if mirror_changed {
            let mirror_pods: BTreeMap<String, Pod> = pods
                .values()
                .filter(|p| is_mirror_pod(p))
                .map(|p| {
                    let k = format!(
                        "{}/{}",
                        p.metadata.namespace.as_deref().unwrap_or_default(),
                        p.metadata.name.as_deref().unwrap_or_default()
                    );
                    (k, Pod::clone(p))
                })
                .collect();
            metrics.mirror_pods.set(i64::try_from(mirror_pods.len()).unwrap_or(i64::MAX));
            *mirrors.write().unwrap() = mirror_pods;
        }
        if changed {
            let snapshot: Vec<Arc<Pod>> = pods.values().filter(|p| !is_mirror_pod(p)).cloned().collect();
            if tx.send(PodUpdate::Set { source: API_SOURCE, pods: snapshot }).await.is_err() {
                return;
            }
        }
    }
}
