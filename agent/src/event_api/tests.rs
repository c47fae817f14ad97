//! End-to-end tests of the event API: a real tonic server and client over a unix socket
//! in a temporary directory.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use super::proto::node_events_client::NodeEventsClient;
use super::*;

/// Generous: only reached when a test is broken, never on the happy path.
const TIMEOUT: Duration = Duration::from_secs(10);

struct Harness {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    bus: EventBus,
    shutdown: CancellationToken,
    server: JoinHandle<Result<()>>,
}

impl Harness {
    async fn start(capacity: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // A parent that does not exist yet: the server creates it.
        let socket = dir.path().join("swiftlet").join("events.sock");
        Self::start_at(dir, socket, capacity).await
    }

    async fn start_at(dir: tempfile::TempDir, socket: PathBuf, capacity: usize) -> Self {
        let bus = EventBus::new(capacity);
        let bound = EventApiServer::new(socket.clone(), bus.clone()).bind().await.unwrap();
        assert_eq!(bound.socket(), socket);
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(bound.run(shutdown.clone()));
        Self { _dir: dir, socket, bus, shutdown, server }
    }

    async fn client(&self) -> NodeEventsClient<Channel> {
        client::connect(&self.socket).await.unwrap()
    }

    async fn watch(&self, req: proto::WatchRequest) -> Streaming<proto::NodeEvent> {
        self.client().await.watch(req).await.unwrap().into_inner()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(TIMEOUT, self.server).await.expect("server did not stop").unwrap().unwrap();
        assert!(!self.socket.exists(), "socket file left behind");
    }
}

fn ev(ns: &str, name: &str, kind: NodeEventKind) -> NodeEvent {
    NodeEvent {
        pod_uid: format!("uid-{ns}-{name}"),
        pod_namespace: ns.into(),
        pod_name: name.into(),
        container_name: "app".into(),
        ..NodeEvent::new(kind)
    }
}

fn namespaces(ns: &[&str]) -> proto::WatchRequest {
    proto::WatchRequest { namespaces: ns.iter().map(ToString::to_string).collect(), ..Default::default() }
}

async fn next(stream: &mut Streaming<proto::NodeEvent>) -> proto::NodeEvent {
    tokio::time::timeout(TIMEOUT, stream.message()).await.expect("no event in time").unwrap().expect("stream ended")
}

async fn end_status(stream: &mut Streaming<proto::NodeEvent>) -> tonic::Status {
    tokio::time::timeout(TIMEOUT, stream.message()).await.expect("stream did not end in time").unwrap_err()
}

