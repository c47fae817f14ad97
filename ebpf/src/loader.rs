//! Loading the embedded BPF object into the kernel and attaching its programs, with
//! errors that tell an operator why the sensors are unavailable on this node.

use std::{io, path::PathBuf};

use aya::{
    Btf, BtfError, Ebpf, EbpfError, EbpfLoader,
    maps::MapError,
    programs::{BtfTracePoint, ProgramError},
};

/// The sensors, compiled by build.rs from `bpf/sensors.bpf.c` (stripped of DWARF, BTF kept).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sensors.bpf.o"));

/// Where the kernel publishes its BTF; CO-RE relocations and `tp_btf` need it.
pub(crate) const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Verifier log lines kept in [`LoadError::VerifierRejected`]: the reason is at the end.
const VERIFIER_LOG_LINES: usize = 20;

/// A program and the BTF tracepoint it attaches to.
#[derive(Clone, Copy, Debug)]
struct ProgramSpec {
    program: &'static str,
    tracepoint: &'static str,
}

/// Every program in the object. The rmdir program comes first so that counters are
/// never left behind by a cgroup removed while the others attach.
const PROGRAMS: &[ProgramSpec] = &[
    ProgramSpec { program: "on_cgroup_rmdir", tracepoint: "cgroup_rmdir" },
    ProgramSpec { program: "on_cgroup_mkdir", tracepoint: "cgroup_mkdir" },
    ProgramSpec { program: "on_exec", tracepoint: "sched_process_exec" },
    ProgramSpec { program: "on_exit", tracepoint: "sched_process_exit" },
    ProgramSpec { program: "on_mark_victim", tracepoint: "mark_victim" },
    ProgramSpec { program: "on_memcg_reclaim_begin", tracepoint: "mm_vmscan_memcg_reclaim_begin" },
    ProgramSpec { program: "on_memcg_reclaim_end", tracepoint: "mm_vmscan_memcg_reclaim_end" },
    ProgramSpec { program: "on_direct_reclaim_begin", tracepoint: "mm_vmscan_direct_reclaim_begin" },
    ProgramSpec { program: "on_direct_reclaim_end", tracepoint: "mm_vmscan_direct_reclaim_end" },
];

/// Why the sensors could not be loaded. Every variant names the cause in an operator's
/// words; the agent logs it once and runs with the relisting PLEG only.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The kernel publishes no BTF, so CO-RE relocation and BTF tracepoints are impossible.
    #[error(
        "no kernel BTF at {}: the eBPF sensors need a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        path.display()
    )]
    NoKernelBtf {
        /// The BTF path.
        path: PathBuf,
        /// Why it could not be read or parsed.
        #[source]
        source: BtfError,
    },

    /// The kernel refused a BPF operation for lack of privilege.
    #[error(
        "permission denied while {action}: the eBPF sensors need root or CAP_BPF + CAP_PERFMON \
         (and no kernel lockdown in confidentiality mode)"
    )]
    PermissionDenied {
        /// What was being done, e.g. "creating map `events`".
        action: String,
        /// The syscall error.
        #[source]
        io_error: io::Error,
    },

    /// The kernel's verifier rejected a program.
    #[error(
        "the kernel verifier rejected program `{program}` (tracepoint {tracepoint}); last verifier lines:\n{verifier_log}"
    )]
    VerifierRejected {
        /// The program.
        program: &'static str,
        /// Its tracepoint.
        tracepoint: &'static str,
        /// The last lines of the verifier log, where the reason is.
        verifier_log: String,
        /// The `BPF_PROG_LOAD` error.
        #[source]
        io_error: io::Error,
    },

    /// The kernel has no such BTF tracepoint (another kernel version or config).
    #[error("this kernel has no tracepoint {tracepoint} (needed by program `{program}`)")]
    MissingTracepoint {
        /// The program.
        program: &'static str,
        /// The tracepoint.
        tracepoint: &'static str,
        /// The BTF lookup error.
        #[source]
        source: ProgramError,
    },

    /// Attaching a loaded program failed.
    #[error("attaching program `{program}` to tracepoint {tracepoint} failed")]
    AttachFailed {
        /// The program.
        program: &'static str,
        /// The tracepoint.
        tracepoint: &'static str,
        /// aya's error.
        #[source]
        source: ProgramError,
    },

    /// Loading a program failed for another reason than the verifier or privileges.
    #[error("loading program `{program}` (tracepoint {tracepoint}) failed")]
    ProgramLoad {
        /// The program.
        program: &'static str,
        /// The tracepoint.
        tracepoint: &'static str,
        /// aya's error.
        #[source]
        source: ProgramError,
    },

    /// The kernel's types differ from what the programs read (a CO-RE relocation failed):
    /// this kernel is too different from the ones the sensors support.
    #[error("the eBPF sensors do not match this kernel's types (CO-RE relocation failed)")]
    IncompatibleKernel {
        /// aya's relocation error.
        #[source]
        source: EbpfError,
    },

    /// The embedded object could not be prepared (maps, BTF); a build or kernel problem.
    #[error("preparing the eBPF object failed")]
    Object {
        /// aya's error.
        #[source]
        source: EbpfError,
    },

    /// The embedded object lacks a program this crate expects (a build mismatch).
    #[error("the eBPF object has no program `{program}`")]
    MissingProgram {
        /// The program.
        program: &'static str,
    },

    /// A configuration value the kernel would reject.
    #[error("invalid sensor configuration: {reason}")]
    InvalidConfig {
        /// What is wrong, naming the setting.
        reason: String,
    },
}

