//! The kubelet's `AtomicWriter` (`pkg/volume/util/atomic_writer.go`): projects a set of
//! files (a [`Payload`]) into a volume directory so that a reader never sees a mix of two
//! versions or a half-written file.
//!
//! Layout of a target directory:
//! ```text
//! <target>/..2024_05_01_12_00_00.123456789/   the data of one version (mode 0755)
//! <target>/..data -> ..2024_05_01_12_00_00.123456789
//! <target>/key     -> ..data/key              one symlink per top-level payload entry
//! <target>/dir     -> ..data/dir
//! ```
//! An update writes a new timestamped directory, then swaps `..data` with `rename(2)` of a
//! fresh `..data_tmp` symlink (atomic), then prunes top-level links of removed entries and
//! the old version. Names starting with `..` are reserved. Nothing is written when every
//! file's content is unchanged and nothing was removed (file modes are not compared, as
//! upstream: `fsGroup` ownership changes them after the write).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::KeyToPath;

use crate::types::io::PathIoError;

/// Upstream `maxFileNameLength`.
const MAX_FILE_NAME_LENGTH: usize = 255;
/// Upstream `maxPathLength`.
const MAX_PATH_LENGTH: usize = 4096;
/// The symlink to the current version.
pub const DATA_DIR_NAME: &str = "..data";
/// The symlink that is renamed over [`DATA_DIR_NAME`].
const NEW_DATA_DIR_NAME: &str = "..data_tmp";

/// Errors of the atomic writer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A payload path is not acceptable (messages as upstream `validatePath`).
    #[error("invalid path: {reason}")]
    InvalidPath {
        /// Why, including the path where upstream names it.
        reason: String,
    },
    /// The target directory does not exist.
    #[error("atomic writer target {path} does not exist")]
    NoTarget {
        /// The target directory.
        path: PathBuf,
    },
    /// `..data` exists but is not a symlink: the directory was not written by us.
    #[error("{path} exists and is not a symlink")]
    DataDirNotSymlink {
        /// The `..data` path.
        path: PathBuf,
    },
    /// A file system call failed.
    #[error(transparent)]
    Io(#[from] PathIoError),
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error + use<> {
    let at = PathIoError::at(op, path);
    move |source| Error::Io(at(source))
}

/// One file to project: its content, its permission bits and, optionally, its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    /// The content.
    pub data: Vec<u8>,
    /// Permission bits (`defaultMode` / item `mode`), e.g. `0o644`.
    pub mode: u32,
    /// Owner uid (`FsUser` upstream: projected service account tokens of pods that run as
    /// one non-root user).
    pub fs_user: Option<u32>,
}

impl FileProjection {
    /// A file with `data` and `mode`, owned by whoever writes it.
    #[must_use]
    pub fn new(data: impl Into<Vec<u8>>, mode: u32) -> Self {
        Self { data: data.into(), mode, fs_user: None }
    }
}

/// Relative path (as given in `items[].path` or a key) → file.
pub type Payload = BTreeMap<String, FileProjection>;

/// The payload of a key-value volume (`configMap`, `secret`): every entry of `all` at its
/// key with `default_mode` when no `items` are listed, else only the listed keys at their
/// paths (and modes). A listed key `lookup` does not find is skipped when `optional`.
///
/// # Errors
/// The first listed key that is missing, unless `optional`.
pub fn key_payload<'a>(
    items: &[KeyToPath],
    all: impl Iterator<Item = (&'a String, Vec<u8>)>,
    lookup: impl Fn(&str) -> Option<Vec<u8>>,
    default_mode: u32,
    optional: bool,
) -> std::result::Result<Payload, String> {
    if items.is_empty() {
        return Ok(all.map(|(k, v)| (k.clone(), FileProjection::new(v, default_mode))).collect());
    }
    let mut payload = Payload::new();
    for item in items {
        let Some(content) = lookup(&item.key) else {
            if optional {
                continue;
            }
            return Err(item.key.clone());
        };
        let mode = item.mode.map_or(default_mode, |m| m as u32);
        payload.insert(item.path.clone(), FileProjection::new(content, mode));
    }
    Ok(payload)
}

