//! swiftlet's eBPF sensors: C CO-RE programs (in `bpf/`, compiled by the build script)
//! and their typed Rust side: load, attach, decode events, read maps. The crate knows
//! cgroups and processes, not pods.
//!
//! TODO(docs): filled in below once measured.

mod cgroup;
mod clock;
mod error;
mod events;
mod loader;
mod maps;
mod ring_buf;
mod sensors;

pub use cgroup::{CgroupError, CgroupId};
pub use error::{Error, Result};
pub use events::{CgroupChange, DecodeError, ExitStatus, ReclaimPhase, ReclaimScope, SensorEvent, TaskInfo, decode};
pub use loader::LoadError;
pub use maps::{CgroupCounters, LastExit, MapsError};
pub use ring_buf::StreamError;
pub use sensors::{SensorConfig, Sensors};
pub use tokio_util::sync::CancellationToken;
