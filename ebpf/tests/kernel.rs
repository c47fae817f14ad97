//! Real-kernel tests: load the sensors, watch a private cgroup root, make things happen
//! in it and check what the kernel reports. They need root and fail (not skip) without
//! it. Each test has its own root and its own `Sensors`, so they run in parallel.

mod common;

use std::{fs, path::PathBuf, time::Duration};

use common::{EVENT_TIMEOUT, TestRoot, collect_until_quiet, expect_event, inode, load, run_outside, v1_hierarchy_of};
use swiftlet_ebpf::{
    CancellationToken, CgroupId, ExitStatus, ReclaimPhase, ReclaimScope, SensorConfig, SensorEvent, Sensors,
};

/// Loads sensors watching the test root in both hierarchies and starts the stream.
fn watching(root: &TestRoot, cfg: &SensorConfig) -> (Sensors, tokio::sync::mpsc::Receiver<SensorEvent>) {
    let mut sensors = load(cfg);
    let memcg = sensors.watch_cgroup(&root.root.memory).unwrap();
    let unified = sensors.watch_cgroup(&root.root.unified).unwrap();
    assert_eq!(memcg, root.root.memcg_id());
    assert_eq!(unified, root.root.cgroup2_id());
    let rx = sensors.take_event_stream(&CancellationToken::new()).unwrap();
    (sensors, rx)
}

#[test]
fn watched_roots_are_keyed_by_hierarchy_and_inode() {
    let root = TestRoot::new("ids");
    let mut sensors = load(&SensorConfig::default());
    let memcg = sensors.watch_cgroup(&root.root.memory).unwrap();
    assert_eq!(memcg, CgroupId { hierarchy_id: v1_hierarchy_of("memory"), id: inode(&root.root.memory) });
    let unified = sensors.watch_cgroup(&root.root.unified).unwrap();
    assert_eq!(unified, CgroupId::unified(inode(&root.root.unified)));

    let mut watched = sensors.watched_cgroups();
    watched.sort();
    assert_eq!(watched, {
        let mut expected = vec![memcg, unified];
        expected.sort();
        expected
    });
    sensors.unwatch_cgroup(&root.root.memory).unwrap();
    sensors.unwatch_cgroup(&root.root.memory).unwrap(); // idempotent
    assert_eq!(sensors.watched_cgroups(), vec![unified]);

    let not_a_cgroup = sensors.watch_cgroup(&PathBuf::from("/tmp")).unwrap_err();
    assert!(not_a_cgroup.to_string().contains("not inside a mounted cgroup hierarchy"), "{not_a_cgroup}");
}

#[tokio::test]
async fn mkdir_and_rmdir_below_the_root_are_reported_with_id_level_and_path() {
    let root = TestRoot::new("mkdir");
    let (_sensors, mut rx) = watching(&root, &SensorConfig::default());
    let memory_hierarchy = v1_hierarchy_of("memory");

    let child = root.child("pod-a");
    let (memcg_id, cgroup2_id) = (child.memcg_id(), child.cgroup2_id());
    for (cgroup, what) in [(memcg_id, "memory mkdir"), (cgroup2_id, "cgroup2 mkdir")] {
        let (event, _) =
            expect_event(&mut rx, what, |e| matches!(e, SensorEvent::CgroupMkdir(c) if c.cgroup == cgroup)).await;
        let SensorEvent::CgroupMkdir(change) = event else { unreachable!() };
        assert_eq!(change.level, 2, "{change:?}");
        assert_eq!(change.path, PathBuf::from(&child.rel), "{change:?}");
        assert!(!change.path_truncated);
        assert!(change.ktime_ns <= Sensors::monotonic_now_ns());
    }
    assert_eq!(memcg_id.hierarchy_id, memory_hierarchy);

    child.remove();
    for (cgroup, what) in [(memcg_id, "memory rmdir"), (cgroup2_id, "cgroup2 rmdir")] {
        let (event, _) =
            expect_event(&mut rx, what, |e| matches!(e, SensorEvent::CgroupRmdir(c) if c.cgroup == cgroup)).await;
        let SensorEvent::CgroupRmdir(change) = event else { unreachable!() };
        assert_eq!((change.level, change.path), (2, PathBuf::from(&child.rel)));
    }
}