/// A hook run on a new version directory before it becomes visible.
pub type SetPerms<'a> = &'a dyn Fn(&Path) -> io::Result<()>;

/// Upstream `validatePath`: relative, no `..` element, not starting with `..`, bounded lengths.
pub fn validate_path(target: &str) -> Result<()> {
    let invalid = |reason: String| Err(Error::InvalidPath { reason });
    if target.is_empty() {
        return invalid(format!("must not be empty: {target:?}"));
    }
    if target.starts_with('/') {
        return invalid(format!("must be relative path: {target}"));
    }
    if target.len() > MAX_PATH_LENGTH {
        return invalid(format!("must be less than or equal to {MAX_PATH_LENGTH} characters"));
    }
    let items: Vec<&str> = target.split('/').collect();
    for item in &items {
        if *item == ".." {
            return invalid(format!("must not contain '..': {target}"));
        }
        if item.len() > MAX_FILE_NAME_LENGTH {
            return invalid(format!("filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"));
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        return invalid(format!("must not start with '..': {target}"));
    }
    Ok(())
}

/// Go's `filepath.Clean` for the relative paths that passed [`validate_path`]: drops empty
/// and `.` elements (so `a//b/./c/` is `a/b/c`).
fn clean(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    if parts.is_empty() { ".".into() } else { parts.join("/") }
}

/// Writes payloads into one target directory. Not synchronized: the caller runs one
/// write per target at a time (the pod worker does).
#[derive(Debug, Clone)]
pub struct AtomicWriter {
    target: PathBuf,
    log_context: String,
}

impl AtomicWriter {
    /// A writer for `target`, which must exist. `log_context` names the volume in logs.
    pub fn new(target: impl Into<PathBuf>, log_context: impl Into<String>) -> Result<Self> {
        let target = target.into();
        if !target.is_dir() {
            return Err(Error::NoTarget { path: target });
        }
        Ok(Self { target, log_context: log_context.into() })
    }

    /// The current version directory (what `..data` points to), if any.
    pub fn current_version(&self) -> Result<Option<PathBuf>> {
        let data = self.target.join(DATA_DIR_NAME);
        match std::fs::read_link(&data) {
            Ok(ts) => Ok(Some(self.target.join(ts))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => Err(Error::DataDirNotSymlink { path: data }),
            Err(e) => Err(io_err("readlink", &data)(e)),
        }
    }

    /// Projects `payload`; returns whether anything was written. `set_perms` runs on the new
    /// version directory after its files are written and before it becomes visible (used
    /// for `fsGroup` ownership).
    pub fn write(&self, payload: &Payload, set_perms: Option<SetPerms<'_>>) -> Result<bool> {
        // (1) validate and clean.
        let mut clean_payload: BTreeMap<String, &FileProjection> = BTreeMap::new();
        for (path, file) in payload {
            validate_path(path)?;
            clean_payload.insert(clean(path), file);
        }

        // (2) the current version, (3) what disappears, (4) whether anything changed.
        let old_ts = self.current_version()?;
        let mut to_remove = BTreeSet::new();
        if let Some(old) = &old_ts {
            to_remove = paths_to_remove(&clean_payload, old)?;
            if !should_write_payload(&clean_payload, old)? && to_remove.is_empty() {
                tracing::trace!(context = %self.log_context, "no update required for target directory");
                return Ok(false);
            }
        }

        // (5) a new version directory.
        let ts_dir = self.new_timestamp_dir()?;
        let result = self.fill_and_swap(&clean_payload, &ts_dir, set_perms);
        if result.is_err() {
            let _ = std::fs::remove_file(self.target.join(NEW_DATA_DIR_NAME));
            let _ = std::fs::remove_dir_all(&ts_dir);
            return result.map(|()| false);
        }

        // (10) prune user-visible links of removed top-level entries.
        let mut last_err = None;
        for p in to_remove.iter().filter(|p| !p.contains('/')) {
            let visible = self.target.join(p);
            if let Err(e) = std::fs::remove_file(&visible)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(context = %self.log_context, path = %visible.display(), error = %e, "error pruning old user-visible path");
                last_err = Some(io_err("remove", &visible)(e));
            }
        }
        if let Some(e) = last_err {
            return Err(e);
        }
        // (11) the old version.
        if let Some(old) = old_ts {
            std::fs::remove_dir_all(&old).map_err(io_err("remove", &old))?;
        }
        Ok(true)
    }

    fn fill_and_swap(
        &self,
        payload: &BTreeMap<String, &FileProjection>,
        ts_dir: &Path,
        set_perms: Option<SetPerms<'_>>,
    ) -> Result<()> {
        // (6) the payload.
        write_payload_to_dir(payload, ts_dir)?;
        if let Some(set_perms) = set_perms {
            set_perms(ts_dir).map_err(io_err("set permissions on", ts_dir))?;
        }
        // (7) links for new top-level entries: they point through ..data, so they are
        // dangling until the swap and never show a partial version.
        for path in payload.keys() {
            let first = path.split('/').next().unwrap_or(path);
            let visible = self.target.join(first);
            if std::fs::symlink_metadata(&visible).is_err() {
                symlink(Path::new(DATA_DIR_NAME).join(first), &visible).map_err(io_err("symlink", &visible))?;
            }
        }
        // (8) ..data_tmp -> new version, (9) renamed over ..data.
        let ts_name = ts_dir.file_name().expect("timestamp dir has a name");
        let tmp = self.target.join(NEW_DATA_DIR_NAME);
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err("remove", &tmp)(e)),
            _ => {}
        }
        symlink(ts_name, &tmp).map_err(io_err("symlink", &tmp))?;
        let data = self.target.join(DATA_DIR_NAME);
        std::fs::rename(&tmp, &data).map_err(io_err("rename", &data))?;
        Ok(())
    }

    /// Upstream `newTimestampDir`: `..<UTC time>.<random>`, mode 0755 whatever the umask.
    fn new_timestamp_dir(&self) -> Result<PathBuf> {
        let stamp = jiff::Timestamp::now().strftime("%Y_%m_%d_%H_%M_%S").to_string();
        loop {
            let dir = self.target.join(format!("..{stamp}.{}", rand::random::<u32>()));
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                        .map_err(io_err("chmod", &dir))?;
                    return Ok(dir);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("mkdir", &dir)(e)),
            }
        }
    }
}

