//! A stopped container's termination message (upstream `getTerminationMessage` and
//! `readLastStringFromContainerLogs` in `kuberuntime_container.go`): what the container
//! wrote to its `terminationMessagePath` (a file of the pod's directory mounted there),
//! at most its last 4 KiB; with `terminationMessagePolicy: FallbackToLogsOnError`, a
//! failed container that wrote none gets the end of its log instead (the last 80 lines,
//! at most their last 2 KiB). The runtime's own message, if any, comes first, then `: `.

use std::io::Read as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use super::api;
use super::labels::{CONTAINER_TERMINATION_MESSAGE_PATH, CONTAINER_TERMINATION_MESSAGE_POLICY};
use crate::types::cri_log::{parse_cri_line, tail_start};

/// Upstream `MaxContainerTerminationMessageLength`.
const MAX_MESSAGE_BYTES: u64 = 4 * 1024;
/// Upstream `MaxContainerTerminationMessageLogLines`.
const MAX_LOG_LINES: u64 = 80;
/// Upstream `MaxContainerTerminationMessageLogLength`.
const MAX_LOG_BYTES: usize = 2 * 1024;

/// The message of the exited container `status`: the runtime's message with the
/// termination message appended. Reads the pod's files; a container not exited keeps
/// the runtime's message.
#[must_use]
pub fn message(status: &api::ContainerStatus) -> String {
    let mut out = status.message.clone();
    if status.state != api::ContainerState::ContainerExited as i32 {
        return out;
    }
    let source = Source::of(status);
    // A container that could not even start has no log worth reading.
    let fallback = source.fallback && status.exit_code != 0 && status.reason != "ContainerCannotRun";
    let written = match source.read_file() {
        Written::Text(text) => text,
        Written::Nothing if fallback => from_log(&source.log),
        Written::Nothing => String::new(),
    };
    if !written.is_empty() {
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&written);
    }
    out
}

/// Where a container's termination message comes from, taken from its runtime status
/// in any state: kept with the status, so that an exit the kernel reports before the
/// runtime records it gets its message too ([`Source::message_without_log`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Source {
    /// The host file mounted at the container's `terminationMessagePath`.
    file: Option<PathBuf>,
    /// `terminationMessagePolicy: FallbackToLogsOnError`.
    fallback: bool,
    /// The container's CRI log.
    log: PathBuf,
}

/// What the container wrote to its termination message file.
enum Written {
    /// Its message, or why it could not be read.
    Text(String),
    /// Nothing: the file is empty, missing or not mounted.
    Nothing,
}

impl Source {
    /// The source of the container whose runtime status is `status`.
    #[must_use]
    pub fn of(status: &api::ContainerStatus) -> Self {
        let annotation = |key: &str| status.annotations.get(key).map(String::as_str).unwrap_or_default();
        let path = annotation(CONTAINER_TERMINATION_MESSAGE_PATH);
        let file = (!path.is_empty())
            .then(|| status.mounts.iter().find(|m| m.container_path == path))
            .flatten()
            .map(|m| PathBuf::from(&m.host_path));
        Self {
            file,
            fallback: annotation(CONTAINER_TERMINATION_MESSAGE_POLICY) == "FallbackToLogsOnError",
            log: PathBuf::from(&status.log_path),
        }
    }

    /// Whether a failed container's message may be the end of its log.
    #[must_use]
    pub fn may_need_log(&self) -> bool {
        self.fallback
    }

    /// The termination message of an exit with `exit_code` the runtime has not recorded
    /// yet, or `None` when it is the end of the log, which the runtime may not have
    /// written out yet: then only the runtime's exit can be reported.
    #[must_use]
    pub fn message_without_log(&self, exit_code: i32) -> Option<String> {
        match self.read_file() {
            Written::Text(text) => Some(text),
            Written::Nothing if self.fallback && exit_code != 0 => None,
            Written::Nothing => Some(String::new()),
        }
    }

