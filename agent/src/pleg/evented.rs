//! [`EventedPleg`]: lifecycle events from the kernel.
//!
//! The eBPF sensors report that the init process of a container (pid 1 of its pid
//! namespace) exec'd or exited, with the cgroup it ran in and a kernel timestamp. The
//! cgroup path is the one the agent chose (`<cgroupRoot>/kubepods/.../pod<uid>/<id>`), so
//! it names the pod and the container (or sandbox) directly. For each such event the
//! PLEG asks CRI for that one container's status until the runtime agrees (the kernel
//! is ahead of containerd by a few milliseconds), records the new state, and emits the
//! [`PodLifecycleEvent`] at once: kernel speed, CRI truth. A start the agent itself asked
//! for waits for its call instead ([`crate::container::starts`]): the processes of a new container
//! exec while `StartContainer` is still under way, CRI cannot agree before it returns,
//! and when it returns success that is CRI's answer.
//!
//! Exits are the exception, because they are where speed matters and where containerd
//! lags most (it records an exit only after `runc delete`, tens of milliseconds later):
//! the exit of a container's init ends the container — the first process in the
//! container's cgroup to exec as pid 1 of a pid namespace; a namespace made inside the
//! container has an init of its own, whose exit ends nothing but that namespace — so
//! the PLEG records it in
//! [`KernelExits`] — which the runtime manager lays over CRI's answer — and emits
//! `ContainerDied` without waiting for CRI.
//!
//! Underneath, the relisting PLEG keeps running at a slow period (30 s by default). A
//! change it finds that the kernel path did not report is a *repair*: it is forwarded,
//! counted in `kubelet_evented_pleg_relist_repairs_total` and logged, because it means
//! the kernel path has a hole (ring-buffer drops, an agent restart, or a container the
//! sensors cannot see, e.g. one sharing the pod's pid namespace or the host's).
//! When the kernel counts ring-buffer drops (a mass deletion on a dense node can fill
//! the buffer faster than the agent reads it), the relist runs at once, at most once a
//! second while the drops go on, so what the lost records told arrives within seconds,
//! not a safety period later.
//! While listing fails (the runtime away: containerd restarting) it tries again every
//! second, and the first listing that works passes on again the changes since the last
//! one that the kernel reported already: the pod workers heard of them at once, but could
//! not act without the runtime, and would otherwise retry only 10 s later.
//!
//! If the kernel stream ends, the PLEG falls back to relisting every second and says so
//! in the log, in `/healthz?verbose` and in `kubelet_evented_pleg_active`.
//!
//! A runtime with an event stream of its own (CRI `GetContainerEvents`: containerd 2.x)
//! is a third input: a start or stop it tells before the kernel path did is recorded and
//! emitted at once (the runtime agrees with itself), and every one of its events is
//! counted by which source told the change first
//! (`kubelet_evented_pleg_runtime_events_total{kind,first}`): what the stream adds to the
//! kernel's. A runtime without it (containerd 1.6) is asked once.
//!
//! What the PLEG remembers of a container (its last state, name and what the kernel saw)
//! goes when a relist reports the container removed, or — for a container born and
//! removed between two relists, which no relist ever lists — after the rmdir of its
//! cgroup: not at once, since the runtime may list the container (exited) long after
//! its cgroup is gone, and a relist that found it then with nothing remembered would
//! forward its exit again and count a miss; but once two relists have been reconciled
//! since the rmdir, the second of which listed the runtime after it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::metrics::{KernelEventLabels, PlegMetrics, RuntimeEventKindLabels, RuntimeEventLabels};
use super::relist::{GenericPleg, PlegState, RELIST_PERIOD};
use super::{PodLifecycleEvent, PodLifecycleEventGenerator, PodLifecycleEventType};
use crate::container::cache::RuntimeCache;
use crate::container::exits::wall_time_of;
use crate::container::{ContainerState, RuntimeService, api};

/// The cgroup2 (default) hierarchy's id, as the kernel numbers it.
pub const CGROUP2_HIERARCHY: u32 = 0;

/// How long a relist finding waits for the kernel path to report the same change
/// before it counts as a miss.
const SUSPECT_GRACE: Duration = Duration::from_secs(2);

/// How long the PLEG waits for CRI to agree with the kernel before leaving the change
/// to the safety-net relist.
const CONFIRM_DEADLINE: Duration = Duration::from_secs(2);

/// How long a start (or an exit of a container not seen running) waits for the pod's
/// start calls to return before asking CRI ([`StartsInFlight`]): starts in a burst take
/// up to a few seconds; one that takes longer is waiting on something else (a CNI
/// plugin), and the PLEG goes back to asking.
const START_SETTLE_LIMIT: Duration = Duration::from_secs(10);

/// A kernel event, as the agent needs it (decoupled from the sensor crate's types).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelEvent {
    CgroupMkdir {
        ktime_ns: u64,
        hierarchy_id: u32,
        cgroup_id: u64,
        path: String,
    },
    CgroupRmdir {
        ktime_ns: u64,
        hierarchy_id: u32,
        cgroup_id: u64,
        path: String,
    },
    /// A process exec'd; `ns_init` when it is pid 1 of its pid namespace or the first
    /// process to exec in its cgroup (a container's main process also when it shares a
    /// pid namespace); `pid1` only for the former.
    Exec {
        ktime_ns: u64,
        pid: u32,
        cgroup2_id: u64,
        memcg_id: u64,
        ns_init: bool,
        pid1: bool,
    },
    /// A process (thread group) exited. `ns_init`: it was pid 1 of its pid namespace,
    /// so the namespace (the container) ended with it. `main_process`: it was the first
    /// process that exec'd in its cgroup since the sensors started (the container's main
    /// process when the cgroup was created under their watch), or the main process the
    /// sensors were told of for a container already running when they started
    /// ([`super::sensors::start`]).
    Exit {
        ktime_ns: u64,
        pid: u32,
        cgroup2_id: u64,
        memcg_id: u64,
        ns_init: bool,
        main_process: bool,
        exit_code: i32,
        signal: i32,
    },
    /// The OOM killer chose a victim.
    OomKill {
        ktime_ns: u64,
        pid: u32,
        cgroup2_id: u64,
        memcg_id: u64,
    },
    /// Memory reclaim (pressure) started or ended; not a lifecycle event.
    Reclaim {
        ktime_ns: u64,
        memcg_id: u64,
        begin: bool,
        direct: bool,
    },
}

impl KernelEvent {
    fn kind_label(&self) -> &'static str {
        match self {
            Self::CgroupMkdir { .. } => "cgroup_mkdir",
            Self::CgroupRmdir { .. } => "cgroup_rmdir",
            Self::Exec { .. } => "exec",
            Self::Exit { .. } => "exit",
            Self::OomKill { .. } => "oom_kill",
            Self::Reclaim { .. } => "reclaim",
        }
    }
}

/// What a cgroup under the kubepods root belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CgroupRef {
    pub pod_uid: String,
    /// The container or sandbox id, for a container cgroup; `None` for the pod cgroup.
    pub container_id: Option<String>,
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The pod uid a pod cgroup's directory names: `pod<uid>` (cgroupfs driver), or
/// `kubepods[-<qos>]-pod<uid>.slice` with the uid's `-` written `_` (systemd driver).
fn pod_uid_of(component: &str) -> Option<String> {
    if let Some(slice) = component.strip_suffix(".slice") {
        let uid = slice.rsplit('-').next()?.strip_prefix("pod")?;
        return (!uid.is_empty()).then(|| uid.replace('_', "-"));
    }
    let uid = component.strip_prefix("pod")?;
    (!uid.is_empty()).then(|| uid.to_owned())
}

/// The container id a container cgroup's directory names: the id itself (cgroupfs
/// driver), or `<runtime>-<id>.scope` (systemd driver: `cri-containerd-`, `crio-`,
/// `docker-`); CRI-O's `crio-conmon-<id>.scope` holds its monitor, not the container.
fn container_id_of(component: &str) -> Option<&str> {
    let id = match component.strip_suffix(".scope") {
        Some(scope) if scope.contains("conmon") => return None,
        Some(scope) => scope.rsplit('-').next()?,
        None => component,
    };
    is_container_id(id).then_some(id)
}

/// Parses a pod or container cgroup path of either driver: `.../pod<uid>[/<64-hex id>]`
/// or `.../kubepods-burstable-pod<uid>.slice[/cri-containerd-<id>.scope]`.
#[must_use]
pub fn parse_cgroup_path(path: &str) -> Option<CgroupRef> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (pos, pod_uid) = parts.iter().enumerate().rev().find_map(|(i, p)| pod_uid_of(p).map(|u| (i, u)))?;
    match &parts[pos + 1..] {
        [] => Some(CgroupRef { pod_uid, container_id: None }),
        [id] => container_id_of(id).map(|id| CgroupRef { pod_uid, container_id: Some(id.to_string()) }),
        _ => None,
    }
}

/// A pod or container cgroup directory found on disk by [`existing_cgroups`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingCgroup {
    pub path: PathBuf,
    /// The directory's inode number: the cgroup id on cgroupfs.
    pub inode: u64,
    pub owner: CgroupRef,
}

/// Every pod and container cgroup under `root` (a kubepods directory in one hierarchy),
/// found by walking the tree: what the agent reads at start for cgroups created before it
/// (the evented PLEG's index, the sensors' adoption of running containers).
#[must_use]
pub fn existing_cgroups(root: &Path) -> Vec<ExistingCgroup> {
    use std::os::unix::fs::MetadataExt as _;
    let mut found = Vec::new();
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if !meta.is_dir() {
                continue;
            }
            let path = e.path();
            if let Some(owner) = path.strip_prefix(root).ok().and_then(|p| parse_cgroup_path(&p.to_string_lossy())) {
                found.push(ExistingCgroup { path: path.clone(), inode: meta.ino(), owner });
            }
            stack.push(path);
        }
    }
    found
}

/// (hierarchy id, cgroup id) → what the cgroup belongs to.
#[derive(Debug, Default, Clone)]
pub struct CgroupIndex {
    map: HashMap<(u32, u64), CgroupRef>,
}

impl CgroupIndex {
    /// Indexes the cgroups that already exist under `root` (a kubepods directory in one
    /// hierarchy): on cgroupfs the cgroup id is the directory's inode number.
    pub fn scan(&mut self, hierarchy_id: u32, root: &Path) {
        for found in existing_cgroups(root) {
            self.map.insert((hierarchy_id, found.inode), found.owner);
        }
    }

    pub fn insert(&mut self, hierarchy_id: u32, cgroup_id: u64, path: &str) {
        if let Some(r) = parse_cgroup_path(path) {
            self.map.insert((hierarchy_id, cgroup_id), r);
        }
    }

    pub fn remove(&mut self, hierarchy_id: u32, cgroup_id: u64) {
        self.map.remove(&(hierarchy_id, cgroup_id));
    }

    #[must_use]
    pub fn get(&self, hierarchy_id: u32, cgroup_id: u64) -> Option<&CgroupRef> {
        self.map.get(&(hierarchy_id, cgroup_id))
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// A lifecycle change the evented path observed (for the node event API).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub pod_uid: String,
    pub container_id: String,
    /// The container's name when the runtime told it (lifecycle events); else empty.
    pub container_name: String,
    pub kind: ObservedKind,
    pub kernel_time_ns: u64,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

/// Kind of an [`Observed`] change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObservedKind {
    ContainerStarted,
    ContainerDied,
    OomKilled,
    CgroupCreated,
    CgroupRemoved,
    MemoryPressure,
}

/// Receives observed changes (the node event API).
pub type ObservedSink = Arc<dyn Fn(Observed) + Send + Sync>;

/// A kernel event resolved to a container, waiting for CRI to agree.
#[derive(Debug)]
struct Work {
    pod_uid: String,
    cid: String,
    want: PlegState,
    ktime: u64,
    /// Exit code and signal, for exits.
    exit: Option<(i32, i32)>,
    /// How often to ask CRI ([`confirm_pause`]).
    pace: Pace,
    /// An exit that is not a pid 1's: moot once the container's init is seen to exec.
    not_pid1_exit: bool,
}

/// How a confirmation polls CRI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// Every 2 ms for 200 ms, then every 25 ms: someone waits for the answer.
    Fine,
    /// From 5 ms, doubling up to 250 ms: the answer is slow to come or not awaited.
    BackOff,
}

