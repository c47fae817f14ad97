//! The `emptyDir` volume (upstream `pkg/volume/emptydir`): a directory of the pod, mode
//! 0777 whatever the umask, on the node's disk, or on a tmpfs for `medium: Memory`. The
//! tmpfs is sized as upstream (`SizeMemoryBackedVolumes`): the smallest of node allocatable
//! memory, the pod's memory limit and the volume's `sizeLimit`. A disk `sizeLimit` is only
//! recorded: enforcing it is eviction's job. Secret and projected volumes use the same
//! tmpfs setup (upstream wraps them in a memory-backed emptyDir).
//!
//! Teardown is the volume manager's: it unmounts what is mounted under the pod's volume
//! directory and removes it.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;

use super::mounter::Mounter;
use crate::types::io::PathIoError;

/// Permission bits of an emptyDir directory.
const PERM: u32 = 0o777;

/// Errors of emptyDir setup.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `medium` this agent does not provide.
    #[error("unknown storage medium {0:?}")]
    UnsupportedMedium(String),
    /// A file system or mount call failed.
    #[error(transparent)]
    Io(#[from] PathIoError),
}

/// Where an emptyDir keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// The node's disk (`medium: ""`).
    Disk,
    /// A tmpfs (`medium: Memory`).
    Memory,
}

impl Medium {
    /// Parses `emptyDir.medium`.
    pub fn parse(medium: Option<&str>) -> Result<Self, Error> {
        match medium.unwrap_or_default() {
            "" => Ok(Self::Disk),
            "Memory" => Ok(Self::Memory),
            other => Err(Error::UnsupportedMedium(other.to_owned())),
        }
    }
}

/// Upstream `calculateEmptyDirMemorySize`: node allocatable memory, lowered to the pod's
/// memory limit and then to `size_limit` when those are positive and smaller.
#[must_use]
pub fn memory_size(node_allocatable_memory: i64, pod: &Pod, size_limit: Option<i64>) -> i64 {
    let mut size = node_allocatable_memory;
    let pod_limit = crate::cm::resources::resource_config_for_pod(pod, false).memory_limit;
    if let Some(limit) = pod_limit.filter(|l| *l > 0 && *l < size) {
        size = limit;
    }
    if let Some(limit) = size_limit.filter(|l| *l > 0 && *l < size) {
        size = limit;
    }
    size
}

/// Upstream `setupDir`: creates `dir` and gives it mode 0777 if its permission bits differ.
pub fn setup_dir(dir: &Path) -> Result<(), Error> {
    let io_err = |op| move |source| Error::Io(PathIoError { op, path: dir.to_owned(), source });
    std::fs::create_dir_all(dir).map_err(io_err("mkdir"))?;
    let mode = std::fs::metadata(dir).map_err(io_err("stat"))?.mode();
    if mode & 0o777 != PERM {
        // Keep setgid (fsGroup) and sticky bits; only the permission bits are ours.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode((mode & 0o7000) | PERM))
            .map_err(io_err("chmod"))?;
    }
    Ok(())
}

/// Sets up an emptyDir at `dir`; idempotent (an existing tmpfs is kept as it is).
pub fn set_up(dir: &Path, medium: Medium, memory_size: i64, mounter: &dyn Mounter) -> Result<(), Error> {
    setup_dir(dir)?;
    if medium == Medium::Memory {
        set_up_tmpfs(dir, memory_size, mounter)?;
    }
    Ok(())
}

/// Mounts a tmpfs of `size` bytes on the existing `dir` unless one is there already.
pub fn set_up_tmpfs(dir: &Path, size: i64, mounter: &dyn Mounter) -> Result<(), Error> {
    let io_err = |op| move |source| Error::Io(PathIoError { op, path: dir.to_owned(), source });
    if mounter.is_tmpfs(dir).map_err(io_err("inspect mounts of"))? {
        return Ok(());
    }
    mounter.mount_tmpfs(dir, Some(size)).map_err(io_err("mount tmpfs on"))
}

#[cfg(test)]
mod tests {
    use super::super::mounter::{FakeMounter, MountCall};
    use super::*;
    use crate::types::pod_resources::test_pods::{ctr, pod};

    #[test]
    fn memory_size_is_the_smallest_positive_bound() {
        let node = 8 << 30;
        let no_limits = pod("u", vec![ctr("c", &[], &[])]);
        assert_eq!(memory_size(node, &no_limits, None), node);
        assert_eq!(memory_size(node, &no_limits, Some(1 << 20)), 1 << 20);
        assert_eq!(memory_size(node, &no_limits, Some(0)), node);
        let limited = pod("u", vec![ctr("c", &[], &[("memory", "256Mi")])]);
        assert_eq!(memory_size(node, &limited, None), 256 << 20);
        assert_eq!(memory_size(node, &limited, Some(1 << 30)), 256 << 20);
        assert_eq!(memory_size(node, &limited, Some(64 << 20)), 64 << 20);
    }

    #[test]
    fn disk_and_memory_setup() {
        let dir = tempfile::tempdir().unwrap();
        let m = FakeMounter::default();
        let disk = dir.path().join("disk");
        set_up(&disk, Medium::Disk, 0, &m).unwrap();
        assert_eq!(std::fs::metadata(&disk).unwrap().mode() & 0o7777, 0o777);
        assert!(m.calls().is_empty());

        let mem = dir.path().join("mem");
        set_up(&mem, Medium::Memory, 1 << 20, &m).unwrap();
        set_up(&mem, Medium::Memory, 1 << 20, &m).unwrap();
        assert_eq!(m.calls(), vec![MountCall::MountTmpfs(mem.clone(), Some(1 << 20))]);
        assert_eq!(
            Medium::parse(Some("HugePages-2Mi")).unwrap_err().to_string(),
            "unknown storage medium \"HugePages-2Mi\""
        );
    }
}
