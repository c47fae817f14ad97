//! `fsGroup` ownership of volumes (upstream `volume.SetVolumeOwnership`): everything under
//! the volume gets the pod's `fsGroup` as group, group read (and write, for writable
//! volumes) permission, and directories get setgid and group search so that new files
//! inherit the group. Symlinks are re-grouped but never chmod-ed (that would change the
//! file they point to) and never followed.
//!
//! The in-tree volumes this agent supports pass no `fsGroupChangePolicy` upstream, so the
//! walk always runs (`OnRootMismatch` only applies to persistent volumes).

use std::io;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

/// Group read-write, for writable volumes.
const RW_MASK: u32 = 0o660;
/// Group read, for the read-only volumes (configMap, secret, downwardAPI, projected).
const RO_MASK: u32 = 0o440;
/// Group search on directories.
const EXEC_MASK: u32 = 0o110;
/// `S_ISGID`.
const SETGID: u32 = 0o2000;

/// Applies `fs_group` to `dir` and everything below it.
pub fn set_volume_ownership(dir: &Path, fs_group: u32, read_only: bool) -> io::Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if let Err(e) = std::os::unix::fs::lchown(&path, None, Some(fs_group)) {
            tracing::warn!(path = %path.display(), error = %e, "lchown failed");
        }
        if meta.file_type().is_symlink() {
            continue;
        }
        let mut mask = if read_only { RO_MASK } else { RW_MASK };
        if meta.is_dir() {
            mask |= SETGID | EXEC_MASK;
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
        let mode = meta.mode() & 0o7777;
        if mode | mask != mode
            && let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode | mask))
        {
            tracing::warn!(path = %path.display(), error = %e, "chmod failed");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn groups_and_masks_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("vol");
        std::fs::create_dir_all(vol.join("sub")).unwrap();
        std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(vol.join("sub/f"), "x").unwrap();
        std::fs::set_permissions(vol.join("sub/f"), std::fs::Permissions::from_mode(0o400)).unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "o").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&outside, vol.join("link")).unwrap();

        set_volume_ownership(&vol, 1234, true).unwrap();
        assert_eq!(mode(&vol), 0o2750);
        assert_eq!(mode(&vol.join("sub/f")), 0o440);
        // The link's target is untouched.
        assert_eq!(mode(&outside), 0o600);
        if crate::volumes::mounter::running_as_root() {
            assert_eq!(std::fs::metadata(vol.join("sub/f")).unwrap().gid(), 1234);
            assert_eq!(std::fs::symlink_metadata(vol.join("link")).unwrap().gid(), 1234);
            assert_ne!(std::fs::metadata(&outside).unwrap().gid(), 1234);
        }

        set_volume_ownership(&vol, 1234, false).unwrap();
        assert_eq!(mode(&vol.join("sub/f")), 0o660);
    }
}
