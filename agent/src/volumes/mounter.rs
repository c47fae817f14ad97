//! Mounting for volumes (upstream `k8s.io/mount-utils` as the volume plugins use it): tmpfs
//! for `emptyDir.medium: Memory`, Secret and projected volumes, unmounting, and the mount
//! table. [`SystemMounter`] calls mount(2)/umount2(2) and reads `/proc/self/mountinfo`;
//! [`FakeMounter`] keeps a table in memory so that unit tests run without root.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Mount operations the volume manager needs.
pub trait Mounter: Send + Sync + std::fmt::Debug {
    /// Mounts a tmpfs on `target` (which exists), with `size=<bytes>` when given.
    fn mount_tmpfs(&self, target: &Path, size_bytes: Option<i64>) -> io::Result<()>;
    /// Unmounts `target`.
    fn unmount(&self, target: &Path) -> io::Result<()>;
    /// Mount points at or below `path` (canonical), deepest first. Empty when `path`
    /// does not exist.
    fn mounts_under(&self, path: &Path) -> io::Result<Vec<PathBuf>>;
    /// Whether `path` is itself the mount point of a tmpfs.
    fn is_tmpfs(&self, path: &Path) -> io::Result<bool>;
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

/// `path` with symlinks resolved, as the mount table shows it; `None` if it does not exist.
fn canonical(path: &Path) -> io::Result<Option<PathBuf>> {
    match std::fs::canonicalize(path) {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The host's mounts, through the kernel.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemMounter;

impl SystemMounter {
    fn table() -> io::Result<Vec<crate::cm::cgroupfs::mounts::Mount>> {
        let text = std::fs::read_to_string("/proc/self/mountinfo")?;
        Ok(crate::cm::cgroupfs::mounts::parse_mountinfo(&text))
    }
}

impl Mounter for SystemMounter {
    fn mount_tmpfs(&self, target: &Path, size_bytes: Option<i64>) -> io::Result<()> {
        let target_c = c_path(target)?;
        let data = size_bytes.filter(|s| *s > 0).map(|s| format!("size={s}")).unwrap_or_default();
        let data = CString::new(data).expect("no NUL in mount options");
        // SAFETY: every pointer is a valid NUL-terminated string that outlives the call;
        // mount(2) only reads them.
        let rc =
            unsafe { libc::mount(c"tmpfs".as_ptr(), target_c.as_ptr(), c"tmpfs".as_ptr(), 0, data.as_ptr().cast()) };
        if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        let target_c = c_path(target)?;
        // SAFETY: a valid NUL-terminated path that outlives the call.
        let rc = unsafe { libc::umount2(target_c.as_ptr(), 0) };
        if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }

    fn mounts_under(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let Some(root) = canonical(path)? else { return Ok(Vec::new()) };
        let mut points: Vec<PathBuf> =
            Self::table()?.into_iter().map(|m| m.point).filter(|p| p.starts_with(&root)).collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        points.dedup();
        Ok(points)
    }

    fn is_tmpfs(&self, path: &Path) -> io::Result<bool> {
        let Some(point) = canonical(path)? else { return Ok(false) };
        // The last entry for a point is the one on top.
        Ok(Self::table()?.iter().rev().find(|m| m.point == point).is_some_and(|m| m.fstype == "tmpfs"))
    }
}

/// One call made to a [`FakeMounter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountCall {
    /// `mount_tmpfs(target, size)`.
    MountTmpfs(PathBuf, Option<i64>),
    /// `unmount(target)`.
    Unmount(PathBuf),
}

#[derive(Debug, Default)]
struct FakeState {
    /// Mount point (canonical) → size option.
    mounts: BTreeMap<PathBuf, Option<i64>>,
    calls: Vec<MountCall>,
    fail_unmount: Option<String>,
}

/// In-memory mount table: mounts nothing, remembers everything.
#[derive(Debug, Clone, Default)]
pub struct FakeMounter {
    state: Arc<Mutex<FakeState>>,
}

impl FakeMounter {
    /// The calls so far.
    #[must_use]
    pub fn calls(&self) -> Vec<MountCall> {
        self.state.lock().unwrap().calls.clone()
    }

    /// The current (fake) tmpfs mounts and their size options.
    #[must_use]
    pub fn mounts(&self) -> BTreeMap<PathBuf, Option<i64>> {
        self.state.lock().unwrap().mounts.clone()
    }

    /// Makes unmounts fail (like `EBUSY`) until cleared with `None`.
    pub fn fail_unmount(&self, message: Option<&str>) {
        self.state.lock().unwrap().fail_unmount = message.map(str::to_owned);
    }
}

impl Mounter for FakeMounter {
    fn mount_tmpfs(&self, target: &Path, size_bytes: Option<i64>) -> io::Result<()> {
        let point = std::fs::canonicalize(target)?;
        let mut s = self.state.lock().unwrap();
        s.calls.push(MountCall::MountTmpfs(target.to_owned(), size_bytes));
        s.mounts.insert(point, size_bytes);
        Ok(())
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        let point = canonical(target)?.unwrap_or_else(|| target.to_owned());
        let mut s = self.state.lock().unwrap();
        s.calls.push(MountCall::Unmount(target.to_owned()));
        if let Some(message) = &s.fail_unmount {
            return Err(io::Error::other(message.clone()));
        }
        match s.mounts.remove(&point) {
            Some(_) => Ok(()),
            None => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    fn mounts_under(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let Some(root) = canonical(path)? else { return Ok(Vec::new()) };
        let s = self.state.lock().unwrap();
        let mut points: Vec<PathBuf> = s.mounts.keys().filter(|p| p.starts_with(&root)).cloned().collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        Ok(points)
    }

    fn is_tmpfs(&self, path: &Path) -> io::Result<bool> {
        let Some(point) = canonical(path)? else { return Ok(false) };
        Ok(self.state.lock().unwrap().mounts.contains_key(&point))
    }
}

/// Whether the mount that `path` (canonical) lives on, the last mount in `table` whose
/// mount point is `path` or one of its parents, propagates to its peers (`shared:N`).
/// `None`: no mount holds `path`.
pub(crate) fn on_shared_mount(table: &[crate::cm::cgroupfs::mounts::Mount], path: &Path) -> Option<bool> {
    // Later lines are mounted on top of earlier ones: the last match is the one in effect.
    let mount = table.iter().rev().find(|m| path.starts_with(&m.point))?;
    Some(mount.optional.iter().any(|f| f.starts_with("shared:")))
}

/// Makes `path` (a directory) a shared mount with all mounts below it shared too, as
/// upstream's kubelet does with its root directory (`MakeRShared` in its setupDataDirs):
/// nothing when it already lives on a shared mount, else a bind mount of `path` on itself
/// made `rshared`. Then a container's `Bidirectional` mount of a directory below it (a
/// CSI driver's mount of `<root>/pods`) sends the mounts it makes back to the host, and
/// the host's to the other containers. The bind mount stays when the agent stops (as
/// upstream's does): a restarted agent finds the path shared and leaves it. Returns
/// whether it mounted.
///
/// # Errors
/// The mount table cannot be read, or mount(2) fails (not root).
pub fn make_rshared(path: &Path) -> io::Result<bool> {
    let path = std::fs::canonicalize(path)?;
    match on_shared_mount(&SystemMounter::table()?, &path) {
        Some(true) => return Ok(false),
        Some(false) => {}
        None => {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no mount holds {}", path.display())));
        }
    }
    let c = c_path(&path)?;
    // SAFETY: valid NUL-terminated paths that outlive the calls; mount(2) only reads them.
    let rc = unsafe { libc::mount(c.as_ptr(), c.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("bind-mounting {} on itself: {e}", path.display())));
    }
    // SAFETY: as above.
    let rc = unsafe {
        libc::mount(std::ptr::null(), c.as_ptr(), std::ptr::null(), libc::MS_SHARED | libc::MS_REC, std::ptr::null())
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("making {} rshared: {e}", path.display())));
    }
    Ok(true)
}

/// Whether this process runs as root (tests that need real mounts skip otherwise).
#[must_use]
pub fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    // /proc/self is owned by the process's effective uid.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(lines: &str) -> Vec<crate::cm::cgroupfs::mounts::Mount> {
        crate::cm::cgroupfs::mounts::parse_mountinfo(lines)
    }

    #[test]
    fn the_mount_in_effect_decides_whether_a_path_is_shared() {
        let t = table(
            "22 1 8:1 / / rw,relatime - ext4 /dev/vda rw\n\
             30 22 8:1 /var/lib/k /var/lib/k rw,relatime shared:5 - ext4 /dev/vda rw\n\
             31 22 0:40 / /var/lib/kx rw master:3 - tmpfs tmpfs rw\n",
        );
        assert_eq!(on_shared_mount(&t, Path::new("/var/lib/k/pods")), Some(true));
        assert_eq!(on_shared_mount(&t, Path::new("/var/lib/k")), Some(true));
        // A sibling whose name only starts the same lives on its own mount or on /.
        assert_eq!(on_shared_mount(&t, Path::new("/var/lib/kx")), Some(false));
        assert_eq!(on_shared_mount(&t, Path::new("/var/lib/ky")), Some(false));
        // Mounted again on top, private: the last line wins.
        let mut stacked = t.clone();
        stacked.extend(table("40 30 8:1 /var/lib/k /var/lib/k rw - ext4 /dev/vda rw\n"));
        assert_eq!(on_shared_mount(&stacked, Path::new("/var/lib/k/pods")), Some(false));
        assert_eq!(on_shared_mount(&[], Path::new("/x")), None);
    }

    /// A real directory on a private mount made rshared, then left alone the second time
    /// (root only; CI runs as root).
    #[test]
    fn make_rshared_binds_a_private_directory_once() {
        if !running_as_root() {
            eprintln!("skipping: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let root = root.canonicalize().unwrap();
        let first = make_rshared(&root);
        let second = make_rshared(&root);
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let shared = on_shared_mount(&table(&text), &root.join("pods"));
        let ours = SystemMounter.mounts_under(&root).unwrap();
        for m in &ours {
            let _ = SystemMounter.unmount(m);
        }
        // Was the temporary directory already on a shared mount, nothing is mounted.
        assert_eq!(first.unwrap(), ours == vec![root.clone()]);
        assert!(!second.unwrap(), "a shared path is bound only once");
        assert_eq!(shared, Some(true));
        assert!(SystemMounter.mounts_under(&root).unwrap().is_empty());
    }

    #[test]
    fn fake_tracks_mounts() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = a.join("b");
        std::fs::create_dir_all(&b).unwrap();
        let m = FakeMounter::default();
        m.mount_tmpfs(&a, Some(10)).unwrap();
        m.mount_tmpfs(&b, None).unwrap();
        assert!(m.is_tmpfs(&a).unwrap());
        let under = m.mounts_under(dir.path()).unwrap();
        assert_eq!(under, vec![b.canonicalize().unwrap(), a.canonicalize().unwrap()]);
        m.unmount(&b).unwrap();
        assert!(m.unmount(&b).is_err());
        assert_eq!(m.mounts_under(dir.path()).unwrap().len(), 1);
    }

    /// A real tmpfs (root only; CI runs as root): mount with a size, see it in the mount
    /// table, unmount.
    #[test]
    fn real_tmpfs_mount_and_unmount() {
        if !running_as_root() {
            eprintln!("skipping: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("mem");
        std::fs::create_dir(&target).unwrap();
        let m = SystemMounter;
        m.mount_tmpfs(&target, Some(4 * 1024 * 1024)).unwrap();
        let mounted = m.is_tmpfs(&target);
        let under = m.mounts_under(dir.path());
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        m.unmount(&target).unwrap();
        assert!(mounted.unwrap());
        assert_eq!(under.unwrap(), vec![target.canonicalize().unwrap()]);
        let line = table.lines().find(|l| l.contains(target.to_str().unwrap())).unwrap();
        assert!(line.contains("size=4096k"), "{line}");
        assert!(!m.is_tmpfs(&target).unwrap());
        assert!(m.mounts_under(dir.path()).unwrap().is_empty());
    }
}
