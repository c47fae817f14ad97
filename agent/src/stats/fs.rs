//! Filesystem usage: `statvfs(2)` for a filesystem's capacity (cAdvisor's `GetDirFsInfo`)
//! and `du`-style walks for what a directory occupies (upstream `fs.DiskUsage` behind
//! `volume.NewMetricsDu`): every entry under the path, the path itself included, counts
//! one inode and `st_blocks × 512` bytes; symlinks are not followed, other filesystems
//! are not entered, and hard links (`st_nlink > 1`) count once. Entries deleted during
//! the walk are ignored.

use std::collections::HashSet;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// A filesystem's size and free space (cAdvisor's `FsInfo`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsInfo {
    /// Size (`f_blocks × f_frsize`).
    pub capacity: u64,
    /// Available to unprivileged users (`f_bavail × f_frsize`).
    pub available: u64,
    /// Used (`(f_blocks − f_bfree) × f_frsize`).
    pub usage: u64,
    /// Inodes (`f_files`).
    pub inodes: u64,
    /// Free inodes (`f_ffree`).
    pub inodes_free: u64,
}

/// `statvfs(2)` of the filesystem holding `path`.
pub fn statvfs(path: &Path) -> io::Result<FsInfo> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path and `st` points to writable memory of
    // the right type; statvfs(2) fills it on success, and it is read only then.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so the struct is initialized.
    let st = unsafe { st.assume_init() };
    let frsize = st.f_frsize;
    Ok(FsInfo {
        capacity: st.f_blocks.saturating_mul(frsize),
        available: st.f_bavail.saturating_mul(frsize),
        usage: st.f_blocks.saturating_sub(st.f_bfree).saturating_mul(frsize),
        inodes: st.f_files,
        inodes_free: st.f_ffree,
    })
}

/// What a directory tree occupies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Bytes allocated (`st_blocks × 512`).
    pub bytes: u64,
    /// Inodes.
    pub inodes: u64,
}

impl DiskUsage {
    /// The sum of two usages.
    #[must_use]
    pub const fn plus(self, other: Self) -> Self {
        Self { bytes: self.bytes.saturating_add(other.bytes), inodes: self.inodes.saturating_add(other.inodes) }
    }
}

/// `du` of `path` (a directory tree, a file or a symlink). Errors if `path` itself
/// cannot be examined.
pub fn disk_usage(path: &Path) -> io::Result<DiskUsage> {
    let top = std::fs::symlink_metadata(path)?;
    let mut usage = DiskUsage::default();
    let mut seen = HashSet::new();
    count(&top, &mut usage, &mut seen);
    if top.is_dir() {
        walk(path, top.dev(), &mut usage, &mut seen);
    }
    Ok(usage)
}

fn count(meta: &std::fs::Metadata, usage: &mut DiskUsage, seen: &mut HashSet<u64>) {
    if meta.nlink() > 1 && !seen.insert(meta.ino()) {
        return;
    }
    usage.bytes = usage.bytes.saturating_add(meta.blocks().saturating_mul(512));
    usage.inodes = usage.inodes.saturating_add(1);
}

fn walk(dir: &Path, dev: u64, usage: &mut DiskUsage, seen: &mut HashSet<u64>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.dev() != dev {
            continue;
        }
        count(&meta, usage, seen);
        if meta.is_dir() {
            walk(&path, dev, usage, seen);
        }
    }
}

/// Usage of the non-directory entries directly in `dir` (upstream `fileMetricsByDir`, for
/// log directories): `Ok(None)` when there are none, an error when `dir` cannot be read.
pub fn files_usage(dir: &Path) -> io::Result<Option<DiskUsage>> {
    let mut total: Option<DiskUsage> = None;
    for entry in std::fs::read_dir(dir)?.flatten() {
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else { continue };
        if meta.is_dir() {
            continue;
        }
        let one = DiskUsage { bytes: meta.blocks().saturating_mul(512), inodes: 1 };
        total = Some(total.map_or(one, |t| t.plus(one)));
    }
    Ok(total)
}