#[tokio::test]
async fn exec_and_exit_code_of_a_process_in_a_child_cgroup() {
    let root = TestRoot::new("exit7");
    let (sensors, mut rx) = watching(&root, &SensorConfig::default());
    let child = root.child("ctr");
    let pid = root.spawn_in(&child, "/bin/sh -c 'exit 7'");

    let (exec, _) =
        expect_event(&mut rx, "exec", |e| matches!(e, SensorEvent::Exec { task, .. } if task.tgid == pid)).await;
    let SensorEvent::Exec { task, ns_init, first_in_cgroup, .. } = exec else { unreachable!() };
    assert!(first_in_cgroup, "the first exec in a fresh cgroup is reported as such");
    assert!(!ns_init, "sh runs in the host pid namespace");
    assert_eq!(task.cgroup2, child.cgroup2_id());
    assert_eq!(task.memcg, Some(child.memcg_id()));
    assert_eq!((task.pid, task.ns_pid, task.ns_tgid), (pid, pid, pid), "host pid namespace: ns ids are global ids");
    assert!(task.cpu_cgroup.is_some(), "cpu is a v1 controller here");

    let (exit, _) =
        expect_event(&mut rx, "exit", |e| matches!(e, SensorEvent::Exit { task, .. } if task.tgid == pid)).await;
    let SensorEvent::Exit { status, task, ns_init, main_process, .. } = exit else { unreachable!() };
    assert_eq!(status, ExitStatus::Exited { code: 7 });
    assert!(!ns_init);
    assert!(main_process, "the first exec in the cgroup is its main process");
    assert_eq!(task.memcg, Some(child.memcg_id()));

    // A second process: its exec is only counted, its exit arrives without a wakeup
    // of its own (with the periodic flush at the latest).
    let second = root.spawn_in(&child, "/bin/sh -c 'exit 5'");
    let (exit, others) =
        expect_event(&mut rx, "second exit", |e| matches!(e, SensorEvent::Exit { task, .. } if task.tgid == second))
            .await;
    assert!(matches!(exit, SensorEvent::Exit { main_process: false, status: ExitStatus::Exited { code: 5 }, .. }));
    assert!(!others.iter().any(|e| matches!(e, SensorEvent::Exec { .. })), "later execs are not reported: {others:#?}");

    for cgroup in [child.memcg_id(), child.cgroup2_id()] {
        let counters = sensors.cgroup_counters(cgroup).expect("counters for a cgroup with activity");
        assert_eq!((counters.execs, counters.process_exits), (2, 2), "{cgroup}: {counters:?}");
        assert!(counters.exits >= 2);
        assert_eq!(counters.main_tgid, Some(pid));
        assert_eq!(counters.last_exit.map(|l| l.status), Some(ExitStatus::Exited { code: 5 }));
    }
    assert_eq!(sensors.drops(), 0);
    assert_eq!(sensors.decode_errors(), 0);
}

