//! Reading a container's CRI log file for `/containerLogs` (upstream
//! `pkg/kubelet/kuberuntime/logs/logs.go`).
//!
//! The runtime writes one line per chunk of output: `<RFC3339Nano> <stdout|stderr> <P|F>
//! <content>`, `P` marking a partial line whose rest follows in the next line(s). The
//! reader turns them back into the container's output, with upstream's options
//! ([`LogOptions`]): `tailLines` (found by reading the file backwards in blocks, never the
//! whole file), `sinceSeconds` / `sinceTime`, `limitBytes`, `timestamps` (each output line
//! prefixed with its time; the pieces of a partial line get one prefix), `stream`
//! (`Stdout`, `Stderr` or `All`) and `follow`.
//!
//! Following waits at the end of the file for the directory to change (inotify) or one
//! second, whichever comes first, and stops once the container is no longer running and the
//! file has been read to its end. A file replaced under the same name (the agent's log
//! rotation renames it and the runtime reopens a new one) is read to its end and then the
//! new file is read from its start; upstream switches at once and may drop the old file's
//! last lines.
//!
//! Output goes out in chunks of at most [`CHUNK_BYTES`] through a bounded channel: memory
//! stays a few chunks whatever the file's size, and a client that goes away stops the read.
//! As upstream, `tailLines` counts the file's lines (a partial line counts as one) and a
//! line that does not parse is skipped; unlike upstream the docker JSON log format is not
//! read (no CRI runtime writes it).

use std::io::{self, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use jiff::Timestamp;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncSeekExt as _, BufReader};
use tokio::sync::mpsc;

use crate::container::{RuntimeService, api};
pub use crate::types::cri_log::{LogMessage, LogStream, ParseError, parse_cri_line, tail_start};

/// Largest piece of output sent at once.
pub const CHUNK_BYTES: usize = 32 * 1024;
/// How long a follower waits at the end of the file before looking again anyway (upstream
/// `logForceCheckPeriod`).
pub const FORCE_CHECK_PERIOD: Duration = Duration::from_secs(1);
/// A CRI log line longer than this is cut (runtimes split output into 16 KiB lines).
const MAX_LINE_BYTES: u64 = 1024 * 1024;

/// Why logs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to open log file {path:?}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to tail {lines} lines of log file {path:?}: {source}")]
    Tail {
        lines: u64,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to read log file {path:?}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Which of the container's streams to return (`stream` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Streams {
    #[default]
    All,
    Stdout,
    Stderr,
}

/// What to read (upstream `LogOptions`, from `v1.PodLogOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// The last this many lines only; `None`: all.
    pub tail_lines: Option<u64>,
    /// Stop after this many bytes of output; `None`: no limit.
    pub limit_bytes: Option<u64>,
    /// Lines written before this time are skipped.
    pub since: Option<Timestamp>,
    /// Keep reading while the container runs.
    pub follow: bool,
    /// Prefix each line with its RFC 3339 time.
    pub timestamps: bool,
    /// The streams to return.
    pub streams: Streams,
}

/// Turns messages into output under the options (upstream `logWriter`).
#[derive(Debug)]
struct LogWriter {
    since: Option<Timestamp>,
    timestamps: bool,
    streams: Streams,
    /// Bytes left under `limitBytes`.
    remain: Option<u64>,
}

/// What writing a message did.
#[derive(Debug, PartialEq, Eq)]
enum Written {
    More,
    /// `limitBytes` reached: stop.
    Limit,
}

impl LogWriter {
    fn new(opts: &LogOptions) -> Self {
        Self { since: opts.since, timestamps: opts.timestamps, streams: opts.streams, remain: opts.limit_bytes }
    }

    /// Appends `msg` to `out`; `new_line` says whether it starts an output line.
    fn write(&mut self, msg: &LogMessage<'_>, new_line: bool, out: &mut BytesMut) -> Written {
        if self.since.is_some_and(|since| msg.timestamp < since) {
            return Written::More;
        }
        match (self.streams, msg.stream) {
            (Streams::Stdout, LogStream::Stderr) | (Streams::Stderr, LogStream::Stdout) => return Written::More,
            _ => {}
        }
        let prefix: &[u8] = if self.timestamps && new_line { msg.timestamp_text } else { &[] };
        let mut pieces = [prefix, if prefix.is_empty() { &[] } else { b" " }, msg.content];
        if let Some(remain) = &mut self.remain {
            let mut left = *remain as usize;
            for piece in &mut pieces {
                let take = piece.len().min(left);
                *piece = &piece[..take];
                left -= take;
            }
            *remain = left as u64;
        }
        for piece in pieces {
            out.extend_from_slice(piece);
        }
        if self.remain == Some(0) { Written::Limit } else { Written::More }
    }
}

