//! Filesystem usage: `statvfs(2)` for a filesystem's capacity (cAdvisor's `GetDirFsInfo`)
//! and `du`-style walks for what a directory occupies (upstream `fs.DiskUsage` behind
//! `volume.NewMetricsDu`): every entry under the path, the path itself included, counts
//! one inode and `st_blocks × 512` bytes; symlinks are not followed, other filesystems
//! are not entered, and hard links (`st_nlink > 1`) count once. Entries deleted during
//! the walk are ignored; directories that cannot be listed are counted ([`Walk`]).

use std::collections::HashSet;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The `metric_source` of `kubelet_volume_metric_collection_duration_seconds` for usage
/// measured by walking (upstream's `du`, its name for `fs.DiskUsage` without quotas).
pub const DU: &str = "du";

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

/// What a walk found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Walk {
    /// What the readable part of the tree occupies.
    pub usage: DiskUsage,
    /// Directories under the path that could not be listed (other than vanished ones).
    pub unreadable: u64,
}

/// `du` of `path` (a directory tree, a file or a symlink). Errors if `path` itself
/// cannot be examined.
pub fn disk_usage(path: &Path) -> io::Result<DiskUsage> {
    walk(path).map(|w| w.usage)
}

/// `du` of `path`, telling how many directories could not be listed. Iterative (no
/// recursion however deep the tree); entries and directories that vanish during the walk
/// are skipped silently.
pub fn walk(path: &Path) -> io::Result<Walk> {
    walk_with(path, &mut |_| {})
}

/// [`walk`], calling `before_list` with each directory just before listing it (tests use
/// it to change the tree during the walk).
pub(crate) fn walk_with(path: &Path, before_list: &mut dyn FnMut(&Path)) -> io::Result<Walk> {
    let top = std::fs::symlink_metadata(path)?;
    let mut out = Walk::default();
    let mut seen = HashSet::new();
    count(&top, &mut out.usage, &mut seen);
    if !top.is_dir() {
        return Ok(out);
    }
    let dev = top.dev();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        before_list(&dir);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(_) => {
                out.unreadable += 1;
                continue;
            }
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            // lstat through the directory handle; a vanished entry is skipped.
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != dev {
                continue;
            }
            count(&meta, &mut out.usage, &mut seen);
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(out)
}

fn count(meta: &std::fs::Metadata, usage: &mut DiskUsage, seen: &mut HashSet<u64>) {
    if meta.nlink() > 1 && !meta.is_dir() && !seen.insert(meta.ino()) {
        return;
    }
    usage.bytes = usage.bytes.saturating_add(meta.blocks().saturating_mul(512));
    usage.inodes = usage.inodes.saturating_add(1);
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
