//! The agent's watch on its own Node object (upstream's node informer and
//! `nodeLister`): the status loop reads the node from it every
//! `nodeStatusUpdateFrequency` instead of asking the API server each time.
//!
//! The watch runs on the main client, not the heartbeat one: the heartbeat client's read
//! timeout (`nodeStatusUpdateFrequency`) would cut a quiet watch every few seconds. A
//! black-holed connection (half-open: nothing moves, nothing closes) is noticed by the
//! heartbeats (the Lease renewal times out, and the agent leaves every connection, as
//! upstream's `closeAllConns`); the watch then starts again on a new connection when the
//! connections' generation moves on, or after [`crate::sources::api::WATCH_SILENCE`]
//! without a word (the API server sends bookmarks about every minute).

use std::sync::{Arc, RwLock};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

use crate::sources::api::WATCH_SILENCE;

/// What the watch has shown of the node.
#[derive(Clone, Debug, Default)]
pub enum Watched {
    /// Not listed yet, or the watch failed and has not listed again: ask the API.
    #[default]
    Unsynced,
    /// Listed, and not there (deleted): confirmed with the API before registering again.
    Absent,
    Present(Box<Node>),
}

/// The shared view the watch writes and the status loop reads.
pub type WatchedNode = Arc<RwLock<Watched>>;

/// Watches the Node `name` (`fieldSelector=metadata.name=<name>`) into `into` until
/// `shutdown`; starts again on a new connection when `connections` moves on or the watch
/// stays silent for [`WATCH_SILENCE`]. The last node seen stays readable meanwhile, as a
/// lister's cache does.
pub async fn run(
    client: kube::Client,
    name: String,
    into: WatchedNode,
    mut connections: tokio::sync::watch::Receiver<u64>,
    shutdown: CancellationToken,
) {
    let api: Api<Node> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let start = || watcher::watcher(api.clone(), cfg.clone()).boxed();
    let mut stream = start();
    let mut listed: Option<Node> = None;
    loop {
        let ev = tokio::select! {
            () = shutdown.cancelled() => return,
            Ok(()) = connections.changed() => {
                tracing::info!("starting the node watch again on a new connection");
                stream = start();
                continue;
            }
            ev = tokio::time::timeout(WATCH_SILENCE, stream.next()) => match ev {
                Ok(Some(ev)) => ev,
                Ok(None) => return,
                Err(_) => {
                    tracing::warn!(silent = ?WATCH_SILENCE, "the node watch heard nothing, not even a bookmark; starting it again");
                    stream = start();
                    continue;
                }
            },
        };
        let next = match ev {
            Ok(watcher::Event::Init) => {
                listed = None;
                continue;
            }
            Ok(watcher::Event::InitApply(n)) => {
                listed = Some(n);
                continue;
            }
            Ok(watcher::Event::InitDone) => listed.take().map_or(Watched::Absent, |n| Watched::Present(Box::new(n))),
            Ok(watcher::Event::Apply(n)) => Watched::Present(Box::new(n)),
            Ok(watcher::Event::Delete(_)) => Watched::Absent,
            Err(e) => {
                // kube-runtime lists again on the next poll; until it has, the status loop
                // reads the API (over the heartbeat client, whose failures count).
                tracing::debug!(error = %e, "node watch failed; the node is read from the API until it lists again");
                *into.write().unwrap() = Watched::Unsynced;
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
                continue;
            }
        };
        *into.write().unwrap() = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// A fake API server for one node: lists answer with it, watches never answer (a
    /// black-holed connection); every request's query is recorded.
    fn black_holing_api(seen: Arc<Mutex<Vec<String>>>) -> kube::Client {
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let seen = seen.clone();
            async move {
                let query = req.uri().query().unwrap_or_default().to_owned();
                seen.lock().unwrap().push(query.clone());
                if query.contains("watch=true") {
                    // Nothing moves, nothing closes.
                    std::future::pending::<()>().await;
                }
                let list = serde_json::json!({
                    "apiVersion": "v1", "kind": "NodeList",
                    "metadata": {"resourceVersion": "7"},
                    "items": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "resourceVersion": "7"}}],
                });
                let body = kube::client::Body::from(list.to_string().into_bytes());
                Ok::<_, std::io::Error>(http::Response::builder().status(200).body(body).unwrap())
            }
        });
        kube::Client::new(service, "default")
    }

    /// The watch lists the node, then hangs on a dead connection; when the agent leaves its
    /// connections (a failed heartbeat), it lists again at once, on the new ones.
    #[tokio::test]
    async fn the_node_watch_lists_the_node_and_starts_again_when_connections_are_left() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let watched = WatchedNode::default();
        let connections = tokio::sync::watch::Sender::new(0_u64);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(
            black_holing_api(seen.clone()),
            "n1".into(),
            watched.clone(),
            connections.subscribe(),
            shutdown.clone(),
        ));
        let lists = || seen.lock().unwrap().iter().filter(|q| !q.contains("watch=true")).count();
        let until = async |what: &str, cond: &dyn Fn() -> bool| {
            tokio::time::timeout(Duration::from_secs(10), async {
                while !cond() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{what}: {:?}", seen.lock().unwrap()));
        };
        until("the node listed and watched", &|| {
            matches!(&*watched.read().unwrap(), Watched::Present(n) if n.metadata.name.as_deref() == Some("n1"))
                && seen.lock().unwrap().iter().any(|q| q.contains("watch=true"))
        })
        .await;
        assert!(seen.lock().unwrap()[0].contains("fieldSelector=metadata.name%3Dn1"), "{:?}", seen.lock().unwrap());
        assert_eq!(lists(), 1);
        connections.send_modify(|g| *g += 1);
        until("listed again after the connections were left", &|| lists() == 2).await;
        assert!(matches!(&*watched.read().unwrap(), Watched::Present(_)), "the cache stays readable");
        shutdown.cancel();
        task.await.unwrap();
    }
}