/// The initial pid namespace's inode number (`PROC_PID_INIT_INO`).
const INITIAL_PIDNS_INUM: u64 = 0xEFFF_FFFC;

/// What the sensors' `agent_pidns_inum` is set to: 0 for the initial pid namespace (the
/// kernel's tgids are the agent's pids), else the namespace's inode number, `pidns`
/// or this process's own (an agent in a node container): the sensors then compare a
/// cgroup's main process by its number there, the one the agent reads in `cgroup.procs`.
fn agent_pidns_inum(pidns: Option<u64>) -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    let inum = pidns.or_else(|| std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino()));
    match inum {
        Some(i) if i != INITIAL_PIDNS_INUM => u32::try_from(i).unwrap_or(0),
        _ => 0,
    }
}

/// Loads the object (maps sized by `ring_buffer_bytes`, main processes counted in the pid
/// namespace `pidns`, see [`agent_pidns_inum`]) and attaches every program.
/// On error everything loaded so far is released when the partial `Ebpf` drops.
pub(crate) fn load_and_attach(ring_buffer_bytes: u32, pidns: Option<u64>) -> Result<Ebpf, LoadError> {
    let btf = Btf::from_sys_fs().map_err(|source| LoadError::NoKernelBtf { path: KERNEL_BTF.into(), source })?;
    let pidns = agent_pidns_inum(pidns);
    let mut ebpf = EbpfLoader::new()
        .btf(Some(&btf))
        .override_global("agent_pidns_inum", &pidns, true)
        .map_max_entries(crate::maps::EVENTS, ring_buffer_bytes)
        .load(OBJECT)
        .map_err(classify_object_error)?;

    for spec in PROGRAMS {
        let ProgramSpec { program, tracepoint } = *spec;
        let prog: &mut BtfTracePoint = ebpf
            .program_mut(program)
            .ok_or(LoadError::MissingProgram { program })?
            .try_into()
            .map_err(|source| LoadError::ProgramLoad { program, tracepoint, source })?;
        prog.load(tracepoint, &btf).map_err(|source| classify_program_error(*spec, source))?;
        prog.attach().map_err(|source| match permission_error(&source) {
            Some(io_error) => {
                LoadError::PermissionDenied { action: format!("attaching program `{program}`"), io_error }
            }
            None => LoadError::AttachFailed { program, tracepoint, source },
        })?;
    }
    Ok(ebpf)
}

