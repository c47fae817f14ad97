//! The test bed's containerd as a process: found by its command line and restarted in
//! place, for the fault tests ("containerd restarted under 50 pods").
//!
//! The daemon is the process whose command line is `containerd … --config <config> …`
//! with the test bed's config file (`containerd_config` in `testbed.json`), as
//! `cargo xtask testbed` finds it — never by name alone. A restart sends it SIGTERM,
//! waits until it is gone, and starts the very same argv again: the same executable
//! (`/proc/<pid>/exe`), `argv[0]`, environment and working directory, in its own session,
//! its output appended to the same log file, and in the same cgroups as the old daemon
//! (so that the test bed lives as long as before, not as long as the test's session).
//! `cargo xtask testbed down` then finds the new daemon by the same command line, and
//! `testbed.json` is updated with its pid (what `testbed status` and `up` check).
//!
//! The shims, and so the pods, outlive the daemon: containerd reconnects to them when it
//! starts. While it is down, CRI calls fail (the socket is refused).
//!
//! If a test fails while the daemon is down, dropping the [`StoppedContainerd`] starts it
//! again, so that one failed test does not leave the shared test bed without a runtime.

use std::ffi::CString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{Cri, TESTBED_STATE, cri_endpoint};

/// The test bed's containerd config when `testbed.json` does not name it.
const DEFAULT_CONFIG: &str = "/var/lib/swiftlet-testbed/containerd.toml";
/// The test bed's containerd log when `testbed.json` does not name it.
const DEFAULT_LOG: &str = "/var/lib/swiftlet-testbed/containerd.log";

/// How long the daemon may take to exit after SIGTERM before it gets SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// How long the new daemon may take to answer CRI.
const READY_TIMEOUT: Duration = Duration::from_mins(1);

fn state_field(field: &str) -> Option<String> {
    let text = std::fs::read_to_string(TESTBED_STATE).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v[field].as_str().map(str::to_owned)
}

/// The test bed's containerd config file (`testbed.json`'s `containerd_config`).
#[must_use]
pub fn config_path() -> PathBuf {
    state_field("containerd_config").map_or_else(|| PathBuf::from(DEFAULT_CONFIG), PathBuf::from)
}

/// The NUL-separated arguments of a process, or `None` once it is gone.
#[must_use]
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
}

/// Whether `args` is a containerd daemon started with the config file `config` (the rule
/// of `xtask/src/containerd.rs` `is_our_containerd`).
#[must_use]
pub fn is_testbed_containerd(args: &[String], config: &Path) -> bool {
    let config = config.display().to_string();
    args.first().is_some_and(|a| a.ends_with("containerd"))
        && args.windows(2).any(|w| w[0] == "--config" && w[1] == config)
}

/// Whether `pid` exists and is not a zombie (a dead daemon is reaped lazily by init).
#[must_use]
pub fn is_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// The live processes whose command line is the test bed's containerd (with `config`).
#[must_use]
pub fn find_pids(config: &Path) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| cmdline(*pid).is_some_and(|a| is_testbed_containerd(&a, config)))
        .filter(|pid| is_alive(*pid))
        .collect();
    pids.sort_unstable();
    pids
}

/// The pid of the test bed's containerd: exactly one process must match.
pub fn testbed_containerd_pid() -> Result<i32> {
    let config = config_path();
    match find_pids(&config)[..] {
        [pid] => Ok(pid),
        [] => bail!("no containerd runs with --config {}: is the test bed up?", config.display()),
        ref many => bail!("{} containerds run with --config {}: {many:?}", many.len(), config.display()),
    }
}

/// How a daemon was started, read from `/proc` so that it can be started again alike.
#[derive(Debug, Clone)]
struct Launch {
    exe: PathBuf,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: PathBuf,
    log: PathBuf,
    /// `cgroup.procs` of each hierarchy the daemon was in.
    cgroup_procs: Vec<PathBuf>,
    /// `/proc/<pid>/cgroup` of the daemon.
    cgroups: String,
}

