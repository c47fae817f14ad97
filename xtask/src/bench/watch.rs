//! The bench's own watch on the pods of its namespace in the test bed's kube-apiserver:
//! what a controller or `kubectl get -w` sees, timed on arrival.
//!
//! A blocking thread ([`PodWatch`]) holds one `GET .../pods?watch=true` (HTTP/1.1 over TLS
//! as the cluster admin, through an `openssl s_client` of its own; chunked, one JSON
//! `WatchEvent` per line), takes `CLOCK_MONOTONIC` as each read of the decrypted stream
//! returns and keeps every event, compacted to what the benches ask about ([`PodEvent`]).
//! A thread rather than a task: xtask runs a current-thread runtime, and a task would
//! timestamp an event only when the bench's other work (a burst of creates, a CRI call)
//! lets it run.
//!
//! The questions are pure functions over the events ([`running_at`], [`exit_seen_at`],
//! [`evicted_at`], ...), each "the first event of this pod after this moment that shows
//! ...", so they are tested without a server.

use std::{
    io::{ErrorKind, Read as _, Write as _},
    os::fd::AsRawFd as _,
    process::{Child, ChildStdout, Command, Stdio},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

use crate::bench::{
    https::{self, ClientTls},
    procfs,
};

/// A watch event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

/// One container of a pod event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerView {
    pub name: String,
    /// The runtime's id, without the `containerd://` prefix.
    pub id: Option<String>,
    pub running: bool,
    pub terminated: bool,
    pub restarts: u32,
}

/// A pod as one watch event showed it, with the event's arrival time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// `CLOCK_MONOTONIC` ns when the bench read the event.
    pub at_ns: u64,
    pub kind: EventKind,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub phase: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    pub containers: Vec<ContainerView>,
}

impl PodEvent {
    pub fn container(&self, name: &str) -> Option<&ContainerView> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// Phase `Running`, not being deleted.
    pub fn is_running(&self) -> bool {
        self.kind != EventKind::Deleted && !self.deleting && self.phase.as_deref() == Some("Running")
    }
}

/// What one line of a watch body is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchLine {
    Pod(Box<PodEvent>),
    /// A `BOOKMARK` with its resourceVersion.
    Bookmark(String),
    /// An `ERROR` event: the `Status` message (`too old resource version`, ...).
    Error(String),
}

fn opt_str(v: &Value) -> Option<String> {
    v.as_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

/// Parses one line of a watch body (a `WatchEvent` of a pod), read at `at_ns`.
pub fn parse_line(line: &str, at_ns: u64) -> Result<WatchLine> {
    let v: Value = serde_json::from_str(line).with_context(|| format!("watch line is not JSON: {line:.200}"))?;
    let object = &v["object"];
    let kind = match v["type"].as_str() {
        Some("ADDED") => EventKind::Added,
        Some("MODIFIED") => EventKind::Modified,
        Some("DELETED") => EventKind::Deleted,
        Some("BOOKMARK") => {
            return Ok(WatchLine::Bookmark(object["metadata"]["resourceVersion"].as_str().unwrap_or("").to_owned()));
        }
        Some("ERROR") => return Ok(WatchLine::Error(object["message"].as_str().unwrap_or("(no message)").to_owned())),
        other => bail!("watch event of type {other:?}: {line:.200}"),
    };
    let meta = &object["metadata"];
    let status = &object["status"];
    let containers = status["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| ContainerView {
            name: c["name"].as_str().unwrap_or_default().to_owned(),
            id: opt_str(&c["containerID"]).map(|s| s.split_once("://").map_or(s.as_str(), |(_, id)| id).to_owned()),
            running: c["state"]["running"].is_object(),
            terminated: c["state"]["terminated"].is_object(),
            restarts: c["restartCount"].as_u64().and_then(|r| u32::try_from(r).ok()).unwrap_or(0),
        })
        .collect();
    Ok(WatchLine::Pod(Box::new(PodEvent {
        at_ns,
        kind,
        name: meta["name"].as_str().context("watch event without metadata.name")?.to_owned(),
        uid: meta["uid"].as_str().unwrap_or_default().to_owned(),
        resource_version: meta["resourceVersion"].as_str().unwrap_or_default().to_owned(),
        phase: opt_str(&status["phase"]),
        reason: opt_str(&status["reason"]),
        message: opt_str(&status["message"]),
        deleting: !meta["deletionTimestamp"].is_null(),
        containers,
    })))
}