/// What one sensor program costs in the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramStats {
    /// The program (function name in `bpf/sensors.bpf.c`).
    pub program: &'static str,
    /// The tracepoint it is attached to.
    pub tracepoint: &'static str,
    /// Times it ran. Counted only while BPF run-time statistics are enabled
    /// (`sysctl kernel.bpf_stats_enabled=1`, or an `aya::sys::enable_stats` fd held open).
    pub run_count: u64,
    /// Total nanoseconds it ran, under the same condition.
    pub run_time_ns: u64,
    /// Instructions the verifier processed when loading it.
    pub verified_instructions: Option<u32>,
    /// Size of its JIT-compiled code in bytes.
    pub jited_bytes: u32,
}

/// Statistics of every attached program; programs whose info cannot be read are skipped.
pub(crate) fn program_stats(ebpf: &Ebpf) -> Vec<ProgramStats> {
    PROGRAMS
        .iter()
        .filter_map(|spec| {
            let info = ebpf.program(spec.program)?.info().ok()?;
            Some(ProgramStats {
                program: spec.program,
                tracepoint: spec.tracepoint,
                run_count: info.run_count(),
                run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                verified_instructions: info.verified_instruction_count(),
                jited_bytes: info.size_jitted(),
            })
        })
        .collect()
}

fn is_permission(io_error: &io::Error) -> bool {
    matches!(io_error.raw_os_error(), Some(libc::EPERM | libc::EACCES))
}

/// The io error of a failed syscall, when the kernel said EPERM/EACCES.
fn permission_error(error: &ProgramError) -> Option<io::Error> {
    match error {
        ProgramError::SyscallError(e) if is_permission(&e.io_error) => Some(copy_io_error(&e.io_error)),
        _ => None,
    }
}

/// `io::Error` is not `Clone`; the errno is all that matters here.
fn copy_io_error(error: &io::Error) -> io::Error {
    error.raw_os_error().map_or_else(|| io::Error::new(error.kind(), error.to_string()), io::Error::from_raw_os_error)
}

fn classify_object_error(error: EbpfError) -> LoadError {
    let denied = |action: String, io_error: &io::Error| {
        is_permission(io_error).then(|| LoadError::PermissionDenied { action, io_error: copy_io_error(io_error) })
    };
    let permission = match &error {
        EbpfError::MapError(MapError::CreateError { name, io_error }) => {
            denied(format!("creating map `{name}`"), io_error)
        }
        EbpfError::BtfError(BtfError::LoadError { io_error, .. }) => {
            denied("loading the object's BTF".to_owned(), io_error)
        }
        _ => None,
    };
    if let Some(permission) = permission {
        return permission;
    }
    match error {
        EbpfError::BtfRelocationError(_) => LoadError::IncompatibleKernel { source: error },
        source => LoadError::Object { source },
    }
}

fn classify_program_error(spec: ProgramSpec, error: ProgramError) -> LoadError {
    let ProgramSpec { program, tracepoint } = spec;
    match error {
        ProgramError::LoadError { io_error, verifier_log } => {
            let log = verifier_log.to_string();
            // EPERM with an empty log is the capability check, before the verifier ran.
            if is_permission(&io_error) && log.trim().is_empty() {
                LoadError::PermissionDenied { action: format!("loading program `{program}`"), io_error }
            } else {
                LoadError::VerifierRejected { program, tracepoint, verifier_log: log_tail(&log), io_error }
            }
        }
        ProgramError::Btf(_) => LoadError::MissingTracepoint { program, tracepoint, source: error },
        source => match permission_error(&source) {
            Some(io_error) => LoadError::PermissionDenied { action: format!("loading program `{program}`"), io_error },
            None => LoadError::ProgramLoad { program, tracepoint, source },
        },
    }
}