impl Launch {
    fn of(pid: i32) -> Result<Self> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).with_context(|| format!("/proc/{pid}/exe"))?;
        let argv = cmdline(pid).context("containerd exited")?;
        let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
        let env = environ
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                kv.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect();
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_else(|_| PathBuf::from("/"));
        // Where its stdout goes; else the test bed's log file.
        let log = std::fs::read_link(format!("/proc/{pid}/fd/1"))
            .ok()
            .filter(|p| p.is_file())
            .or_else(|| state_field("containerd_log").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_LOG));
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
        let cgroup_procs = cgroup_procs_files(&cgroups);
        Ok(Self { exe, argv, env, cwd, log, cgroup_procs, cgroups })
    }

    /// Starts the daemon: own session, output appended to the log, in the old cgroups.
    fn spawn(&self) -> Result<i32> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg0(&self.argv[0])
            .args(&self.argv[1..])
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let procs: Vec<CString> =
            self.cgroup_procs.iter().filter_map(|p| CString::new(p.as_os_str().as_encoded_bytes()).ok()).collect();
        // SAFETY: between fork and exec only async-signal-safe calls (setsid, open, write,
        // close) on memory prepared before the fork. A new session keeps the daemon out of
        // the test's process group and terminal; writing "0" to `cgroup.procs` moves the
        // child itself into the cgroups the old daemon was in, before it runs.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                for p in &procs {
                    let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd >= 0 {
                        libc::write(fd, c"0".as_ptr().cast(), 1);
                        libc::close(fd);
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("starting {}", self.exe.display()))?;
        let pid = i32::try_from(child.id())?;
        // The child is not waited for: the daemon outlives the test (init reaps it).
        drop(child);
        Ok(pid)
    }
}

/// The `cgroup.procs` files of the hierarchies listed in a `/proc/<pid>/cgroup` text
/// (`<id>:<controllers>:<path>` lines), those that exist under `/sys/fs/cgroup`.
fn cgroup_procs_files(cgroups: &str) -> Vec<PathBuf> {
    cgroups
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let mount = match controllers {
                // The unified hierarchy: beside the v1 ones, or alone at the top.
                "" if Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists() => "unified",
                "" => "",
                c => c.strip_prefix("name=").unwrap_or(c),
            };
            let file = Path::new("/sys/fs/cgroup").join(mount).join(path.trim_start_matches('/')).join("cgroup.procs");
            file.exists().then_some(file)
        })
        .collect()
}

/// The test bed's containerd, stopped by [`stop_testbed_containerd`]. [`Self::start`]
/// starts it again; dropping it unstarted starts it too (without waiting for CRI).
#[derive(Debug)]
pub struct StoppedContainerd {
    launch: Launch,
    old_pid: i32,
    /// When SIGTERM was sent.
    pub stopped_at: Instant,
    /// How long the daemon took to exit.
    pub exit_took: Duration,
    started: bool,
}

/// The test bed's containerd started again.
#[derive(Debug, Clone)]
pub struct RestartedContainerd {
    pub old_pid: i32,
    pub pid: i32,
    /// From SIGTERM to CRI answering again.
    pub downtime: Duration,
    /// When CRI answered again.
    pub ready_at: Instant,
    /// What it answered (`containerd 1.6.20~ds1 (CRI v1)`).
    pub version: String,
}

/// SIGTERM to the test bed's containerd (found by its command line), and waits until it
/// is gone (SIGKILL after 30 s). Its shims and pods run on.
pub fn stop_testbed_containerd() -> Result<StoppedContainerd> {
    let pid = testbed_containerd_pid()?;
    let launch = Launch::of(pid)?;
    ensure!(is_testbed_containerd(&launch.argv, &config_path()), "pid {pid} is no longer the test bed's containerd");
    let stopped_at = Instant::now();
    signal(pid, libc::SIGTERM);
    let mut killed = false;
    while is_alive(pid) {
        if !killed && stopped_at.elapsed() > STOP_GRACE {
            eprintln!("containerd pid {pid} still alive {STOP_GRACE:?} after SIGTERM: SIGKILL");
            signal(pid, libc::SIGKILL);
            killed = true;
        }
        ensure!(stopped_at.elapsed() < STOP_GRACE * 2, "containerd pid {pid} survived SIGKILL");
        std::thread::sleep(Duration::from_millis(20));
    }
    let exit_took = stopped_at.elapsed();
    Ok(StoppedContainerd { launch, old_pid: pid, stopped_at, exit_took, started: false })
}

