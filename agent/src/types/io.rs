//! Errors of file system calls on paths, shared by the modules that write files.

use std::path::{Path, PathBuf};

/// A file system call that failed on a path, shown as `{op} {path}: {source}`: the `Io`
/// error of the checkpoint users (the allocation checkpoint) and of the other file
/// writers (volumes, container log rotation).
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct PathIoError {
    /// What was being done (`read`, `mkdir`, ...).
    pub op: &'static str,
    /// On which path.
    pub path: PathBuf,
    /// The error.
    #[source]
    pub source: std::io::Error,
}

impl PathIoError {
    /// For `map_err`: the failure of `op` on `path`.
    pub fn at(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Self + use<> {
        let path = path.to_owned();
        move |source| Self { op, path, source }
    }
}
