//! The desired state of the world: the plugin sockets that exist under the registry
//! directory right now, each with a generation that changes when the file at that path is
//! a new socket (a restarted plugin unlinks its socket and binds a fresh one).
//!
//! Two kinds of observation feed it: a walk of the directory tree (at start, and every
//! reconcile period as a safety net) and inotify's changes for single paths in between. Both
//! lead to the same state: a walk that finds what the events already said changes nothing.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

/// What tells two socket files at one path apart. Not the change time: plugins often chmod
/// their socket after binding it, and that is no new plugin. The inode alone may be reused
/// at once by some filesystems after an unlink; the modification time, set by `bind`,
/// tells such a successor apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SocketId {
    dev: u64,
    ino: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl SocketId {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self { dev: meta.dev(), ino: meta.ino(), mtime: meta.mtime(), mtime_nsec: meta.mtime_nsec() }
    }
}

/// One socket that should be registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DesiredPlugin {
    id: SocketId,
    /// Unique within this manager's life; a new socket file at the same path gets a new
    /// one, which is what makes the reconciler deregister the old plugin and register anew.
    pub generation: u64,
}

/// A change inotify reported for one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Change {
    /// The path (a socket or a whole directory) was unlinked or moved away. Taken on
    /// trust, without a look at the path: a socket removed and bound again at once must
    /// still count as a new one even if the look finds an identical-looking successor.
    Gone(PathBuf),
    /// Something appeared at the path (created, moved in): it is looked at.
    Appeared(PathBuf),
    /// Events were lost (queue overflow, watcher error): walk the whole tree.
    Rescan,
}

impl Change {
    /// The changes a `notify` event stands for; none for the events that do not matter
    /// (reads, writes, attribute changes).
    pub(super) fn from_event(event: &notify::Event) -> Vec<Self> {
        use notify::EventKind;
        use notify::event::{ModifyKind, RenameMode};
        if event.need_rescan() {
            return vec![Self::Rescan];
        }
        match event.kind {
            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {
                event.paths.iter().cloned().map(Self::Gone).collect()
            }
            // `paths` is [from, to].
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => match event.paths.as_slice() {
                [from, to] => vec![Self::Gone(from.clone()), Self::Appeared(to.clone())],
                _ => vec![Self::Rescan],
            },
            EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(_)) => {
                event.paths.iter().cloned().map(Self::Appeared).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// The sockets under `root`, by path.
#[derive(Debug)]
pub(super) struct DesiredState {
    root: PathBuf,
    sockets: BTreeMap<PathBuf, DesiredPlugin>,
    next_generation: u64,
}

impl DesiredState {
    pub(super) fn new(root: PathBuf) -> Self {
        Self { root, sockets: BTreeMap::new(), next_generation: 1 }
    }

    pub(super) fn get(&self, socket: &Path) -> Option<&DesiredPlugin> {
        self.sockets.get(socket)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&PathBuf, &DesiredPlugin)> {
        self.sockets.iter()
    }

    /// Walks the whole tree and makes the state match it.
    pub(super) fn rescan(&mut self) {
        let root = self.root.clone();
        self.resync_under(&root);
    }

    pub(super) fn apply(&mut self, change: Change) {
        match change {
            Change::Gone(path) => self.forget_under(&path),
            Change::Appeared(path) => self.observe(&path),
            Change::Rescan => self.rescan(),
        }
    }

    /// Looks at one path: a socket is added (or given a new generation if it is another
    /// file than the one known), a directory is walked, anything else is dropped.
    fn observe(&mut self, path: &Path) {
        if !self.is_candidate(path) {
            return;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() => self.resync_under(path),
            Ok(_) => match socket_id(path) {
                Some(id) => self.upsert(path.to_owned(), id),
                None => self.forget_under(path),
            },
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "plugin registry entry vanished before it was looked at");
                self.forget_under(path);
            }
        }
    }

    /// Walks `dir` and makes the state below it match what the walk found.
    fn resync_under(&mut self, dir: &Path) {
        let mut found = BTreeMap::new();
        walk(dir, &mut found);
        self.sockets.retain(|p, _| !p.starts_with(dir) || found.contains_key(p));
        for (path, id) in found {
            self.upsert(path, id);
        }
    }

    fn forget_under(&mut self, path: &Path) {
        self.sockets.retain(|p, _| !p.starts_with(path));
    }

    fn upsert(&mut self, path: PathBuf, id: SocketId) {
        let generation = self.next_generation;
        match self.sockets.get_mut(&path) {
            Some(known) if known.id == id => return,
            Some(known) => {
                tracing::debug!(path = %path.display(), "plugin socket was replaced");
                *known = DesiredPlugin { id, generation };
            }
            None => {
                tracing::debug!(path = %path.display(), "plugin socket found");
                self.sockets.insert(path, DesiredPlugin { id, generation });
            }
        }
        self.next_generation += 1;
    }

    /// Below the root, and no component below the root is hidden (a leading '.').
    fn is_candidate(&self, path: &Path) -> bool {
        path.strip_prefix(&self.root).is_ok_and(|rel| rel.components().all(|c| !is_hidden(c.as_os_str())))
    }
}

fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.as_encoded_bytes().starts_with(b".")
}

