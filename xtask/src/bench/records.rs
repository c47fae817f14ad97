//! The agent's benchmark records, read from its log (tracing's default text format,
//! `RUST_LOG=pleg_dispatch=debug,pod_status=debug`):
//!
//! ```text
//! 2026-11-30T18:00:00.000001Z DEBUG pleg_dispatch: dispatched mono_ns=.. kernel_ns=.. uid=.. id=.. kind=ContainerDied
//! 2026-11-30T18:00:00.000002Z DEBUG pod_worker{..}: pod_status: updated mono_ns=.. uid=.. containers=c0:running:0,c1:terminated:1
//! 2026-11-30T18:00:00.000003Z DEBUG eviction: eviction_decision: decided mono_ns=.. pass_mono_ns=.. signal_mono_ns=.. trigger=memcg_threshold uid=.. eviction_signal=allocatableMemory.available
//! ```
//!
//! Only `target: message` and the `key=value` fields after it are read; timestamps, levels
//! and span contexts are ignored, and colour codes are stripped should a terminal ever
//! have been the writer.

use std::{
    fs::File,
    io::{Read as _, Seek as _, SeekFrom},
    path::Path,
};

use anyhow::{Context as _, Result};

/// `pleg_dispatch: dispatched`: a PLEG event reached the pod worker.
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

/// A container's state in a `pod_status: updated` record.
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

/// `pod_status: updated`: the pod worker computed the pod's status.
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

/// `eviction_decision: decided`: the eviction manager chose a pod to evict.
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

const DISPATCH: &str = "pleg_dispatch: dispatched";
const STATUS: &str = "pod_status: updated";
const EVICTION: &str = "eviction_decision: decided";

/// Removes ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(line: &str) -> std::borrow::Cow<'_, str> {
    if !line.contains('\x1b') {
        return line.into();
    }
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// The `key=value` fields after `marker` (which must be followed by a space or the end
/// of the line), or `None` when the line is not that record.
fn fields_after<'a>(line: &'a str, marker: &str) -> Option<Vec<(&'a str, &'a str)>> {
    let start = line.find(marker)? + marker.len();
    let rest = &line[start..];
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    Some(rest.split_whitespace().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k, v.trim_matches('"'))).collect())
}