/// Every path (files and directories) under the old version that the new payload does
/// not contain, relative to the version directory.
fn paths_to_remove(payload: &BTreeMap<String, &FileProjection>, old_ts: &Path) -> Result<BTreeSet<String>> {
    let mut existing = BTreeSet::new();
    let mut stack = vec![old_ts.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
            Err(e) => return Err(io_err("read", &dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io_err("read", &dir))?;
            let path = entry.path();
            let rel = path.strip_prefix(old_ts).expect("under the version dir").to_string_lossy().into_owned();
            if entry.file_type().map_err(io_err("stat", &path))?.is_dir() {
                stack.push(path);
            }
            existing.insert(rel);
        }
    }
    let mut wanted = BTreeSet::new();
    for file in payload.keys() {
        let mut sub = file.as_str();
        loop {
            wanted.insert(sub.to_owned());
            match sub.rsplit_once('/') {
                Some((parent, _)) => sub = parent,
                None => break,
            }
        }
    }
    Ok(existing.difference(&wanted).cloned().collect())
}

fn should_write_payload(payload: &BTreeMap<String, &FileProjection>, old_ts: &Path) -> Result<bool> {
    for (path, file) in payload {
        let on_disk = old_ts.join(path);
        match std::fs::read(&on_disk) {
            Ok(content) if content == file.data => {}
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(io_err("read", &on_disk)(e)),
        }
    }
    Ok(false)
}

