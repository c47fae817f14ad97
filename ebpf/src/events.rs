//! Sensor events: the ring-buffer record layouts (mirrors of `bpf/events.h`) and
//! their decoding into [`SensorEvent`].
//!
//! Decoding trusts nothing: every record is length-checked before it is read, and
//! unknown kinds or out-of-range fields become a [`DecodeError`], never a panic.

use std::{ffi::OsStr, os::unix::ffi::OsStrExt as _, path::PathBuf};

use crate::cgroup::CgroupId;

/// One thing the kernel saw happen to a watched cgroup or one of its tasks.
///
/// Every variant carries `ktime_ns`, the kernel's `CLOCK_MONOTONIC` time (nanoseconds
/// since boot, not counting suspend) when the event happened; compare it with
/// [`crate::Sensors::monotonic_now_ns`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SensorEvent {
    /// A cgroup was created at or below a watched root.
    CgroupMkdir(CgroupChange),
    /// A cgroup at or below a watched root was removed. Its counters are gone.
    CgroupRmdir(CgroupChange),
    /// A task of a watched cgroup called `execve`, and either it is the first exec in
    /// one of its watched cgroups or its thread group is pid 1 of its pid namespace.
    /// Later execs (probes, `kubectl exec`, shells) are only counted.
    Exec {
        /// When the exec completed.
        ktime_ns: u64,
        /// The task after the exec (`comm` is the new program's).
        task: TaskInfo,
        /// The thread group is pid 1 of its pid namespace: a container's main process.
        ns_init: bool,
        /// The first exec counted in one of the task's watched cgroups.
        first_in_cgroup: bool,
    },
    /// The last thread of a process (thread group) of a watched cgroup exited.
    /// Exits of single threads of a live process are only counted.
    ///
    /// Exits of a cgroup's main process (`main_process` or `ns_init`) wake the reader
    /// at once; other exits are delivered with the next wakeup or flush (at most
    /// `SensorConfig::pressure_flush_interval` later); `ktime_ns` is exact for both.
    Exit {
        /// When the last thread started to exit (before its memory was released).
        ktime_ns: u64,
        /// The last thread of the group (its `pid` is not the process id when the
        /// main thread died first; `tgid` is).
        task: TaskInfo,
        /// What `wait(2)` reports for the process.
        status: ExitStatus,
        /// The process was pid 1 of its pid namespace: a container's main process.
        ns_init: bool,
        /// The process made the first exec counted in its cgroup: the container's
        /// main process, also for containers that share the host's pid namespace.
        main_process: bool,
    },
    /// The OOM killer chose a victim in a watched cgroup.
    OomKill {
        /// When the victim was marked.
        ktime_ns: u64,
        /// The victim (not the task whose allocation failed). `memcg` is its memory
        /// cgroup on v1; on cgroup2 `cgroup2` is.
        victim: TaskInfo,
        /// The victim's uid.
        uid: u32,
    },
    /// A task of a watched cgroup entered or left memory reclaim: memory pressure.
    Reclaim {
        /// When the phase happened.
        ktime_ns: u64,
        /// The task doing the reclaim (it stalls while reclaiming).
        task: TaskInfo,
        /// Whose shortage caused it.
        scope: ReclaimScope,
        /// Begin or end, with the phase's details.
        phase: ReclaimPhase,
    },
}

impl SensorEvent {
    /// The kernel's `CLOCK_MONOTONIC` timestamp of the event, in nanoseconds.
    #[must_use]
    pub fn ktime_ns(&self) -> u64 {
        match self {
            Self::CgroupMkdir(change) | Self::CgroupRmdir(change) => change.ktime_ns,
            Self::Exec { ktime_ns, .. }
            | Self::Exit { ktime_ns, .. }
            | Self::OomKill { ktime_ns, .. }
            | Self::Reclaim { ktime_ns, .. } => *ktime_ns,
        }
    }
}

/// A cgroup directory appearing or disappearing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupChange {
    /// When the directory was created or removed.
    pub ktime_ns: u64,
    /// The cgroup (its id is the directory's inode number).
    pub cgroup: CgroupId,
    /// Depth below the hierarchy root (the root is 0, `/kubepods` is 1).
    pub level: u32,
    /// Path from the hierarchy root, e.g. `/kubepods/burstable/pod<uid>/<container id>`.
    pub path: PathBuf,
    /// The kernel's path filled the 511-byte buffer and may have been cut.
    pub path_truncated: bool,
}