// ---------------------------------------------------------------------------------------
// Questions about the events.

/// The first event of pod `name` at or after `after_ns` that shows it Running.
pub fn running_at(events: &[PodEvent], name: &str, after_ns: u64) -> Option<u64> {
    events.iter().find(|e| e.name == name && e.at_ns >= after_ns && e.is_running()).map(|e| e.at_ns)
}

/// The first event of pod `name` at or after `after_ns` in which container `container`
/// no longer runs or its restart count went above `restarts_before`: the kill is visible
/// in the API.
pub fn exit_seen_at(
    events: &[PodEvent],
    name: &str,
    container: &str,
    restarts_before: u32,
    after_ns: u64,
) -> Option<u64> {
    events
        .iter()
        .filter(|e| e.name == name && e.at_ns >= after_ns)
        .find(|e| e.container(container).is_some_and(|c| !c.running || c.restarts > restarts_before))
        .map(|e| e.at_ns)
}

/// Message prefix of an eviction for node pressure (upstream `evictionMessage`).
pub const EVICTED_PREFIX: &str = "The node was low on resource";
/// Message prefix of an admission refusal under pressure (upstream `Admit`).
pub const REJECTED_PREFIX: &str = "The node had condition";

/// The first event of pod `name` that shows it evicted for node pressure (reason
/// `Evicted`, message [`EVICTED_PREFIX`]...).
pub fn evicted_at(events: &[PodEvent], name: &str) -> Option<u64> {
    events
        .iter()
        .find(|e| {
            e.name == name
                && e.reason.as_deref() == Some("Evicted")
                && e.message.as_deref().is_some_and(|m| m.starts_with(EVICTED_PREFIX))
        })
        .map(|e| e.at_ns)
}

/// Whether pod `name` was refused at admission because of node pressure.
pub fn rejected(events: &[PodEvent], name: &str) -> bool {
    events.iter().any(|e| e.name == name && e.message.as_deref().is_some_and(|m| m.starts_with(REJECTED_PREFIX)))
}

/// The last event of pod `name`, if any.
pub fn latest<'a>(events: &'a [PodEvent], name: &str) -> Option<&'a PodEvent> {
    events.iter().rev().find(|e| e.name == name)
}

// ---------------------------------------------------------------------------------------
// The chunked body, incrementally.

/// Decodes a chunked body (RFC 9112 §7.1) as it arrives, in any pieces, into complete
/// lines of its payload.
#[derive(Debug, Default)]
pub struct ChunkedLines {
    /// Raw bytes not decoded yet.
    raw: Vec<u8>,
    /// Payload bytes of the line being completed.
    line: Vec<u8>,
    state: ChunkState,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Expecting a chunk-size line.
    #[default]
    Size,
    /// Inside a chunk, this many payload bytes left.
    Data(usize),
    /// After a chunk's payload, expecting its CRLF.
    DataEnd,
    /// After the last (empty) chunk, expecting trailers and the final empty line.
    Trailers,
    /// The body ended.
    Done,
}

impl ChunkedLines {
    /// Whether the last chunk and its trailers have been read.
    pub fn done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Takes one raw line (through `\n`) off the front of `raw`, without its line ending.
    fn take_line(&mut self) -> Option<String> {
        let end = self.raw.iter().position(|b| *b == b'\n')?;
        let line: Vec<u8> = self.raw.drain(..=end).collect();
        Some(String::from_utf8_lossy(&line).trim_end_matches(['\r', '\n']).to_owned())
    }