#[tokio::test]
async fn containers_started_before_the_sensors_can_be_adopted() {
    let root = TestRoot::new("adopt");
    let child = root.child("ctr");
    let main = root.spawn_in(&child, "sleep 1000");
    // Wait until the main process is inside and has exec'd, before the sensors exist.
    let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
    while fs::read_to_string(format!("/proc/{main}/comm")).unwrap_or_default().trim() != "sleep" {
        assert!(std::time::Instant::now() < deadline, "sleep never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let (mut sensors, mut rx) = watching(&root, &SensorConfig::default());
    for cgroup in [child.memcg_id(), child.cgroup2_id()] {
        sensors.adopt_cgroup(cgroup, main).unwrap();
        assert_eq!(sensors.cgroup_counters(cgroup).unwrap().main_tgid, Some(main));
    }
    // A later exec (a probe, say) is neither reported nor taken for the main process.
    let probe = root.spawn_in(&child, "/bin/true");
    let (_, others) =
        expect_event(&mut rx, "probe exit", |e| matches!(e, SensorEvent::Exit { task, .. } if task.tgid == probe))
            .await;
    assert!(others.is_empty(), "{others:#?}");

    root.kill(main);
    let (exit, _) =
        expect_event(&mut rx, "main exit", |e| matches!(e, SensorEvent::Exit { task, .. } if task.tgid == main)).await;
    assert!(matches!(exit, SensorEvent::Exit { main_process: true, .. }), "{exit:?}");
    assert_eq!(sensors.cgroup_counters(child.cgroup2_id()).unwrap().execs, 1);
}

/// The children of a process (`/proc/<pid>/task/<pid>/children`).
fn children_of(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// An agent in a node container (kind's way) sees the node's process ids: the pid it
/// adopts a running container with is the node's, and so is the one the kernel must
/// compare at the main process's exit. Here a pid namespace of its own plays the node:
/// the container's main process is its pid 2 (not the namespace's init), adopted as 2.
#[tokio::test]
async fn adoption_by_an_agent_in_another_pid_namespace_names_the_main_process_there() {
    let root = TestRoot::new("adopt-pidns");
    let child = root.child("ctr");
    let inner = format!(
        "echo 0 > {}/cgroup.procs && echo 0 > {}/cgroup.procs && exec sleep 60",
        child.memory.display(),
        child.unified.display()
    );
    // unshare -> sh (the namespace's init, pid 1) -> sh -c inner (pid 2, exec'ing sleep).
    let unshare = root.spawn(
        std::process::Command::new("unshare")
            .args(["--pid", "--fork", "sh", "-c"])
            .arg(format!("sh -c '{inner}' & wait")),
    );
    let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
    let main = loop {
        let sleeping = children_of(unshare)
            .into_iter()
            .flat_map(children_of)
            .find(|p| fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default().trim() == "sleep");
        if let Some(pid) = sleeping {
            break pid;
        }
        assert!(std::time::Instant::now() < deadline, "the namespace's sleep never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let status = fs::read_to_string(format!("/proc/{main}/status")).unwrap();
    let nspid: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert_eq!(nspid, vec![main, 2], "the main process is pid 2 of its namespace");
    let pidns = inode(&PathBuf::from(format!("/proc/{main}/ns/pid")));

    let cfg = SensorConfig { pid_namespace_inum: Some(pidns), ..SensorConfig::default() };
    let (mut sensors, mut rx) = watching(&root, &cfg);
    for cgroup in [child.memcg_id(), child.cgroup2_id()] {
        sensors.adopt_cgroup(cgroup, 2).unwrap();
    }
    // A process outside the namespace exec'd into the cgroup is not the main one either.
    let probe = root.spawn_in(&child, "/bin/true");
    let (exit, _) =
        expect_event(&mut rx, "probe exit", |e| matches!(e, SensorEvent::Exit { task, .. } if task.tgid == probe))
            .await;
    assert!(matches!(exit, SensorEvent::Exit { main_process: false, .. }), "{exit:?}");

    // SAFETY: kill(2) of the test's own sleep, a grandchild of its unshare child.
    assert_eq!(unsafe { libc::kill(i32::try_from(main).unwrap(), libc::SIGKILL) }, 0);
    let (exit, _) =
        expect_event(&mut rx, "main exit", |e| matches!(e, SensorEvent::Exit { task, .. } if task.tgid == main)).await;
    let SensorEvent::Exit { main_process, ns_init, task, .. } = exit else { unreachable!() };
    assert!(!ns_init, "pid 2 is not its namespace's init");
    assert!(main_process, "the adopted main process's exit, named by its pid in the agent's namespace");
    assert_eq!(task.ns_tgid, 2);
}

#[tokio::test]
async fn a_process_killed_by_sigkill_reports_signal_9() {
    let root = TestRoot::new("sigkill");
    let (sensors, mut rx) = watching(&root, &SensorConfig::default());
    let child = root.child("ctr");
    let pid = root.spawn_in(&child, "sleep 1000");
    // Only kill once it is inside (and has exec'd): otherwise the kill hits the sh outside.
    expect_event(&mut rx, "exec of sleep", |e| matches!(e, SensorEvent::Exec { task, .. } if task.tgid == pid)).await;
    root.kill(pid);

    let (exit, _) =
        expect_event(&mut rx, "exit", |e| matches!(e, SensorEvent::Exit { task, .. } if task.tgid == pid)).await;
    let SensorEvent::Exit { status, .. } = exit else { unreachable!() };
    assert_eq!(status, ExitStatus::Signaled { signal: 9, core_dumped: false });
    assert_eq!(status.container_exit_code(), 137);
    let last = sensors.cgroup_counters(child.cgroup2_id()).unwrap().last_exit.unwrap();
    assert_eq!(last.status.signal(), Some(9));
}

#[tokio::test]
async fn the_init_of_a_pid_namespace_is_marked() {
    let root = TestRoot::new("nsinit");
    let (_sensors, mut rx) = watching(&root, &SensorConfig::default());
    let child = root.child("ctr");
    // unshare (the first exec inside) forks the namespace's pid 1, which execs sh.
    let pid = root.spawn_in(&child, "unshare --pid --fork /bin/sh -c 'exit 3'");

    let (exec, _) = expect_event(
        &mut rx,
        "exec of the namespace init",
        |e| matches!(e, SensorEvent::Exec { task, ns_init: true, .. } if task.ns_tgid == 1),
    )
    .await;
    let SensorEvent::Exec { task: init, first_in_cgroup, .. } = exec else { unreachable!() };
    assert!(!first_in_cgroup, "unshare exec'd first");
    assert_ne!(init.tgid, pid, "the init is unshare's child");
    assert_eq!(init.cgroup2, child.cgroup2_id());

    let (exit, _) = expect_event(
        &mut rx,
        "exit of the namespace init",
        |e| matches!(e, SensorEvent::Exit { task, .. } if task.tgid == init.tgid),
    )
    .await;
    let SensorEvent::Exit { status, ns_init, main_process, task, .. } = exit else { unreachable!() };
    assert!(ns_init, "{task:?}");
    assert!(!main_process, "unshare made the first exec");
    assert_eq!(status, ExitStatus::Exited { code: 3 });

    let (exit, _) =
        expect_event(&mut rx, "exit of unshare", |e| matches!(e, SensorEvent::Exit { task, .. } if task.tgid == pid))
            .await;
    assert!(matches!(
        exit,
        SensorEvent::Exit { ns_init: false, main_process: true, status: ExitStatus::Exited { code: 3 }, .. }
    ));
}

#[tokio::test]
async fn activity_outside_the_watched_root_is_silent() {
    let root = TestRoot::new("quiet");
    let outside = TestRoot::new("quiet-outside");
    let (sensors, mut rx) = watching(&root, &SensorConfig::default());

    // Processes in the test's own cgroup, and cgroups and processes in an unwatched root.
    for _ in 0..20 {
        run_outside("/bin/true");
    }
    let unwatched = outside.child("busy");
    let unwatched_ids = (unwatched.memcg_id(), unwatched.cgroup2_id());
    outside.spawn_in(&unwatched, "/bin/sh -c 'exit 1'");
    outside.wait_all();
    unwatched.remove();

    // A marker inside, on cgroup2 only: everything the sensors sent before it must be
    // nothing, since records arrive in the order they were written.
    let marker = root.child_path("marker");
    fs::create_dir(&marker.unified).unwrap();
    let marker_id = marker.cgroup2_id();
    let (_, before) =
        expect_event(&mut rx, "marker mkdir", |e| matches!(e, SensorEvent::CgroupMkdir(c) if c.cgroup == marker_id))
            .await;
    assert!(before.is_empty(), "events from outside the watched root: {before:#?}");
    assert_eq!(sensors.cgroup_counters(unwatched_ids.0), None);
    assert_eq!(sensors.cgroup_counters(unwatched_ids.1), None);
    assert_eq!(sensors.drops(), 0);
}

#[tokio::test]
async fn an_oom_kill_reports_the_victim_memcg() {
    let root = TestRoot::new("oom");
    let (sensors, mut rx) = watching(&root, &SensorConfig::default());
    let child = root.child("victim");
    fs::write(child.memory.join("memory.limit_in_bytes"), "16M").unwrap();
    let pid = root.spawn_in(&child, "tail /dev/zero");

    let (oom, before) =
        expect_event(&mut rx, "OOM kill", |e| matches!(e, SensorEvent::OomKill { victim, .. } if victim.tgid == pid))
            .await;
    let SensorEvent::OomKill { victim, uid, .. } = oom else { unreachable!() };
    assert_eq!(victim.memcg, Some(child.memcg_id()));
    assert_eq!(victim.cgroup2, child.cgroup2_id());
    assert_eq!(victim.comm, "tail");
    assert_eq!(uid, 0);

    // The memcg reclaimed before giving up: pressure was visible first.
    let reclaim = |e: &SensorEvent, want_end: bool| {
        matches!(e, SensorEvent::Reclaim { task, scope: ReclaimScope::Memcg, phase, .. }
            if task.tgid == pid && matches!(phase, ReclaimPhase::End { .. }) == want_end)
    };
    assert!(before.iter().any(|e| reclaim(e, false)), "no memcg reclaim begin before the OOM kill: {before:#?}");
    assert!(before.iter().any(|e| reclaim(e, true)), "no memcg reclaim end before the OOM kill: {before:#?}");

    let (exit, _) = expect_event(
        &mut rx,
        "exit of the victim",
        |e| matches!(e, SensorEvent::Exit { task, .. } if task.tgid == pid),
    )
    .await;
    assert!(matches!(exit, SensorEvent::Exit { status: ExitStatus::Signaled { signal: 9, .. }, .. }), "{exit:?}");

    let counters = sensors.cgroup_counters(child.memcg_id()).unwrap();
    assert!(counters.oom_kills >= 1, "{counters:?}");
    assert!(counters.reclaims >= 1 && counters.reclaim_ns > 0, "{counters:?}");
}

#[tokio::test]
async fn a_full_ring_buffer_counts_drops() {
    const CGROUPS: usize = 40;
    let root = TestRoot::new("drops");
    // One page holds 7 cgroup records (560 bytes each with the ring header).
    let mut sensors = load(&SensorConfig { ring_buffer_bytes: 4096, ..SensorConfig::default() });
    sensors.watch_cgroup(&root.root.memory).unwrap();

    // Nobody reads yet: the burst overflows the buffer.
    for i in 0..CGROUPS {
        fs::create_dir(root.root.memory.join(format!("c{i}"))).unwrap();
    }
    let drops = sensors.drops();
    assert!(drops > 0, "40 records into a 4 KiB ring buffer dropped nothing");

    let mut rx = sensors.take_event_stream(&CancellationToken::new()).unwrap();
    let received = collect_until_quiet(&mut rx, Duration::from_millis(500)).await;
    assert!(received.iter().all(|e| matches!(e, SensorEvent::CgroupMkdir(_))), "{received:#?}");
    assert_eq!(received.len() as u64 + drops, CGROUPS as u64, "every record is either delivered or counted");
}

#[tokio::test]
async fn counters_disappear_when_the_cgroup_is_removed() {
    let root = TestRoot::new("counters");
    let (sensors, mut rx) = watching(&root, &SensorConfig::default());
    let child = root.child("ctr");
    let (memcg_id, cgroup2_id) = (child.memcg_id(), child.cgroup2_id());
    let pid = root.spawn_in(&child, "/bin/true");
    expect_event(&mut rx, "exit", |e| matches!(e, SensorEvent::Exit { task, .. } if task.tgid == pid)).await;
    assert!(sensors.cgroup_counters(memcg_id).is_some());
    assert!(sensors.cgroup_counters(cgroup2_id).is_some());

    child.remove();
    assert_eq!(sensors.cgroup_counters(memcg_id), None, "memcg counters outlived rmdir");
    assert_eq!(sensors.cgroup_counters(cgroup2_id), None, "cgroup2 counters outlived rmdir");
}

#[tokio::test]
async fn removing_a_watched_root_forgets_it_and_unwatch_stops_events() {
    let root = TestRoot::new("unwatch");
    let (mut sensors, mut rx) = watching(&root, &SensorConfig::default());

    // A nested root that goes away is dropped from the kernel's map.
    let nested = root.child("nested");
    let nested_id = sensors.watch_cgroup(&nested.unified).unwrap();
    assert!(sensors.watched_cgroups().contains(&nested_id));
    nested.remove();
    assert!(!sensors.watched_cgroups().contains(&nested_id));

    sensors.unwatch_cgroup(&root.root.memory).unwrap();
    sensors.unwatch_cgroup(&root.root.unified).unwrap();
    let _ = collect_until_quiet(&mut rx, Duration::from_millis(200)).await;
    let _child = root.child("after");
    let late = collect_until_quiet(&mut rx, Duration::from_millis(500)).await;
    assert!(late.is_empty(), "events after unwatch: {late:#?}");
}

#[tokio::test]
async fn the_stream_ends_on_cancel_and_can_be_taken_once() {
    let root = TestRoot::new("cancel");
    let mut sensors = load(&SensorConfig::default());
    sensors.watch_cgroup(&root.root.unified).unwrap();
    let cancel = CancellationToken::new();
    let mut rx = sensors.take_event_stream(&cancel).unwrap();
    assert!(sensors.take_event_stream(&CancellationToken::new()).is_err(), "a second stream");
    cancel.cancel();
    let end = tokio::time::timeout(EVENT_TIMEOUT, rx.recv()).await.expect("the reader stops on cancel");
    assert!(end.is_none());
}

#[test]
fn the_stream_needs_a_runtime_and_survives_the_attempt() {
    let mut sensors = load(&SensorConfig::default());
    let error = sensors.take_event_stream(&CancellationToken::new()).unwrap_err();
    assert!(error.to_string().contains("tokio runtime"), "{error}");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async { sensors.take_event_stream(&CancellationToken::new()).map(drop) }).unwrap();
}

/// Set in a re-executed copy of this test binary that runs in a hostile environment.
const CHILD_MODE: &str = "SWIFTLET_EBPF_TEST_CHILD";

/// The arguments that run one test of this binary, in child mode.
fn this_test(test: &str) -> Vec<String> {
    let exe = std::env::current_exe().unwrap().display().to_string();
    vec![exe, "--exact".into(), test.into(), "--nocapture".into(), "--test-threads=1".into()]
}

/// Runs `program args` with the child-mode variable set; its output, or a panic.
fn run_child(program: &str, args: &[String]) -> String {
    let output = std::process::Command::new(program).args(args).env(CHILD_MODE, "1").output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{program} {args:?} failed:\n{text}");
    text
}

#[test]
fn without_privileges_loading_fails_with_a_permission_error() {
    if std::env::var_os(CHILD_MODE).is_some() {
        let error = Sensors::load(&SensorConfig::default()).unwrap_err();
        assert!(matches!(error, swiftlet_ebpf::Error::Load(swiftlet_ebpf::LoadError::PermissionDenied { .. })));
        println!("operator sees: {error}");
        return;
    }
    common::require_root();
    // Still uid 0 (so the test binary stays reachable wherever the target dir is),
    // but with every capability gone from the bounding set.
    let mut args: Vec<String> = ["--bounding-set=-all", "--inh-caps=-all"].map(String::from).to_vec();
    args.extend(this_test("without_privileges_loading_fails_with_a_permission_error"));
    let output = run_child("setpriv", &args);
    assert!(output.contains("need root or CAP_BPF + CAP_PERFMON"), "{output}");
}

#[test]
fn without_kernel_btf_loading_fails_naming_the_btf() {
    if std::env::var_os(CHILD_MODE).is_some() {
        let error = Sensors::load(&SensorConfig::default()).unwrap_err();
        assert!(matches!(error, swiftlet_ebpf::Error::Load(swiftlet_ebpf::LoadError::NoKernelBtf { .. })), "{error}");
        println!("operator sees: {error}");
        return;
    }
    common::require_root();
    // A private mount namespace in which the kernel's BTF reads as empty.
    let script = format!(
        "mount --bind /dev/null /sys/kernel/btf/vmlinux && exec {}",
        this_test("without_kernel_btf_loading_fails_naming_the_btf").join(" ")
    );
    let args = ["--mount", "--propagation", "private", "sh", "-c", &script].map(String::from);
    let output = run_child("unshare", &args);
    assert!(output.contains("no kernel BTF at /sys/kernel/btf/vmlinux"), "{output}");
}