/// Whether the container is running (upstream `isContainerRunning`): an error or a gone
/// container is "not running".
async fn container_running(runtime: &dyn RuntimeService, id: &str) -> bool {
    match runtime.container_status(id).await {
        Ok(status) => status.state == api::ContainerState::ContainerRunning as i32,
        Err(e) => {
            tracing::debug!(container = id, error = %e, "container status while following logs");
            false
        }
    }
}

/// The inode of `path`, if it exists.
fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Reads a container's log file: opens it (resolving symlinks, as upstream) and finds the
/// start of `tailLines` before returning, so that those errors can still be answered as
/// errors; [`LogReader::run`] then streams the output.
#[derive(Debug)]
pub struct LogReader {
    path: PathBuf,
    file: tokio::fs::File,
    container_id: String,
    opts: LogOptions,
    runtime: Arc<dyn RuntimeService>,
}

impl LogReader {
    /// Opens `path` (the log of container `container_id`) and seeks to where reading starts.
    pub async fn open(
        path: &Path,
        container_id: &str,
        opts: LogOptions,
        runtime: Arc<dyn RuntimeService>,
    ) -> Result<Self, Error> {
        let path = tokio::fs::canonicalize(path).await.map_err(|source| Error::Open { path: path.into(), source })?;
        let std_file = std::fs::File::open(&path).map_err(|source| Error::Open { path: path.clone(), source })?;
        let (std_file, start) = match opts.tail_lines {
            None => (std_file, 0),
            Some(lines) => {
                let tail = tokio::task::spawn_blocking(move || tail_start(&std_file, lines).map(|s| (std_file, s)));
                tail.await.map_err(io::Error::other).and_then(|r| r).map_err(|source| Error::Tail {
                    lines,
                    path: path.clone(),
                    source,
                })?
            }
        };
        let mut file = tokio::fs::File::from_std(std_file);
        file.seek(SeekFrom::Start(start)).await.map_err(|source| Error::Read { path: path.clone(), source })?;
        Ok(Self { path, file, container_id: container_id.to_owned(), opts, runtime })
    }

    /// Streams the output into `tx` until done (end of file, `tailLines` or `limitBytes`
    /// reached, or the container stopped when following) or the receiver is gone. An error
    /// after output started ends the stream with it.
    pub async fn run(self, tx: mpsc::Sender<io::Result<Bytes>>) {
        let path = self.path.clone();
        if let Err(e) = self.stream(&tx).await {
            tracing::debug!(path = %path.display(), error = %e, "reading container log");
            let _ = tx.send(Err(io::Error::other(e.to_string()))).await;
        }
    }

