//! The ring buffer overflowed on purpose (issue 26's fault matrix): a standalone agent
//! whose eBPF sensors have the smallest ring buffer (one page,
//! `--evented-pleg-ring-buffer-bytes=4096`: 42 exit records of 96 bytes) and a 5 s safety
//! relist runs a pod whose container forks and execs `/bin/true` in four tight loops.
//! Every one of those processes' exits is a ring-buffer record, thousands a second.
//!
//! The flood alone overflows the buffer only now and then on this machine: the agent's
//! reader, woken once the buffer is a quarter full, drains it faster than even 4,500
//! processes a second fill it, so a drop at the moment of a given exit is luck. The main
//! processes of five other pods' containers are killed from the host, by pid, while the
//! flood runs:
//! - in a first round with the agent running: `always0` (SIGKILL, 137) and `onfailure`
//!   (SIGTERM, which its script turns into exit code 3, so it is restarted). The agent's
//!   reader drains the buffer faster than the flood fills it here, so these exits mostly
//!   arrive from the kernel; some may be dropped.
//! - in a second round with the agent stopped (SIGSTOP: a starved agent, the runbook's
//!   cause of drops): once 1,000 flood processes have exited since the stop, the buffer
//!   (42 records) is full and stays full, so the exits of `always1`, `always2` (SIGKILL)
//!   and `never` (SIGTERM, exit code 42, `restartPolicy: Never`) are certainly dropped.
//!   The agent is resumed once they are all dead.
//!
//! What the PLEG promises, and what is checked for each killed container: its exit reaches
//! the pod worker exactly once, either from the kernel (the record was delivered: the
//! evented PLEG logs `kernel lifecycle event ... want=Exited` at trace level, and it is a
//! `CONTAINER_DIED` on the node event API unless the relist happened to list the exit
//! first) or from the safety relist, which then counts a repair in
//! `kubelet_evented_pleg_relist_repairs_total` and logs it (`relist repaired a change the
//! kernel path missed ... state=Exited`). Exactly one of the two for every container, and
//! the relist for every exit of the second round. Also checked:
//! - drops are counted: `kubelet_evented_pleg_ringbuf_drops_total` reaches at least the
//!   flood's exits while the agent was stopped, less the 42 records the buffer holds (the
//!   flood counts its processes); the repair counter equals the repairs logged;
//! - the final state is right, after two more relists: each restarted container restarted
//!   exactly once with the right exit code in its last state (137 or 3), the `Never` pod
//!   `Failed` with its container terminated with exit code 42; the flood and an untouched
//!   pod never restarted (in `/pods` and in the runtime);
//! - the PLEG stays healthy and evented (`/healthz?verbose`) through the flood and after.
//!
//! Printed: records dropped, relist repairs, the time from each kill to the status showing
//! it (p50/max, by path), the flood's rate (processes per second, counted by the flood).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;
use swiftlet::event_api::proto::{EventKind, NodeEvent, WatchRequest};
use swiftlet_tests::pods::{SERVE, container, phase, pod_yaml, restarts, running, uid};
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, tail, testbed_lock};

/// One page: the smallest ring buffer the kernel takes.
const RING_BUFFER_BYTES: u32 = 4096;
/// Exit records of 96 bytes (with the ring's header) that fill it.
const RING_RECORDS: u64 = RING_BUFFER_BYTES as u64 / 96;
/// The safety relist's period: a lost exit is repaired within about one of them.
const RELIST_PERIOD: &str = "5s";
const DROPS: &str = "kubelet_evented_pleg_ringbuf_drops_total";
const REPAIRS: &str = "kubelet_evented_pleg_relist_repairs_total";
const RELISTS: &str = "kubelet_pleg_relist_duration_seconds_count";
/// The evented PLEG's log lines (`agent/src/pleg/evented.rs`): a repair (warn), and a
/// kernel lifecycle event resolved to a container (trace).
const REPAIR_LINE: &str = "relist repaired a change the kernel path missed";
const KERNEL_LINE: &str = "kernel lifecycle event";
/// The agent's log filter: its `--v 4` one, and the evented PLEG's trace lines.
const LOG_FILTER: &str = "info,swiftlet=debug,swiftlet::pleg::evented=trace";