/// The identity of a task in an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskInfo {
    /// Thread id in the initial pid namespace (what the node's `/proc` shows).
    pub pid: u32,
    /// Process (thread group) id in the initial pid namespace.
    pub tgid: u32,
    /// Thread id in the task's own pid namespace (the container's view).
    pub ns_pid: u32,
    /// Process id in the task's own pid namespace; 1 for a container's main process.
    pub ns_tgid: u32,
    /// The task's cgroup2 cgroup (hierarchy 0). On a v1-only node this is the root.
    pub cgroup2: CgroupId,
    /// The task's v1 memory cgroup; `None` when memory is not on a v1 hierarchy.
    pub memcg: Option<CgroupId>,
    /// The task's v1 cpu cgroup; `None` when cpu is not on a v1 hierarchy.
    pub cpu_cgroup: Option<CgroupId>,
    /// The task's `comm` (first 15 bytes of the program name).
    pub comm: String,
}

/// How a process ended, decoded from a `wait(2)` status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExitStatus {
    /// The process called `exit(code)` (or returned `code` from `main`).
    Exited {
        /// The exit code, 0..=255.
        code: u8,
    },
    /// A signal killed the process (an OOM kill is `SIGKILL`, 9).
    Signaled {
        /// The signal number.
        signal: u8,
        /// The kernel dumped core.
        core_dumped: bool,
    },
}

impl ExitStatus {
    /// Decodes a `wait(2)` status: the low 7 bits are the killing signal (0 = none),
    /// bit 7 the core-dump flag, bits 8..16 the exit code.
    #[must_use]
    pub const fn from_wait_status(status: u32) -> Self {
        let signal = (status & 0x7f) as u8;
        if signal == 0 {
            Self::Exited { code: ((status >> 8) & 0xff) as u8 }
        } else {
            Self::Signaled { signal, core_dumped: status & 0x80 != 0 }
        }
    }

    /// The exit code, when the process exited on its own.
    #[must_use]
    pub const fn code(&self) -> Option<i32> {
        match self {
            Self::Exited { code } => Some(*code as i32),
            Self::Signaled { .. } => None,
        }
    }

    /// The killing signal, when a signal ended the process.
    #[must_use]
    pub const fn signal(&self) -> Option<i32> {
        match self {
            Self::Exited { .. } => None,
            Self::Signaled { signal, .. } => Some(*signal as i32),
        }
    }

    /// The exit code as the kubelet reports it for a container: the code, or 128 +
    /// the signal (137 for `SIGKILL`).
    #[must_use]
    pub const fn container_exit_code(&self) -> i32 {
        match self {
            Self::Exited { code } => *code as i32,
            Self::Signaled { signal, .. } => 128 + *signal as i32,
        }
    }
}

/// Whose memory shortage made a task reclaim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReclaimScope {
    /// A memory cgroup reached its limit (`memory.max`/`memory.limit_in_bytes`).
    Memcg,
    /// The node ran short and the allocating task reclaimed directly.
    Direct,
}

/// A reclaim episode's begin or end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReclaimPhase {
    /// The task entered reclaim.
    Begin {
        /// Order of the allocation that triggered it (pages = 2^order).
        order: u32,
        /// The allocation's gfp flags (kernel-internal bit values).
        gfp_flags: u32,
    },
    /// The task left reclaim. Only episodes whose begin was seen end with a record.
    End {
        /// Pages reclaimed.
        nr_reclaimed: u64,
        /// Nanoseconds since the matching begin: how long the task stalled.
        duration_ns: u64,
    },
}

/// Why a ring-buffer record could not be decoded. The record is skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The record is shorter than its kind's layout.
    #[error("{what} record of {len} bytes is shorter than its {expected}-byte layout")]
    Short {
        /// The record kind (or "header").
        what: &'static str,
        /// Bytes received.
        len: usize,
        /// Bytes the layout needs.
        expected: usize,
    },
    /// The header names a kind this reader does not know.
    #[error("unknown record kind {kind}")]
    UnknownKind {
        /// The kind field.
        kind: u32,
    },
    /// A field holds a value outside its range.
    #[error("{what} record has invalid {field} {value}")]
    InvalidField {
        /// The record kind.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// The value found.
        value: u64,
    },
}

// ---- the ABI: mirrors of bpf/events.h ----------------------------------------------

const PATH_MAX: usize = 512;
const COMM_LEN: usize = 16;

const KIND_CGROUP_MKDIR: u32 = 1;
const KIND_CGROUP_RMDIR: u32 = 2;
const KIND_EXEC: u32 = 3;
const KIND_EXIT: u32 = 4;
const KIND_OOM_KILL: u32 = 5;
const KIND_RECLAIM: u32 = 6;