/// The socket's identity, when `path` is (or links to) a unix socket.
fn socket_id(path: &Path) -> Option<SocketId> {
    // Followed, as a plugin may link its socket into the directory.
    let meta = std::fs::metadata(path).ok()?;
    meta.file_type().is_socket().then(|| SocketId::of(&meta))
}

/// Collects the sockets in `dir` and its non-hidden subdirectories (not followed through
/// symbolic links, so a link cannot make the walk loop). The directory is small and local:
/// the walk runs inline on the manager's task.
fn walk(dir: &Path, found: &mut BTreeMap<PathBuf, SocketId>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot read plugin registry directory");
            return;
        }
    };
    for entry in entries.flatten() {
        if is_hidden(&entry.file_name()) {
            continue;
        }
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => walk(&path, found),
            Ok(_) => {
                if let Some(id) = socket_id(&path) {
                    found.insert(path, id);
                } else {
                    tracing::trace!(path = %path.display(), "not a socket; ignored");
                }
            }
            Err(e) => tracing::debug!(path = %path.display(), error = %e, "cannot stat plugin registry entry"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    fn paths(state: &DesiredState) -> Vec<PathBuf> {
        state.iter().map(|(p, _)| p.strip_prefix(&state.root).unwrap().to_owned()).collect()
    }

    fn generation(state: &DesiredState, path: &Path) -> u64 {
        state.get(path).unwrap().generation
    }

    #[test]
    fn walk_finds_sockets_in_subdirectories_and_skips_hidden_and_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let _a = UnixListener::bind(root.join("a.sock")).unwrap();
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        let _b = UnixListener::bind(root.join("sub/deeper/b.sock")).unwrap();
        let _hidden = UnixListener::bind(root.join(".hidden.sock")).unwrap();
        std::fs::create_dir(root.join(".dir")).unwrap();
        let _in_hidden = UnixListener::bind(root.join(".dir/c.sock")).unwrap();
        std::fs::write(root.join("plain"), "not a socket").unwrap();

        let mut state = DesiredState::new(root.to_owned());
        state.rescan();
        assert_eq!(paths(&state), [PathBuf::from("a.sock"), PathBuf::from("sub/deeper/b.sock")]);
    }

    #[test]
    fn rescan_keeps_generations_of_unchanged_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("a.sock");
        let _a = UnixListener::bind(&sock).unwrap();
        let mut state = DesiredState::new(dir.path().to_owned());
        state.rescan();
        let first = generation(&state, &sock);
        state.rescan();
        state.apply(Change::Appeared(sock.clone()));
        assert_eq!(generation(&state, &sock), first);
        // A chmod is no new plugin.
        std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        state.rescan();
        assert_eq!(generation(&state, &sock), first);
    }

    #[test]
    fn a_socket_bound_again_gets_a_new_generation() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("a.sock");
        let mut state = DesiredState::new(dir.path().to_owned());
        let first_listener = UnixListener::bind(&sock).unwrap();
        state.rescan();
        let first = generation(&state, &sock);

        // Seen by the walk only: the old listener still holds its inode, so the new one
        // differs.
        std::fs::remove_file(&sock).unwrap();
        let _second_listener = UnixListener::bind(&sock).unwrap();
        state.rescan();
        let second = generation(&state, &sock);
        assert_ne!(second, first);
        drop(first_listener);

        // Seen through events: the removal counts even if the successor looked the same.
        state.apply(Change::Gone(sock.clone()));
        assert!(state.get(&sock).is_none());
        state.apply(Change::Appeared(sock.clone()));
        assert_ne!(generation(&state, &sock), second);
    }

    #[test]
    fn events_add_and_drop_sockets_and_directories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut state = DesiredState::new(root.to_owned());
        state.rescan();
        assert!(paths(&state).is_empty());

        // A directory that arrives with a socket already in it.
        std::fs::create_dir(root.join("sub")).unwrap();
        let _b = UnixListener::bind(root.join("sub/b.sock")).unwrap();
        state.apply(Change::Appeared(root.join("sub")));
        assert_eq!(paths(&state), [PathBuf::from("sub/b.sock")]);

        // Hidden names and plain files are ignored; events from outside the root too.
        let _h = UnixListener::bind(root.join(".h.sock")).unwrap();
        state.apply(Change::Appeared(root.join(".h.sock")));
        std::fs::write(root.join("plain"), "x").unwrap();
        state.apply(Change::Appeared(root.join("plain")));
        state.apply(Change::Appeared(PathBuf::from("/elsewhere.sock")));
        assert_eq!(paths(&state), [PathBuf::from("sub/b.sock")]);

        // The whole directory goes away.
        state.apply(Change::Gone(root.join("sub")));
        assert!(paths(&state).is_empty());
    }

    #[test]
    fn a_path_that_became_a_plain_file_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("a.sock");
        let mut state = DesiredState::new(dir.path().to_owned());
        drop(UnixListener::bind(&sock).unwrap());
        state.rescan();
        assert!(state.get(&sock).is_some());
        std::fs::remove_file(&sock).unwrap();
        std::fs::write(&sock, "x").unwrap();
        state.apply(Change::Appeared(sock.clone()));
        assert!(state.get(&sock).is_none());
    }

    #[test]
    fn notify_events_map_to_changes() {
        use notify::event::{CreateKind, Flag, ModifyKind, RemoveKind, RenameMode};
        use notify::{Event, EventKind};
        let a = PathBuf::from("/r/a");
        let b = PathBuf::from("/r/b");
        let ev = |kind| Event::new(kind).add_path(a.clone());
        assert_eq!(Change::from_event(&ev(EventKind::Create(CreateKind::File))), [Change::Appeared(a.clone())]);
        assert_eq!(Change::from_event(&ev(EventKind::Remove(RemoveKind::File))), [Change::Gone(a.clone())]);
        assert_eq!(
            Change::from_event(&ev(EventKind::Modify(ModifyKind::Name(RenameMode::From)))),
            [Change::Gone(a.clone())]
        );
        assert_eq!(
            Change::from_event(&ev(EventKind::Modify(ModifyKind::Name(RenameMode::To)))),
            [Change::Appeared(a.clone())]
        );
        assert_eq!(
            Change::from_event(&ev(EventKind::Modify(ModifyKind::Name(RenameMode::Both))).add_path(b.clone())),
            [Change::Gone(a.clone()), Change::Appeared(b)]
        );
        assert!(
            Change::from_event(&ev(EventKind::Modify(ModifyKind::Metadata(notify::event::MetadataKind::Any))))
                .is_empty()
        );
        assert_eq!(Change::from_event(&Event::new(EventKind::Other).set_flag(Flag::Rescan)), [Change::Rescan]);
    }
}