/// What to do with a kernel event after [`EventedPleg::classify`].
#[derive(Debug)]
enum Next {
    /// Emit this at once (an exit, already recorded).
    Emit(PodLifecycleEvent),
    /// Confirm with CRI first.
    Confirm(Work),
}

/// A kernel observation waiting for CRI to agree ([`Work`]).
#[derive(Debug, Clone)]
struct Awaiting {
    pod_uid: String,
    want: PlegState,
    ktime: u64,
    exit: Option<(i32, i32)>,
}

#[derive(Debug, Default)]
struct State {
    /// Last state of each container/sandbox this PLEG reported (either path).
    known: HashMap<String, PlegState>,
    /// Ids whose kernel event is being confirmed with CRI.
    /// Counted: runc's own processes in a new container cgroup also exec and exit, so
    /// several confirmations of one container can be in flight at once.
    pending: HashMap<String, usize>,
    /// The latest kernel observation awaiting CRI per id (see [`Awaiting`]): a runtime
    /// event telling the same change is that confirmation.
    awaiting: HashMap<String, Awaiting>,
    /// Ids whose start is being confirmed: runc's helper and then the container's init
    /// exec in a new container, and one answer from CRI settles both.
    starting: HashSet<String>,
    /// The most advanced state the kernel reported per container, whether or not it
    /// led to an event: what decides if a relist finding was a miss; and when (kernel
    /// monotonic ns) it saw the container reach it, what the runtime's event telling the
    /// same change is timed against.
    kernel_seen: HashMap<String, (PlegState, u64)>,
    /// Relist findings not (yet) reported by the kernel: (state, when found, pod uid).
    /// The relist can be ahead of the kernel for a moment (CRI marks a container
    /// running when `StartContainer` returns, a little before its process execs), so a
    /// finding is a miss only if the kernel has not reported it within [`SUSPECT_GRACE`].
    suspects: HashMap<String, (PlegState, tokio::time::Instant, String)>,
    /// Container names CRI told when confirming starts, for the exits' observations.
    names: HashMap<String, String>,
    /// The process (host tgid) that was the first in each container's cgroup to exec as
    /// pid 1 of a pid namespace: the container's init. A process inside the container
    /// can make pid namespaces of its own (`unshare -p`, bubblewrap, a browser's sandbox,
    /// a nested runtime); their inits' exits are not the container's end.
    inits: HashMap<String, u32>,
    /// Containers whose cgroup was removed, with the count of relists reconciled at the
    /// time: forgotten two relists later (see the module docs).
    retired: Vec<(String, u64)>,
    /// Relists reconciled so far.
    reconciled: u64,
    /// The last safety relist failed (the runtime away, e.g. containerd restarting).
    listing_failed: bool,
    index: CgroupIndex,
}

impl State {
    /// Forgets the containers whose cgroup went before the last relist began, unless
    /// something about them is still under way (a confirmation, a suspect).
    fn prune_retired(&mut self) {
        let reconciled = self.reconciled;
        let retired = std::mem::take(&mut self.retired);
        for (id, at) in retired {
            if at + 2 > reconciled || self.pending.contains_key(&id) || self.suspects.contains_key(&id) {
                self.retired.push((id, at));
                continue;
            }
            self.known.remove(&id);
            self.names.remove(&id);
            self.kernel_seen.remove(&id);
            self.inits.remove(&id);
        }
    }
}

