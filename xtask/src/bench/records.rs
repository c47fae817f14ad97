//! The agent's benchmark records, from its node-local event API
//! (`proto/swiftlet/events/v1/events.proto`, `--event-api-socket`): a `Watch` that names
//! the record kinds `PLEG_EVENT_DISPATCHED`, `POD_STATUS_COMPUTED` and `EVICTION_DECIDED`
//! (the agent sends them to no other watcher). [`RecordStream`] collects them in the
//! background from the moment it is connected; every time in them is `CLOCK_MONOTONIC`
//! nanoseconds, as the bench's own.
//!
//! The messages are written by hand with `#[derive(prost::Message)]`, as in `crate::cri`
//! (xtask builds before `protoc` is installed); only the fields the bench reads are
//! declared (protobuf skips the others on decode).

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use anyhow::{Context as _, Result, bail};
use tonic::{Request, codegen::http::uri::PathAndQuery};

/// `PLEG_EVENT_DISPATCHED`: a PLEG event reached the pod worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    /// `CLOCK_MONOTONIC` ns when the event reached the pod worker.
    pub mono_ns: u64,
    /// When the kernel saw the change; 0 for events found by a relist.
    pub kernel_ns: u64,
    pub uid: String,
    /// The container (or sandbox) id.
    pub id: String,
    /// `ContainerDied`, `ContainerStarted`, ...
    pub kind: String,
}

/// A container's state in a `POD_STATUS_COMPUTED` record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    Terminated,
    Waiting,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSummary {
    pub name: String,
    pub state: State,
    pub restarts: u32,
}

/// `POD_STATUS_COMPUTED`: the pod worker computed the pod's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusUpdate {
    pub mono_ns: u64,
    pub uid: String,
    pub containers: Vec<ContainerSummary>,
}

impl StatusUpdate {
    pub fn container(&self, name: &str) -> Option<&ContainerSummary> {
        self.containers.iter().find(|c| c.name == name)
    }
}

/// `EVICTION_DECIDED`: the eviction manager chose a pod to evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionDecision {
    /// `CLOCK_MONOTONIC` ns of the decision.
    pub mono_ns: u64,
    /// When the pass that decided started.
    pub pass_mono_ns: u64,
    /// When the kernel signal that started the pass reached the agent; 0 for the
    /// periodic pass.
    pub signal_mono_ns: u64,
    /// `periodic`, or the signal's source (`memcg_threshold`, `psi`, `ebpf_reclaim`, ...).
    pub trigger: String,
    /// The evicted pod.
    pub uid: String,
    pub eviction_signal: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Dispatch(Dispatch),
    Status(StatusUpdate),
    Eviction(EvictionDecision),
}

/// `swiftlet.events.v1.EventKind` values of the records.
const PLEG_EVENT_DISPATCHED: i32 = 8;
const POD_STATUS_COMPUTED: i32 = 9;
const EVICTION_DECIDED: i32 = 10;

