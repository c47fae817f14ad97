//! `volumeMounts[].subPath` (upstream `makeMounts` plus `pkg/volume/util/subpath`): the
//! sub path must be relative and without `..`; a missing one is created with the mode of
//! the volume root (upstream `SafeMakeDir`); and the result must stay inside the volume
//! even through symlinks a container may have planted there.
//!
//! Upstream defends against a symlink swapped in *after* the check by bind-mounting the
//! checked path (opened component by component with `O_NOFOLLOW`) under
//! `volume-subpaths/`. This agent checks each component as it walks (symlinks are resolved
//! and must land inside the volume) and hands the runtime the fully resolved path, which
//! leaves a window between the check and the runtime's bind mount in which a container
//! that can write the volume could swap a component. Messages returned to the pod are
//! generic, as upstream's, so that they reveal nothing about the host's file system.

use std::io;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};

/// Sub path errors (messages as upstream).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// An absolute sub path.
    #[error("error SubPath `{0}` must not be an absolute path")]
    Absolute(String),
    /// A sub path with a `..` element.
    #[error("unable to provision SubPath `{0}`: must not contain '..'")]
    Backsteps(String),
    /// Creating the missing sub path failed.
    #[error("failed to create subPath directory for volumeMount {volume:?} of container {container:?}")]
    Create {
        /// The volume mount's name.
        volume: String,
        /// The container.
        container: String,
    },
    /// The sub path leaves the volume or cannot be resolved.
    #[error("failed to prepare subPath for volumeMount {volume:?} of container {container:?}")]
    Prepare {
        /// The volume mount's name.
        volume: String,
        /// The container.
        container: String,
    },
}

/// Upstream's checks of every sub path: relative, and without a `..` element.
pub fn validate(sub_path: &str) -> Result<(), Error> {
    if sub_path.starts_with('/') {
        return Err(Error::Absolute(sub_path.to_owned()));
    }
    if sub_path.split('/').any(|p| p == "..") {
        return Err(Error::Backsteps(sub_path.to_owned()));
    }
    Ok(())
}

/// Validates `sub_path`, creates it if missing and returns its resolved host path.
pub fn prepare(volume_path: &Path, sub_path: &str, volume: &str, container: &str) -> Result<PathBuf, Error> {
    validate(sub_path)?;
    let prepare_err = |why: &dyn std::fmt::Display| {
        tracing::warn!(volume, container, sub_path, reason = %why, "failed to prepare subPath");
        Error::Prepare { volume: volume.to_owned(), container: container.to_owned() }
    };
    let root = std::fs::canonicalize(volume_path).map_err(|e| prepare_err(&e))?;
    let root_mode = std::fs::metadata(&root).map_err(|e| prepare_err(&e))?.mode() & 0o7777;
    let mut cur = root.clone();
    for comp in Path::new(sub_path).components() {
        let Component::Normal(name) = comp else { continue };
        let next = cur.join(name);
        match std::fs::symlink_metadata(&next) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let resolved = std::fs::canonicalize(&next).map_err(|e| prepare_err(&e))?;
                if !resolved.starts_with(&root) {
                    return Err(prepare_err(&format_args!("{} leads outside the volume", next.display())));
                }
                cur = resolved;
            }
            Ok(_) => cur = next,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                make_dir(&next, root_mode).map_err(|e| {
                    tracing::warn!(volume, container, sub_path, error = %e, "failed to create subPath directory");
                    Error::Create { volume: volume.to_owned(), container: container.to_owned() }
                })?;
                cur = next;
            }
            Err(e) => return Err(prepare_err(&e)),
        }
    }
    // Belt and braces: the whole path, resolved once more, is still inside.
    let resolved = std::fs::canonicalize(&cur).map_err(|e| prepare_err(&e))?;
    if !resolved.starts_with(&root) {
        return Err(prepare_err(&format_args!("{} leads outside the volume", resolved.display())));
    }
    Ok(resolved)
}

/// `mkdir` without following anything, then the exact mode whatever the umask.
fn make_dir(path: &Path, mode: u32) -> io::Result<()> {
    std::fs::DirBuilder::new().mode(mode & 0o777).create(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn vol() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("vol");
        std::fs::create_dir(&v).unwrap();
        std::fs::set_permissions(&v, std::fs::Permissions::from_mode(0o777)).unwrap();
        (dir, v)
    }

    #[test]
    fn creates_missing_sub_paths_with_the_root_mode() {
        let (_d, v) = vol();
        let p = prepare(&v, "a/b", "data", "c").unwrap();
        assert_eq!(p, v.canonicalize().unwrap().join("a/b"));
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o777);
        // Existing paths, files included, are used as they are.
        std::fs::write(v.join("f"), "x").unwrap();
        assert_eq!(prepare(&v, "f", "data", "c").unwrap(), v.canonicalize().unwrap().join("f"));
        assert_eq!(prepare(&v, "./a//b/", "data", "c").unwrap(), p);
    }

    #[test]
    fn rejects_absolute_and_backsteps() {
        let (_d, v) = vol();
        assert_eq!(
            prepare(&v, "/etc", "data", "c").unwrap_err().to_string(),
            "error SubPath `/etc` must not be an absolute path"
        );
        assert_eq!(
            prepare(&v, "a/../../etc", "data", "c").unwrap_err().to_string(),
            "unable to provision SubPath `a/../../etc`: must not contain '..'"
        );
    }

    #[test]
    fn rejects_symlinks_that_escape() {
        let (d, v) = vol();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        symlink(&outside, v.join("evil")).unwrap();
        symlink("../outside", v.join("rel")).unwrap();
        symlink("/", v.join("root")).unwrap();
        for sub in ["evil", "evil/new", "rel", "root/etc"] {
            let err = prepare(&v, sub, "data", "c").unwrap_err();
            assert_eq!(
                err.to_string(),
                "failed to prepare subPath for volumeMount \"data\" of container \"c\"",
                "{sub}"
            );
        }
        // Nothing was created outside.
        assert!(!outside.join("new").exists());
        // A symlink that stays inside is fine.
        std::fs::create_dir(v.join("real")).unwrap();
        symlink("real", v.join("alias")).unwrap();
        assert_eq!(prepare(&v, "alias/x", "data", "c").unwrap(), v.canonicalize().unwrap().join("real/x"));
    }
}