/// The evented PLEG (see the module docs).
#[derive(Clone)]
pub struct EventedPleg {
    relist: GenericPleg,
    rt: Arc<dyn RuntimeService>,
    metrics: Arc<PlegMetrics>,
    safety_period: Duration,
    memory_hierarchy: u32,
    state: Arc<Mutex<State>>,
    kernel_alive: Arc<AtomicBool>,
    fallback: Arc<Mutex<Option<String>>>,
    sink: Option<ObservedSink>,
    /// Where kernel exits are recorded and the runtime manager's start calls are marked:
    /// the relisting PLEG's cache.
    cache: Arc<RuntimeCache>,
    /// Where direct reclaim in pod cgroups and OOM kills are signalled (eviction).
    pressure: Option<crate::pressure::PressureSignals>,
    /// The running sensors' events, until [`PodLifecycleEventGenerator::start`] takes them.
    sensors: Arc<Mutex<Option<super::sensors::Running>>>,
    /// Wakes the safety relist before its period: the ring buffer overflowed, and what
    /// the lost records told is found by listing.
    relist_now: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for EventedPleg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventedPleg")
            .field("safety_period", &self.safety_period)
            .field("kernel_alive", &self.kernel_alive.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn state_of(kind: PodLifecycleEventType) -> Option<PlegState> {
    match kind {
        PodLifecycleEventType::ContainerStarted => Some(PlegState::Running),
        PodLifecycleEventType::ContainerDied => Some(PlegState::Exited),
        PodLifecycleEventType::ContainerChanged => Some(PlegState::Unknown),
        PodLifecycleEventType::ContainerRemoved => Some(PlegState::NonExistent),
        PodLifecycleEventType::PodSync => None,
    }
}

/// Order of a container's (or sandbox's) states: a container only ever moves forward
/// (created → running → exited → removed), so an older observation never overrides a
/// newer one, whichever path (kernel or relist) made it.
fn rank(s: PlegState) -> u8 {
    match s {
        PlegState::Unknown => 0,
        PlegState::Running => 1,
        PlegState::Exited => 2,
        PlegState::NonExistent => 3,
    }
}

/// Records `new` unless something at least as advanced is known; true when recorded.
/// [`advance`] of what the kernel saw of container `id`, remembering when it saw it.
fn kernel_saw(s: &mut State, id: &str, new: PlegState, ktime: u64) {
    match s.kernel_seen.get(id) {
        Some((old, _)) if rank(*old) >= rank(new) => {}
        _ => {
            s.kernel_seen.insert(id.to_owned(), (new, ktime));
        }
    }
}

fn advance(known: &mut HashMap<String, PlegState>, id: &str, new: PlegState) -> bool {
    match known.get(id) {
        Some(old) if rank(*old) >= rank(new) => false,
        _ => {
            known.insert(id.to_string(), new);
            true
        }
    }
}

/// How long to wait before asking CRI again, after `polls` answers that did not agree
/// yet, `elapsed` after the kernel event.
///
/// [`Pace::Fine`] for the exit of a running container: containerd records it some tens of
/// ms after the kernel (it runs `runc delete` first), and the status waits for it: poll
/// finely while that is likely, then every 25 ms (a doubling back-off would overshoot the
/// moment it agrees by up to its last step).
///
/// [`Pace::BackOff`] for the rest. A start: the container's first exec comes before the
/// runtime's `StartContainer` returns, which on a node busy starting many pods takes
/// hundreds of ms, and the pod worker that asked for the start learns of it from that
/// call. Fine polling there cost about 100 `ContainerStatus` calls per container start,
/// and some 170 per exit of runc's helper (which never agrees: a 2 s time-out), hundreds
/// a second in a 100-pod burst, on a runtime that had no CPU to spare.
fn confirm_pause(pace: Pace, elapsed: Duration, polls: u32) -> Duration {
    match pace {
        Pace::BackOff => Duration::from_millis(5u64 << polls.saturating_sub(1).min(6)).min(Duration::from_millis(250)),
        Pace::Fine if elapsed < Duration::from_millis(200) => Duration::from_millis(2),
        Pace::Fine => Duration::from_millis(25),
    }
}

/// Outcome of waiting for CRI to agree with the kernel.
enum Confirmation {
    /// CRI shows the state; the container's name.
    Agreed(String),
    /// CRI already shows a later state (a container that exited before it was seen
    /// running); its own later event will tell.
    Passed,
    /// CRI did not agree in time; the relist will tell.
    TimedOut,
    /// The exit of a process that was not a pid 1 (taken for the cgroup's main process:
    /// most often runc's helper, the first to exec there), in a container whose own init
    /// has exec'd since: not the container's end, no more to ask.
    Moot,
}

/// Asks CRI for one container's (or sandbox's) state, and the container's name.
async fn runtime_state(rt: &dyn RuntimeService, id: &str) -> Option<(PlegState, String)> {
    match rt.container_status(id).await {
        Ok(st) => Some((ContainerState::from_cri(st.state).into(), st.metadata.map(|m| m.name).unwrap_or_default())),
        Err(e) if e.is_not_found() => match rt.pod_sandbox_status(id).await {
            Ok(sb) if sb.state == api::PodSandboxState::SandboxReady as i32 => {
                Some((PlegState::Running, String::new()))
            }
            Ok(_) => Some((PlegState::Exited, String::new())),
            Err(e) if e.is_not_found() => Some((PlegState::NonExistent, String::new())),
            Err(_) => None,
        },
        Err(_) => None,
    }
}

impl EventedPleg {
    /// `relist` should be built with the safety period; `memory_hierarchy` is the v1
    /// memory hierarchy id (0 when memory is on cgroup2), used to map OOM victims.
    #[must_use]
    pub fn new(
        relist: GenericPleg,
        rt: Arc<dyn RuntimeService>,
        metrics: Arc<PlegMetrics>,
        safety_period: Duration,
        index: CgroupIndex,
        memory_hierarchy: u32,
        sink: Option<ObservedSink>,
    ) -> Self {
        metrics.evented_pleg_active.set(1);
        Self {
            cache: relist.cache().clone(),
            relist,
            rt,
            metrics,
            safety_period,
            memory_hierarchy,
            state: Arc::new(Mutex::new(State { index, ..State::default() })),
            kernel_alive: Arc::new(AtomicBool::new(true)),
            fallback: Arc::new(Mutex::new(None)),
            sink,
            pressure: None,
            sensors: Arc::default(),
            relist_now: Arc::default(),
        }
    }

    /// Reads kernel events from `sensors` once started.
    #[must_use]
    pub fn with_sensors(self, sensors: super::sensors::Running) -> Self {
        *self.sensors.lock().unwrap() = Some(sensors);
        self
    }

    /// Signals direct reclaim starting in a pod's memory cgroup and OOM kills to
    /// `pressure` (the eviction manager's fast path).
    #[must_use]
    pub fn with_pressure(mut self, pressure: crate::pressure::PressureSignals) -> Self {
        self.pressure = Some(pressure);
        self
    }

    /// The relisting PLEG underneath (its snapshot feeds housekeeping).
    #[must_use]
    pub fn relist(&self) -> &GenericPleg {
        &self.relist
    }

    /// Why the kernel path is not in use, if it is not.
    #[must_use]
    pub fn fallback_reason(&self) -> Option<String> {
        self.fallback.lock().unwrap().clone()
    }

    fn observe(&self, o: Observed) {
        if let Some(s) = &self.sink {
            s(o);
        }
    }

    /// Observes what happened to the cgroup of `r` (no exit code; the container name is
    /// not known from the cgroup).
    fn observe_cgroup(&self, r: CgroupRef, kind: ObservedKind, kernel_time_ns: u64, signal: Option<i32>) {
        self.observe(Observed {
            pod_uid: r.pod_uid,
            container_id: r.container_id.unwrap_or_default(),
            container_name: String::new(),
            kind,
            kernel_time_ns,
            exit_code: None,
            signal,
        });
    }

    /// Handles one kernel event; returns the lifecycle event to emit (for a start, once
    /// CRI agrees).
    #[cfg(test)]
    async fn handle_kernel_event(&self, ev: KernelEvent) -> Option<PodLifecycleEvent> {
        match self.classify(&ev)? {
            Next::Emit(e) => Some(e),
            Next::Confirm(work) => self.complete(work).await,
        }
    }

    /// The synchronous part of handling a kernel event, run in event order: keeps the
    /// cgroup index current and resolves exec/exit to a container *before* a later
    /// rmdir of that container's cgroup can remove the mapping. Returns the exit event
    /// to emit, or the CRI confirmation still to do.
    fn classify(&self, ev: &KernelEvent) -> Option<Next> {
        self.metrics
            .evented_pleg_kernel_events
            .get_or_create(&KernelEventLabels { kind: ev.kind_label().into() })
            .inc();
        // For an exec as pid 1: its tgid. For an exit: its tgid and whether it was the
        // process the sensors took for the cgroup's main one.
        let mut exec_pid1 = None;
        let mut exit_process = (0, false);
        let (target, want, ktime, exit) = match *ev {
            KernelEvent::CgroupMkdir { hierarchy_id, cgroup_id, ref path, ktime_ns } => {
                let mut s = self.state.lock().unwrap();
                s.index.insert(hierarchy_id, cgroup_id, path);
                if let (CGROUP2_HIERARCHY, Some(r)) = (hierarchy_id, s.index.get(hierarchy_id, cgroup_id).cloned()) {
                    drop(s);
                    self.observe_cgroup(r, ObservedKind::CgroupCreated, ktime_ns, None);
                }
                return None;
            }
            KernelEvent::CgroupRmdir { hierarchy_id, cgroup_id, ktime_ns, .. } => {
                let removed = {
                    let mut s = self.state.lock().unwrap();
                    let r = s.index.get(hierarchy_id, cgroup_id).cloned();
                    s.index.remove(hierarchy_id, cgroup_id);
                    // Its events came before its rmdir: the init is of no more use, and
                    // the rest goes once the relist cannot find it any more.
                    if let Some(cid) = r.as_ref().and_then(|r| r.container_id.clone()) {
                        s.inits.remove(&cid);
                        let at = s.reconciled;
                        s.retired.push((cid, at));
                    }
                    r
                };
                if let (CGROUP2_HIERARCHY, Some(r)) = (hierarchy_id, removed) {
                    self.observe_cgroup(r, ObservedKind::CgroupRemoved, ktime_ns, None);
                }
                return None;
            }
            KernelEvent::OomKill { ktime_ns, cgroup2_id, memcg_id, .. } => {
                if let Some(p) = &self.pressure {
                    p.send(crate::pressure::PressureSource::KernelOom);
                }
                if let Some(r) = self.lookup(cgroup2_id, memcg_id) {
                    if let Some(cid) = &r.container_id {
                        self.cache.exits().record_oom(cid, wall_time_of(ktime_ns));
                    }
                    self.observe_cgroup(r, ObservedKind::OomKilled, ktime_ns, Some(9));
                }
                return None;
            }
            KernelEvent::Reclaim { memcg_id, begin: true, direct: true, .. } => {
                if let Some(p) = &self.pressure
                    && self.lookup(0, memcg_id).is_some()
                {
                    p.send(crate::pressure::PressureSource::KernelReclaim);
                }
                return None;
            }
            KernelEvent::Reclaim { .. }
            | KernelEvent::Exec { ns_init: false, .. }
            | KernelEvent::Exit { ns_init: false, main_process: false, .. } => {
                return None;
            }
            KernelEvent::Exec { cgroup2_id, memcg_id, ktime_ns, pid, pid1, .. } => {
                exec_pid1 = pid1.then_some(pid);
                (self.lookup(cgroup2_id, memcg_id)?, PlegState::Running, ktime_ns, None)
            }
            KernelEvent::Exit { cgroup2_id, memcg_id, ktime_ns, exit_code, signal, pid, ns_init, main_process } => {
                exit_process = (pid, main_process);
                let Some(target) = self.lookup(cgroup2_id, memcg_id) else {
                    tracing::debug!(
                        pid,
                        cgroup2_id,
                        memcg_id,
                        "main-process exit in a cgroup that is not a known container"
                    );
                    return None;
                };
                (target, PlegState::Exited, ktime_ns, Some((exit_code, signal, ns_init)))
            }
        };
        let cid = target.container_id.clone()?;
        let mut s = self.state.lock().unwrap();
        tracing::trace!(container = %cid, ?want, known = ?s.known.get(&cid), "kernel lifecycle event");
        if let Some(pid) = exec_pid1 {
            s.inits.entry(cid.clone()).or_insert(pid);
        }
        // Which pid namespace ended: the container's own (its init's), one made inside the
        // container (not a lifecycle event at all), or one whose init the sensors did
        // not see exec (a ring-buffer drop): then the process they took for the main one
        // (userspace names it for containers older than the sensors), else CRI decides.
        let ns_end = match (exit, s.inits.get(&cid)) {
            (Some((_, _, true)), Some(&init)) if init != exit_process.0 => {
                tracing::trace!(container = %cid, pid = exit_process.0, init, "a pid namespace inside the container ended");
                return None;
            }
            (Some((_, _, true)), Some(_)) => true,
            (Some((_, _, true)), None) => exit_process.1,
            // Not a pid 1, in a container whose init is: the container goes on.
            (Some((_, _, false)), Some(_)) => return None,
            _ => false,
        };
        // An exit that may not be the container's end (most often runc's helper, the first
        // process to exec in a new container cgroup, exiting before the container's init
        // execs) reports the end only once CRI agrees: already (the relist listed the exit
        // first) or when confirmed ([`Self::complete`]). Taken as seen at once, the helper's
        // exit made every later relist finding of the container's exit look reported, and
        // a missed exit never counted as a repair.
        if exit.is_none() || ns_end || s.known.get(&cid).is_some_and(|k| rank(*k) >= rank(want)) {
            kernel_saw(&mut s, &cid, want, ktime);
        }
        // The end of a container's pid namespace is the end of the container: emit it
        // now. A "main process" exit without that certainty (a container sharing the
        // host's or the pod's pid namespace, or a cgroup older than the sensors, where the
        // first exec seen may be any process) waits for CRI like a start; so does a failed
        // exit whose termination message may be the end of the log, which the runtime
        // writes out before it records the exit.
        let awaits_runtime = exit.is_some_and(|(code, _, _)| code != 0) && self.cache.exits().awaits_runtime(&cid);
        if let (Some((code, signal, _)), true) = (exit, ns_end && !awaits_runtime) {
            if !advance(&mut s.known, &cid, want) {
                return None;
            }
            let container_name = s.names.get(&cid).cloned().unwrap_or_default();
            drop(s);
            self.cache.exits().record(&target.pod_uid, &cid, code, wall_time_of(ktime));
            self.observe(Observed {
                pod_uid: target.pod_uid.clone(),
                container_id: cid.clone(),
                container_name,
                kind: ObservedKind::ContainerDied,
                kernel_time_ns: ktime,
                exit_code: Some(code),
                signal: Some(signal).filter(|s| *s != 0),
            });
            return Some(Next::Emit(PodLifecycleEvent {
                pod_uid: target.pod_uid,
                kind: PodLifecycleEventType::ContainerDied,
                data: cid,
                kernel_time_ns: Some(ktime),
            }));
        }
        if s.known.get(&cid).is_some_and(|k| rank(*k) >= rank(want)) {
            return None;
        }
        // An exit is awaited (the pod's status waits for it) once the container is known
        // to run. One of a container not yet seen running is most often the runtime's
        // own: runc's helper can be the first process to exec in a new container cgroup
        // and exits a few ms later, before the container's process execs, while CRI goes
        // on reporting the container created or running for good.
        let pace = if want == PlegState::Exited && s.known.get(&cid) == Some(&PlegState::Running) {
            Pace::Fine
        } else {
            Pace::BackOff
        };
        if want == PlegState::Running && !s.starting.insert(cid.clone()) {
            return None;
        }
        *s.pending.entry(cid.clone()).or_default() += 1;
        let not_pid1_exit = exit.is_some_and(|(_, _, ns_init)| !ns_init);
        let exit = exit.map(|(c, s, _)| (c, s));
        s.awaiting.insert(cid.clone(), Awaiting { pod_uid: target.pod_uid.clone(), want, ktime, exit });
        Some(Next::Confirm(Work { pod_uid: target.pod_uid, cid, want, ktime, exit, pace, not_pid1_exit }))
    }

    /// The asynchronous part: waits for CRI to agree, then records and emits.
    async fn complete(&self, work: Work) -> Option<PodLifecycleEvent> {
        let Work { pod_uid, cid, want, ktime, exit, pace, not_pid1_exit } = work;
        let confirmed = self.confirm(&pod_uid, &cid, want, pace, not_pid1_exit).await;
        let mut s = self.state.lock().unwrap();
        if want == PlegState::Running {
            s.starting.remove(&cid);
        }
        if let Some(n) = s.pending.get_mut(&cid) {
            *n -= 1;
            if *n == 0 {
                s.pending.remove(&cid);
                s.awaiting.remove(&cid);
            }
        }
        let container_name = match confirmed {
            Confirmation::Agreed(name) => {
                kernel_saw(&mut s, &cid, want, ktime);
                name
            }
            Confirmation::Passed => {
                // It did reach `want` (the kernel saw it): remember that much, so that a
                // relist listing taken meanwhile is not mistaken for a miss.
                kernel_saw(&mut s, &cid, want, ktime);
                advance(&mut s.known, &cid, want);
                return None;
            }
            Confirmation::Moot => return None,
            Confirmation::TimedOut => {
                tracing::debug!(container = %cid, ?want, "runtime did not confirm the kernel event in time; the relist will");
                return None;
            }
        };
        if !container_name.is_empty() {
            s.names.insert(cid.clone(), container_name.clone());
        }
        if !advance(&mut s.known, &cid, want) {
            // A later state was recorded while we waited (e.g. the exit of a container
            // whose start we were confirming): this event is stale.
            return None;
        }
        drop(s);
        Some(self.report_confirmed(pod_uid, cid, container_name, want, ktime, exit))
    }

    /// A kernel observation the runtime agreed to (CRI's answer or its own event):
    /// observed for the event API and traces, and the lifecycle event with the kernel's
    /// time.
    fn report_confirmed(
        &self,
        pod_uid: String,
        cid: String,
        container_name: String,
        want: PlegState,
        ktime: u64,
        exit: Option<(i32, i32)>,
    ) -> PodLifecycleEvent {
        let (kind, observed) = if want == PlegState::Running {
            (PodLifecycleEventType::ContainerStarted, ObservedKind::ContainerStarted)
        } else {
            (PodLifecycleEventType::ContainerDied, ObservedKind::ContainerDied)
        };
        self.observe(Observed {
            pod_uid: pod_uid.clone(),
            container_id: cid.clone(),
            container_name,
            kind: observed,
            kernel_time_ns: ktime,
            exit_code: exit.map(|e| e.0),
            signal: exit.map(|e| e.1).filter(|s| *s != 0),
        });
        PodLifecycleEvent { pod_uid, kind, data: cid, kernel_time_ns: Some(ktime) }
    }

    fn lookup(&self, cgroup2_id: u64, memcg_id: u64) -> Option<CgroupRef> {
        let s = self.state.lock().unwrap();
        s.index
            .get(CGROUP2_HIERARCHY, cgroup2_id)
            .or_else(|| (memcg_id != 0).then(|| s.index.get(self.memory_hierarchy, memcg_id)).flatten())
            .cloned()
    }

    /// Polls CRI until the container is in `want`, up to [`CONFIRM_DEADLINE`], at the
    /// pace of [`confirm_pause`]. A `not_pid1_exit` stops as soon as the container's
    /// init is known: in a burst, runc's helper exits tens of ms before the container's
    /// process execs, and CRI never agrees to that exit (it polled 13 times in 2 s).
    /// At [`Pace::BackOff`] (a start, or the exit of a container not seen running) it
    /// first waits for the pod's start calls to return: CRI cannot agree before, and a
    /// start call that succeeded is CRI's agreement already.
    async fn confirm(&self, pod_uid: &str, id: &str, want: PlegState, pace: Pace, not_pid1_exit: bool) -> Confirmation {
        if pace == Pace::BackOff {
            let starts = self.cache.starts();
            if !starts.settled(pod_uid, START_SETTLE_LIMIT).await {
                tracing::debug!(
                    pod = pod_uid,
                    container = id,
                    "a start call of the pod is still under way; asking the runtime"
                );
            }
            // The start call's success is the runtime's answer already.
            if want == PlegState::Running
                && let Some(name) = starts.take_started(id)
            {
                return Confirmation::Agreed(name);
            }
        }
        let started = tokio::time::Instant::now();
        let give_up = started + CONFIRM_DEADLINE;
        let mut polls = 0u32;
        loop {
            if not_pid1_exit && self.state.lock().unwrap().inits.contains_key(id) {
                return Confirmation::Moot;
            }
            match runtime_state(self.rt.as_ref(), id).await {
                Some((s, name)) if s == want => return Confirmation::Agreed(name),
                Some((s, _)) if rank(s) > rank(want) => return Confirmation::Passed,
                _ => {}
            }
            polls += 1;
            let pause = confirm_pause(pace, started.elapsed(), polls);
            if tokio::time::Instant::now() + pause > give_up {
                return Confirmation::TimedOut;
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Filters a relist batch: forwards what the kernel path did not report, counting it
    /// as a repair unless `initial` (the first listing after start is not a miss).
    ///
    /// The first listing after failed ones (the runtime was away) also passes on again
    /// the changes since the previous listing that the kernel path reported already, where
    /// the two agree: the pod workers heard of them, but a sync that needed the runtime
    /// failed and is retried only 10 s later. The relisting PLEG would send exactly these
    /// events now; a start the worker has seen is no news to it.
    fn reconcile(&self, events: Vec<PodLifecycleEvent>, initial: bool) -> Vec<PodLifecycleEvent> {
        let mut out = Vec::new();
        let mut s = self.state.lock().unwrap();
        self.settle_suspects(&mut s);
        let runtime_was_away = std::mem::take(&mut s.listing_failed);
        let mut again = 0;
        for e in events {
            let Some(new) = state_of(e.kind) else { continue };
            if s.pending.contains_key(&e.data) {
                continue;
            }
            if new == PlegState::NonExistent {
                // Removals are the kubelet's own doing; forget the id and pass it on.
                s.known.remove(&e.data);
                s.names.remove(&e.data);
                s.inits.remove(&e.data);
                self.cache.exits().forget(&e.data);
                if !s.suspects.contains_key(&e.data) {
                    s.kernel_seen.remove(&e.data);
                }
                out.push(e);
                continue;
            }
            // A listing older than what the kernel path already reported adds nothing.
            if !advance(&mut s.known, &e.data, new) {
                if runtime_was_away && s.known.get(&e.data) == Some(&new) {
                    again += 1;
                    out.push(e);
                }
                continue;
            }
            let is_lifecycle =
                matches!(e.kind, PodLifecycleEventType::ContainerStarted | PodLifecycleEventType::ContainerDied);
            let kernel_saw = s.kernel_seen.get(&e.data).is_some_and(|(k, _)| rank(*k) >= rank(new));
            if is_lifecycle && !initial && !kernel_saw && self.kernel_alive.load(Ordering::Relaxed) {
                s.suspects.insert(e.data.clone(), (new, tokio::time::Instant::now(), e.pod_uid.clone()));
            }
            // Forwarded at once either way: the pod worker must not wait for the verdict.
            out.push(e);
        }
        s.reconciled += 1;
        s.prune_retired();
        if runtime_was_away {
            tracing::info!(
                changes = again,
                "runtime answers again; passed on again the changes since the last listing that the kernel had reported"
            );
        }
        out
    }

    /// Decides the relist findings older than [`SUSPECT_GRACE`]: reported by the kernel
    /// meanwhile (the relist was just faster), or a miss, counted and logged.
    fn settle_suspects(&self, s: &mut State) {
        let now = tokio::time::Instant::now();
        let ids: Vec<String> = s.suspects.keys().cloned().collect();
        for id in ids {
            let (state, found, pod_uid) = s.suspects[&id].clone();
            if s.kernel_seen.get(&id).is_some_and(|(k, _)| rank(*k) >= rank(state)) {
                s.suspects.remove(&id);
            } else if now.duration_since(found) >= SUSPECT_GRACE {
                s.suspects.remove(&id);
                self.metrics.evented_pleg_relist_repairs.inc();
                tracing::warn!(%pod_uid, %id, ?state, "relist repaired a change the kernel path missed");
            }
        }
    }

    /// Runs the kernel consumer and the safety-net relist until shutdown. `drops` reads
    /// the sensors' ring-buffer drop counter.
    pub async fn run(
        self,
        mut kernel: mpsc::Receiver<KernelEvent>,
        drops: Box<dyn Fn() -> u64 + Send>,
        tx: mpsc::Sender<PodLifecycleEvent>,
        shutdown: CancellationToken,
    ) {
        let relist_task = {
            let this = self.clone();
            let tx = tx.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { this.safety_relist(tx, shutdown).await })
        };
        let runtime_events_task = {
            let this = self.clone();
            let tx = tx.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { this.runtime_events(tx, shutdown).await })
        };
        let mut last_drops = 0;
        let mut drop_tick = tokio::time::interval(Duration::from_secs(1));
        drop_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let inflight = tokio_util::task::TaskTracker::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = drop_tick.tick() => {
                    let d = drops();
                    if d > last_drops {
                        self.metrics.evented_pleg_ringbuf_drops.inc_by(d - last_drops);
                        tracing::warn!(dropped = d - last_drops, "eBPF ring buffer overflowed; relisting now to repair");
                        last_drops = d;
                        // At most once a second (this tick), however long the overflow.
                        self.relist_now.notify_one();
                    }
                }
                ev = kernel.recv() => {
                    let Some(ev) = ev else {
                        // At shutdown the reader closes the stream too: that is no fallback.
                        if !shutdown.is_cancelled() {
                            self.fall_back("the eBPF event stream ended");
                        }
                        break;
                    };
                    // Resolve in order; each CRI confirmation then runs on its own, never
                    // holding up the next event.
                    let work = match self.classify(&ev) {
                        None => continue,
                        Some(Next::Emit(e)) => {
                            if tx.send(e).await.is_err() {
                                tracing::debug!("sync loop gone");
                            }
                            continue;
                        }
                        Some(Next::Confirm(work)) => work,
                    };
                    let this = self.clone();
                    let tx = tx.clone();
                    inflight.spawn(async move {
                        if let Some(out) = this.complete(work).await
                            && tx.send(out).await.is_err()
                        {
                            tracing::debug!("sync loop gone");
                        }
                    });
                }
            }
        }
        if !shutdown.is_cancelled() {
            // Keep the relist running alone until shutdown.
            shutdown.cancelled().await;
        }
        inflight.close();
        relist_task.abort();
        runtime_events_task.abort();
    }

    /// Handles one event of the runtime's own stream (CRI `GetContainerEvents`, containerd
    /// 2.x): a start or a stop the kernel path has not reported yet is recorded and
    /// emitted (the runtime already agrees: it is its own event); every event is counted
    /// by which source reported the change first. Creations and removals are counted
    /// only: the kubelet makes and removes containers itself, and the relist forgets them.
    fn handle_runtime_event(&self, ev: &api::ContainerEventResponse) -> Option<PodLifecycleEvent> {
        let (kind, new, lifecycle) = match api::ContainerEventType::try_from(ev.container_event_type) {
            Ok(api::ContainerEventType::ContainerStartedEvent) => {
                ("started", PlegState::Running, PodLifecycleEventType::ContainerStarted)
            }
            Ok(api::ContainerEventType::ContainerStoppedEvent) => {
                ("stopped", PlegState::Exited, PodLifecycleEventType::ContainerDied)
            }
            Ok(api::ContainerEventType::ContainerCreatedEvent) => {
                self.count_runtime_event("created", "none");
                return None;
            }
            Ok(api::ContainerEventType::ContainerDeletedEvent) => {
                self.count_runtime_event("deleted", "none");
                return None;
            }
            Err(_) => return None,
        };
        let pod_uid = ev.pod_sandbox_status.as_ref().and_then(|s| s.metadata.as_ref()).map(|m| m.uid.clone());
        let id = &ev.container_id;
        let mut s = self.state.lock().unwrap();
        // The kernel told it first and waits for CRI to agree (a main process's exit in a
        // shared pid namespace, a start): the runtime's own event is that agreement. The
        // change is the kernel's, with its time and exit status; the confirmation still
        // polling finds it reported.
        if let Some(a) = s.awaiting.get(id).filter(|a| a.want == new).cloned() {
            kernel_saw(&mut s, id, new, a.ktime);
            self.observe_runtime_lag(kind, a.ktime);
            let fresh = advance(&mut s.known, id, new);
            // The name CRI would have told the confirmation: the event's own status has it.
            let told = ev.containers_statuses.iter().find(|c| c.id == *id).and_then(|c| c.metadata.as_ref());
            if let Some(m) = told.filter(|m| !m.name.is_empty()) {
                s.names.entry(id.clone()).or_insert_with(|| m.name.clone());
            }
            let container_name = s.names.get(id).cloned().unwrap_or_default();
            drop(s);
            self.count_runtime_event(kind, "kernel");
            if !fresh {
                return None;
            }
            return Some(self.report_confirmed(a.pod_uid, id.clone(), container_name, a.want, a.ktime, a.exit));
        }
        if let Some(&(k, at)) = s.kernel_seen.get(id).filter(|(k, _)| rank(*k) >= rank(new)) {
            // Timed only against the kernel's sight of this very state (not a later one).
            let seen_at = (k == new).then_some(at);
            drop(s);
            self.count_runtime_event(kind, "kernel");
            if let Some(ktime) = seen_at {
                self.observe_runtime_lag(kind, ktime);
            }
            return None;
        }
        let Some(pod_uid) = pod_uid.filter(|u| !u.is_empty()) else {
            drop(s);
            self.count_runtime_event(kind, "none");
            return None;
        };
        if !advance(&mut s.known, id, new) {
            drop(s);
            self.count_runtime_event(kind, "none");
            return None;
        }
        drop(s);
        self.count_runtime_event(kind, "runtime");
        tracing::debug!(pod = %pod_uid, container = %id, kind, "the runtime's event stream told a change first");
        Some(PodLifecycleEvent { pod_uid, kind: lifecycle, data: id.clone(), kernel_time_ns: None })
    }

    /// `kubelet_evented_pleg_runtime_event_lag_seconds`: the runtime's event of `kind`
    /// arrives now; the kernel saw the same change at `ktime`.
    fn observe_runtime_lag(&self, kind: &str, ktime: u64) {
        let lag_ns = crate::types::clock::monotonic_now_ns().saturating_sub(ktime);
        #[expect(clippy::cast_precision_loss, reason = "nanoseconds of a lag fit in f64")]
        let lag = lag_ns as f64 / 1e9;
        self.metrics
            .evented_pleg_runtime_event_lag
            .get_or_create(&RuntimeEventKindLabels { kind: kind.into() })
            .observe(lag);
    }

    fn count_runtime_event(&self, kind: &str, first: &str) {
        self.metrics
            .evented_pleg_runtime_events
            .get_or_create(&RuntimeEventLabels { kind: kind.into(), first: first.into() })
            .inc();
    }

    /// Reads the runtime's event stream until shutdown, reopening it when it breaks; a
    /// runtime without it (containerd 1.6) is asked once.
    async fn runtime_events(&self, tx: mpsc::Sender<PodLifecycleEvent>, shutdown: CancellationToken) {
        use futures::StreamExt as _;
        let mut retry = Duration::from_secs(1);
        loop {
            let mut stream = match self.rt.container_events().await {
                Ok(stream) => {
                    tracing::info!(
                        "reading the runtime's container events (CRI GetContainerEvents) beside the kernel's"
                    );
                    retry = Duration::from_secs(1);
                    stream
                }
                Err(crate::container::Error::Rpc { status, .. }) if status.code() == tonic::Code::Unimplemented => {
                    tracing::info!(
                        "the runtime has no container event stream (CRI GetContainerEvents); kernel events only"
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?retry, "cannot open the runtime's container event stream");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            loop {
                let item = tokio::select! {
                    () = shutdown.cancelled() => return,
                    item = stream.next() => item,
                };
                match item {
                    Some(Ok(ev)) => {
                        if let Some(e) = self.handle_runtime_event(&ev)
                            && tx.send(e).await.is_err()
                        {
                            return;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "the runtime's container event stream broke; reopening it");
                        break;
                    }
                    None => {
                        tracing::info!("the runtime closed its container event stream; reopening it");
                        break;
                    }
                }
            }
        }
    }

    fn fall_back(&self, why: &str) {
        self.kernel_alive.store(false, Ordering::Relaxed);
        self.metrics.evented_pleg_active.set(0);
        *self.fallback.lock().unwrap() = Some(why.to_string());
        tracing::error!(reason = why, "evented PLEG stopped; relisting every {}s", RELIST_PERIOD.as_secs());
    }

    async fn safety_relist(&self, tx: mpsc::Sender<PodLifecycleEvent>, shutdown: CancellationToken) {
        let mut initial = true;
        loop {
            match self.relist.relist_events().await {
                Ok(events) => {
                    for e in self.reconcile(events, initial) {
                        if tx.try_send(e).is_err() {
                            self.metrics.pleg_discard_events.inc();
                        }
                    }
                    initial = false;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "PLEG relist failed");
                    self.state.lock().unwrap().listing_failed = true;
                }
            }
            // While listing fails, try again every second: the pod workers whose syncs
            // failed meanwhile hear from the first listing that works (see `reconcile`).
            let failing = self.state.lock().unwrap().listing_failed;
            let period =
                if self.kernel_alive.load(Ordering::Relaxed) && !failing { self.safety_period } else { RELIST_PERIOD };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(period) => {}
                () = self.relist_now.notified() => {}
            }
        }
    }
}

impl PodLifecycleEventGenerator for EventedPleg {
    fn healthy(&self) -> Result<(), String> {
        self.relist.healthy()
    }