#[derive(Clone, PartialEq, prost::Message)]
struct WatchRequest {
    #[prost(enumeration = "i32", repeated, tag = "4")]
    kinds: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WireEvent {
    #[prost(string, tag = "1")]
    pod_uid: String,
    #[prost(string, tag = "4")]
    container_id: String,
    #[prost(int32, tag = "6")]
    kind: i32,
    #[prost(uint64, tag = "7")]
    kernel_time_ns: u64,
    #[prost(uint64, tag = "13")]
    agent_time_ns: u64,
    #[prost(string, tag = "14")]
    pleg_event: String,
    #[prost(message, repeated, tag = "15")]
    containers: Vec<WireContainer>,
    #[prost(message, optional, tag = "16")]
    eviction: Option<WireEviction>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WireContainer {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    state: String,
    #[prost(uint32, tag = "3")]
    restart_count: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WireEviction {
    #[prost(string, tag = "1")]
    eviction_signal: String,
    #[prost(string, tag = "2")]
    trigger: String,
    #[prost(uint64, tag = "3")]
    pass_time_ns: u64,
    #[prost(uint64, tag = "4")]
    signal_time_ns: u64,
}

/// The record one event is, if it is one (and well formed).
fn record_of(ev: WireEvent) -> Option<Record> {
    match ev.kind {
        PLEG_EVENT_DISPATCHED => Some(Record::Dispatch(Dispatch {
            mono_ns: ev.agent_time_ns,
            kernel_ns: ev.kernel_time_ns,
            uid: ev.pod_uid,
            id: ev.container_id,
            kind: ev.pleg_event,
        })),
        POD_STATUS_COMPUTED => Some(Record::Status(StatusUpdate {
            mono_ns: ev.agent_time_ns,
            uid: ev.pod_uid,
            containers: ev
                .containers
                .into_iter()
                .map(|c| {
                    let state = match c.state.as_str() {
                        "running" => State::Running,
                        "terminated" => State::Terminated,
                        "waiting" => State::Waiting,
                        _ => return None,
                    };
                    Some(ContainerSummary { name: c.name, state, restarts: c.restart_count })
                })
                .collect::<Option<_>>()?,
        })),
        EVICTION_DECIDED => {
            let d = ev.eviction?;
            Some(Record::Eviction(EvictionDecision {
                mono_ns: ev.agent_time_ns,
                pass_mono_ns: d.pass_time_ns,
                signal_mono_ns: d.signal_time_ns,
                trigger: d.trigger,
                uid: ev.pod_uid,
                eviction_signal: d.eviction_signal,
            }))
        }
        _ => None,
    }
}

/// What the background reader has collected.
#[derive(Debug, Default)]
struct Collected {
    records: Vec<Record>,
    /// Why the stream ended, if it did (the agent stopped, or dropped records because
    /// the bench read too slowly): the figures would miss records.
    ended: Option<String>,
}

/// The records of one agent, collected in the background from the moment of
/// [`RecordStream::connect`].
#[derive(Debug)]
pub struct RecordStream {
    collected: Arc<Mutex<Collected>>,
    /// How many records [`RecordStream::poll`] has returned.
    polled: usize,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for RecordStream {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl RecordStream {
    /// Watches the record kinds on the agent's event API socket.
    pub async fn connect(socket: &Path) -> Result<Self> {
        let channel = crate::cri::unix_channel(socket, "http://events.invalid")
            .await
            .with_context(|| format!("connecting to the event API at {}", socket.display()))?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.context("event API channel")?;
        let request =
            Request::new(WatchRequest { kinds: vec![PLEG_EVENT_DISPATCHED, POD_STATUS_COMPUTED, EVICTION_DECIDED] });
        let mut stream = grpc
            .server_streaming(
                request,
                PathAndQuery::from_static("/swiftlet.events.v1.NodeEvents/Watch"),
                tonic_prost::ProstCodec::<WatchRequest, WireEvent>::default(),
            )
            .await
            .with_context(|| format!("Watch on the event API at {}", socket.display()))?
            .into_inner();
        let collected = Arc::new(Mutex::new(Collected::default()));
        let sink = collected.clone();
        let reader = tokio::spawn(async move {
            let ended = loop {
                match stream.message().await {
                    Ok(Some(ev)) => {
                        if let Some(r) = record_of(ev) {
                            sink.lock().expect("records lock").records.push(r);
                        }
                    }
                    Ok(None) => break "the agent ended the stream".to_owned(),
                    Err(status) => break format!("{}: {}", status.code(), status.message()),
                }
            };
            sink.lock().expect("records lock").ended = Some(ended);
        });
        Ok(Self { collected, polled: 0, reader })
    }

    /// The records that came since the last call; an error once the stream has ended.
    pub fn poll(&mut self) -> Result<Vec<Record>> {
        let c = self.collected.lock().expect("records lock");
        if let Some(why) = &c.ended {
            bail!("the event API's record stream ended: {why}");
        }
        let new = c.records[self.polled..].to_vec();
        self.polled = c.records.len();
        Ok(new)
    }

    /// Every record since the stream was connected.
    pub fn all(&self) -> Result<Vec<Record>> {
        let c = self.collected.lock().expect("records lock");
        if let Some(why) = &c.ended {
            bail!("the event API's record stream ended: {why}");
        }
        Ok(c.records.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: i32) -> WireEvent {
        WireEvent { pod_uid: "3f2a".into(), kind, agent_time_ns: 1000, ..WireEvent::default() }
    }

    #[test]
    fn a_dispatch_record() {
        let ev = WireEvent {
            kernel_time_ns: 900,
            container_id: "0123abcd".into(),
            pleg_event: "ContainerDied".into(),
            ..event(PLEG_EVENT_DISPATCHED)
        };
        assert_eq!(
            record_of(ev),
            Some(Record::Dispatch(Dispatch {
                mono_ns: 1000,
                kernel_ns: 900,
                uid: "3f2a".into(),
                id: "0123abcd".into(),
                kind: "ContainerDied".into(),
            }))
        );
    }

    #[test]
    fn a_status_record_with_its_containers() {
        let c = |name: &str, state: &str, restart_count| WireContainer {
            name: name.into(),
            state: state.into(),
            restart_count,
        };
        let ev = WireEvent {
            containers: vec![c("c0", "running", 0), c("c1", "terminated", 1), c("c-2", "waiting", 3)],
            ..event(POD_STATUS_COMPUTED)
        };
        let Some(Record::Status(s)) = record_of(ev) else { panic!("not a status record") };
        assert_eq!((s.mono_ns, s.uid.as_str()), (1000, "3f2a"));
        assert_eq!(
            s.container("c1"),
            Some(&ContainerSummary { name: "c1".into(), state: State::Terminated, restarts: 1 })
        );
        assert_eq!(s.container("c-2").map(|c| (c.state, c.restarts)), Some((State::Waiting, 3)));
        assert_eq!(s.container("c0").map(|c| c.state), Some(State::Running));
        let Some(Record::Status(empty)) = record_of(event(POD_STATUS_COMPUTED)) else { panic!() };
        assert!(empty.containers.is_empty());
        let odd = WireEvent { containers: vec![c("c0", "sleeping", 0)], ..event(POD_STATUS_COMPUTED) };
        assert_eq!(record_of(odd), None, "an unknown state is not a record");
    }

    #[test]
    fn an_eviction_record() {
        let ev = WireEvent {
            eviction: Some(WireEviction {
                eviction_signal: "allocatableMemory.available".into(),
                trigger: "memcg_threshold".into(),
                pass_time_ns: 800,
                signal_time_ns: 700,
            }),
            ..event(EVICTION_DECIDED)
        };
        assert_eq!(
            record_of(ev),
            Some(Record::Eviction(EvictionDecision {
                mono_ns: 1000,
                pass_mono_ns: 800,
                signal_mono_ns: 700,
                trigger: "memcg_threshold".into(),
                uid: "3f2a".into(),
                eviction_signal: "allocatableMemory.available".into(),
            }))
        );
        assert_eq!(record_of(event(EVICTION_DECIDED)), None, "an eviction record without its decision");
    }

    #[test]
    fn other_kinds_are_not_records() {
        for kind in 0..8 {
            assert_eq!(record_of(event(kind)), None, "kind {kind}");
        }
    }

    /// The hand-written messages decode what the agent's generated ones encode.
    #[test]
    fn the_wire_format_matches_the_agents_proto() {
        use prost::Message as _;
        let sent = WireEvent {
            containers: vec![WireContainer { name: "c0".into(), state: "running".into(), restart_count: 2 }],
            ..event(POD_STATUS_COMPUTED)
        };
        let got = WireEvent::decode(sent.encode_to_vec().as_slice()).unwrap();
        assert_eq!(got, sent);
    }
}