/// Waits for `/tmp/go`, then runs four loops that fork and exec `/bin/true` until
/// `/tmp/stop` exists (`[`, `echo` and the arithmetic are shell builtins: only `/bin/true`
/// is a process); each loop writes its count of processes to `/tmp/count.<loop>` every
/// 50. Serves on after.
const FLOOD: &str = "while [ ! -e /tmp/go ]; do sleep 1; done; \
    for i in 1 2 3 4; do (n=0; while [ ! -e /tmp/stop ]; do /bin/true; n=$((n+1)); \
    [ $((n % 50)) -ne 0 ] || echo $n > /tmp/count.$i; done) & done; \
    trap 'exit 0' TERM; while true; do sleep 1; done";

/// Exits `code` on SIGTERM, at once (`wait` is interrupted by the trapped signal).
fn exit_on_term(code: i32) -> String {
    format!("trap 'exit {code}' TERM; sleep 3600 & wait $!")
}

/// A killed container: how it was killed and what its status must come to show.
struct Victim {
    pod: &'static str,
    policy: &'static str,
    /// Killed with the agent stopped (its exit record certainly dropped).
    agent_stopped: bool,
    signal: i32,
    exit_code: i64,
    uid: String,
    /// The container that was killed (CRI id) and its main process.
    id: String,
    pid: i32,
    start_time: u64,
    killed_at: Option<Instant>,
    shown_after: Option<Duration>,
}

impl Victim {
    const fn new(pod: &'static str, policy: &'static str, agent_stopped: bool, signal: i32, exit_code: i64) -> Self {
        Self {
            pod,
            policy,
            agent_stopped,
            signal,
            exit_code,
            uid: String::new(),
            id: String::new(),
            pid: 0,
            start_time: 0,
            killed_at: None,
            shown_after: None,
        }
    }

    fn script(&self) -> String {
        if self.signal == libc::SIGKILL { SERVE.to_owned() } else { exit_on_term(self.exit_code as i32) }
    }

    const fn restarted(&self) -> bool {
        matches!(self.policy.as_bytes(), b"Always" | b"OnFailure")
    }

    /// Whether the pod status shows this kill.
    fn shown(&self, p: &Value) -> bool {
        let c = container(p, "main");
        if self.restarted() {
            restarts(p, "main") == 1 && c["lastState"]["terminated"]["exitCode"] == self.exit_code
        } else {
            c["state"]["terminated"]["exitCode"] == self.exit_code
        }
    }

    fn kill(&mut self) -> Result<()> {
        // SAFETY: kill(2) on the container's main process, found through CRI and checked
        // to be the same process (its start time) just before.
        ensure!(unsafe { libc::kill(self.pid, self.signal) } == 0, "kill {} ({}) failed", self.pid, self.pod);
        self.killed_at = Some(Instant::now());
        Ok(())
    }

    /// Whether the main process has exited (a zombie, reaped, or its pid reused): its
    /// exit has passed the kernel's exit tracepoint.
    fn exited(&self) -> bool {
        proc_state(self.pid).is_none_or(|(state, start)| start != self.start_time || matches!(state, 'Z' | 'X'))
    }
}

/// A process's state letter and start time (clock ticks after boot) from
/// `/proc/<pid>/stat`.
fn proc_state(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), from field 3 (state) on.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let started = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, started))
}

/// The agent stopped (SIGSTOP) until dropped (SIGCONT): its ring-buffer reader drains
/// nothing meanwhile.
struct Stopped {
    pid: i32,
    since: Instant,
}