impl StoppedContainerd {
    /// Starts the same argv again and waits until CRI answers `Version` and
    /// `ListPodSandbox` (the CRI plugin fails calls with "server is not initialized yet"
    /// while it loads its state); records the new pid in `testbed.json`.
    pub async fn start(mut self) -> Result<RestartedContainerd> {
        self.started = true;
        let pid = self.launch.spawn()?;
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cgroups != self.launch.cgroups {
            eprintln!(
                "warning: the new containerd (pid {pid}) is not in the old one's cgroups:\n{cgroups}\nwas:\n{}",
                self.launch.cgroups
            );
        }
        let argv = cmdline(pid).unwrap_or_default();
        ensure!(argv == self.launch.argv, "containerd pid {pid} runs {argv:?}, not {:?}", self.launch.argv);
        if let Err(e) = record_pid(pid) {
            eprintln!("warning: could not record containerd pid {pid} in {TESTBED_STATE}: {e:#}");
        }
        let cri = Cri::connect(&cri_endpoint()?)?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            ensure!(
                is_alive(pid),
                "containerd (pid {pid}) exited during start-up; its log {}:\n{}",
                self.launch.log.display(),
                crate::tail(&std::fs::read_to_string(&self.launch.log).unwrap_or_default(), 30)
            );
            let answers = async { Ok::<_, anyhow::Error>((cri.version().await?, cri.all_sandboxes().await?)) };
            match tokio::time::timeout(Duration::from_secs(5), answers).await {
                Ok(Ok((v, _))) => {
                    let ready_at = Instant::now();
                    return Ok(RestartedContainerd {
                        old_pid: self.old_pid,
                        pid,
                        downtime: ready_at - self.stopped_at,
                        ready_at,
                        version: format!("{} {} (CRI {})", v.runtime_name, v.runtime_version, v.runtime_api_version),
                    });
                }
                Ok(Err(e)) if Instant::now() > deadline => {
                    bail!("containerd pid {pid} did not answer CRI within {READY_TIMEOUT:?}: {e:#}")
                }
                Err(_) if Instant::now() > deadline => {
                    bail!("containerd pid {pid}: CRI calls timed out for {READY_TIMEOUT:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Drop for StoppedContainerd {
    /// A test that failed while the daemon was down must not leave the test bed without
    /// it.
    fn drop(&mut self) {
        if self.started {
            return;
        }
        match self.launch.spawn() {
            Ok(pid) => {
                eprintln!("containerd restarted (pid {pid}) by the drop of a StoppedContainerd");
                let _ = record_pid(pid);
            }
            Err(e) => eprintln!("could not restart the test bed's containerd: {e:#}"),
        }
    }
}

/// SIGTERM, wait, start again: [`stop_testbed_containerd`] then [`StoppedContainerd::start`].
pub async fn restart_testbed_containerd() -> Result<RestartedContainerd> {
    stop_testbed_containerd()?.start().await
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions; the pid's command line was
    // checked to be the test bed's containerd.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Writes `pid` as `containerd_pid` into `testbed.json`, changing nothing else of it.
fn record_pid(pid: i32) -> Result<()> {
    let text = std::fs::read_to_string(TESTBED_STATE)?;
    let updated = replace_pid(&text, pid).context("testbed.json has no containerd_pid")?;
    let tmp = PathBuf::from(format!("{TESTBED_STATE}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, updated)?;
    std::fs::rename(&tmp, TESTBED_STATE)?;
    Ok(())
}

/// `text` with the number after `"containerd_pid":` replaced by `pid`.
fn replace_pid(text: &str, pid: i32) -> Option<String> {
    const KEY: &str = "\"containerd_pid\":";
    let at = text.find(KEY)? + KEY.len();
    let rest = &text[at..];
    let value_start = at + (rest.len() - rest.trim_start().len());
    let digits = text[value_start..].bytes().take_while(|b| b.is_ascii_digit() || *b == b'-').count();
    let value_end = value_start + digits;
    // `null` (no daemon recorded) is replaced too.
    let value_end = if digits == 0 && text[value_start..].starts_with("null") { value_start + 4 } else { value_end };
    (value_end > value_start).then(|| format!("{}{pid}{}", &text[..value_start], &text[value_end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn recognises_the_testbed_daemon_by_its_config_only() {
        let cfg = Path::new("/v/containerd.toml");
        assert!(is_testbed_containerd(&args("containerd --config /v/containerd.toml"), cfg));
        assert!(is_testbed_containerd(&args("/usr/bin/containerd --config /v/containerd.toml"), cfg));
        assert!(!is_testbed_containerd(&args("containerd"), cfg));
        assert!(!is_testbed_containerd(&args("containerd --config /other.toml"), cfg));
        assert!(!is_testbed_containerd(&args("vim --config /v/containerd.toml"), cfg));
        assert!(!is_testbed_containerd(
            &args("containerd-shim-runc-v2 -namespace k8s.io -address /v/containerd.sock"),
            cfg
        ));
    }

    #[test]
    fn the_recorded_pid_alone_changes() {
        let text = "{\n  \"socket\": \"/s\",\n  \"containerd_pid\": 31725,\n  \"x\": 1\n}";
        assert_eq!(
            replace_pid(text, 42).unwrap(),
            "{\n  \"socket\": \"/s\",\n  \"containerd_pid\": 42,\n  \"x\": 1\n}"
        );
        assert_eq!(replace_pid("{\"containerd_pid\": null}", 7).unwrap(), "{\"containerd_pid\": 7}");
        assert_eq!(replace_pid("{\"containerd_pid\":1}", 7).unwrap(), "{\"containerd_pid\":7}");
        assert_eq!(replace_pid("{\"other\": 1}", 7), None);
    }

    #[test]
    fn cgroup_procs_files_of_this_process_exist() {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let files = cgroup_procs_files(&own);
        assert!(!files.is_empty(), "{own}");
        assert!(files.iter().all(|f| f.ends_with("cgroup.procs") && f.exists()), "{files:?}");
    }
}