fn write_payload_to_dir(payload: &BTreeMap<String, &FileProjection>, dir: &Path) -> Result<()> {
    for (path, file) in payload {
        let full = dir.join(path);
        if let Some(parent) = full.parent()
            && parent != dir
        {
            std::fs::DirBuilder::new().recursive(true).mode(0o755).create(parent).map_err(io_err("mkdir", parent))?;
        }
        std::fs::write(&full, &file.data).map_err(io_err("write", &full))?;
        // The umask applied at creation: set the exact mode.
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(file.mode & 0o7777))
            .map_err(io_err("chmod", &full))?;
        if let Some(uid) = file.fs_user {
            std::os::unix::fs::chown(&full, Some(uid), None).map_err(io_err("chown", &full))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn payload(entries: &[(&str, &str)]) -> Payload {
        entries.iter().map(|(k, v)| ((*k).to_string(), FileProjection::new(v.as_bytes(), 0o644))).collect()
    }

    fn read(dir: &Path, p: &str) -> String {
        std::fs::read_to_string(dir.join(p)).unwrap()
    }

    fn versions(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != DATA_DIR_NAME)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn path_validation_as_upstream() {
        for ok in ["a", "a/b", "a/..b", "a..", ".a"] {
            assert!(validate_path(ok).is_ok(), "{ok}");
        }
        let msg = |p: &str| validate_path(p).unwrap_err().to_string();
        assert_eq!(msg(""), "invalid path: must not be empty: \"\"");
        assert_eq!(msg("/etc/x"), "invalid path: must be relative path: /etc/x");
        assert_eq!(msg("a/../b"), "invalid path: must not contain '..': a/../b");
        assert_eq!(msg(".."), "invalid path: must not contain '..': ..");
        assert_eq!(msg("..data"), "invalid path: must not start with '..': ..data");
        assert!(msg(&"x".repeat(256)).contains("filenames must be less than or equal to 255"));
        assert!(msg(&"a/".repeat(2049)).contains("4096"));
        assert_eq!(clean("a//b/./c/"), "a/b/c");
    }

    #[test]
    fn first_write_layout_and_modes() {
        let dir = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(dir.path(), "test").unwrap();
        let mut p = payload(&[("a", "1"), ("sub/dir/b", "2")]);
        p.get_mut("a").unwrap().mode = 0o400;
        assert!(w.write(&p, None).unwrap());
        assert_eq!(read(dir.path(), "a"), "1");
        assert_eq!(read(dir.path(), "sub/dir/b"), "2");
        assert_eq!(std::fs::read_link(dir.path().join("a")).unwrap(), Path::new("..data/a"));
        assert_eq!(std::fs::read_link(dir.path().join("sub")).unwrap(), Path::new("..data/sub"));
        let ts = std::fs::read_link(dir.path().join(DATA_DIR_NAME)).unwrap();
        let ts = ts.to_string_lossy().into_owned();
        assert!(ts.starts_with("..") && ts.len() > "..2006_01_02_15_04_05.".len(), "{ts}");
        let meta = |p: &str| std::fs::metadata(dir.path().join(p)).unwrap().mode() & 0o7777;
        assert_eq!(meta("a"), 0o400);
        assert_eq!(meta("sub/dir/b"), 0o644);
        assert_eq!(meta(&ts), 0o755);
        assert_eq!(versions(dir.path()), vec![ts]);
    }

    #[test]
    fn unchanged_content_is_not_rewritten_and_updates_swap_versions() {
        let dir = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(dir.path(), "test").unwrap();
        assert!(w.write(&payload(&[("a", "1"), ("b", "2")]), None).unwrap());
        let v1 = versions(dir.path());
        assert!(!w.write(&payload(&[("a", "1"), ("b", "2")]), None).unwrap());
        assert_eq!(versions(dir.path()), v1);

        assert!(w.write(&payload(&[("a", "1"), ("b", "3")]), None).unwrap());
        let v2 = versions(dir.path());
        assert_eq!(v2.len(), 1);
        assert_ne!(v2, v1);
        assert_eq!(read(dir.path(), "b"), "3");
        assert!(std::fs::symlink_metadata(dir.path().join(NEW_DATA_DIR_NAME)).is_err());
    }

    #[test]
    fn removed_keys_disappear() {
        let dir = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(dir.path(), "test").unwrap();
        w.write(&payload(&[("a", "1"), ("b", "2"), ("d/x", "3"), ("d/y", "4")]), None).unwrap();
        // Same content, fewer keys: still a write.
        assert!(w.write(&payload(&[("a", "1"), ("d/x", "3")]), None).unwrap());
        assert!(std::fs::symlink_metadata(dir.path().join("b")).is_err());
        assert!(!dir.path().join("d/y").exists());
        assert_eq!(read(dir.path(), "d/x"), "3");
        // Everything removed: an empty version remains.
        assert!(w.write(&Payload::new(), None).unwrap());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn set_perms_runs_before_the_swap() {
        let dir = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(dir.path(), "test").unwrap();
        let target = dir.path().to_path_buf();
        let check = move |ts: &Path| {
            assert!(ts.join("a").exists());
            // Not visible yet.
            assert!(!target.join("a").exists());
            Ok(())
        };
        w.write(&payload(&[("a", "1")]), Some(&check)).unwrap();
        // A failing hook leaves the old version in place and no debris.
        let fail = |_: &Path| Err(io::Error::other("nope"));
        assert!(w.write(&payload(&[("a", "2")]), Some(&fail)).is_err());
        assert_eq!(read(dir.path(), "a"), "1");
        assert_eq!(versions(dir.path()).len(), 1);
    }

    #[test]
    fn refuses_a_foreign_data_dir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(DATA_DIR_NAME)).unwrap();
        let w = AtomicWriter::new(dir.path(), "test").unwrap();
        assert!(matches!(w.write(&payload(&[("a", "1")]), None), Err(Error::DataDirNotSymlink { .. })));
        assert!(matches!(AtomicWriter::new(dir.path().join("missing"), "t"), Err(Error::NoTarget { .. })));
    }

    /// Readers racing with updates only ever see complete versions: every file of the
    /// version `..data` points to has the same full content, and a file read through the
    /// user-visible link is never partial.
    #[test]
    fn readers_never_see_partial_state() {
        const SIZE: usize = 64 * 1024;
        let dir = tempfile::tempdir().unwrap();
        let w = AtomicWriter::new(dir.path(), "test").unwrap();
        let version = |n: u8| {
            let body = vec![b'a' + n % 26; SIZE];
            ["x", "y", "z/w"].iter().map(|k| ((*k).to_string(), FileProjection::new(body.clone(), 0o644))).collect()
        };
        w.write(&version(0), None).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let target = dir.path().to_path_buf();
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut complete = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(body) = std::fs::read(target.join("x")) {
                        assert_eq!(body.len(), SIZE, "partial file");
                        assert!(body.iter().all(|b| *b == body[0]), "mixed file");
                    }
                    let Ok(ts) = std::fs::read_link(target.join(DATA_DIR_NAME)) else { continue };
                    let files: Vec<_> =
                        ["x", "y", "z/w"].iter().map(|k| std::fs::read(target.join(&ts).join(k))).collect();
                    // The old version may be pruned under us (NotFound); what we read is whole.
                    if files.iter().all(Result::is_ok) {
                        let first = files[0].as_ref().unwrap();
                        assert_eq!(first.len(), SIZE);
                        assert!(files.iter().all(|f| f.as_ref().unwrap() == first), "mixed version");
                        complete += 1;
                    }
                }
                complete
            })
        };
        for n in 1..=200 {
            w.write(&version(n), None).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        assert_eq!(read(dir.path(), "z/w").as_bytes()[0], b'a' + 200 % 26);
    }
}
