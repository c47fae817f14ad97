//! The `hostPath` volume (upstream `pkg/volume/hostpath`): a path of the node mounted as
//! is, after the check its `type` asks for. `DirectoryOrCreate` creates the directory
//! (0755) and `FileOrCreate` the file (0644; its parent must exist), as upstream; an empty
//! type checks nothing. Checks follow symlinks (`stat`, not `lstat`), as upstream.

use std::io;
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// A failed type check or creation; messages as upstream.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path is not what `type` says.
    #[error("hostPath type check failed: {path} is not a {what}")]
    TypeCheck {
        /// The host path.
        path: String,
        /// `directory`, `file`, `socket file`, `character device` or `block device`.
        what: &'static str,
    },
    /// `type` is not one of the known values.
    #[error("{0} is an invalid volume type")]
    InvalidType(String),
    /// Creating the directory or file failed.
    #[error("{op} {path}: {source}")]
    Create {
        /// `mkdir` or `create`.
        op: &'static str,
        /// The host path.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// Checks (and for the `OrCreate` types, creates) `path` as `type_` asks.
pub fn check_type(path: &Path, type_: Option<&str>) -> Result<(), Error> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).ok();
    // `path` is there and is a `what`, as `is` tells from its metadata.
    let expect = |what, is: fn(&std::fs::Metadata) -> bool| {
        if meta.as_ref().is_some_and(is) { Ok(()) } else { Err(Error::TypeCheck { path: shown.clone(), what }) }
    };
    match type_.unwrap_or_default() {
        "" => Ok(()),
        "DirectoryOrCreate" if meta.is_none() => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(path)
            .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)))
            .map_err(|source| Error::Create { op: "mkdir", path: shown.clone(), source }),
        "DirectoryOrCreate" | "Directory" => expect("directory", std::fs::Metadata::is_dir),
        "FileOrCreate" if meta.is_none() => std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map(drop)
            .map_err(|source| Error::Create { op: "create", path: shown.clone(), source }),
        "FileOrCreate" | "File" => expect("file", std::fs::Metadata::is_file),
        "Socket" => expect("socket file", |m| m.file_type().is_socket()),
        "CharDevice" => expect("character device", |m| m.file_type().is_char_device()),
        "BlockDevice" => expect("block device", |m| m.file_type().is_block_device()),
        other => Err(Error::InvalidType(other.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    fn msg(path: &Path, t: &str) -> String {
        check_type(path, Some(t)).unwrap_err().to_string()
    }

    #[test]
    fn directory_types() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(check_type(dir.path(), Some("Directory")).is_ok());
        assert!(check_type(dir.path(), None).is_ok());
        assert_eq!(
            msg(&file, "Directory"),
            format!("hostPath type check failed: {} is not a directory", file.display())
        );
        assert!(msg(&dir.path().join("missing"), "Directory").ends_with("is not a directory"));
        assert!(msg(&file, "DirectoryOrCreate").ends_with("is not a directory"));

        let created = dir.path().join("a/b/c");
        check_type(&created, Some("DirectoryOrCreate")).unwrap();
        assert!(created.is_dir());
        assert_eq!(std::fs::metadata(&created).unwrap().mode() & 0o7777, 0o755);
        // Idempotent.
        check_type(&created, Some("DirectoryOrCreate")).unwrap();
    }

    #[test]
    fn file_types() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        check_type(&file, Some("FileOrCreate")).unwrap();
        // 0644 less the umask, as Go's OpenFile.
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o7777 & !0o644, 0);
        std::fs::write(&file, "keep").unwrap();
        check_type(&file, Some("FileOrCreate")).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
        assert!(check_type(&file, Some("File")).is_ok());
        assert_eq!(
            msg(dir.path(), "File"),
            format!("hostPath type check failed: {} is not a file", dir.path().display())
        );
        // The parent of a FileOrCreate path is not created, as upstream.
        assert!(matches!(check_type(&dir.path().join("no/f"), Some("FileOrCreate")), Err(Error::Create { .. })));
    }

    #[test]
    fn special_types() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(check_type(&sock, Some("Socket")).is_ok());
        assert!(msg(dir.path(), "Socket").ends_with("is not a socket file"));
        assert!(check_type(Path::new("/dev/null"), Some("CharDevice")).is_ok());
        assert!(msg(&sock, "CharDevice").ends_with("is not a character device"));
        assert!(msg(Path::new("/dev/null"), "BlockDevice").ends_with("is not a block device"));
        assert_eq!(msg(dir.path(), "Fifo"), "Fifo is an invalid volume type");
    }
}