    fn period(&self) -> Duration {
        if self.kernel_alive.load(Ordering::Relaxed) { self.safety_period } else { RELIST_PERIOD }
    }

    fn describe(&self) -> String {
        match self.fallback_reason() {
            Some(why) => format!("relisting only, every {}s: {why}", RELIST_PERIOD.as_secs()),
            None => format!("evented: eBPF sensors, safety relist every {}s", self.period().as_secs()),
        }
    }

    fn start(&self, tx: mpsc::Sender<PodLifecycleEvent>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        let this = self.clone();
        let sensors = self.sensors.lock().unwrap().take();
        Box::pin(async move {
            if let Some(s) = sensors {
                this.run(s.events, s.drops, tx, shutdown).await;
            } else {
                tracing::error!("the evented PLEG has no sensors to read (started twice?)");
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::fake::FakeRuntime;
    use crate::pleg::relist::RELIST_THRESHOLD;

    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn cgroup_paths() {
        assert_eq!(
            parse_cgroup_path(&format!("/kubepods/burstable/podu-1/{CID}")),
            Some(CgroupRef { pod_uid: "u-1".into(), container_id: Some(CID.into()) })
        );
        assert_eq!(
            parse_cgroup_path("/r/kubepods/podabc"),
            Some(CgroupRef { pod_uid: "abc".into(), container_id: None })
        );
        assert_eq!(parse_cgroup_path("/kubepods/burstable"), None);
        // The systemd driver's slices and scopes, below whatever the node's own cgroup is.
        let sliced = "/n/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu_1_2.slice";
        assert_eq!(parse_cgroup_path(sliced), Some(CgroupRef { pod_uid: "u-1-2".into(), container_id: None }));
        for runtime in ["cri-containerd", "crio", "docker"] {
            assert_eq!(
                parse_cgroup_path(&format!("{sliced}/{runtime}-{CID}.scope")),
                Some(CgroupRef { pod_uid: "u-1-2".into(), container_id: Some(CID.into()) }),
                "{runtime}"
            );
        }
        assert_eq!(parse_cgroup_path(&format!("{sliced}/crio-conmon-{CID}.scope")), None);
        assert_eq!(parse_cgroup_path("/kubepods.slice/kubepods-burstable.slice"), None);
        assert_eq!(parse_cgroup_path("/kubepods.slice/kubepods-pod.slice"), None);
        assert_eq!(parse_cgroup_path("/kubepods/podabc/not-an-id"), None);
    }

    #[test]
    fn index_scans_existing_dirs_by_inode() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("besteffort/podu1").join(CID);
        std::fs::create_dir_all(&c).unwrap();
        let mut idx = CgroupIndex::default();
        idx.scan(CGROUP2_HIERARCHY, dir.path());
        let ino = std::fs::metadata(&c).unwrap().ino();
        assert_eq!(idx.get(0, ino).unwrap().container_id.as_deref(), Some(CID));
        let pod_ino = std::fs::metadata(dir.path().join("besteffort/podu1")).unwrap().ino();
        assert_eq!(idx.get(0, pod_ino).unwrap().container_id, None);
        assert_eq!(idx.len(), 2);
    }

    async fn setup() -> (Arc<FakeRuntime>, EventedPleg, String, String) {
        let rt = Arc::new(FakeRuntime::with_images(&["img"]));
        let metrics = Arc::new(PlegMetrics::default());
        let sb = rt
            .run_pod_sandbox(
                api::PodSandboxConfig {
                    labels: HashMap::from([(crate::container::labels::POD_UID.to_string(), "u1".to_string())]),
                    ..Default::default()
                },
                String::new(),
            )
            .await
            .unwrap();
        let cfg = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: "c".into(), attempt: 0 }),
            labels: HashMap::from([(crate::container::labels::POD_UID.to_string(), "u1".to_string())]),
            ..Default::default()
        };
        let cid = rt.create_container(&sb, cfg, api::PodSandboxConfig::default()).await.unwrap();
        rt.start_container(&cid).await.unwrap();
        let relist =
            GenericPleg::new(rt.clone(), metrics.clone(), Arc::default(), Duration::from_secs(30), RELIST_THRESHOLD);
        let mut idx = CgroupIndex::default();
        idx.insert(CGROUP2_HIERARCHY, 42, &format!("/kubepods/podu1/{cid}"));
        let pleg = EventedPleg::new(relist, rt.clone(), metrics, Duration::from_secs(30), idx, 7, None);
        (rt, pleg, cid, sb)
    }