/// The last lines of a verifier log: the verifier prints the path it walked and ends
/// with the reason it gave up, so the tail is what explains a rejection.
fn log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(VERIFIER_LOG_LINES);
    let mut tail = if start > 0 { format!("[... {start} earlier lines]\n") } else { String::new() };
    tail.push_str(&lines[start..].join("\n"));
    tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The license the kernel sees agrees with the sources' SPDX lines, and is one the
    /// kernel takes as GPL-compatible (the programs call GPL-only helpers:
    /// `bpf_get_current_task_btf`, `bpf_probe_read_kernel`).
    #[test]
    fn the_program_license_matches_the_spdx_lines_and_is_gpl_compatible() {
        let source = include_str!("../bpf/sensors.bpf.c");
        let license = source
            .lines()
            .find_map(|l| l.strip_prefix("char LICENSE[] SEC(\"license\") = \""))
            .and_then(|rest| rest.strip_suffix("\";"))
            .expect("a LICENSE string");
        // include/linux/license.h, license_is_gpl_compatible().
        let gpl_compatible =
            ["GPL", "GPL v2", "GPL and additional rights", "Dual BSD/GPL", "Dual MIT/GPL", "Dual MPL/GPL"];
        assert!(gpl_compatible.contains(&license), "{license:?} is not GPL-compatible for the kernel");
        let spdx_of_license = match license {
            "Dual MIT/GPL" => "(MIT OR GPL-2.0-only)",
            "Dual BSD/GPL" => "(BSD-2-Clause OR GPL-2.0-only)",
            _ => "GPL-2.0-only",
        };
        for (file, text) in [
            ("sensors.bpf.c", source),
            ("events.h", include_str!("../bpf/events.h")),
            ("kernel.h", include_str!("../bpf/kernel.h")),
        ] {
            let spdx = text.lines().next().and_then(|l| l.split("SPDX-License-Identifier: ").nth(1));
            let spdx = spdx.map(|s| s.trim_end_matches("*/").trim());
            assert_eq!(spdx, Some(spdx_of_license), "{file}");
        }
    }

    #[test]
    fn log_tail_keeps_the_reason() {
        let log: String = (0..50).map(|i| format!("{i}: insn\n")).chain(["R1 invalid mem access\n".into()]).collect();
        let tail = log_tail(&log);
        assert!(tail.starts_with("[... 31 earlier lines]\n"), "{tail}");
        assert!(tail.ends_with("R1 invalid mem access"));
        assert_eq!(tail.lines().count(), VERIFIER_LOG_LINES + 1);
        assert_eq!(log_tail("one\n\ntwo\n"), "one\ntwo");
    }

    #[test]
    fn verifier_rejections_name_the_program() {
        let error = classify_program_error(
            PROGRAMS[0],
            ProgramError::LoadError {
                io_error: io::Error::from_raw_os_error(libc::EACCES),
                verifier_log: aya_verifier_log("0: (b7) r0 = 0\ninvalid access to map value\n"),
            },
        );
        let message = error.to_string();
        assert!(message.contains("verifier rejected program `on_cgroup_rmdir`"), "{message}");
        assert!(message.contains("invalid access to map value"), "{message}");
    }

    #[test]
    fn eperm_without_a_log_is_a_permission_problem() {
        let error = classify_program_error(
            PROGRAMS[2],
            ProgramError::LoadError {
                io_error: io::Error::from_raw_os_error(libc::EPERM),
                verifier_log: aya_verifier_log(""),
            },
        );
        assert!(matches!(error, LoadError::PermissionDenied { .. }), "{error:?}");
        assert!(error.to_string().contains("CAP_BPF + CAP_PERFMON"));
    }

    #[test]
    fn the_object_has_every_program() {
        let object = aya_obj::Object::parse(OBJECT).expect("embedded object parses");
        for spec in PROGRAMS {
            assert!(object.programs.contains_key(spec.program), "missing {}", spec.program);
        }
        assert_eq!(object.programs.len(), PROGRAMS.len(), "a program in the object is not attached");
    }

    fn aya_verifier_log(text: &str) -> aya_obj::VerifierLog {
        aya_obj::VerifierLog::new(text.to_owned())
    }
}
