//! The crate's umbrella error: one variant per concept (loading, cgroups, maps, the
//! event stream), each wrapping that concept's own error enum.

use crate::{cgroup::CgroupError, loader::LoadError, maps::MapsError, ring_buf::StreamError};

/// Everything that can go wrong in `swiftlet-ebpf`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sensors could not be loaded or attached; the agent falls back to relisting.
    #[error(transparent)]
    Load(#[from] LoadError),

    /// A cgroup directory could not be resolved to a cgroup id.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),

    /// Reading or updating a sensor map failed.
    #[error(transparent)]
    Maps(#[from] MapsError),

    /// The event stream could not be started.
    #[error(transparent)]
    Stream(#[from] StreamError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