    #[tokio::test]
    async fn direct_reclaim_in_a_pod_cgroup_and_oom_kills_signal_pressure() {
        let (_, pleg, cid, _) = setup().await;
        let (signals, mut rx) = crate::pressure::PressureSignals::channel();
        let mut idx = CgroupIndex::default();
        idx.insert(7, 99, &format!("/kubepods/podu1/{cid}"));
        pleg.state.lock().unwrap().index = idx;
        let pleg = pleg.with_pressure(signals);
        let reclaim = |memcg_id, begin, direct| KernelEvent::Reclaim { ktime_ns: 1, memcg_id, begin, direct };
        // kswapd, the end of a reclaim, and reclaim outside the pods: no signal.
        for ev in [reclaim(99, true, false), reclaim(99, false, true), reclaim(5, true, true)] {
            assert!(pleg.classify(&ev).is_none());
        }
        assert!(rx.try_recv().is_err());
        assert!(pleg.classify(&reclaim(99, true, true)).is_none(), "not a lifecycle event");
        assert_eq!(rx.try_recv().unwrap().source, crate::pressure::PressureSource::KernelReclaim);
        pleg.classify(&KernelEvent::OomKill { ktime_ns: 1, pid: 3, cgroup2_id: 0, memcg_id: 99 });
        assert_eq!(rx.try_recv().unwrap().source, crate::pressure::PressureSource::KernelOom);
    }

    /// The container's init exec'ing as pid 1 (`pid`), as the sensors report it.
    fn pid1_exec(pid: u32) -> KernelEvent {
        KernelEvent::Exec { ktime_ns: 1, pid, cgroup2_id: 42, memcg_id: 0, ns_init: true, pid1: true }
    }

    /// The fields of a [`KernelEvent::Exit`] the tests vary; the default is a clean exit
    /// of pid 1 of the container's pid namespace (cgroup 42) at ktime 1.
    #[derive(Clone, Copy)]
    struct ExitSpec {
        ktime_ns: u64,
        pid: u32,
        cgroup2_id: u64,
        ns_init: bool,
        main_process: bool,
        exit_code: i32,
        signal: i32,
    }

    impl Default for ExitSpec {
        fn default() -> Self {
            Self { ktime_ns: 1, pid: 1, cgroup2_id: 42, ns_init: true, main_process: false, exit_code: 0, signal: 0 }
        }
    }

    impl ExitSpec {
        fn event(self) -> KernelEvent {
            let Self { ktime_ns, pid, cgroup2_id, ns_init, main_process, exit_code, signal } = self;
            KernelEvent::Exit { ktime_ns, pid, cgroup2_id, memcg_id: 0, ns_init, main_process, exit_code, signal }
        }
    }

    fn ns_init_exit(pid: u32, code: i32) -> KernelEvent {
        ExitSpec { ktime_ns: crate::types::clock::monotonic_now_ns(), pid, exit_code: code, ..ExitSpec::default() }
            .event()
    }

    #[tokio::test]
    async fn kernel_exit_is_container_died_at_once_and_recorded_for_the_status() {
        let (rt, pleg, cid, _) = setup().await;
        let exits_cache = pleg.cache.clone();
        let exits = exits_cache.exits();
        let started = pleg.handle_kernel_event(pid1_exec(9)).await.expect("CRI agrees it runs");
        assert_eq!(started.kind, PodLifecycleEventType::ContainerStarted);
        // The kernel is ahead of the runtime: CRI still says running.
        let exit = ExitSpec {
            ktime_ns: crate::types::clock::monotonic_now_ns(),
            pid: 9,
            exit_code: 137,
            signal: 9,
            ..ExitSpec::default()
        }
        .event();
        let Some(Next::Emit(ev)) = pleg.classify(&exit) else { panic!("an exit is emitted without CRI") };
        assert_eq!(
            rt.container_status(&cid).await.unwrap().state,
            api::ContainerState::ContainerRunning as i32,
            "CRI has not caught up"
        );
        assert_eq!(ev.kind, PodLifecycleEventType::ContainerDied);
        let KernelEvent::Exit { ktime_ns, .. } = exit else { unreachable!() };
        assert_eq!((ev.pod_uid.as_str(), ev.data.as_str(), ev.kernel_time_ns), ("u1", cid.as_str(), Some(ktime_ns)));
        let rec = exits.get(&cid).expect("recorded for the pod status");
        assert_eq!((rec.pod_uid.as_str(), rec.exit_code, rec.oom_killed), ("u1", 137, false));
        let age = std::time::SystemTime::now().duration_since(rec.finished_at).unwrap();
        assert!(age < Duration::from_secs(5), "the kernel time in wall-clock terms: {age:?} ago");
        // The runtime catches up; nothing more is emitted.
        rt.exit_container(&cid, 137);
        // The same state again is not news.
        assert!(pleg.handle_kernel_event(exit).await.is_none());
        // Other processes' exits and unknown cgroups are ignored.
        let other = ExitSpec { ktime_ns: 6, pid: 10, ns_init: false, ..ExitSpec::default() }.event();
        assert!(pleg.handle_kernel_event(other).await.is_none());
        let unknown = ExitSpec { ktime_ns: 6, pid: 10, cgroup2_id: 99, ..ExitSpec::default() }.event();
        assert!(pleg.handle_kernel_event(unknown).await.is_none());
    }