const CGROUP_PATH_TRUNCATED: u32 = 1 << 0;
const TASK_NS_INIT: u32 = 1 << 0;
const TASK_FIRST_EXEC: u32 = 1 << 1;
const TASK_MAIN: u32 = 1 << 3;

const RECLAIM_MEMCG: u32 = 1;
const RECLAIM_DIRECT: u32 = 2;
const RECLAIM_BEGIN: u32 = 1;
const RECLAIM_END: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawHeader {
    pub(crate) kind: u32,
    pub(crate) cpu: u32,
    pub(crate) ktime_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawTask {
    pub(crate) pid: u32,
    pub(crate) tgid: u32,
    pub(crate) ns_pid: u32,
    pub(crate) ns_tgid: u32,
    pub(crate) cgroup2_id: u64,
    pub(crate) memcg_id: u64,
    pub(crate) cpu_cgroup_id: u64,
    pub(crate) memcg_hierarchy_id: u32,
    pub(crate) cpu_hierarchy_id: u32,
    pub(crate) comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawCgroupEvent {
    pub(crate) hdr: RawHeader,
    pub(crate) cgroup_id: u64,
    pub(crate) hierarchy_id: u32,
    pub(crate) level: u32,
    pub(crate) flags: u32,
    pub(crate) path_len: u32,
    pub(crate) path: [u8; PATH_MAX],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawExecEvent {
    pub(crate) hdr: RawHeader,
    pub(crate) task: RawTask,
    pub(crate) flags: u32,
    pub(crate) pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawExitEvent {
    pub(crate) hdr: RawHeader,
    pub(crate) task: RawTask,
    pub(crate) flags: u32,
    pub(crate) exit_status: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawOomEvent {
    pub(crate) hdr: RawHeader,
    pub(crate) task: RawTask,
    pub(crate) uid: u32,
    pub(crate) pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawReclaimEvent {
    pub(crate) hdr: RawHeader,
    pub(crate) task: RawTask,
    pub(crate) scope: u32,
    pub(crate) phase: u32,
    pub(crate) order: u32,
    pub(crate) gfp_flags: u32,
    pub(crate) nr_reclaimed: u64,
    pub(crate) duration_ns: u64,
}

// The C side asserts the same sizes (events.h); a field added on one side only fails
// the build instead of silently shifting every later field.
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<RawHeader>() == 16);
    assert!(size_of::<RawTask>() == 64);
    assert!(size_of::<RawCgroupEvent>() == 40 + PATH_MAX);
    assert!(size_of::<RawExecEvent>() == 88);
    assert!(size_of::<RawExitEvent>() == 88);
    assert!(size_of::<RawOomEvent>() == 88);
    assert!(size_of::<RawReclaimEvent>() == 112);
};

// SAFETY: plain `#[repr(C)]` structs of integers and byte arrays without padding
// (sizes asserted above): every bit pattern is a valid value.
unsafe impl aya::Pod for RawHeader {}
// SAFETY: as above.
unsafe impl aya::Pod for RawTask {}
// SAFETY: as above.
unsafe impl aya::Pod for RawCgroupEvent {}
// SAFETY: as above.
unsafe impl aya::Pod for RawExecEvent {}
// SAFETY: as above.
unsafe impl aya::Pod for RawExitEvent {}
// SAFETY: as above.
unsafe impl aya::Pod for RawOomEvent {}
// SAFETY: as above.
unsafe impl aya::Pod for RawReclaimEvent {}

/// Copies a `T` out of the front of `record` after checking the length.
fn read<T: aya::Pod>(record: &[u8], what: &'static str) -> Result<T, DecodeError> {
    let expected = size_of::<T>();
    if record.len() < expected {
        return Err(DecodeError::Short { what, len: record.len(), expected });
    }
    // SAFETY: `record` holds at least `size_of::<T>()` bytes (checked above), the read
    // is unaligned-safe, and `T: Pod` is valid for any bit pattern.
    Ok(unsafe { record.as_ptr().cast::<T>().read_unaligned() })
}

/// Decodes one ring-buffer record.
pub fn decode(record: &[u8]) -> Result<SensorEvent, DecodeError> {
    let header: RawHeader = read(record, "header")?;
    match header.kind {
        KIND_CGROUP_MKDIR => Ok(SensorEvent::CgroupMkdir(decode_cgroup(record, "cgroup_mkdir")?)),
        KIND_CGROUP_RMDIR => Ok(SensorEvent::CgroupRmdir(decode_cgroup(record, "cgroup_rmdir")?)),
        KIND_EXEC => {
            let raw: RawExecEvent = read(record, "exec")?;
            Ok(SensorEvent::Exec {
                ktime_ns: raw.hdr.ktime_ns,
                task: raw.task.into(),
                ns_init: raw.flags & TASK_NS_INIT != 0,
                first_in_cgroup: raw.flags & TASK_FIRST_EXEC != 0,
            })
        }
        KIND_EXIT => {
            let raw: RawExitEvent = read(record, "exit")?;
            Ok(SensorEvent::Exit {
                ktime_ns: raw.hdr.ktime_ns,
                task: raw.task.into(),
                status: ExitStatus::from_wait_status(raw.exit_status),
                ns_init: raw.flags & TASK_NS_INIT != 0,
                main_process: raw.flags & TASK_MAIN != 0,
            })
        }
        KIND_OOM_KILL => {
            let raw: RawOomEvent = read(record, "oom_kill")?;
            Ok(SensorEvent::OomKill { ktime_ns: raw.hdr.ktime_ns, victim: raw.task.into(), uid: raw.uid })
        }
        KIND_RECLAIM => {
            let raw: RawReclaimEvent = read(record, "reclaim")?;
            let invalid = |field, value| DecodeError::InvalidField { what: "reclaim", field, value };
            let scope = match raw.scope {
                RECLAIM_MEMCG => ReclaimScope::Memcg,
                RECLAIM_DIRECT => ReclaimScope::Direct,
                other => return Err(invalid("scope", other.into())),
            };
            let phase = match raw.phase {
                RECLAIM_BEGIN => ReclaimPhase::Begin { order: raw.order, gfp_flags: raw.gfp_flags },
                RECLAIM_END => ReclaimPhase::End { nr_reclaimed: raw.nr_reclaimed, duration_ns: raw.duration_ns },
                other => return Err(invalid("phase", other.into())),
            };
            Ok(SensorEvent::Reclaim { ktime_ns: raw.hdr.ktime_ns, task: raw.task.into(), scope, phase })
        }
        kind => Err(DecodeError::UnknownKind { kind }),
    }
}

fn decode_cgroup(record: &[u8], what: &'static str) -> Result<CgroupChange, DecodeError> {
    let raw: RawCgroupEvent = read(record, what)?;
    let len = raw.path_len as usize;
    let path = raw.path.get(..len).ok_or(DecodeError::InvalidField { what, field: "path_len", value: len as u64 })?;
    Ok(CgroupChange {
        ktime_ns: raw.hdr.ktime_ns,
        cgroup: CgroupId { hierarchy_id: raw.hierarchy_id, id: raw.cgroup_id },
        level: raw.level,
        path: PathBuf::from(OsStr::from_bytes(path)),
        path_truncated: raw.flags & CGROUP_PATH_TRUNCATED != 0,
    })
}

impl From<RawTask> for TaskInfo {
    fn from(raw: RawTask) -> Self {
        let v1 = |hierarchy_id, id| (id != 0).then_some(CgroupId { hierarchy_id, id });
        let comm_len = raw.comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
        Self {
            pid: raw.pid,
            tgid: raw.tgid,
            ns_pid: raw.ns_pid,
            ns_tgid: raw.ns_tgid,
            cgroup2: CgroupId::unified(raw.cgroup2_id),
            memcg: v1(raw.memcg_hierarchy_id, raw.memcg_id),
            cpu_cgroup: v1(raw.cpu_hierarchy_id, raw.cpu_cgroup_id),
            comm: String::from_utf8_lossy(&raw.comm[..comm_len]).into_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serialises a raw struct as the kernel would write it.
    fn bytes_of<T: aya::Pod>(value: &T) -> Vec<u8> {
        // SAFETY: T is Pod (no padding, plain integers), so all its bytes are initialised.
        unsafe { std::slice::from_raw_parts(std::ptr::from_ref(value).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    fn header(kind: u32) -> RawHeader {
        RawHeader { kind, cpu: 1, ktime_ns: 123_456_789 }
    }

    fn task() -> RawTask {
        let mut comm = [0u8; COMM_LEN];
        comm[..5].copy_from_slice(b"sleep");
        RawTask {
            pid: 4242,
            tgid: 4242,
            ns_pid: 1,
            ns_tgid: 1,
            cgroup2_id: 77,
            memcg_id: 88,
            cpu_cgroup_id: 0,
            memcg_hierarchy_id: 4,
            cpu_hierarchy_id: 0,
            comm,
        }
    }

    fn exit_record(status: u32, flags: u32) -> Vec<u8> {
        bytes_of(&RawExitEvent { hdr: header(KIND_EXIT), task: task(), flags, exit_status: status })
    }

    #[test]
    fn decodes_exit_with_code() {
        let event = decode(&exit_record(7 << 8, TASK_NS_INIT)).unwrap();
        let SensorEvent::Exit { ktime_ns, task, status, ns_init, main_process } = event else {
            panic!("not an exit: {event:?}")
        };
        assert_eq!(ktime_ns, 123_456_789);
        assert_eq!(status, ExitStatus::Exited { code: 7 });
        assert!(ns_init);
        assert!(!main_process);
        assert_eq!(task.comm, "sleep");
        assert_eq!(task.cgroup2, CgroupId::unified(77));
        assert_eq!(task.memcg, Some(CgroupId { hierarchy_id: 4, id: 88 }));
        assert_eq!(task.cpu_cgroup, None, "id 0 means the controller is not on v1");
    }

    #[test]
    fn wait_status_decoding() {
        assert_eq!(ExitStatus::from_wait_status(0), ExitStatus::Exited { code: 0 });
        assert_eq!(ExitStatus::from_wait_status(255 << 8), ExitStatus::Exited { code: 255 });
        let killed = ExitStatus::from_wait_status(9);
        assert_eq!(killed, ExitStatus::Signaled { signal: 9, core_dumped: false });
        assert_eq!((killed.code(), killed.signal(), killed.container_exit_code()), (None, Some(9), 137));
        assert_eq!(ExitStatus::from_wait_status(0x80 | 0x0b), ExitStatus::Signaled { signal: 11, core_dumped: true });
        assert_eq!(ExitStatus::Exited { code: 3 }.container_exit_code(), 3);
    }

    #[test]
    fn decodes_cgroup_paths_by_length() {
        let mut path = [0xffu8; PATH_MAX];
        path[..15].copy_from_slice(b"/kubepods/pod-a");
        let raw = RawCgroupEvent {
            hdr: header(KIND_CGROUP_RMDIR),
            cgroup_id: 99,
            hierarchy_id: 0,
            level: 2,
            flags: 0,
            path_len: 15,
            path,
        };
        let SensorEvent::CgroupRmdir(change) = decode(&bytes_of(&raw)).unwrap() else { panic!("not an rmdir") };
        assert_eq!(change.path, PathBuf::from("/kubepods/pod-a"));
        assert_eq!((change.cgroup, change.level, change.path_truncated), (CgroupId::unified(99), 2, false));

        let too_long = RawCgroupEvent { path_len: PATH_MAX as u32 + 1, ..raw };
        assert!(matches!(decode(&bytes_of(&too_long)), Err(DecodeError::InvalidField { field: "path_len", .. })));
    }

    #[test]
    fn decodes_reclaim_phases() {
        let raw = RawReclaimEvent {
            hdr: header(KIND_RECLAIM),
            task: task(),
            scope: RECLAIM_MEMCG,
            phase: RECLAIM_END,
            order: 0,
            gfp_flags: 0,
            nr_reclaimed: 32,
            duration_ns: 5_000,
        };
        let event = decode(&bytes_of(&raw)).unwrap();
        assert!(matches!(
            event,
            SensorEvent::Reclaim {
                scope: ReclaimScope::Memcg,
                phase: ReclaimPhase::End { nr_reclaimed: 32, duration_ns: 5_000 },
                ..
            }
        ));
        assert_eq!(event.ktime_ns(), 123_456_789);
        let bad = RawReclaimEvent { scope: 9, ..raw };
        assert!(matches!(decode(&bytes_of(&bad)), Err(DecodeError::InvalidField { field: "scope", value: 9, .. })));
    }

    #[test]
    fn short_records_are_errors_not_panics() {
        let full = exit_record(0, 0);
        for len in 0..full.len() {
            let error = decode(&full[..len]).unwrap_err();
            assert!(matches!(error, DecodeError::Short { .. }), "len {len}: {error}");
        }
        let mkdir = bytes_of(&header(KIND_CGROUP_MKDIR));
        assert_eq!(
            decode(&mkdir).unwrap_err(),
            DecodeError::Short { what: "cgroup_mkdir", len: 16, expected: 40 + PATH_MAX }
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert_eq!(decode(&[0xff; 200]).unwrap_err(), DecodeError::UnknownKind { kind: u32::MAX });
        // A cheap deterministic fuzz: every kind, every length, pseudo-random bytes.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for kind in 0..=7u32 {
            for len in [0, 8, 16, 63, 88, 111, 112, 551, 552, 600] {
                let mut record: Vec<u8> = (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        state as u8
                    })
                    .collect();
                if record.len() >= 4 {
                    record[..4].copy_from_slice(&kind.to_ne_bytes());
                }
                let _ = decode(&record);
            }
        }
    }
}