    /// Feeds bytes; returns the payload lines completed by them (without `\n`; empty
    /// lines dropped).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<String>> {
        self.raw.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            match self.state {
                ChunkState::Size => {
                    let Some(line) = self.take_line() else { break };
                    let size = line.split(';').next().unwrap_or_default().trim();
                    let size = usize::from_str_radix(size, 16).with_context(|| format!("chunk size {line:?}"))?;
                    self.state = if size == 0 { ChunkState::Trailers } else { ChunkState::Data(size) };
                }
                ChunkState::Data(left) => {
                    if self.raw.is_empty() {
                        break;
                    }
                    let n = left.min(self.raw.len());
                    for b in self.raw.drain(..n) {
                        if b == b'\n' {
                            let line = std::mem::take(&mut self.line);
                            if !line.iter().all(u8::is_ascii_whitespace) {
                                out.push(String::from_utf8_lossy(&line).into_owned());
                            }
                        } else {
                            self.line.push(b);
                        }
                    }
                    self.state = if n == left { ChunkState::DataEnd } else { ChunkState::Data(left - n) };
                }
                ChunkState::DataEnd => {
                    let Some(line) = self.take_line() else { break };
                    ensure!(line.is_empty(), "chunk not followed by CRLF: {line:?}");
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers => {
                    let Some(line) = self.take_line() else { break };
                    if line.is_empty() {
                        self.state = ChunkState::Done;
                    }
                }
                ChunkState::Done => break,
            }
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------
// The watching thread.

/// What the watching thread shares with the bench.
#[derive(Debug, Default)]
struct Shared {
    events: Vec<PodEvent>,
    /// Why the watch stopped, if it failed.
    error: Option<String>,
}

/// A watch on the pods of one namespace, read by its own thread until dropped.
#[derive(Debug)]
pub struct PodWatch {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Where the watch connects and what it asks for.
#[derive(Debug, Clone)]
pub struct WatchTarget {
    /// kube-apiserver's `ip:port`.
    pub host: String,
    /// The client certificate the watch presents and the CA it verifies the server with.
    pub tls: ClientTls,
    pub namespace: String,
}

impl WatchTarget {
    /// The watch request, resuming after `resource_version`.
    pub fn request(&self, resource_version: &str) -> String {
        format!(
            "GET /api/v1/namespaces/{ns}/pods?watch=true&resourceVersion={resource_version}&allowWatchBookmarks=true\
             &timeoutSeconds=3600 HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nUser-Agent: \
             swiftlet-xtask-bench\r\n\r\n",
            ns = self.namespace,
            host = self.host,
        )
    }
}

impl PodWatch {
    /// Starts watching after `resource_version` (from a list), and returns once the server
    /// answered the watch request with 200.
    pub fn start(target: WatchTarget, resource_version: &str) -> Result<Self> {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let thread = {
            let (shared, stop, rv) = (shared.clone(), stop.clone(), resource_version.to_owned());
            std::thread::Builder::new().name("bench-watch".into()).spawn(move || {
                if let Err(e) = watch_loop(&target, rv, &shared, &stop, &ready_tx) {
                    let _ = ready_tx.send(Err(format!("{e:#}")));
                    shared.lock().unwrap_or_else(PoisonError::into_inner).error = Some(format!("{e:#}"));
                }
            })?
        };
        let watch = Self { shared, stop, thread: Some(thread) };
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(watch),
            Ok(Err(e)) => bail!("starting the pod watch: {e}"),
            Err(_) => bail!("the pod watch did not start within 10 s"),
        }
    }

    /// A copy of every event so far; fails if the watch broke.
    pub fn events(&self) -> Result<Vec<PodEvent>> {
        let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = &shared.error {
            bail!("the bench's pod watch failed: {e}");
        }
        Ok(shared.events.clone())
    }

    /// Applies `f` to the events so far without copying them; fails if the watch broke.
    pub fn with_events<T>(&self, f: impl FnOnce(&[PodEvent]) -> T) -> Result<T> {
        let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = &shared.error {
            bail!("the bench's pod watch failed: {e}");
        }
        Ok(f(&shared.events))
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long one blocking read waits before the thread checks whether to stop.
const READ_TIMEOUT: Duration = Duration::from_millis(200);

/// One watch connection: `openssl s_client` holding the TLS connection, its output the
/// decrypted response. Dropping it ends openssl.
struct Connection {
    child: Child,
    stdout: ChildStdout,
}

impl Connection {
    fn open(target: &WatchTarget) -> Result<Self> {
        let mut child = Command::new("openssl")
            .args(https::s_client_args(&target.host, Some(&target.tls)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running openssl s_client (apt package openssl)")?;
        let stdout = child.stdout.take().context("openssl stdout")?;
        Ok(Self { child, stdout })
    }

    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        let stdin = self.child.stdin.as_mut().context("openssl stdin")?;
        stdin.write_all(bytes)?;
        stdin.flush()?;
        Ok(())
    }

    /// Reads what arrives within `timeout`: `Ok(None)` if nothing did, `Ok(Some(0))` at
    /// the end of the connection.
    fn read(&mut self, buf: &mut [u8], timeout: Duration) -> std::io::Result<Option<usize>> {
        let mut fds = libc::pollfd { fd: self.stdout.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one pollfd of a descriptor this connection owns, for the call's length.
        let ready = unsafe { libc::poll(&raw mut fds, 1, ms) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == ErrorKind::Interrupted { Ok(None) } else { Err(e) };
        }
        if ready == 0 {
            return Ok(None);
        }
        self.stdout.read(buf).map(Some)
    }

    /// Ends openssl; returns what it printed on stderr (why a connection failed).
    fn close(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err.trim().to_owned()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects, sends the watch request and reads the response head; returns the decoder
/// primed with whatever body bytes came with the head.
fn open_watch(target: &WatchTarget, resource_version: &str) -> Result<(Connection, ChunkedLines, Vec<String>)> {
    let mut conn = Connection::open(target)?;
    let head = read_head(&mut conn, target, resource_version);
    match head {
        Ok(v) => Ok((conn, v.0, v.1)),
        Err(e) => {
            let why = conn.close();
            Err(e.context(format!("watching through {} (openssl: {why})", target.host)))
        }
    }
}

fn read_head(
    conn: &mut Connection,
    target: &WatchTarget,
    resource_version: &str,
) -> Result<(ChunkedLines, Vec<String>)> {
    conn.send(target.request(resource_version).as_bytes())?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        ensure!(raw.len() < 64 * 1024, "watch response head longer than 64 KiB");
        ensure!(std::time::Instant::now() < deadline, "no answer to the watch request within 10 s");
        let Some(n) = conn.read(&mut buf, READ_TIMEOUT).context("reading the watch response head")? else {
            continue;
        };
        ensure!(n > 0, "the API server closed the watch before answering");
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let (status, headers) = https::parse_head(&head)?;
    let body = &raw[head_end + 4..];
    if status != 200 {
        bail!("watch answered {status}: {}", String::from_utf8_lossy(body));
    }
    ensure!(https::framing(status, &headers)? == https::Framing::Chunked, "the watch response is not chunked: {head}");
    let mut decoder = ChunkedLines::default();
    let lines = decoder.feed(body)?;
    Ok((decoder, lines))
}

fn watch_loop(
    target: &WatchTarget,
    mut resource_version: String,
    shared: &Mutex<Shared>,
    stop: &AtomicBool,
    ready: &std::sync::mpsc::Sender<Result<(), String>>,
) -> Result<()> {
    let mut first = true;
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let (mut conn, mut decoder, mut lines) = open_watch(target, &resource_version)?;
        if first {
            let _ = ready.send(Ok(()));
            first = false;
        }
        let mut at_ns = procfs::monotonic_ns();
        loop {
            for line in lines.drain(..) {
                match parse_line(&line, at_ns)? {
                    WatchLine::Pod(e) => {
                        resource_version.clone_from(&e.resource_version);
                        shared.lock().unwrap_or_else(PoisonError::into_inner).events.push(*e);
                    }
                    WatchLine::Bookmark(rv) => resource_version = rv,
                    WatchLine::Error(message) => bail!("the watch ended with an error: {message}"),
                }
            }
            if stop.load(Ordering::Relaxed) || decoder.done() {
                break;
            }
            match conn.read(&mut buf, READ_TIMEOUT) {
                // Nothing within the timeout: check whether to stop.
                Ok(None) => {}
                // The server ended the watch (its timeout, a restart): resume.
                Ok(Some(0)) => break,
                Ok(Some(n)) => {
                    at_ns = procfs::monotonic_ns();
                    lines = decoder.feed(&buf[..n])?;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("reading the watch"),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNNING: &str = r#"{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1",
        "metadata":{"name":"start-03","namespace":"swiftlet-bench","uid":"u3","resourceVersion":"42"},
        "spec":{"nodeName":"bench"},
        "status":{"phase":"Running","containerStatuses":[
          {"name":"c0","containerID":"containerd://abc","restartCount":1,"state":{"running":{"startedAt":"x"}}},
          {"name":"c1","containerID":"","restartCount":0,"state":{"waiting":{"reason":"ContainerCreating"}}}]}}}"#;

    fn event(at_ns: u64, name: &str, phase: &str, c0: (bool, u32)) -> PodEvent {
        PodEvent {
            at_ns,
            kind: EventKind::Modified,
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: at_ns.to_string(),
            phase: Some(phase.into()),
            reason: None,
            message: None,
            deleting: false,
            containers: vec![ContainerView {
                name: "c0".into(),
                id: Some("id".into()),
                running: c0.0,
                terminated: !c0.0,
                restarts: c0.1,
            }],
        }
    }

    #[test]
    fn parses_a_pod_event() {
        let WatchLine::Pod(e) = parse_line(&RUNNING.replace('\n', ""), 7).unwrap() else { panic!("not a pod") };
        assert_eq!((e.at_ns, e.kind, e.name.as_str(), e.uid.as_str()), (7, EventKind::Modified, "start-03", "u3"));
        assert_eq!(e.resource_version, "42");
        assert!(e.is_running());
        assert_eq!(
            e.container("c0"),
            Some(&ContainerView {
                name: "c0".into(),
                id: Some("abc".into()),
                running: true,
                terminated: false,
                restarts: 1
            })
        );
        assert_eq!(e.container("c1").map(|c| (c.id.clone(), c.running)), Some((None, false)));
    }

    #[test]
    fn parses_deletions_bookmarks_and_errors() {
        let deleted = r#"{"type":"DELETED","object":{"metadata":{"name":"p","uid":"u","resourceVersion":"9",
            "deletionTimestamp":"2026-12-02T10:00:00Z"},"status":{"phase":"Running","reason":"Evicted",
            "message":"The node was low on resource: memory. "}}}"#
            .replace('\n', "");
        let WatchLine::Pod(e) = parse_line(&deleted, 1).unwrap() else { panic!("not a pod") };
        assert!(e.deleting && !e.is_running());
        assert_eq!(e.kind, EventKind::Deleted);
        assert_eq!(
            parse_line(r#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"77"}}}"#, 1)
                .unwrap(),
            WatchLine::Bookmark("77".into())
        );
        assert_eq!(
            parse_line(
                r#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old resource version"}}"#,
                1
            )
            .unwrap(),
            WatchLine::Error("too old resource version".into())
        );
        assert!(parse_line("not json", 1).is_err());
        assert!(parse_line(r#"{"type":"SOMETHING","object":{}}"#, 1).is_err());
    }

    #[test]
    fn running_is_the_first_running_event_after_the_create() {
        let events = [
            event(5, "a", "Running", (true, 0)), // an earlier pod of the same name
            event(10, "a", "Pending", (false, 0)),
            event(12, "b", "Running", (true, 0)),
            event(15, "a", "Running", (true, 0)),
            event(20, "a", "Running", (true, 0)),
        ];
        assert_eq!(running_at(&events, "a", 8), Some(15));
        assert_eq!(running_at(&events, "a", 0), Some(5));
        assert_eq!(running_at(&events, "b", 13), None);
        let mut deleting = event(30, "c", "Running", (true, 0));
        deleting.deleting = true;
        assert_eq!(running_at(&[deleting], "c", 0), None);
    }

    #[test]
    fn an_exit_is_seen_when_the_container_stops_or_restarted() {
        let events = [
            event(10, "a", "Running", (true, 0)),
            event(20, "a", "Running", (true, 0)),
            event(30, "b", "Running", (false, 0)),
            event(40, "a", "Running", (true, 1)),
        ];
        // The restart count went up without a status showing the exit.
        assert_eq!(exit_seen_at(&events, "a", "c0", 0, 15), Some(40));
        assert_eq!(exit_seen_at(&events, "a", "c0", 1, 15), None);
        assert_eq!(exit_seen_at(&events, "b", "c0", 0, 0), Some(30));
        assert_eq!(exit_seen_at(&events, "b", "c1", 0, 0), None);
    }

    #[test]
    fn evictions_and_admission_refusals_are_told_apart() {
        let mut evicted = event(50, "hog-0", "Failed", (false, 0));
        evicted.reason = Some("Evicted".into());
        evicted.message = Some("The node was low on resource: memory. Threshold quantity: 100Mi".into());
        let mut refused = event(60, "hog-1", "Failed", (false, 0));
        refused.reason = Some("Evicted".into());
        refused.message = Some("The node had condition: [MemoryPressure]. ".into());
        let events = [event(40, "hog-0", "Running", (true, 0)), evicted, refused];
        assert_eq!(evicted_at(&events, "hog-0"), Some(50));
        assert_eq!(evicted_at(&events, "hog-1"), None);
        assert!(rejected(&events, "hog-1") && !rejected(&events, "hog-0"));
        assert_eq!(latest(&events, "hog-0").map(|e| e.at_ns), Some(50));
        assert!(latest(&events, "nope").is_none());
    }

    #[test]
    fn chunked_lines_come_out_whole_whatever_the_pieces() {
        let payload = "{\"a\":1}\n{\"b\":2}\n\n{\"c\":3}\n";
        // Chunks that split lines, plus an extension, then the last chunk and a trailer.
        let (p1, rest) = payload.split_at(5);
        let (p2, p3) = rest.split_at(9);
        let wire = format!(
            "{:x};ext=1\r\n{p1}\r\n{:x}\r\n{p2}\r\n{:x}\r\n{p3}\r\n0\r\nx-t: y\r\n\r\n",
            p1.len(),
            p2.len(),
            p3.len()
        );
        for step in [1, 2, 3, 7, wire.len()] {
            let mut d = ChunkedLines::default();
            let mut lines = Vec::new();
            for piece in wire.as_bytes().chunks(step) {
                lines.extend(d.feed(piece).unwrap());
            }
            assert_eq!(lines, ["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"], "pieces of {step}");
            assert!(d.done());
        }
        let mut bad = ChunkedLines::default();
        assert!(bad.feed(b"zz\r\n").is_err());
        let mut no_crlf = ChunkedLines::default();
        assert!(no_crlf.feed(b"2\r\nabX\r\n").is_err());
    }

    #[test]
    fn the_watch_request_resumes_with_bookmarks() {
        let tls = ClientTls { ca: "/ca".into(), cert: "/c".into(), key: "/k".into() };
        let t = WatchTarget { host: "127.0.0.1:6443".into(), tls, namespace: "ns".into() };
        let r = t.request("12");
        assert!(
            r.starts_with(
                "GET /api/v1/namespaces/ns/pods?watch=true&resourceVersion=12&allowWatchBookmarks=true\
                 &timeoutSeconds=3600 HTTP/1.1\r\nHost: 127.0.0.1:6443\r\n"
            ),
            "{r}"
        );
        assert!(!r.contains("Authorization") && r.ends_with("\r\n\r\n"), "{r}");
    }
}
