//! What the summary keeps to explain a row that misses its target: a CPU profile of the
//! agent over a measurement window (`perf record --call-graph dwarf -p <pid>`, when `perf` is installed)
//! and its memory breakdown (`/proc/<pid>/smaps_rollup` and `/proc/<pid>/status`), written
//! under `target/bench/`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, Result};
use tokio::process::{Child, Command};

/// The note of a row whose profile could not be taken for want of `perf`.
pub const PERF_MISSING: &str = "profile not taken: perf missing";

/// Whether `perf` is on the `PATH` (what `command -v perf` says).
pub fn perf_available() -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|d| {
            let p = d.join("perf");
            fs::metadata(&p)
                .is_ok_and(|m| m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
        })
    })
}

/// A `perf record` running over a window.
#[derive(Debug)]
pub struct Perf {
    child: Child,
    pub path: PathBuf,
}

/// The `perf record` arguments profiling `pid` into `out`, until stopped: call graphs
/// unwound from the stack (`dwarf`: the release agent has no frame pointers, so `-g`
/// names the hot functions but not who calls them), sampled at 99 Hz (perf's default
/// 4 kHz cost an idle agent at 500 pods half its CPU again).
pub fn perf_args(pid: i32, out: &Path) -> Vec<String> {
    ["record", "--call-graph", "dwarf,16384", "-F", "99", "-p", &pid.to_string(), "-o", &out.display().to_string()]
        .map(str::to_owned)
        .to_vec()
}

impl Perf {
    /// Starts profiling `pid` into `out` until [`Perf::finish`]; `None` when `perf` is not
    /// installed or would not start (said on stderr).
    pub fn start(pid: i32, out: &Path) -> Option<Self> {
        if !perf_available() {
            return None;
        }
        if let Err(e) = prepare_output(out) {
            eprintln!("bench: perf record into {}: {e}", out.display());
            return None;
        }
        let log = fs::File::create(format!("{}.log", out.display())).ok();
        let spawned = Command::new("perf")
            .args(perf_args(pid, out))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.map_or_else(Stdio::null, Stdio::from))
            .kill_on_drop(true)
            .spawn();
        match spawned {
            Ok(child) => Some(Self { child, path: out.to_owned() }),
            Err(e) => {
                eprintln!("bench: perf record -p {pid}: {e}");
                None
            }
        }
    }

    /// Stops `perf record` (SIGINT, as Ctrl-C) and waits (at most 30 s) for it to write
    /// its file; the file, if it did.
    pub async fn finish(mut self) -> Option<PathBuf> {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: a signal to the perf process this bench started and has not reaped.
            unsafe {
                libc::kill(pid, libc::SIGINT);
            }
        }
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            // perf ends SIGINTed with status 0 or 130 depending on its version: the file decides.
            Ok(Ok(_)) if fs::metadata(&self.path).is_ok_and(|m| m.len() > 0) => Some(self.path),
            Ok(Ok(status)) => {
                eprintln!("bench: perf record into {} ended {status}", self.path.display());
                None
            }
            Ok(Err(e)) => {
                eprintln!("bench: perf record into {}: {e}", self.path.display());
                None
            }
            Err(_) => {
                let _ = self.child.start_kill();
                eprintln!("bench: perf record into {} did not end", self.path.display());
                None
            }
        }
    }
}

/// Makes `out`'s directory (perf does not; `target/bench/` may not exist yet) and removes
/// an earlier run's `out` (perf would keep it as `<out>.old`: this run's alone is kept).
fn prepare_output(out: &Path) -> std::io::Result<()> {
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir)?;
    }
    match fs::remove_file(out) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Copies `/proc/<pid>/smaps_rollup` and `/proc/<pid>/status` to `<dir>/<stem>.smaps_rollup`
/// and `<dir>/<stem>.status`; the files written.
pub fn memory_breakdown(pid: i32, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut out = Vec::new();
    for what in ["smaps_rollup", "status"] {
        let from = format!("/proc/{pid}/{what}");
        let text = fs::read_to_string(&from).with_context(|| format!("reading {from}"))?;
        let to = dir.join(format!("{stem}.{what}"));
        fs::write(&to, text).with_context(|| format!("writing {}", to.display()))?;
        out.push(to);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_records_call_graphs_of_one_process() {
        assert_eq!(
            perf_args(42, Path::new("/t/swiftlet-r1-idle.perf.data")).join(" "),
            "record --call-graph dwarf,16384 -F 99 -p 42 -o /t/swiftlet-r1-idle.perf.data"
        );
    }

    #[test]
    fn perfs_output_directory_is_made_and_an_old_file_removed() {
        let dir = std::env::temp_dir().join(format!("swiftlet-perf-out-{}", std::process::id()));
        let out = dir.join("bench/density-swiftlet-500-idle.perf.data");
        prepare_output(&out).unwrap();
        assert!(out.parent().unwrap().is_dir());
        fs::write(&out, "old").unwrap();
        prepare_output(&out).unwrap();
        assert!(!out.exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn memory_breakdown_copies_the_processs_own_files() {
        let dir = std::env::temp_dir().join(format!("swiftlet-profile-test-{}", std::process::id()));
        let files = memory_breakdown(std::process::id().cast_signed(), &dir, "me").unwrap();
        assert_eq!(files, vec![dir.join("me.smaps_rollup"), dir.join("me.status")]);
        assert!(fs::read_to_string(&files[1]).unwrap().contains("VmRSS:"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
