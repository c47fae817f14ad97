//! swiftlet's eBPF sensors: C CO-RE programs (in `bpf/`, compiled by the build script)
//! and their typed Rust side: load, attach, decode events, read maps. The crate knows
//! cgroups and processes, not pods; the agent maps cgroup ids to containers.
//!
//! # Use
//! ```no_run
//! # async fn run() -> swiftlet_ebpf::Result<()> {
//! use swiftlet_ebpf::{CancellationToken, SensorConfig, Sensors};
//! let mut sensors = Sensors::load(&SensorConfig::default())?; // LoadError says why not
//! sensors.watch_cgroup("/sys/fs/cgroup/unified/kubepods".as_ref())?;
//! sensors.watch_cgroup("/sys/fs/cgroup/memory/kubepods".as_ref())?;
//! let mut events = sensors.take_event_stream(&CancellationToken::new())?;
//! while let Some(event) = events.recv().await {
//!     let latency_ns = Sensors::monotonic_now_ns() - event.ktime_ns();
//!     # let _ = latency_ns;
//! }
//! # Ok(()) }
//! ```
//!
//! # What is reported
//! [`SensorEvent`]: cgroup mkdir/rmdir (id, hierarchy, level, path), the first exec in
//! a cgroup and every exec of a pid namespace's init, exits of whole processes (wait
//! status decoded into [`ExitStatus`]; `ns_init`/`main_process` mark the container's
//! main process), OOM-kill victims (their memcg and cgroup2 ids), and memcg/direct
//! reclaim begin/end (with the stall's duration). Every event carries `ktime_ns` from
//! `bpf_ktime_get_ns()` (`CLOCK_MONOTONIC`). A v1 cgroup id is only unique in its
//! hierarchy, hence [`CgroupId`] = (hierarchy id, kernfs id = directory inode); cgroup2
//! is hierarchy 0.
//!
//! Per-cgroup [`CgroupCounters`] count what is not streamed: every exec and task exit,
//! process exits, OOM kills, reclaim episodes and time, the last exit status and the
//! main process. The kernel deletes a cgroup's counters when the cgroup is removed.
//! Ring-buffer overflows are counted ([`Sensors::drops`]); the agent's relisting PLEG
//! repairs whatever was dropped.
//!
//! # Kernel-side filter
//! Userspace registers roots ([`Sensors::watch_cgroup`]) in the `watched_roots` hash,
//! keyed by (hierarchy id, cgroup id), and sets bit `level` of `watched_levels[hierarchy]`.
//! A cgroup event passes when the cgroup or an ancestor (`cgrp->ancestors[]`) is a
//! root in its own hierarchy; a task event when the task's cgroup2 cgroup or its v1
//! memory cgroup (`task->cgroups->subsys[memory_cgrp_id]`, the id relocated with
//! `bpf_core_enum_value`) is. Only ancestors at levels with a root are looked up, so an
//! unrelated exec or exit costs about 0.28 us and writes nothing. Exec records are sent
//! for the first exec in a cgroup (the runtime's init exec'ing the container process)
//! and for pid-namespace inits only; exit records for whole processes only. Everything
//! else only bumps counters.
//!
//! # Wakeups
//! A ring-buffer wakeup costs the writing task ~10 us on these VMs (`irq_work` + IPI),
//! most of a record's kernel cost. Records the agent acts on at once force a wakeup:
//! cgroup mkdir/rmdir, reported execs, OOM kills, and the exit of a cgroup's main process
//! (its first exec, a pid namespace's init, or the process named by
//! [`Sensors::adopt_cgroup`] after an agent restart). Other exits and reclaim records go
//! without a wakeup unless the ring is a quarter full; the reader drains them with the
//! next wakeup or its periodic flush ([`SensorConfig::pressure_flush_interval`], 250 ms).
//! Forcing rather than the kernel's adaptive default, because an adaptive wakeup is
//! skipped whenever an unread no-wakeup record sits in front of it.
//!
//! # Measured here
//! `cargo run --release -p swiftlet-ebpf --example latency` (kernel 6.18, 2 vCPUs,
//! current-thread consumer, 200 exits per row):
//!
//! | exit -> consumer latency           | p50     | p90     | p99     | max     |
//! |------------------------------------|---------|---------|---------|---------|
//! | main process, idle                 | 17 us   | 27 us   | 80 us   | 0.8-1 ms |
//! | main process, both CPUs busy       | 22 us   | 24 us   | 85 us   | 0.1-1.8 ms |
//! | other process (no wakeup)          | 126 ms  | 225 ms  | 248 ms  | 250 ms  |
//!
//! Kernel cost per run (`bpf_stats`): exec/exit of an unrelated task 0.28 us; counted
//! but unreported exec 0.5 us, exit 1.3 us; reported main-process exit 11-13 us and
//! cgroup mkdir/rmdir 6 us, dominated by the wakeup.
//!
//! # Requirements and pitfalls
//! Kernel BTF at `/sys/kernel/btf/vmlinux`, root or `CAP_BPF` + `CAP_PERFMON`, BTF
//! tracepoints (`tp_btf`); no kprobes or fentry are used. Programs read kernel
//! structs through BTF pointers directly except where the verifier forbids it: the
//! flexible arrays `cgroup::ancestors[]` and `pid::numbers[]` need helper reads.
//! On 6.18 `sched_process_exit` is `(task, group_dead)` and `mark_victim` is
//! `(task, uid)`; the exit status is `signal->group_exit_code` once the group is dead
//! (what `wait(2)` reports), the task's own `exit_code` otherwise.
//!
//! # Licence of the programs
//! The C sources in `bpf/` are `MIT OR GPL-2.0-only` (their SPDX lines) and the object
//! declares `Dual MIT/GPL`, the matching string the kernel takes as GPL-compatible: the
//! programs call GPL-only helpers (`bpf_get_current_task_btf`, `bpf_probe_read_kernel`),
//! which the verifier refuses to a program without such a licence. The Rust code is the
//! workspace's Apache-2.0.

mod cgroup;
mod clock;
mod error;
mod events;
mod loader;
mod maps;
mod ring_buf;
mod sensors;

pub use cgroup::{CgroupError, CgroupId};
pub use error::{Error, Result};
pub use events::{CgroupChange, DecodeError, ExitStatus, ReclaimPhase, ReclaimScope, SensorEvent, TaskInfo, decode};
pub use loader::{LoadError, ProgramStats};
pub use maps::{CgroupCounters, LastExit, MapsError};
pub use ring_buf::StreamError;
pub use sensors::{SensorConfig, Sensors};
pub use tokio_util::sync::CancellationToken;