    fn runtime_event(cid: &str, kind: api::ContainerEventType, uid: &str) -> api::ContainerEventResponse {
        api::ContainerEventResponse {
            container_id: cid.into(),
            container_event_type: kind as i32,
            created_at: 1,
            pod_sandbox_status: Some(api::PodSandboxStatus {
                metadata: Some(api::PodSandboxMetadata { uid: uid.into(), ..Default::default() }),
                ..Default::default()
            }),
            containers_statuses: Vec::new(),
        }
    }

    fn runtime_events_counted(pleg: &EventedPleg, kind: &str, first: &str) -> u64 {
        pleg.metrics
            .evented_pleg_runtime_events
            .get_or_create(&RuntimeEventLabels { kind: kind.into(), first: first.into() })
            .get()
    }

    /// The runtime's own events (containerd 2.x): what the kernel told first is only
    /// counted; what it did not is emitted at once and counted as the runtime's; an older
    /// state, a creation or a removal is no news.
    #[tokio::test]
    async fn the_runtimes_event_stream_fills_in_what_the_kernel_did_not_tell() {
        use api::ContainerEventType as T;
        let (_, pleg, cid, _) = setup().await;
        pleg.handle_kernel_event(pid1_exec(9)).await.expect("started");
        assert!(pleg.handle_runtime_event(&runtime_event(&cid, T::ContainerStartedEvent, "u1")).is_none());
        assert_eq!(runtime_events_counted(&pleg, "started", "kernel"), 1);
        // An exit the kernel did not report (say, a ring-buffer drop): the runtime's event
        // is emitted, without a kernel time.
        let died = pleg.handle_runtime_event(&runtime_event(&cid, T::ContainerStoppedEvent, "u1")).expect("emitted");
        assert_eq!(
            (died.pod_uid.as_str(), died.kind, died.data.as_str(), died.kernel_time_ns),
            ("u1", PodLifecycleEventType::ContainerDied, cid.as_str(), None)
        );
        assert_eq!(runtime_events_counted(&pleg, "stopped", "runtime"), 1);
        // The kernel's late report of it is no news, nor is the same event again.
        assert!(pleg.handle_kernel_event(ns_init_exit(9, 0)).await.is_none());
        assert!(pleg.handle_runtime_event(&runtime_event(&cid, T::ContainerStoppedEvent, "u1")).is_none());
        // A start after the exit (an older state), creations, removals and events without
        // a pod are not emitted.
        assert!(pleg.handle_runtime_event(&runtime_event("other", T::ContainerCreatedEvent, "u1")).is_none());
        assert!(pleg.handle_runtime_event(&runtime_event("other", T::ContainerDeletedEvent, "u1")).is_none());
        assert!(pleg.handle_runtime_event(&runtime_event("other", T::ContainerStartedEvent, "")).is_none());
        assert_eq!(runtime_events_counted(&pleg, "created", "none"), 1);
        assert_eq!(runtime_events_counted(&pleg, "deleted", "none"), 1);
        assert_eq!(runtime_events_counted(&pleg, "started", "none"), 1);
    }

    /// `(count, sum)` of `kubelet_evented_pleg_runtime_event_lag_seconds{kind}`.
    fn runtime_lag(pleg: &EventedPleg, kind: &str) -> (u64, f64) {
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register("lag", "", pleg.metrics.evented_pleg_runtime_event_lag.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode_registry(&mut text, &reg).unwrap();
        let field = |suffix: &str| {
            let prefix = format!("lag_{suffix}{{kind=\"{kind}\"}} ");
            text.lines().find_map(|l| l.strip_prefix(&prefix)?.parse::<f64>().ok()).unwrap_or(0.0)
        };
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a count")]
        let count = field("count") as u64;
        (count, field("sum"))
    }

    /// How far the runtime's stream lags behind the kernel is timed from the kernel's
    /// sight of the same change (a start from the init's exec, a stop from its exit), and
    /// only when the kernel told it first.
    #[tokio::test]
    async fn the_runtimes_lag_is_timed_from_the_kernels_sight_of_the_same_change() {
        use api::ContainerEventType as T;
        let (_, pleg, cid, _) = setup().await;
        let now = crate::types::clock::monotonic_now_ns();
        let exec = KernelEvent::Exec {
            ktime_ns: now - 40_000_000,
            pid: 9,
            cgroup2_id: 42,
            memcg_id: 0,
            ns_init: true,
            pid1: true,
        };
        pleg.handle_kernel_event(exec).await.expect("started");
        assert!(pleg.handle_runtime_event(&runtime_event(&cid, T::ContainerStartedEvent, "u1")).is_none());
        let (count, started) = runtime_lag(&pleg, "started");
        assert_eq!(count, 1);
        assert!(started >= 0.04, "timed from the exec 40 ms ago: {started}");
        let exit = ExitSpec { ktime_ns: now - 5_000_000, pid: 9, ..ExitSpec::default() }.event();
        pleg.handle_kernel_event(exit).await.expect("died");
        assert!(pleg.handle_runtime_event(&runtime_event(&cid, T::ContainerStoppedEvent, "u1")).is_none());
        let (count, stopped) = runtime_lag(&pleg, "stopped");
        assert_eq!(count, 1);
        assert!((0.005..started).contains(&stopped), "timed from the exit 5 ms ago, not the exec: {stopped}");
        // A late start event (the kernel is past it) and the runtime's own news are not timed.
        assert!(pleg.handle_runtime_event(&runtime_event(&cid, T::ContainerStartedEvent, "u1")).is_none());
        assert_eq!(runtime_lag(&pleg, "started").0, 1);
        let other = pleg.handle_runtime_event(&runtime_event("other", T::ContainerStoppedEvent, "u1"));
        assert!(other.is_some(), "the runtime told it first");
        assert_eq!(runtime_lag(&pleg, "stopped").0, 1);
    }

    /// A main-process exit the kernel told but cannot be sure ends the container (a shared
    /// pid namespace: found with the agent in the node container) waits for CRI; the
    /// runtime's stop event arriving first is that agreement: the kernel's exit is emitted
    /// with its time, counted as told by the kernel first, and the confirmation still
    /// polling adds nothing.
    #[tokio::test]
    async fn the_runtimes_event_confirms_a_kernel_exit_awaiting_cri() {
        use api::ContainerEventType as T;
        let (rt, pleg, cid, _) = setup().await;
        // The main process shares the pod's pid namespace: its exec is the cgroup's first,
        // not a pid 1's.
        let exec = KernelEvent::Exec { ktime_ns: 1, pid: 77, cgroup2_id: 42, memcg_id: 0, ns_init: true, pid1: false };
        pleg.handle_kernel_event(exec).await.expect("started");
        let exit =
            ExitSpec { ktime_ns: 1234, pid: 77, ns_init: false, main_process: true, signal: 9, ..ExitSpec::default() }
                .event();
        let Some(Next::Confirm(work)) = pleg.classify(&exit) else { panic!("a main-process exit waits for CRI") };
        let died = pleg.handle_runtime_event(&runtime_event(&cid, T::ContainerStoppedEvent, "u1")).expect("emitted");
        assert_eq!(
            (died.kind, died.data.as_str(), died.kernel_time_ns),
            (PodLifecycleEventType::ContainerDied, cid.as_str(), Some(1234))
        );
        assert_eq!(runtime_events_counted(&pleg, "stopped", "kernel"), 1);
        assert_eq!(runtime_events_counted(&pleg, "stopped", "runtime"), 0);
        rt.exit_container(&cid, 137);
        assert!(pleg.complete(work).await.is_none(), "reported once");
    }

    /// A start the kernel told (the container's first exec) and the runtime's started
    /// event confirms: observed with the container's name from the event, as the CRI
    /// confirmation would have told it (the pod-start trace's `firstExec` names it).
    #[tokio::test]
    async fn a_start_confirmed_by_the_runtimes_event_is_observed_with_its_name() {
        use api::ContainerEventType as T;
        let (_, mut pleg, cid, _) = setup().await;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        pleg.sink = Some(Arc::new(move |o: Observed| sink.lock().unwrap().push(o)));
        let Some(Next::Confirm(_)) = pleg.classify(&pid1_exec(9)) else { panic!("a start waits for CRI") };
        let mut ev = runtime_event(&cid, T::ContainerStartedEvent, "u1");
        ev.containers_statuses = vec![api::ContainerStatus {
            id: cid.clone(),
            metadata: Some(api::ContainerMetadata { name: "main".into(), attempt: 0 }),
            ..Default::default()
        }];
        let started = pleg.handle_runtime_event(&ev).expect("emitted");
        assert_eq!(started.kind, PodLifecycleEventType::ContainerStarted);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!((seen[0].container_name.as_str(), seen[0].kind), ("main", ObservedKind::ContainerStarted));
    }

    /// The fake runtime is containerd 1.6: no event stream; the reader asks once and stops.
    #[tokio::test]
    async fn a_runtime_without_an_event_stream_is_asked_once() {
        let (_, pleg, _, _) = setup().await;
        let (tx, _rx) = mpsc::channel(8);
        tokio::time::timeout(Duration::from_secs(5), pleg.runtime_events(tx, CancellationToken::new()))
            .await
            .expect("returns at once on Unimplemented");
    }

    /// A failed exit whose termination message may be the end of the log is reported once
    /// the runtime has recorded it (and written the log out); a clean one at once.
    #[tokio::test]
    async fn a_failed_exit_that_awaits_the_runtime_is_confirmed_before_it_is_reported() {
        let (rt, pleg, cid, _) = setup().await;
        pleg.cache.exits().await_runtime("u1", &cid);
        pleg.handle_kernel_event(pid1_exec(9)).await.expect("CRI agrees it runs");
        let Some(Next::Confirm(work)) = pleg.classify(&ns_init_exit(9, 1)) else {
            panic!("a failed exit awaiting the runtime is confirmed")
        };
        assert!(pleg.cache.exits().get(&cid).is_none(), "no kernel record to lay over the runtime's status");
        rt.exit_container(&cid, 1);
        let ev = pleg.complete(work).await.expect("the runtime agrees");
        assert_eq!((ev.kind, ev.data.as_str()), (PodLifecycleEventType::ContainerDied, cid.as_str()));
        // A clean exit needs no log.
        let (_rt, pleg, cid, _) = setup().await;
        pleg.cache.exits().await_runtime("u1", &cid);
        pleg.handle_kernel_event(pid1_exec(9)).await.expect("CRI agrees it runs");
        assert!(matches!(pleg.classify(&ns_init_exit(9, 0)), Some(Next::Emit(_))));
        assert!(pleg.cache.exits().get(&cid).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_a_pid_namespace_made_inside_the_container_is_not_the_containers() {
        let (_, pleg, cid, _) = setup().await;
        let exits_cache = pleg.cache.clone();
        let exits = exits_cache.exits();
        assert!(pleg.handle_kernel_event(pid1_exec(100)).await.is_some());
        // A process in the container makes a pid namespace of its own (`unshare -pf`, a
        // sandboxing browser): its init execs and exits as pid 1 of that namespace.
        assert!(pleg.handle_kernel_event(pid1_exec(200)).await.is_none(), "the container runs already");
        assert!(pleg.classify(&ns_init_exit(200, 0)).is_none(), "not the container's end");
        assert!(exits.is_empty(), "no exit laid over CRI's answer");
        // The container's own init ends it, at once.
        let Some(Next::Emit(ev)) = pleg.classify(&ns_init_exit(100, 3)) else { panic!("the init's exit is emitted") };
        assert_eq!((ev.kind, ev.data.as_str()), (PodLifecycleEventType::ContainerDied, cid.as_str()));
        assert_eq!(exits.get(&cid).unwrap().exit_code, 3);
        // An init exit in a container whose init exec the sensors missed is left to CRI,
        // which still shows this one running: nothing is recorded.
        let (_, pleg2, _, _) = setup().await;
        let second_cache = pleg2.cache.clone();
        let exits2 = second_cache.exits();
        assert!(matches!(pleg2.classify(&ns_init_exit(300, 0)), Some(Next::Confirm(_))));
        assert!(exits2.is_empty());
    }

    /// Creates (does not start) container "late" of pod u1 in sandbox `sb`, its cgroup
    /// (id 43) known to the PLEG.
    async fn late_container(rt: &FakeRuntime, pleg: &EventedPleg, sb: &str) -> String {
        let cfg = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: "late".into(), attempt: 0 }),
            labels: HashMap::from([(crate::container::labels::POD_UID.to_string(), "u1".to_string())]),
            ..Default::default()
        };
        let late = rt.create_container(sb, cfg, api::PodSandboxConfig::default()).await.unwrap();
        pleg.state.lock().unwrap().index.insert(CGROUP2_HIERARCHY, 43, &format!("/kubepods/podu1/{late}"));
        late
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_is_confirmed_without_flooding_a_slow_runtime() {
        // In a burst the first exec comes long before the runtime's StartContainer returns:
        // the confirmation backs off instead of asking every few ms.
        let (rt, pleg, _, sb) = setup().await;
        let late = late_container(&rt, &pleg, &sb).await;
        let statuses = || rt.calls().iter().filter(|c| *c == "container_status").count();
        let before = statuses();
        let starter = {
            let (rt, late) = (rt.clone(), late.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(400)).await;
                rt.start_container(&late).await.unwrap();
            })
        };
        let exec = KernelEvent::Exec { ktime_ns: 1, pid: 88, cgroup2_id: 43, memcg_id: 0, ns_init: true, pid1: true };
        let ev = pleg.handle_kernel_event(exec).await.expect("confirmed once the runtime agrees");
        starter.await.unwrap();
        assert_eq!((ev.kind, ev.data.as_str()), (PodLifecycleEventType::ContainerStarted, late.as_str()));
        // 0, 5, 15, 35, 75, 155, 315 ms: not yet; 565 ms: running.
        assert_eq!(statuses() - before, 8);
    }