/// Polls (the subscription is dropped by the server's connection task, not by us).
async fn wait_for_subscribers(bus: &EventBus, n: usize) {
    tokio::time::timeout(TIMEOUT, async {
        while bus.subscriber_count() != n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} subscribers, want {n}", bus.subscriber_count()));
}

#[test]
fn default_socket_is_under_the_root_dir() {
    assert_eq!(default_socket(Path::new("/var/lib/kubelet")), Path::new("/var/lib/kubelet/swiftlet/events.sock"));
}

#[tokio::test]
async fn namespace_filter_delivers_only_matching_events_in_order() {
    let h = Harness::start(DEFAULT_CAPACITY).await;
    let mut stream = h.watch(namespaces(&["team-a"])).await;

    h.bus.publish(ev("team-a", "web", NodeEventKind::ContainerStarted));
    h.bus.publish(ev("team-b", "db", NodeEventKind::ContainerStarted));
    h.bus.publish(NodeEvent::new(NodeEventKind::MemoryPressure));
    h.bus.publish(NodeEvent { exit_code: Some(1), ..ev("team-a", "web", NodeEventKind::ContainerDied) });
    h.bus.publish(ev("team-b", "db", NodeEventKind::ContainerDied));
    h.bus.publish(ev("team-a", "job", NodeEventKind::ContainerStarted));

    let got: Vec<_> = [next(&mut stream).await, next(&mut stream).await, next(&mut stream).await]
        .into_iter()
        .map(|e| (e.pod_namespace.clone(), e.pod_name.clone(), e.kind(), e.exit_code))
        .collect();
    assert_eq!(
        got,
        [
            ("team-a".into(), "web".into(), proto::EventKind::ContainerStarted, None),
            ("team-a".into(), "web".into(), proto::EventKind::ContainerDied, Some(1)),
            ("team-a".into(), "job".into(), proto::EventKind::ContainerStarted, None),
        ]
    );
    h.stop().await;
}

#[tokio::test]
async fn two_clients_each_get_their_own_filter() {
    let h = Harness::start(DEFAULT_CAPACITY).await;
    let mut a = h.watch(namespaces(&["team-a"])).await;
    let mut died = h
        .watch(proto::WatchRequest { kinds: vec![proto::EventKind::ContainerDied.into()], ..Default::default() })
        .await;

    h.bus.publish(ev("team-a", "web", NodeEventKind::ContainerStarted));
    h.bus.publish(ev("team-b", "db", NodeEventKind::ContainerDied));
    h.bus.publish(ev("team-a", "web", NodeEventKind::ContainerDied));

    assert_eq!(next(&mut a).await.kind(), proto::EventKind::ContainerStarted);
    assert_eq!(next(&mut a).await.kind(), proto::EventKind::ContainerDied);
    assert_eq!(next(&mut died).await.pod_namespace, "team-b");
    assert_eq!(next(&mut died).await.pod_namespace, "team-a");
    h.stop().await;
}

#[tokio::test]
async fn a_client_that_disconnects_does_not_break_the_others() {
    let h = Harness::start(DEFAULT_CAPACITY).await;
    let gone = h.watch(proto::WatchRequest::default()).await;
    let mut stays = h.watch(proto::WatchRequest::default()).await;
    wait_for_subscribers(&h.bus, 2).await;

    drop(gone);
    wait_for_subscribers(&h.bus, 1).await;

    h.bus.publish(ev("ns", "web", NodeEventKind::CgroupCreated));
    assert_eq!(next(&mut stays).await.kind(), proto::EventKind::CgroupCreated);
    h.stop().await;
}

#[tokio::test]
async fn shutdown_ends_streams_and_removes_the_socket() {
    let h = Harness::start(DEFAULT_CAPACITY).await;
    let mut stream = h.watch(proto::WatchRequest::default()).await;
    let socket = h.socket.clone();

    h.shutdown.cancel();
    assert_eq!(end_status(&mut stream).await.code(), Code::Unavailable);
    h.stop().await;
    assert!(client::connect(&socket).await.is_err(), "still accepting after shutdown");
}

#[tokio::test]
async fn socket_is_group_accessible_only() {
    let h = Harness::start(DEFAULT_CAPACITY).await;
    let mode = std::fs::metadata(&h.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "{mode:o}");
    h.stop().await;
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("events.sock");
    // What a crashed agent leaves behind: the file, with nobody listening.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());

    let h = Harness::start_at(dir, socket, DEFAULT_CAPACITY).await;
    let mut stream = h.watch(proto::WatchRequest::default()).await;
    h.bus.publish(ev("ns", "web", NodeEventKind::ContainerStarted));
    assert_eq!(next(&mut stream).await.pod_name, "web");
    h.stop().await;
}

#[tokio::test]
async fn a_live_socket_is_not_taken_over() {
    let h = Harness::start(DEFAULT_CAPACITY).await;
    let err = EventApiServer::new(h.socket.clone(), EventBus::default()).bind().await.unwrap_err();
    assert!(matches!(err, Error::InUse { .. }), "{err:?}");
    assert!(err.to_string().contains(&h.socket.display().to_string()), "{err}");

    // The first server is unharmed.
    let mut stream = h.watch(proto::WatchRequest::default()).await;
    h.bus.publish(ev("ns", "web", NodeEventKind::ContainerStarted));
    assert_eq!(next(&mut stream).await.pod_name, "web");
    h.stop().await;
}

#[tokio::test]
async fn a_path_that_is_not_a_socket_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.sock");
    std::fs::write(&path, "precious").unwrap();

    let err = EventApiServer::new(path.clone(), EventBus::default()).bind().await.unwrap_err();
    assert!(matches!(err, Error::NotASocket { .. }), "{err:?}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
}

#[tokio::test]
async fn a_bad_filter_is_rejected() {
    let h = Harness::start(DEFAULT_CAPACITY).await;
    let status = h
        .client()
        .await
        .watch(proto::WatchRequest { kinds: vec![proto::EventKind::Unspecified.into()], ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    h.stop().await;
}

// The default (current-thread) runtime makes the lag exact: the server's stream cannot
// run while the test publishes, so the client falls behind by precisely 100 - 4 events.
#[tokio::test]
async fn a_lagging_client_is_cut_off_and_counted() {
    let h = Harness::start(4).await;
    let mut slow = h.watch(proto::WatchRequest::default()).await;

    for i in 0..100 {
        h.bus.publish(ev("ns", &format!("pod-{i}"), NodeEventKind::ContainerStarted));
    }

    let status = end_status(&mut slow).await;
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "client too slow, 96 events dropped");
    assert_eq!(h.bus.dropped_total(), 96);
    // The stream is over, not resumed.
    assert!(tokio::time::timeout(TIMEOUT, slow.message()).await.unwrap().unwrap().is_none());

    // The agent and the other clients carry on.
    let mut fresh = h.watch(proto::WatchRequest::default()).await;
    h.bus.publish(ev("ns", "after", NodeEventKind::ContainerStarted));
    assert_eq!(next(&mut fresh).await.pod_name, "after");
    h.stop().await;
}

#[tokio::test]
async fn a_client_that_stopped_reading_does_not_hold_up_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("events.sock");
    let bus = EventBus::default();
    let bound = EventApiServer::new(socket.clone(), bus.clone())
        .with_shutdown_grace(Duration::from_millis(100))
        .bind()
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(bound.run(shutdown.clone()));

    // Never read: large events fill the HTTP/2 flow-control windows (hyper's client
    // defaults: 2 MiB per stream, 5 MiB per connection), after which the server cannot
    // even send the stream's final status.
    let _stuck = client::connect(&socket).await.unwrap().watch(proto::WatchRequest::default()).await.unwrap();
    for _ in 0..100 {
        bus.publish(NodeEvent { message: "x".repeat(64 * 1024), ..NodeEvent::new(NodeEventKind::MemoryPressure) });
    }
    // Let the server fill the windows. Too short a wait only makes the test pass without
    // testing the grace period; it cannot make it fail.
    tokio::time::sleep(Duration::from_millis(50)).await;

    shutdown.cancel();
    tokio::time::timeout(TIMEOUT, server).await.expect("shutdown waited for the stuck client").unwrap().unwrap();
    assert!(!socket.exists());
}