fn field<'a>(fields: &[(&'a str, &'a str)], key: &str) -> Option<&'a str> {
    fields.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// `name:state:restarts,...` (empty for a pod without container statuses).
fn parse_containers(s: &str) -> Option<Vec<ContainerSummary>> {
    s.split(',')
        .filter(|c| !c.is_empty())
        .map(|c| {
            let mut parts = c.rsplitn(3, ':');
            let restarts = parts.next()?.parse().ok()?;
            let state = match parts.next()? {
                "running" => State::Running,
                "terminated" => State::Terminated,
                "waiting" => State::Waiting,
                _ => return None,
            };
            let name = parts.next()?.to_owned();
            Some(ContainerSummary { name, state, restarts })
        })
        .collect()
}

/// The record on one log line, if it is one (and well formed).
pub fn parse_line(line: &str) -> Option<Record> {
    // Cheap filter on the target names (colour codes may split `target: message`).
    if !line.contains("pleg_dispatch") && !line.contains("pod_status") && !line.contains("eviction_decision") {
        return None;
    }
    let line = strip_ansi(line);
    if let Some(f) = fields_after(&line, EVICTION) {
        return Some(Record::Eviction(EvictionDecision {
            mono_ns: field(&f, "mono_ns")?.parse().ok()?,
            pass_mono_ns: field(&f, "pass_mono_ns")?.parse().ok()?,
            signal_mono_ns: field(&f, "signal_mono_ns")?.parse().ok()?,
            trigger: field(&f, "trigger")?.to_owned(),
            uid: field(&f, "uid")?.to_owned(),
            eviction_signal: field(&f, "eviction_signal")?.to_owned(),
        }));
    }
    if let Some(f) = fields_after(&line, DISPATCH) {
        return Some(Record::Dispatch(Dispatch {
            mono_ns: field(&f, "mono_ns")?.parse().ok()?,
            kernel_ns: field(&f, "kernel_ns")?.parse().ok()?,
            uid: field(&f, "uid")?.to_owned(),
            id: field(&f, "id")?.to_owned(),
            kind: field(&f, "kind")?.to_owned(),
        }));
    }
    let f = fields_after(&line, STATUS)?;
    Some(Record::Status(StatusUpdate {
        mono_ns: field(&f, "mono_ns")?.parse().ok()?,
        uid: field(&f, "uid")?.to_owned(),
        // `containers=` with nothing after it is split away as an empty value.
        containers: parse_containers(field(&f, "containers").unwrap_or(""))?,
    }))
}

/// Every record in a log text.
pub fn parse_all(text: &str) -> Vec<Record> {
    text.lines().filter_map(parse_line).collect()
}

/// Follows a growing log file, returning the records of the lines completed since the
/// last call.
#[derive(Debug)]
pub struct LogTail {
    file: File,
    pos: u64,
    partial: Vec<u8>,
}

impl LogTail {
    /// Starts at the current end of `path`: only later lines are returned.
    pub fn from_end(path: &Path) -> Result<Self> {
        let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let pos = file.seek(SeekFrom::End(0))?;
        Ok(Self { file, pos, partial: Vec::new() })
    }

    pub fn poll(&mut self) -> Result<Vec<Record>> {
        self.file.seek(SeekFrom::Start(self.pos))?;
        let mut buf = Vec::new();
        let n = self.file.read_to_end(&mut buf)?;
        self.pos += n as u64;
        if n == 0 {
            return Ok(Vec::new());
        }
        self.partial.extend_from_slice(&buf);
        let Some(last_newline) = self.partial.iter().rposition(|b| *b == b'\n') else {
            return Ok(Vec::new());
        };
        let rest = self.partial.split_off(last_newline + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        Ok(parse_all(&String::from_utf8_lossy(&complete)))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    const DISPATCH_LINE: &str = "2026-11-30T18:00:00.123456Z DEBUG pleg_dispatch: dispatched mono_ns=1000 \
                                 kernel_ns=900 uid=3f2a id=0123abcd kind=ContainerDied";

    #[test]
    fn parses_a_dispatch_record() {
        assert_eq!(
            parse_line(DISPATCH_LINE),
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
    fn parses_a_status_record_inside_spans() {
        let line = "2026-11-30T18:00:00Z DEBUG pod_worker{pod=\"lat-00-bench_swiftlet-bench\"}:sync: pod_status: \
                    updated mono_ns=2000 uid=3f2a containers=c0:running:0,c1:terminated:1,c-2:waiting:3";
        let Some(Record::Status(s)) = parse_line(line) else { panic!("not a status record") };
        assert_eq!(s.mono_ns, 2000);
        assert_eq!(s.uid, "3f2a");
        assert_eq!(
            s.container("c1"),
            Some(&ContainerSummary { name: "c1".into(), state: State::Terminated, restarts: 1 })
        );
        assert_eq!(s.container("c-2").map(|c| (c.state, c.restarts)), Some((State::Waiting, 3)));
        assert_eq!(s.container("c0").map(|c| c.state), Some(State::Running));
    }

    #[test]
    fn a_pod_without_containers_has_an_empty_list() {
        let Some(Record::Status(s)) = parse_line("x DEBUG pod_status: updated mono_ns=5 uid=u containers=") else {
            panic!("not a status record")
        };
        assert!(s.containers.is_empty());
    }

    #[test]
    fn parses_an_eviction_decision_inside_its_span() {
        let line = "2026-12-02T10:00:00.5Z DEBUG eviction: eviction_decision: decided mono_ns=5000 pass_mono_ns=4000 \
                    signal_mono_ns=3900 trigger=\"memcg_threshold\" uid=\"9a\" eviction_signal=\"allocatableMemory.available\"";
        assert_eq!(
            parse_line(line),
            Some(Record::Eviction(EvictionDecision {
                mono_ns: 5000,
                pass_mono_ns: 4000,
                signal_mono_ns: 3900,
                trigger: "memcg_threshold".into(),
                uid: "9a".into(),
                eviction_signal: "allocatableMemory.available".into(),
            }))
        );
        let periodic = "x DEBUG eviction_decision: decided mono_ns=7 pass_mono_ns=6 signal_mono_ns=0 trigger=periodic \
                        uid=u eviction_signal=memory.available";
        let Some(Record::Eviction(d)) = parse_line(periodic) else { panic!("not an eviction record") };
        assert_eq!((d.trigger.as_str(), d.signal_mono_ns), ("periodic", 0));
        assert_eq!(parse_line("x DEBUG eviction_decision: decided mono_ns=7 trigger=periodic uid=u"), None);
    }

    #[test]
    fn strips_colours() {
        let coloured = "\x1b[2m2026-11-30T18:00:00Z\x1b[0m \x1b[34mDEBUG\x1b[0m \x1b[2mpleg_dispatch\x1b[0m\x1b[2m:\x1b[0m \
                        dispatched \x1b[3mmono_ns\x1b[0m\x1b[2m=\x1b[0m1000 \x1b[3mkernel_ns\x1b[0m\x1b[2m=\x1b[0m900 \
                        \x1b[3muid\x1b[0m\x1b[2m=\x1b[0m3f2a \x1b[3mid\x1b[0m\x1b[2m=\x1b[0m0123abcd \
                        \x1b[3mkind\x1b[0m\x1b[2m=\x1b[0mContainerDied";
        assert_eq!(parse_line(coloured), parse_line(DISPATCH_LINE));
    }

    #[test]
    fn ignores_other_and_malformed_lines() {
        assert_eq!(parse_line("2026 INFO swiftlet::agent: pod added pod=x"), None);
        // Another message of the same target, a longer target name, a missing field, a bad number.
        assert_eq!(parse_line("x DEBUG pleg_dispatch: dispatchedX mono_ns=1 kernel_ns=0 uid=u id=i kind=K"), None);
        assert_eq!(parse_line("x DEBUG pleg_dispatch: dispatched mono_ns=1 kernel_ns=0 uid=u kind=K"), None);
        assert_eq!(parse_line("x DEBUG pod_status: updated mono_ns=abc uid=u containers="), None);
        assert_eq!(parse_line("x DEBUG pod_status: updated mono_ns=1 uid=u containers=c0:sleeping:0"), None);
    }

    #[test]
    fn tail_returns_only_completed_new_lines() {
        let path = std::env::temp_dir().join(format!("xtask-bench-tail-{}.log", std::process::id()));
        std::fs::write(&path, format!("{DISPATCH_LINE}\n")).unwrap();
        let mut tail = LogTail::from_end(&path).unwrap();
        assert!(tail.poll().unwrap().is_empty(), "lines before the start are skipped");

        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        let (head, rest) = DISPATCH_LINE.split_at(40);
        write!(f, "noise\n{head}").unwrap();
        assert!(tail.poll().unwrap().is_empty(), "half a line is kept for later");
        writeln!(f, "{rest}").unwrap();
        let got = tail.poll().unwrap();
        assert_eq!(got, vec![parse_line(DISPATCH_LINE).unwrap()]);
        std::fs::remove_file(&path).unwrap();
    }
}