    /// The agent's own `StartContainer` is under way when runc's helper and then the
    /// container's init exec; it returns after 400 ms, its success recorded when
    /// `succeeded`. The PLEG's event, when it came (after the start), and how many
    /// `ContainerStatus` calls it made.
    async fn start_under_way(succeeded: bool) -> (PodLifecycleEvent, Duration, usize) {
        let (rt, pleg, _, sb) = setup().await;
        let starts = pleg.cache.starts().clone();
        let late = late_container(&rt, &pleg, &sb).await;
        let statuses = || rt.calls().iter().filter(|c| *c == "container_status").count();
        let before = statuses();
        let under_way = starts.begin("u1");
        let starter = {
            let (rt, late) = (rt.clone(), late.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(400)).await;
                rt.start_container(&late).await.unwrap();
                if succeeded {
                    under_way.succeeded(&late, "late");
                }
                drop(under_way);
            })
        };
        let begun = tokio::time::Instant::now();
        let helper =
            KernelEvent::Exec { ktime_ns: 1, pid: 87, cgroup2_id: 43, memcg_id: 0, ns_init: true, pid1: false };
        let init = KernelEvent::Exec { ktime_ns: 2, pid: 88, cgroup2_id: 43, memcg_id: 0, ns_init: true, pid1: true };
        let Some(Next::Confirm(work)) = pleg.classify(&helper) else { panic!("a start is confirmed") };
        assert!(pleg.classify(&init).is_none(), "the start is being confirmed already");
        let ev = pleg.complete(work).await.expect("confirmed once the start returned");
        let after = begun.elapsed();
        starter.await.unwrap();
        assert_eq!((ev.kind, ev.data.as_str()), (PodLifecycleEventType::ContainerStarted, late.as_str()));
        let s = pleg.state.lock().unwrap();
        assert_eq!(s.inits.get(&late), Some(&88), "the init is known all the same");
        assert_eq!(s.names.get(&late).map(String::as_str), Some("late"));
        (ev, after, statuses() - before)
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_under_way_is_confirmed_by_its_call_returning_success() {
        let (_, after, asked) = start_under_way(true).await;
        assert_eq!(after, Duration::from_millis(400), "at the moment the start returned");
        assert_eq!(asked, 0, "the call's success was the runtime's answer");
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_under_way_without_a_recorded_success_is_asked_about_once_it_returns() {
        let (_, after, asked) = start_under_way(false).await;
        assert_eq!(after, Duration::from_millis(400), "at the moment the start returned");
        assert_eq!(asked, 1, "asked once, not while the start was under way");
    }

    #[test]
    fn awaited_exits_are_confirmed_finely_the_rest_with_a_back_off() {
        let ms = Duration::from_millis;
        assert_eq!(confirm_pause(Pace::Fine, ms(10), 5), ms(2));
        assert_eq!(confirm_pause(Pace::Fine, ms(250), 120), ms(25));
        assert_eq!(confirm_pause(Pace::BackOff, ms(0), 1), ms(5));
        assert_eq!(confirm_pause(Pace::BackOff, ms(75), 5), ms(80));
        assert_eq!(confirm_pause(Pace::BackOff, ms(1000), 12), ms(250));
    }

    /// The exit of a process taken for the cgroup's main one that is not a pid 1.
    fn main_process_exit(pid: u32) -> KernelEvent {
        ExitSpec { pid, ns_init: false, main_process: true, ..ExitSpec::default() }.event()
    }

    #[tokio::test(start_paused = true)]
    async fn a_main_process_exit_outside_pid_1_waits_for_the_runtime() {
        // After an agent restart the first exec seen in an old container's cgroup may be
        // any process (a `sleep` of a shell loop): its exit must not kill the container.
        let (rt, pleg, cid, _) = setup().await;
        let exits_cache = pleg.cache.clone();
        let exits = exits_cache.exits();
        let exit = main_process_exit(77);
        let statuses = || rt.calls().iter().filter(|c| *c == "container_status").count();
        let before = statuses();
        assert!(pleg.handle_kernel_event(exit.clone()).await.is_none(), "CRI says running: nothing happened");
        assert!(exits.is_empty());
        // Not seen running yet (as when runc's helper was the cgroup's first exec): asked
        // with a back-off until the 2 s time-out, not every 2 ms.
        assert_eq!(statuses() - before, 13);
        // When CRI does agree (a hostPID container's main process), it is a ContainerDied.
        rt.exit_container(&cid, 0);
        let ev = pleg.handle_kernel_event(exit).await.expect("confirmed by CRI");
        assert_eq!(ev.kind, PodLifecycleEventType::ContainerDied);
        assert!(exits.is_empty(), "CRI already has it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_helper_exit_before_the_init_execs_stops_being_asked_about() {
        // runc's helper is the first to exec in a new container cgroup (so it is taken
        // for the main process) and exits before the container's init execs as pid 1.
        let (rt, pleg, _, _) = setup().await;
        let statuses = || rt.calls().iter().filter(|c| *c == "container_status").count();
        let before = statuses();
        let confirming = {
            let pleg = pleg.clone();
            tokio::spawn(async move { pleg.handle_kernel_event(main_process_exit(50)).await })
        };
        // Asked at 0 and 5 ms (CRI says running); then the init execs.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(matches!(pleg.classify(&pid1_exec(51)), Some(Next::Confirm(_))));
        assert!(confirming.await.unwrap().is_none(), "not the container's end");
        assert_eq!(statuses() - before, 2, "asked until the init showed, not for 2 s");
        // Later exits of processes other than the init are not asked about at all.
        assert!(pleg.classify(&main_process_exit(52)).is_none());
        assert_eq!(statuses() - before, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_helper_exit_at_the_start_does_not_hide_a_missed_exit_from_the_repairs() {
        // runc's helper, the first process to exec in the new container's cgroup, exits
        // before the container's init execs: no report of the container's end. Later the
        // container's own exit is lost (a ring-buffer drop): the relist repairs it, and
        // that must be counted.
        let (rt, pleg, cid, _) = setup().await;
        let helper_exit = {
            let pleg = pleg.clone();
            tokio::spawn(async move { pleg.handle_kernel_event(main_process_exit(50)).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let Some(Next::Confirm(start)) = pleg.classify(&pid1_exec(51)) else { panic!("a start is confirmed") };
        let started = pleg.complete(start).await.expect("CRI says running");
        assert_eq!(started.kind, PodLifecycleEventType::ContainerStarted);
        assert!(helper_exit.await.unwrap().is_none(), "not the container's end");
        let initial = pleg.relist.relist_events().await.unwrap();
        pleg.reconcile(initial, true);
        // The container's exit never reaches the PLEG; the relist finds it.
        rt.exit_container(&cid, 137);
        let events = pleg.relist.relist_events().await.unwrap();
        let forwarded = pleg.reconcile(events, false);
        assert_eq!(forwarded.len(), 1, "forwarded at once");
        assert_eq!(forwarded[0].kind, PodLifecycleEventType::ContainerDied);
        tokio::time::advance(SUSPECT_GRACE).await;
        pleg.reconcile(Vec::new(), false);
        assert_eq!(pleg.metrics.evented_pleg_relist_repairs.get(), 1, "a missed exit is a repair");
    }

    #[tokio::test(start_paused = true)]
    async fn relist_repairs_what_the_kernel_missed_and_counts_it() {
        let (rt, pleg, cid, _) = setup().await;
        let initial = pleg.relist.relist_events().await.unwrap();
        let forwarded = pleg.reconcile(initial, true);
        assert!(!forwarded.is_empty());
        assert_eq!(pleg.metrics.evented_pleg_relist_repairs.get(), 0, "the first listing is not a miss");
        // The container dies without a kernel event (e.g. a ring-buffer drop).
        rt.exit_container(&cid, 1);
        let events = pleg.relist.relist_events().await.unwrap();
        let forwarded = pleg.reconcile(events, false);
        assert_eq!(forwarded.len(), 1, "forwarded at once");
        assert_eq!(forwarded[0].kind, PodLifecycleEventType::ContainerDied);
        // It is a miss only once the kernel had its chance.
        assert_eq!(pleg.metrics.evented_pleg_relist_repairs.get(), 0);
        tokio::time::advance(SUSPECT_GRACE).await;
        assert!(pleg.reconcile(Vec::new(), false).is_empty());
        assert_eq!(pleg.metrics.evented_pleg_relist_repairs.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn relist_ahead_of_the_kernel_is_not_a_miss() {
        let (rt, pleg, cid, _) = setup().await;
        let initial = pleg.relist.relist_events().await.unwrap();
        pleg.reconcile(initial, true);
        rt.exit_container(&cid, 0);
        // The relist lists the exit first ...
        let events = pleg.relist.relist_events().await.unwrap();
        assert_eq!(pleg.reconcile(events, false).len(), 1, "the exit is forwarded at once");
        // ... and the kernel's exit event arrives a moment later.
        let exit = ExitSpec::default().event();
        assert!(pleg.handle_kernel_event(exit).await.is_none(), "already reported by the relist");
        tokio::time::advance(SUSPECT_GRACE).await;
        pleg.reconcile(Vec::new(), false);
        assert_eq!(pleg.metrics.evented_pleg_relist_repairs.get(), 0);
    }

    #[tokio::test]
    async fn relist_does_not_repeat_what_the_kernel_reported() {
        let (rt, pleg, cid, _) = setup().await;
        let initial = pleg.relist.relist_events().await.unwrap();
        pleg.reconcile(initial, true);
        rt.exit_container(&cid, 0);
        let exit = ExitSpec::default().event();
        assert!(pleg.handle_kernel_event(exit).await.is_some());
        let events = pleg.relist.relist_events().await.unwrap();
        assert!(pleg.reconcile(events, false).is_empty());
        assert_eq!(pleg.metrics.evented_pleg_relist_repairs.get(), 0);
    }

    /// A container's exit and the removal of its cgroup, as the sensors report them.
    fn exit_and_rmdir(pid: u32, cgroup_id: u64) -> [KernelEvent; 2] {
        [
            ExitSpec { ktime_ns: 2, pid, cgroup2_id: cgroup_id, ..ExitSpec::default() }.event(),
            KernelEvent::CgroupRmdir { ktime_ns: 3, hierarchy_id: CGROUP2_HIERARCHY, cgroup_id, path: String::new() },
        ]
    }

    /// What the PLEG still holds about container `id`.
    fn remembers(pleg: &EventedPleg, id: &str) -> Vec<&'static str> {
        let s = pleg.state.lock().unwrap();
        [
            ("known", s.known.contains_key(id)),
            ("names", s.names.contains_key(id)),
            ("kernel_seen", s.kernel_seen.contains_key(id)),
        ]
        .into_iter()
        .filter_map(|(what, held)| held.then_some(what))
        .collect()
    }

    /// A container born, ended and removed between two safety relists is never listed,
    /// so no relist reports its removal: the PLEG forgets it after its cgroup's rmdir,
    /// once a listing taken after the rmdir has been reconciled.
    #[tokio::test]
    async fn a_container_never_listed_is_forgotten_after_its_cgroup_rmdir() {
        let (rt, pleg, _, sb) = setup().await;
        let initial = pleg.relist.relist_events().await.unwrap();
        pleg.reconcile(initial, true);
        let late = late_container(&rt, &pleg, &sb).await;
        rt.start_container(&late).await.unwrap();
        let exec = KernelEvent::Exec { ktime_ns: 1, pid: 77, cgroup2_id: 43, memcg_id: 0, ns_init: true, pid1: true };
        assert!(pleg.handle_kernel_event(exec).await.is_some());
        rt.exit_container(&late, 0);
        let [exit, rmdir] = exit_and_rmdir(77, 43);
        assert!(pleg.handle_kernel_event(exit).await.is_some());
        rt.remove_container(&late).await.unwrap();
        assert!(pleg.handle_kernel_event(rmdir).await.is_none());
        for _ in 0..2 {
            let events = pleg.relist.relist_events().await.unwrap();
            assert!(pleg.reconcile(events, false).is_empty(), "the relist never saw it");
        }
        assert_eq!(remembers(&pleg, &late), Vec::<&str>::new());
    }

    /// The cgroup of an exited container goes long before the container: a relist that
    /// lists it exited after the rmdir is neither forwarded again nor counted as a miss.
    #[tokio::test(start_paused = true)]
    async fn a_relist_after_the_rmdir_of_an_exited_container_is_no_repair() {
        let (rt, pleg, cid, _) = setup().await;
        let initial = pleg.relist.relist_events().await.unwrap();
        pleg.reconcile(initial, true);
        let started = pleg.handle_kernel_event(pid1_exec(9)).await;
        assert!(started.is_none(), "the first listing reported it running");
        rt.exit_container(&cid, 0);
        let [exit, rmdir] = exit_and_rmdir(9, 42);
        assert!(pleg.handle_kernel_event(exit).await.is_some());
        assert!(pleg.handle_kernel_event(rmdir).await.is_none());
        let events = pleg.relist.relist_events().await.unwrap();
        assert!(pleg.reconcile(events, false).is_empty(), "the kernel reported the exit already");
        tokio::time::advance(SUSPECT_GRACE).await;
        pleg.reconcile(Vec::new(), false);
        assert_eq!(pleg.metrics.evented_pleg_relist_repairs.get(), 0);
        // Removed later: the relist reports it, and nothing of it is left.
        rt.remove_container(&cid).await.unwrap();
        let events = pleg.relist.relist_events().await.unwrap();
        assert_eq!(pleg.reconcile(events, false).len(), 1);
        assert_eq!(remembers(&pleg, &cid), Vec::<&str>::new());
    }

    #[tokio::test]
    async fn end_of_kernel_stream_falls_back_to_fast_relist() {
        let (_rt, pleg, _cid, _) = setup().await;
        let (ktx, krx) = mpsc::channel(1);
        drop(ktx);
        let (tx, _rx) = mpsc::channel(100);
        let stop = CancellationToken::new();
        let task = tokio::spawn(pleg.clone().run(krx, Box::new(|| 0), tx, stop.clone()));
        tokio::time::timeout(Duration::from_secs(5), async {
            while pleg.fallback_reason().is_none() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        assert_eq!(pleg.period(), RELIST_PERIOD);
        assert_eq!(pleg.metrics.evented_pleg_active.get(), 0);
        stop.cancel();
        task.await.unwrap();
    }

    /// The kernel stream closing because the agent is stopping is not reported as a
    /// fallback (no error in the log, the gauge untouched).
    #[tokio::test]
    async fn end_of_kernel_stream_at_shutdown_is_no_fallback() {
        let (_rt, pleg, _cid, _) = setup().await;
        let active = pleg.metrics.evented_pleg_active.get();
        // Both the token and the closed stream are ready at once: whichever the loop
        // looks at first, the answer must be the same (a few rounds to be sure).
        for _ in 0..16 {
            let (ktx, krx) = mpsc::channel(1);
            let (tx, _rx) = mpsc::channel(100);
            let stop = CancellationToken::new();
            stop.cancel();
            drop(ktx);
            pleg.clone().run(krx, Box::new(|| 0), tx, stop).await;
        }
        assert_eq!(pleg.fallback_reason(), None);
        assert_eq!(pleg.metrics.evented_pleg_active.get(), active);
    }

    /// The next event about container `id`, skipping the others; `None` when none comes
    /// within `within` (virtual time).
    async fn next_about(
        rx: &mut mpsc::Receiver<PodLifecycleEvent>,
        id: &str,
        within: Duration,
    ) -> Option<PodLifecycleEvent> {
        tokio::time::timeout(within, async {
            loop {
                let e = rx.recv().await?;
                if e.data == id {
                    return Some(e);
                }
            }
        })
        .await
        .ok()
        .flatten()
    }

    /// containerd restarted: a container died while the runtime was away. The kernel
    /// reported it at once, but the pod worker it woke could not act (its sync needs the
    /// runtime) and retries only 10 s later. Once listing works again — within a second,
    /// not a safety period — the relist passes the exit on again, as the relisting PLEG
    /// would: it is no repair (the kernel saw it), and the relist goes back to its period.
    #[tokio::test(start_paused = true)]
    async fn exits_seen_while_the_runtime_was_away_are_passed_on_again_when_it_answers() {
        let (rt, pleg, cid, _) = setup().await;
        let (ktx, krx) = mpsc::channel(10);
        let (tx, mut rx) = mpsc::channel(100);
        let stop = CancellationToken::new();
        let task = tokio::spawn(pleg.clone().run(krx, Box::new(|| 0), tx, stop.clone()));
        let first = next_about(&mut rx, &cid, Duration::from_secs(1)).await.expect("the first listing");
        assert_eq!(first.kind, PodLifecycleEventType::ContainerStarted);
        ktx.send(pid1_exec(9)).await.unwrap();

        rt.set_unavailable(true);
        rt.exit_container(&cid, 137);
        ktx.send(ns_init_exit(9, 137)).await.unwrap();
        let died = next_about(&mut rx, &cid, Duration::from_secs(1)).await.expect("the kernel needs no runtime");
        assert_eq!((died.kind, died.kernel_time_ns.is_some()), (PodLifecycleEventType::ContainerDied, true));
        // The safety relist (30 s) fails meanwhile.
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(pleg.cache.runtime_pods()["u1"].containers[&cid].1, ContainerState::Running, "no listing worked");

        rt.set_unavailable(false);
        let again = next_about(&mut rx, &cid, Duration::from_millis(1500)).await.expect("passed on again");
        assert_eq!((again.kind, again.kernel_time_ns), (PodLifecycleEventType::ContainerDied, None));
        // Not a repair; and the relist is back at its 30 s.
        tokio::time::sleep(SUSPECT_GRACE).await;
        let lists = || rt.calls().iter().filter(|c| *c == "list_containers").count();
        let before = lists();
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(lists(), before, "relisting every second after the runtime came back");
        assert!(next_about(&mut rx, &cid, Duration::from_secs(10)).await.is_none(), "passed on once");
        assert_eq!(pleg.metrics.evented_pleg_relist_repairs.get(), 0);
        stop.cancel();
        task.await.unwrap();
    }

    /// The ring buffer overflowed (the kernel counted drops) and a container's exit was
    /// among the lost records: the PLEG relists at once instead of waiting out the
    /// safety period, so the exit reaches the pod worker within seconds, as a repair.
    #[tokio::test(start_paused = true)]
    async fn ring_buffer_drops_start_a_relist_at_once() {
        let (rt, pleg, cid, _) = setup().await;
        let (_ktx, krx) = mpsc::channel(10);
        let (tx, mut rx) = mpsc::channel(100);
        let stop = CancellationToken::new();
        let drops = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let read = drops.clone();
        let task =
            tokio::spawn(pleg.clone().run(krx, Box::new(move || read.load(Ordering::Relaxed)), tx, stop.clone()));
        let first = next_about(&mut rx, &cid, Duration::from_secs(1)).await.expect("the first listing");
        assert_eq!(first.kind, PodLifecycleEventType::ContainerStarted);
        // The exit's record is lost: only the drop counter moves.
        rt.exit_container(&cid, 137);
        drops.store(12, Ordering::Relaxed);
        let died = next_about(&mut rx, &cid, Duration::from_secs(3)).await.expect("repaired before the safety period");
        assert_eq!((died.kind, died.kernel_time_ns), (PodLifecycleEventType::ContainerDied, None));
        assert_eq!(pleg.metrics.evented_pleg_ringbuf_drops.get(), 12);
        tokio::time::sleep(SUSPECT_GRACE + Duration::from_secs(1)).await;
        pleg.reconcile(Vec::new(), false);
        assert_eq!(pleg.metrics.evented_pleg_relist_repairs.get(), 1);
        // No more drops: back to the safety period.
        let lists = || rt.calls().iter().filter(|c| *c == "list_containers").count();
        let before = lists();
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(lists(), before, "relisting although nothing was dropped");
        stop.cancel();
        task.await.unwrap();
    }

    #[test]
    fn states_only_move_forward() {
        let mut known = HashMap::new();
        assert!(advance(&mut known, "c", PlegState::Running));
        assert!(advance(&mut known, "c", PlegState::Exited));
        assert!(!advance(&mut known, "c", PlegState::Running), "a stale listing must not roll back");
        assert!(!advance(&mut known, "c", PlegState::Exited));
        assert_eq!(known["c"], PlegState::Exited);
    }

    #[tokio::test]
    async fn a_stale_relist_after_a_kernel_exit_is_neither_forwarded_nor_a_repair() {
        let (rt, pleg, cid, _) = setup().await;
        pleg.reconcile(Vec::new(), true);
        rt.exit_container(&cid, 0);
        let exit = ExitSpec::default().event();
        assert!(pleg.handle_kernel_event(exit).await.is_some());
        // A listing taken before the exit reports the container as started.
        let stale = vec![PodLifecycleEvent {
            pod_uid: "u1".into(),
            kind: PodLifecycleEventType::ContainerStarted,
            data: cid.clone(),
            kernel_time_ns: None,
        }];
        assert!(pleg.reconcile(stale, false).is_empty());
        assert_eq!(pleg.metrics.evented_pleg_relist_repairs.get(), 0);
    }
}
