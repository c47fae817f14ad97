//! Watch: newline-delimited JSON `WatchEvent`s over a chunked response, as the real
//! server's watch cache serves them (`cacher.go`, `cache_watcher.go`):
//!
//! - without a resourceVersion (or with "0", or with `sendInitialEvents=true`) the watch
//!   starts with a synthetic ADDED per existing object; with `sendInitialEvents` it is
//!   followed by a BOOKMARK annotated `k8s.io/initial-events-end`;
//! - with a resourceVersion, every later event of the resource history is replayed; one
//!   older than the history is answered with an ERROR event carrying 410 Expired
//!   ("too old resource version"), and one newer than the server's with 504;
//! - selectors apply to the old and new state of each change: an object that stops
//!   matching is sent as DELETED (its previous state at the event's resourceVersion), one
//!   that starts matching as ADDED;
//! - with `allowWatchBookmarks`, a BOOKMARK with the current resourceVersion every
//!   bookmark interval (the real server's is one minute);
//! - the watch ends after `timeoutSeconds` (default: random 30–60 min, as
//!   `--min-request-timeout`), when the client goes away, when the server stops, or when
//!   the client falls too far behind (the real server drops unresponsive watchers too).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::registry::matches;
use super::resources::ResourceInfo;
use super::selector::{FieldSelector, LabelSelector};
use super::status::StatusError;
use super::store::{EventType, Store, StoredEvent};
use super::views;

/// The parameters of one watch request.
#[derive(Debug)]
pub(crate) struct WatchParams {
    pub info: &'static ResourceInfo,
    pub namespace: Option<String>,
    pub label: LabelSelector,
    pub field: FieldSelector,
    pub resource_version: Option<String>,
    pub allow_bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Duration,
    pub bookmark_interval: Duration,
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut s = json!({ "type": kind, "object": object }).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn bookmark(info: &ResourceInfo, rv: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({ "resourceVersion": rv.to_string(), "creationTimestamp": null });
    if initial_end {
        metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    line("BOOKMARK", &json!({ "kind": info.kind, "apiVersion": info.api_version(), "metadata": metadata }))
}

/// What a stored event looks like to this watcher, if it sees it at all.
fn convert(p: &WatchParams, ev: &StoredEvent) -> Option<Bytes> {
    if ev.storage != p.info.storage {
        return None;
    }
    let ns = p.namespace.as_deref();
    let cur = ev.kind != EventType::Deleted && matches(p.info, &ev.object, ns, &p.label, &p.field);
    let old = ev.prev.as_deref().is_some_and(|prev| matches(p.info, prev, ns, &p.label, &p.field));
    match (cur, old) {
        (true, false) => Some(line("ADDED", &views::to_view(p.info, &ev.object))),
        (true, true) => Some(line("MODIFIED", &views::to_view(p.info, &ev.object))),
        (false, true) => {
            let mut last = if ev.kind == EventType::Deleted {
                (*ev.object).clone()
            } else {
                ev.prev.as_deref().cloned().unwrap_or(Value::Null)
            };
            super::meta::meta_mut(&mut last).insert("resourceVersion".into(), json!(ev.rv.to_string()));
            Some(line("DELETED", &views::to_view(p.info, &last)))
        }
        (false, false) => None,
    }
}

/// Starts a watch: validates it, takes the initial state and the subscription atomically,
/// and returns the streaming body.
pub(crate) fn start(store: Arc<Store>, p: WatchParams, cancel: CancellationToken) -> Result<Body, StatusError> {
    if p.send_initial_events && !p.allow_bookmarks {
        return Err(StatusError::invalid(
            "ListOptions",
            "meta.k8s.io",
            "",
            &[super::status::FieldError::forbidden(
                "allowWatchBookmarks",
                "allowWatchBookmarks must be true when sendInitialEvents is set",
            )],
        ));
    }
    let requested = match p.resource_version.as_deref() {
        None | Some("" | "0") => None,
        Some(r) => {
            Some(r.parse::<u64>().map_err(|_| StatusError::bad_request(format!("invalid resource version: {r}")))?)
        }
    };
    let mut first: Vec<Bytes> = Vec::new();
    let mut end_after_first = false;
    let (rx, start_rv) = {
        let d = store.lock();
        let current = d.rv();
        let rx = d.subscribe();
        if p.send_initial_events || requested.is_none() {
            for o in d.iter(p.info.storage, p.namespace.as_deref()) {
                if matches(p.info, o, p.namespace.as_deref(), &p.label, &p.field) {
                    first.push(line("ADDED", &views::to_view(p.info, o)));
                }
            }
            if p.send_initial_events {
                first.push(bookmark(p.info, current, true));
            }
        } else if let Some(n) = requested {
            if n > current {
                first.push(line("ERROR", &StatusError::too_large_resource_version(n, current).to_status()));
                end_after_first = true;
            } else {
                match d.events_since(p.info.storage, n) {
                    Ok(events) => first.extend(events.iter().filter_map(|e| convert(&p, e))),
                    Err(e) => {
                        first.push(line("ERROR", &e.to_status()));
                        end_after_first = true;
                    }
                }
            }
        }
        (rx, current)
    };
    let (tx, body_rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(run(store, p, rx, start_rv, first, end_after_first, tx, cancel));
    Ok(Body::from_stream(ReceiverStream::new(body_rx)))
}

#[expect(clippy::too_many_arguments, reason = "the state of one watcher, handed over once")]
async fn run(
    store: Arc<Store>,
    p: WatchParams,
    mut rx: broadcast::Receiver<Arc<StoredEvent>>,
    start_rv: u64,
    first: Vec<Bytes>,
    end_after_first: bool,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
    cancel: CancellationToken,
) {
    for b in first {
        if tx.send(Ok(b)).await.is_err() {
            return;
        }
    }
    if end_after_first {
        return;
    }
    let deadline = tokio::time::sleep(p.timeout);
    tokio::pin!(deadline);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + p.bookmark_interval, p.bookmark_interval);
    loop {
        let out: Vec<Bytes> = tokio::select! {
            () = cancel.cancelled() => return,
            () = tx.closed() => return,
            () = &mut deadline => return,
            _ = ticker.tick(), if p.allow_bookmarks => {
                // Everything committed up to `rv` is already in the channel (events are
                // sent under the lock): deliver it first, then the bookmark.
                let (rv, pending) = {
                    let d = store.lock();
                    let mut pending = Vec::new();
                    loop {
                        match rx.try_recv() {
                            Ok(e) => pending.push(e),
                            Err(broadcast::error::TryRecvError::Lagged(_)) => return,
                            Err(_) => break,
                        }
                    }
                    (d.rv(), pending)
                };
                let mut out: Vec<Bytes> =
                    pending.iter().filter(|e| e.rv > start_rv).filter_map(|e| convert(&p, e)).collect();
                out.push(bookmark(p.info, rv, false));
                out
            }
            ev = rx.recv() => match ev {
                Ok(e) if e.rv > start_rv => convert(&p, &e).into_iter().collect(),
                Ok(_) => Vec::new(),
                // Too slow a consumer, or the store is gone: end the watch; the client resumes.
                Err(_) => return,
            },
        };
        for b in out {
            if tx.send(Ok(b)).await.is_err() {
                return;
            }
        }
    }
}