impl Stopped {
    /// Stops the agent; returns once every thread of it is stopped.
    async fn new(pid: u32) -> Result<Self> {
        let pid = i32::try_from(pid)?;
        // SAFETY: kill(2) on the agent this test started.
        ensure!(unsafe { libc::kill(pid, libc::SIGSTOP) } == 0, "cannot stop the agent");
        let stopped = Self { pid, since: Instant::now() };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let threads: Vec<char> = std::fs::read_dir(format!("/proc/{pid}/task"))?
                .flatten()
                .filter_map(|t| t.file_name().to_str()?.parse().ok())
                .filter_map(|tid| proc_state(tid).map(|(state, _)| state))
                .collect();
            if threads.iter().all(|s| matches!(s, 'T' | 't')) {
                return Ok(stopped);
            }
            ensure!(Instant::now() < deadline, "the agent's threads did not stop: {threads:?}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Resumes the agent; how long it was stopped.
    fn resume(self) -> Duration {
        self.since.elapsed()
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the agent this test started.
        unsafe {
            libc::kill(self.pid, libc::SIGCONT);
        }
    }
}

/// Processes the flood has run so far: the sum of its loops' counts (read through the
/// container's root, `/proc/<pid>/root`). A loop's file is rewritten in place (truncated,
/// then written): a read that finds it empty is tried again, never taken for 0.
fn flood_processes(flood_pid: i32) -> u64 {
    (1..=4)
        .map(|i| {
            let path = format!("/proc/{flood_pid}/root/tmp/count.{i}");
            for _ in 0..1000 {
                match std::fs::read_to_string(&path) {
                    // Fewer than 50 processes yet.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
                    Ok(text) if text.ends_with('\n') => {
                        if let Ok(n) = text.trim().parse::<u64>() {
                            return n;
                        }
                    }
                    _ => {}
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            panic!("{path}: no count to read");
        })
        .sum()
}

/// Waits until the flood has run `n` more processes.
async fn flood_runs(flood_pid: i32, n: u64, timeout: Duration) -> Result<()> {
    let start = flood_processes(flood_pid);
    let deadline = Instant::now() + timeout;
    while flood_processes(flood_pid) < start + n {
        ensure!(Instant::now() < deadline, "the flood ran fewer than {n} processes in {timeout:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Waits until every victim in `victims` has exited.
async fn exited(victims: &[&Victim], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while let Some(v) = victims.iter().find(|v| !v.exited()) {
        ensure!(Instant::now() < deadline, "{} ({}) did not exit within {timeout:?} of its signal", v.pod, v.pid);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The pods of `/pods` by name (without the `-<node>` suffix of static pods).
async fn pods_by_name(agent: &Agent) -> Result<HashMap<String, Value>> {
    let suffix = format!("-{}", agent.node_name);
    Ok(agent
        .pods()
        .await?
        .into_iter()
        .filter_map(|p| {
            let name = p["metadata"]["name"].as_str()?.strip_suffix(&suffix)?.to_owned();
            Some((name, p))
        })
        .collect())
}

/// `/healthz?verbose` answers 200 with the evented PLEG healthy.
async fn assert_evented_pleg_healthy(agent: &Agent, when: &str) -> Result<()> {
    let (code, health) = agent.get("/healthz?verbose").await?;
    ensure!(code == 200 && health.contains("[+]pleg ok (evented"), "{when}: /healthz?verbose {code}: {health}");
    Ok(())
}

/// Waits until `n` more safety relists have run.
async fn relists(agent: &Agent, n: f64, timeout: Duration) -> Result<()> {
    let start = agent.metric(RELISTS).await?;
    let deadline = Instant::now() + timeout;
    while agent.metric(RELISTS).await? < start + n {
        ensure!(Instant::now() < deadline, "the safety relist did not run {n} times in {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The reconciliation follows the relist's observation at once.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

/// The value of ` name=` in a log line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(&format!(" {name}=")).nth(1)?.split_whitespace().next()
}

#[tokio::test]
async fn a_flooded_ring_buffer_drops_records_and_the_relist_repairs_every_lost_exit() -> Result<()> {
    let _g = testbed_lock().await;
    let started = Instant::now();
    let cri = Cri::connect(&cri_endpoint()?)?;
    let agent = Agent::start(AgentOptions {
        sync_frequency: "1m",
        extra_flags: vec![
            format!("--evented-pleg-ring-buffer-bytes={RING_BUFFER_BYTES}"),
            format!("--pleg-relist-period={RELIST_PERIOD}"),
        ],
        env: vec![("RUST_LOG".into(), LOG_FILTER.into())],
        ..AgentOptions::default()
    })
    .await?;
    let result = flood_and_kill(&agent, &cri).await;
    if result.is_err() {
        let _ = std::fs::write(std::env::temp_dir().join("swiftlet-ring-buffer-failure.log"), agent.log());
    }
    let shutdown = agent.shutdown(&cri).await;
    println!("run time {:.1} s (test bed lock held)", started.elapsed().as_secs_f64());
    result.and(shutdown)
}

async fn flood_and_kill(agent: &Agent, cri: &Cri) -> Result<()> {
    assert_evented_pleg_healthy(agent, "at start").await?;
    ensure!(
        agent.log().contains(&format!("ring_buffer_bytes={RING_BUFFER_BYTES}")),
        "the agent does not say it runs a {RING_BUFFER_BYTES}-byte ring buffer:\n{}",
        tail(&agent.log(), 40)
    );
    let mut victims = [
        Victim::new("always0", "Always", false, libc::SIGKILL, 137),
        Victim::new("onfailure", "OnFailure", false, libc::SIGTERM, 3),
        Victim::new("always1", "Always", true, libc::SIGKILL, 137),
        Victim::new("always2", "Always", true, libc::SIGKILL, 137),
        Victim::new("never", "Never", true, libc::SIGTERM, 42),
    ];
    agent.write_manifest("flood.yaml", &pod_yaml("flood", "Always", FLOOD, ""))?;
    agent.write_manifest("bystander.yaml", &pod_yaml("bystander", "Always", SERVE, ""))?;
    for v in &victims {
        agent.write_manifest(&format!("{}.yaml", v.pod), &pod_yaml(v.pod, v.policy, &v.script(), ""))?;
    }
    let mut ids = HashMap::new();
    for name in ["flood", "bystander"].into_iter().chain(victims.iter().map(|v| v.pod)) {
        let p = agent.wait_pod(name, Duration::from_mins(1), |p| running(p, "main")).await?;
        let containers = cri.containers(&uid(&p)).await?;
        ensure!(containers.len() == 1, "{name}: {} containers at start", containers.len());
        ids.insert(name, (uid(&p), containers[0].id.clone()));
    }
    for v in &mut victims {
        (v.uid, v.id) = ids[v.pod].clone();
        v.pid = cri.container_pid(&v.id).await?;
        v.start_time = proc_state(v.pid).context("a victim's main process is gone")?.1;
    }
    let flood_pid = cri.container_pid(&ids["flood"].1).await?;
    // Seven pods starting at once can overflow a one-page buffer already (a cgroup record
    // is 560 bytes): what the flood adds is counted from here.
    let drops_before = agent.metric(DROPS).await?;

    // What the kernel path reports of the victims: their deaths on the node event API.
    let mut client = swiftlet::event_api::client::connect(&agent.event_socket()).await?;
    let request = WatchRequest {
        pod_uids: victims.iter().map(|v| v.uid.clone()).collect(),
        kinds: vec![EventKind::ContainerDied as i32],
        ..Default::default()
    };
    let mut stream = client.watch(request).await?.into_inner();
    let (died_tx, mut died_rx) = tokio::sync::mpsc::unbounded_channel::<NodeEvent>();
    let watcher = tokio::spawn(async move {
        while let Ok(Some(event)) = stream.message().await {
            if died_tx.send(event).is_err() {
                break;
            }
        }
    });

    // The flood, measured over its first 1,000 processes.
    let (code, _) = cri.exec(&ids["flood"].1, &["touch", "/tmp/go"]).await?;
    ensure!(code == 0, "cannot start the flood");
    flood_runs(flood_pid, 1, Duration::from_secs(20)).await?;
    let flood_start = Instant::now();
    let counted_at_start = flood_processes(flood_pid);
    flood_runs(flood_pid, 1000, Duration::from_secs(20)).await?;
    let measured = flood_processes(flood_pid) - counted_at_start;
    let early_rate = measured as f64 / flood_start.elapsed().as_secs_f64();

    // The log from here on: a container's start has a `want=Exited` kernel event of its own
    // (runc's helper, the first process to exec in the cgroup, exits).
    let log_at_kills = agent.log().len();

    // First round: the agent runs.
    let (first, second) = victims.split_at_mut(2);
    for v in first.iter_mut() {
        v.kill()?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    exited(&first.iter().collect::<Vec<_>>(), Duration::from_secs(10)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Second round: the agent stopped until the flood has filled the ring buffer many
    // times over (1,000 records after the stop; it holds 42), then the kills,
    // resumed once they have all exited.
    let stopped = Stopped::new(agent.pid().context("the agent runs")?).await?;
    let counted_at_stop = flood_processes(flood_pid);
    flood_runs(flood_pid, 1000, Duration::from_secs(10)).await?;
    for v in second.iter_mut() {
        v.kill()?;
    }
    exited(&second.iter().collect::<Vec<_>>(), Duration::from_secs(10)).await?;
    let counted_at_resume = flood_processes(flood_pid);
    let stopped_for = stopped.resume();

    // Drops counted: at least the flood's exits while nothing drained the buffer, less
    // what the buffer holds (each loop's count may lag its processes by 49). The agent
    // reads the kernel's counter every second.
    let certainly_dropped = counted_at_resume.saturating_sub(counted_at_stop + 4 * 49 + RING_RECORDS);
    ensure!(certainly_dropped >= 500, "only {certainly_dropped} flood exits certainly dropped while the agent stopped");
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.metric(DROPS).await? - drops_before < certainly_dropped as f64 {
        ensure!(
            Instant::now() < deadline,
            "{} drops counted 10 s after the agent resumed, {certainly_dropped} at least expected",
            agent.metric(DROPS).await? - drops_before
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_evented_pleg_healthy(agent, "during the flood").await?;

    // Each kill shown in the pod's status: by the kernel at once, or by the relist within
    // one of its periods (found, then restarted).
    let deadline = Instant::now() + Duration::from_secs(30);
    while victims.iter().any(|v| v.shown_after.is_none()) {
        let pods = pods_by_name(agent).await?;
        for v in victims.iter_mut().filter(|v| v.shown_after.is_none()) {
            if pods.get(v.pod).is_some_and(|p| v.shown(p)) {
                v.shown_after = v.killed_at.map(|t| t.elapsed());
            }
        }
        if Instant::now() > deadline {
            let late: Vec<String> = victims
                .iter()
                .filter(|v| v.shown_after.is_none())
                .map(|v| format!("{}: {}", v.pod, pods.get(v.pod).map_or(Value::Null, |p| p["status"].clone())))
                .collect();
            bail!("kills not shown within 30 s:\n{}\n{}", late.join("\n"), tail(&agent.log(), 60));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Stop the flood.
    let flood_processes_total = flood_processes(flood_pid);
    let flood_time = flood_start.elapsed();
    let (code, _) = cri.exec(&ids["flood"].1, &["touch", "/tmp/stop"]).await?;
    ensure!(code == 0, "cannot stop the flood");
    assert_evented_pleg_healthy(agent, "after the flood").await?;

    // Two more relists: every relist finding is settled (a repair or the kernel's), and a
    // wrong restart would show.
    relists(agent, 2.0, Duration::from_secs(20)).await?;
    let drops = agent.metric(DROPS).await?;
    let repairs = agent.metric(REPAIRS).await?;
    let log = agent.log();
    let repaired: Vec<(&str, &str)> = log
        .lines()
        .filter(|l| l.contains(REPAIR_LINE))
        .filter_map(|l| Some((field(l, "id")?, field(l, "state")?)))
        .collect();
    let kernel_exits: Vec<&str> = log[log_at_kills..]
        .lines()
        .filter(|l| l.contains(KERNEL_LINE) && field(l, "want") == Some("Exited"))
        .filter_map(|l| field(l, "container"))
        .collect();
    watcher.abort();
    let mut kernel_died: HashMap<String, NodeEvent> = HashMap::new();
    while let Ok(event) = died_rx.try_recv() {
        kernel_died.entry(event.container_id.clone()).or_insert(event);
    }

    ensure!(
        (repairs - repaired.len() as f64).abs() < 0.5,
        "the repair counter says {repairs}, the log {} repairs: {repaired:?}",
        repaired.len()
    );
    let (mut by_kernel, mut by_kernel_after_relist, mut by_relist) = (Vec::new(), Vec::new(), Vec::new());
    for v in &victims {
        let was_repaired = repaired.iter().any(|(id, state)| *id == v.id && *state == "Exited");
        let kernel_saw = kernel_exits.contains(&v.id.as_str());
        let context = || log.lines().filter(|l| l.contains(&v.id[..16])).collect::<Vec<_>>().join("\n");
        ensure!(
            kernel_saw != was_repaired,
            "{} ({}): exit delivered by the kernel: {kernel_saw}, repaired by the relist: {was_repaired}; exactly \
             one must be true\n{}",
            v.pod,
            v.id,
            context()
        );
        ensure!(
            !v.agent_stopped || was_repaired,
            "{}: killed while the ring buffer was full, yet not repaired by the relist\n{}",
            v.pod,
            context()
        );
        let event = kernel_died.get(&v.id);
        ensure!(event.is_none() || kernel_saw, "{}: a CONTAINER_DIED without a kernel exit: {event:?}", v.pod);
        if let Some(event) = event {
            let signal = (v.signal == libc::SIGKILL).then_some(libc::SIGKILL);
            ensure!(
                (event.exit_code, event.signal) == (Some(v.exit_code as i32), signal),
                "{}: the kernel reported {event:?}",
                v.pod
            );
        }
        let after = v.shown_after.context("shown")?;
        match (was_repaired, event.is_some()) {
            (true, _) => by_relist.push(after),
            (false, true) => by_kernel.push(after),
            (false, false) => by_kernel_after_relist.push(after),
        }
    }
    ensure!(repairs >= by_relist.len() as f64, "{repairs} repairs for {} exits lost", by_relist.len());

    // The final state, after the relists.
    let pods = pods_by_name(agent).await?;
    for v in &victims {
        let p = pods.get(v.pod).with_context(|| format!("{} gone", v.pod))?;
        ensure!(v.shown(p), "{}: {}", v.pod, p["status"]);
        let containers = cri.containers(&v.uid).await?;
        if v.restarted() {
            ensure!(running(p, "main"), "{} not running again: {}", v.pod, p["status"]);
            ensure!(containers.len() == 2, "{}: {} containers in the runtime, not 2", v.pod, containers.len());
        } else {
            ensure!(phase(p) == "Failed" && restarts(p, "main") == 0, "{}: {}", v.pod, p["status"]);
            ensure!(container(p, "main")["state"]["terminated"]["reason"] == "Error", "{}: {}", v.pod, p["status"]);
            ensure!(containers.len() == 1, "{}: {} containers in the runtime, not 1", v.pod, containers.len());
        }
    }
    for name in ["flood", "bystander"] {
        let p = pods.get(name).with_context(|| format!("{name} gone"))?;
        ensure!(running(p, "main") && restarts(p, "main") == 0, "{name} restarted: {}", p["status"]);
        ensure!(cri.containers(&uid(p)).await?.len() == 1, "{name}: another container in the runtime");
    }
    assert_evented_pleg_healthy(agent, "at the end").await?;
    ensure!(agent.metric("kubelet_evented_pleg_active").await? > 0.5, "the evented PLEG fell back to relisting");

    let mut all: Vec<Duration> = by_kernel.iter().chain(&by_kernel_after_relist).chain(&by_relist).copied().collect();
    for durations in [&mut all, &mut by_kernel, &mut by_relist] {
        durations.sort();
    }
    println!(
        "ring buffer {RING_BUFFER_BYTES} B, safety relist {RELIST_PERIOD}: flood of {:.0} processes/s ({:.0} in its \
         first 1,000), {flood_processes_total} in {:.1} s; agent stopped {:.2} s ({} flood exits, {certainly_dropped} \
         certainly dropped); {drops:.0} records dropped ({drops_before:.0} of them as the pods started), \
         {repairs:.0} relist repairs",
        flood_processes_total as f64 / flood_time.as_secs_f64(),
        early_rate,
        flood_time.as_secs_f64(),
        stopped_for.as_secs_f64(),
        counted_at_resume - counted_at_stop,
    );
    println!(
        "{} kills, status showing it p50 {:.2} s, max {:.2} s: {} from the kernel (max {:.2} s), {} from the kernel \
         after the relist listed it, {} lost and repaired by the relist (p50 {:.2} s, max {:.2} s)",
        all.len(),
        percentile(&all, 50.0).as_secs_f64(),
        percentile(&all, 100.0).as_secs_f64(),
        by_kernel.len(),
        percentile(&by_kernel, 100.0).as_secs_f64(),
        by_kernel_after_relist.len(),
        by_relist.len(),
        percentile(&by_relist, 50.0).as_secs_f64(),
        percentile(&by_relist, 100.0).as_secs_f64(),
    );
    Ok(())
}
