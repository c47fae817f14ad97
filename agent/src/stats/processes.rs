//! cAdvisor's process stats of a cgroup, from procfs: the open descriptors and sockets of
//! its processes (`/proc/<pid>/fd`) and the soft open-files limit of its root process
//! (`/proc/<pid>/limits`), as `container/libcontainer/handler.go` `processStatsFromProcs`
//! reads them for `container_file_descriptors`, `container_sockets` and
//! `container_ulimits_soft`.
//!
//! What cAdvisor does, and what is kept:
//! - the processes are the lines of the cgroup's own `cgroup.procs` in the cpu hierarchy
//!   (v1) or the cgroup's directory (v2): a pod cgroup, which has no process of its own,
//!   counts 0; the root cgroup counts the processes left in it;
//! - every entry of each process's `fd` directory is a descriptor; one whose link reads
//!   `socket…` (the kernel's `socket:[inode]`) is also a socket;
//! - a process whose `fd` directory cannot be listed (it exited between `cgroup.procs`
//!   and the walk, or is not ours to see) is skipped silently, whole; a descriptor closed
//!   between the listing and its `readlink` still counts as a descriptor, not a socket;
//! - the limit exported is `Max open files` only (cAdvisor's one allowed ulimit), as
//!   `max_open_files`: the soft value, `unlimited` as -1; a line whose soft or hard value
//!   does not parse is left out.
//!
//! Cost: a pass walks every process of every container. The walk lists each `fd`
//! directory with `getdents64(2)` into one buffer kept between walks and reads each link
//! with `readlinkat(2)` relative to the directory into a few bytes on the stack (only its
//! prefix matters), so nothing is allocated per process or per descriptor.

use std::ffi::CStr;
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

/// cAdvisor's process stats of one cgroup (`info.ProcessStats`, the parts kept).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessStats {
    /// Open descriptors of the cgroup's processes.
    pub fds: u64,
    /// Of these, sockets.
    pub sockets: u64,
    /// The soft `Max open files` of the cgroup's root process (-1: unlimited); `None`
    /// without a root process (pod cgroups) or when its `limits` could not be read.
    pub max_open_files: Option<i64>,
}

/// Descriptors and sockets counted over processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FdCounts {
    /// Descriptors.
    pub fds: u64,
    /// Sockets among them.
    pub sockets: u64,
}

/// The `getdents64` buffer, in `u64`s so that the records the kernel writes are aligned.
const DENTS_WORDS: usize = 4096;

/// Counts the descriptors of processes under a procfs root, reusing its buffers between
/// walks (see the module docs).
#[derive(Debug)]
pub struct FdCounter {
    /// `<proc root>`, with `<pid>/fd` pushed and popped again for each process.
    path: PathBuf,
    /// The decimal pid being walked.
    pid: String,
    dents: Vec<u64>,
}

impl FdCounter {
    /// A counter of the processes under `proc_root` (`/proc`).
    #[must_use]
    pub fn new(proc_root: &Path) -> Self {
        let mut path = PathBuf::with_capacity(proc_root.as_os_str().len() + 16);
        path.push(proc_root);
        Self { path, pid: String::with_capacity(10), dents: vec![0; DENTS_WORDS] }
    }

    /// The descriptors and sockets of `pids`, skipping the processes that cannot be walked.
    pub fn count(&mut self, pids: &[u32]) -> FdCounts {
        let mut total = FdCounts::default();
        for &pid in pids {
            if let Some(c) = self.count_process(pid) {
                total.fds += c.fds;
                total.sockets += c.sockets;
            }
        }
        total
    }

    /// The descriptors and sockets of one process; `None` if its `fd` directory could not
    /// be listed to the end (it exited, or may not be looked at).
    pub fn count_process(&mut self, pid: u32) -> Option<FdCounts> {
        use std::fmt::Write as _;
        self.pid.clear();
        let _ = write!(self.pid, "{pid}");
        self.path.push(&self.pid);
        self.path.push("fd");
        let dir = File::open(&self.path);
        self.path.pop();
        self.path.pop();
        let dir = dir.ok()?;
        let fd = dir.as_raw_fd();
        let mut counts = FdCounts::default();
        loop {
            let capacity = self.dents.len() * size_of::<u64>();
            // SAFETY: `dents` is a live, writable buffer of `capacity` bytes and `fd` an
            // open directory; getdents64(2) writes at most `capacity` bytes into it.
            let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, self.dents.as_mut_ptr(), capacity) };
            let Ok(n) = usize::try_from(n) else { return None };
            if n == 0 {
                return Some(counts);
            }
            // SAFETY: the buffer is `capacity >= n` initialized bytes (u64s seen as bytes,
            // which any bit pattern is), borrowed for this iteration only.
            let bytes = unsafe { std::slice::from_raw_parts(self.dents.as_ptr().cast::<u8>(), n) };
            for name in dirent_names(bytes) {
                if name == c"." || name == c".." {
                    continue;
                }
                counts.fds += 1;
                if is_socket(fd, name) {
                    counts.sockets += 1;
                }
            }
        }
    }
}

/// The names of the `linux_dirent64` records in `bytes` (`d_ino` u64, `d_off` i64,
/// `d_reclen` u16, `d_type` u8, then the NUL-terminated name), stopping at a malformed one.
fn dirent_names(bytes: &[u8]) -> impl Iterator<Item = &CStr> {
    const NAME: usize = 19;
    let mut at = 0;
    std::iter::from_fn(move || {
        let record = bytes.get(at..)?;
        let reclen = usize::from(u16::from_ne_bytes([*record.get(16)?, *record.get(17)?]));
        let name = CStr::from_bytes_until_nul(record.get(NAME..reclen)?).ok()?;
        at += reclen;
        Some(name)
    })
}

/// Whether the descriptor `name` of the `fd` directory open as `dir` is a socket: its
/// link reads `socket:[inode]`. Only the first bytes are read (readlink truncates).
fn is_socket(dir: libc::c_int, name: &CStr) -> bool {
    const SOCKET: &[u8] = b"socket";
    let mut link = [0u8; SOCKET.len()];
    // SAFETY: `name` is NUL-terminated, `link` is writable for `link.len()` bytes and
    // readlinkat(2) writes at most that many; `dir` is an open directory descriptor.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), link.as_mut_ptr().cast(), link.len()) };
    usize::try_from(n).is_ok_and(|n| n == SOCKET.len()) && link == SOCKET
}

/// The soft `Max open files` of a `/proc/<pid>/limits` (-1 for `unlimited`), as cAdvisor
/// reads it: `None` without that line or when its soft or hard value does not parse.
#[must_use]
pub fn parse_max_open_files(limits: &str) -> Option<i64> {
    let line = limits.lines().find_map(|l| l.strip_prefix("Max open files"))?;
    let mut fields = line.split_ascii_whitespace();
    let soft = parse_limit(fields.next()?)?;
    // The hard value must parse too: cAdvisor drops the line otherwise.
    parse_limit(fields.next()?)?;
    Some(soft)
}

/// A limit value: a number, or `unlimited` (any case) as -1.
fn parse_limit(value: &str) -> Option<i64> {
    value.parse().ok().or_else(|| value.eq_ignore_ascii_case("unlimited").then_some(-1))
}