    async fn stream(self, tx: &mpsc::Sender<io::Result<Bytes>>) -> Result<(), Error> {
        let Self { path, file, container_id, opts, runtime } = self;
        let read_error = |source| Error::Read { path: path.clone(), source };
        let mut current_inode = file.metadata().await.map_err(read_error)?.ino();
        let mut reader = BufReader::with_capacity(64 * 1024, file);
        let mut writer = LogWriter::new(&opts);
        // Without follow, `tailLines` also stops the read after that many lines.
        let mut lines_left = opts.tail_lines.filter(|_| !opts.follow);
        let mut out = BytesMut::with_capacity(CHUNK_BYTES);
        let mut line = Vec::new();
        let mut new_line = true;
        // Following: whether the container still runs (false: read to the end and stop).
        let mut running = true;
        let mut watcher: Option<(notify::RecommendedWatcher, mpsc::Receiver<()>)> = None;
        let mut watch_started = false;
        // Rotation seen and the old file read again to its end since.
        let mut old_drained = false;
        let flush = |out: &mut BytesMut| {
            let chunk = out.split().freeze();
            async move { chunk.is_empty() || tx.send(Ok(chunk)).await.is_ok() }
        };
        loop {
            if lines_left == Some(0) {
                break;
            }
            let had = line.len();
            let n = (&mut reader)
                .take(MAX_LINE_BYTES.saturating_sub(had as u64).max(1))
                .read_until(b'\n', &mut line)
                .await
                .map_err(read_error)?;
            let complete = line.last() == Some(&b'\n') || line.len() as u64 >= MAX_LINE_BYTES;
            if n == 0 || !complete {
                // End of the file for now.
                if opts.follow {
                    if !flush(&mut out).await {
                        return Ok(());
                    }
                    if !running {
                        // The container had stopped and its output is read: done.
                        break;
                    }
                    // Rotated: the old file is read to its end, go on with the new one.
                    let now = inode(&path);
                    if line.is_empty()
                        && let Some(ino) = now.filter(|&ino| ino != current_inode)
                    {
                        // The end just read may predate the last writes to the old file
                        // (made before the runtime reopened): read it once more first.
                        if !old_drained {
                            old_drained = true;
                            continue;
                        }
                        old_drained = false;
                        match tokio::fs::File::open(&path).await {
                            Ok(f) => {
                                current_inode = ino;
                                reader = BufReader::with_capacity(64 * 1024, f);
                                continue;
                            }
                            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                            Err(source) => return Err(Error::Open { path: path.clone(), source }),
                        }
                    }
                    if !watch_started {
                        watch_started = true;
                        watcher = watch_dir(&path);
                        // Look again: a change may have come before the watch.
                        continue;
                    }
                    running = container_running(runtime.as_ref(), &container_id).await;
                    if running {
                        wait_for_change(watcher.as_mut().map(|(_, rx)| rx), tx).await;
                        if tx.is_closed() {
                            return Ok(());
                        }
                    }
                    continue;
                }
                if line.is_empty() {
                    break;
                }
                tracing::debug!(path = %path.display(), "incomplete line at the end of the log file");
            }
            let text = std::mem::take(&mut line);
            match parse_cri_line(&text) {
                Ok(msg) => {
                    if writer.write(&msg, new_line, &mut out) == Written::Limit {
                        break;
                    }
                    new_line = !msg.partial;
                    if let Some(left) = &mut lines_left {
                        *left -= 1;
                    }
                }
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "skipping a log line that does not parse");
                }
            }
            line = text;
            line.clear();
            if out.len() >= CHUNK_BYTES && !flush(&mut out).await {
                return Ok(());
            }
            if n == 0 {
                // The last, incomplete line without follow.
                break;
            }
        }
        flush(&mut out).await;
        Ok(())
    }
}

/// Watches the directory of `path` (rotation creates a new file in it); `None` when
/// inotify is unavailable (following then looks every [`FORCE_CHECK_PERIOD`]).
fn watch_dir(path: &Path) -> Option<(notify::RecommendedWatcher, mpsc::Receiver<()>)> {
    use notify::Watcher as _;
    let (tx, rx) = mpsc::channel(1);
    let name = path.file_name().map(std::ffi::OsStr::to_os_string);
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if let Ok(event) = res
            && !matches!(event.kind, notify::EventKind::Access(_))
            && event.paths.iter().any(|p| p.file_name().map(std::ffi::OsStr::to_os_string) == name)
        {
            let _ = tx.try_send(());
        }
    })
    .map_err(|e| tracing::debug!(error = %e, "inotify for following logs"))
    .ok()?;
    let dir = path.parent()?;
    watcher
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .map_err(|e| tracing::debug!(dir = %dir.display(), error = %e, "watching the log directory"))
        .ok()?;
    Some((watcher, rx))
}

/// Waits for a change in the log's directory, [`FORCE_CHECK_PERIOD`], or the client to go.
async fn wait_for_change(changes: Option<&mut mpsc::Receiver<()>>, tx: &mpsc::Sender<io::Result<Bytes>>) {
    let change = async {
        match changes {
            Some(rx) => {
                rx.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = change => {}
        () = tokio::time::sleep(FORCE_CHECK_PERIOD) => {}
        () = tx.closed() => {}
    }
}

#[cfg(test)]
mod tests;
