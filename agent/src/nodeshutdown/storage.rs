//! The `graceful_node_shutdown_state` file in the root directory (upstream `storage.go`):
//! `{"startTime":"<RFC 3339>","endTime":"<RFC 3339>"}` as Go marshals a `time.Time`
//! (fractional seconds without trailing zeros; an unset time is Go's zero time
//! `0001-01-01T00:00:00Z`), written atomically (temp file, fsync, rename). It outlives
//! the agent so that the metrics of the last shutdown survive the reboot.

use std::path::{Path, PathBuf};

use jiff::Timestamp;

/// Go's zero `time.Time` as JSON.
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Errors reading or writing the state file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
}

/// When the last shutdown started and ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub start_time: Option<Timestamp>,
    pub end_time: Option<Timestamp>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default)]
    start_time: String,
    #[serde(default)]
    end_time: String,
}

fn to_wire(t: Option<Timestamp>) -> String {
    t.map_or_else(|| GO_ZERO_TIME.to_owned(), |t| t.to_string())
}

fn from_wire(text: &str) -> Result<Option<Timestamp>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    let t: Timestamp = text.parse().map_err(|e| format!("time {text:?}: {e}"))?;
    let zero: Timestamp = GO_ZERO_TIME.parse().expect("Go's zero time is a valid timestamp");
    Ok((t != zero).then_some(t))
}

/// A time as the metrics show it: whole Unix seconds, 0 when unset (upstream `timestamp`).
#[must_use]
pub fn timestamp(t: Option<Timestamp>) -> f64 {
    t.map_or(0.0, |t| t.as_second() as f64)
}

/// The state file.
#[derive(Clone, Debug)]
pub struct Storage {
    path: PathBuf,
}

impl Storage {
    #[must_use]
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `state` atomically.
    pub fn store(&self, state: &State) -> Result<(), Error> {
        let wire = Wire { start_time: to_wire(state.start_time), end_time: to_wire(state.end_time) };
        let data = serde_json::to_vec(&wire).expect("two strings serialize");
        crate::cm::checkpoint::write_atomic_with_mode(&self.path, &data, 0o644)
            .map_err(|source| Error::Io { path: self.path.clone(), source })
    }

    /// The state; the default when the file does not exist.
    pub fn load(&self) -> Result<State, Error> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::default()),
            Err(source) => return Err(Error::Io { path: self.path.clone(), source }),
        };
        let parse = |message: String| Error::Parse { path: self.path.clone(), message };
        let wire: Wire = serde_json::from_str(&text).map_err(|e| parse(e.to_string()))?;
        Ok(State {
            start_time: from_wire(&wire.start_time).map_err(parse)?,
            end_time: from_wire(&wire.end_time).map_err(parse)?,
        })
    }
}