    fn read_file(&self) -> Written {
        let Some(file) = &self.file else { return Written::Nothing };
        match read_last(file, MAX_MESSAGE_BYTES) {
            Ok(data) if data.is_empty() => Written::Nothing,
            Ok(data) => Written::Text(String::from_utf8_lossy(&data).into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Written::Nothing,
            Err(e) => Written::Text(format!("Error on reading termination log {}: {e}", file.display())),
        }
    }
}

/// The last `max` bytes of the file at `path` (upstream `tail.ReadAtMost`).
fn read_last(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let start = size.saturating_sub(max);
    let mut data = vec![0; usize::try_from(size - start).unwrap_or(0)];
    file.read_exact_at(&mut data, start)?;
    Ok(data)
}

/// The output of the last lines of the CRI log at `path`, at most its last
/// [`MAX_LOG_BYTES`].
fn from_log(path: &Path) -> String {
    match read_log_tail(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("Error on reading termination message from logs: {e}"),
    }
}

fn read_log_tail(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    let start = tail_start(&file, MAX_LOG_LINES)?;
    let mut raw = Vec::new();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(start))?;
    file.read_to_end(&mut raw)?;
    let mut out = Vec::new();
    for line in raw.split_inclusive(|&b| b == b'\n') {
        // Lines that do not parse are skipped, as upstream's reader skips them.
        if let Ok(msg) = parse_cri_line(line) {
            out.extend_from_slice(msg.content);
        }
    }
    let keep = out.len().saturating_sub(MAX_LOG_BYTES);
    Ok(out.split_off(keep))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn exited(dir: &Path, policy: &str, exit_code: i32, written: Option<&[u8]>) -> api::ContainerStatus {
        let host = dir.join("termination");
        if let Some(data) = written {
            std::fs::write(&host, data).unwrap();
        }
        api::ContainerStatus {
            state: api::ContainerState::ContainerExited as i32,
            exit_code,
            reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
            annotations: HashMap::from([
                (CONTAINER_TERMINATION_MESSAGE_PATH.into(), "/dev/termination-log".into()),
                (CONTAINER_TERMINATION_MESSAGE_POLICY.into(), policy.into()),
            ]),
            mounts: vec![api::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: host.to_string_lossy().into_owned(),
                ..Default::default()
            }],
            log_path: dir.join("0.log").to_string_lossy().into_owned(),
            ..Default::default()
        }
    }

    fn write_log(dir: &Path, lines: &[&str]) {
        let mut body = String::new();
        for l in lines {
            body.push_str("2026-12-05T10:00:00.000000000Z stdout ");
            body.push_str(l);
            body.push('\n');
        }
        std::fs::write(dir.join("0.log"), body).unwrap();
    }

    #[test]
    fn the_file_the_container_wrote_is_the_message() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(message(&exited(dir.path(), "File", 0, Some(b"DONE"))), "DONE");
        // The runtime's message comes first.
        let mut s = exited(dir.path(), "File", 0, Some(b"DONE"));
        s.message = "runtime says".into();
        assert_eq!(message(&s), "runtime says: DONE");
        // Only the last 4 KiB.
        let big: Vec<u8> = (0..5000).map(|i| b'a' + (i % 26) as u8).collect();
        let m = message(&exited(dir.path(), "File", 0, Some(&big)));
        assert_eq!(m.as_bytes(), &big[big.len() - 4096..]);
        // A running container keeps the runtime's message alone.
        let mut running = exited(dir.path(), "File", 0, Some(b"DONE"));
        running.state = api::ContainerState::ContainerRunning as i32;
        assert_eq!(message(&running), "");
    }

    #[test]
    fn a_failed_container_falls_back_to_its_log_only_when_asked_and_silent() {
        let dir = tempfile::tempdir().unwrap();
        write_log(dir.path(), &["F first", "P part", "F ial", "F last"]);
        // File policy: no message.
        assert_eq!(message(&exited(dir.path(), "File", 1, Some(b""))), "");
        // Fallback, the file empty: the log's output (partial lines joined).
        assert_eq!(message(&exited(dir.path(), "FallbackToLogsOnError", 1, Some(b""))), "first\npartial\nlast\n");
        // Fallback, the file missing: the log too.
        assert_eq!(message(&exited(dir.path(), "FallbackToLogsOnError", 1, None)), "first\npartial\nlast\n");
        // Fallback but the file has a message: the file wins.
        assert_eq!(message(&exited(dir.path(), "FallbackToLogsOnError", 1, Some(b"why"))), "why");
        // Fallback but the container succeeded: no log.
        std::fs::remove_file(dir.path().join("termination")).unwrap();
        assert_eq!(message(&exited(dir.path(), "FallbackToLogsOnError", 0, Some(b""))), "");
        // Only the last 80 lines, and at most 2 KiB of them.
        let lines: Vec<String> = (0..100).map(|i| format!("F line {i:03} {}", "x".repeat(20))).collect();
        write_log(dir.path(), &lines.iter().map(String::as_str).collect::<Vec<_>>());
        let m = message(&exited(dir.path(), "FallbackToLogsOnError", 2, Some(b"")));
        assert_eq!(m.len(), 2048);
        assert!(m.ends_with(&format!("line 099 {}\n", "x".repeat(20))), "{m}");
        let short: Vec<String> = (0..100).map(|i| format!("F {i}")).collect();
        write_log(dir.path(), &short.iter().map(String::as_str).collect::<Vec<_>>());
        let m = message(&exited(dir.path(), "FallbackToLogsOnError", 2, Some(b"")));
        assert!(m.starts_with("20\n21\n") && m.ends_with("99\n"), "{m}");
    }

    #[test]
    fn before_the_runtime_records_an_exit_only_a_message_that_needs_no_log_is_known() {
        let dir = tempfile::tempdir().unwrap();
        write_log(dir.path(), &["F half written"]);
        let source = |policy, written| Source::of(&exited(dir.path(), policy, 1, written));
        assert_eq!(source("File", Some(b"why")).message_without_log(1).as_deref(), Some("why"));
        assert_eq!(source("File", Some(b"")).message_without_log(1).as_deref(), Some(""));
        let fallback = source("FallbackToLogsOnError", Some(b"why"));
        assert!(fallback.may_need_log());
        assert_eq!(fallback.message_without_log(1).as_deref(), Some("why"), "the file wins");
        let silent = source("FallbackToLogsOnError", Some(b""));
        assert_eq!(silent.message_without_log(1), None, "the log's end, not yet known");
        assert_eq!(silent.message_without_log(0).as_deref(), Some(""), "a success needs no log");
        std::fs::remove_file(dir.path().join("termination")).unwrap();
        assert_eq!(source("FallbackToLogsOnError", None).message_without_log(137), None);
        assert!(!source("File", None).may_need_log());
    }
}
