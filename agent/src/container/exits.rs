//! [`KernelExits`]: container exits the kernel has seen and the runtime may not have
//! recorded yet.
//!
//! containerd marks a container exited some tens of milliseconds after its init process
//! is gone (it runs `runc delete` first). Rather than wait for it, the evented PLEG
//! records the exit it saw in the kernel here and wakes the pod worker at once; the
//! runtime manager lays these records over the CRI answer when it builds a pod's
//! status, so the worker sees the container exited — with the kernel's exit code,
//! signal and time — and acts on it (status, restart) without waiting for containerd.
//!
//! The exit of the init process of a container's pid namespace ends the container: the
//! kernel kills everything else in the namespace, so the record is not a guess. Once
//! CRI reports the exit too, its values are used, except `finishedAt`, which stays the
//! kernel's (the more precise time, and a status that does not change again when the
//! runtime catches up). Records go when the container leaves the runtime.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::container::{ContainerState, RuntimePodStatus};

/// How many records are kept at most; the oldest go first (a safety bound: records
/// normally go when their container is removed).
const MAX_RECORDS: usize = 8192;

/// How long after an OOM kill in a container's cgroup its init's exit counts as
/// `OOMKilled`.
const OOM_WINDOW: Duration = Duration::from_secs(5);

/// One exit seen by the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelExit {
    /// The pod the container (or sandbox) belongs to.
    pub pod_uid: String,
    /// The exit status as the runtime reports it: the exit code, or 128 + the signal
    /// that killed the process.
    pub exit_code: i32,
    /// When the process exited (wall clock).
    pub finished_at: SystemTime,
    /// The OOM killer struck in the container's cgroup just before.
    pub oom_killed: bool,
    seq: u64,
}

#[derive(Debug, Default)]
struct Inner {
    exits: HashMap<String, KernelExit>,
    /// Recent OOM kills per container id.
    ooms: HashMap<String, SystemTime>,
    /// Containers whose exits wait for the runtime, and their pods.
    awaiting_runtime: HashMap<String, String>,
    seq: u64,
}

/// Shared between the evented PLEG (writer) and the runtime manager (reader).
#[derive(Debug, Default)]
pub struct KernelExits {
    inner: Mutex<Inner>,
}

/// The wall-clock time of a kernel timestamp (`CLOCK_MONOTONIC` ns).
#[must_use]
pub fn wall_time_of(ktime_ns: u64) -> SystemTime {
    let ago = crate::types::clock::monotonic_now_ns().saturating_sub(ktime_ns);
    SystemTime::now().checked_sub(Duration::from_nanos(ago)).unwrap_or_else(SystemTime::now)
}

impl KernelExits {
    /// Notes an OOM kill in container `id`'s cgroup.
    pub fn record_oom(&self, id: &str, at: SystemTime) {
        let mut s = self.inner.lock().unwrap();
        s.ooms.retain(|_, t| at.duration_since(*t).unwrap_or_default() < OOM_WINDOW);
        s.ooms.insert(id.to_string(), at);
    }

    /// Records that the init process of container (or sandbox) `id` exited with
    /// `exit_code` (as the runtime reports it: 128 + the signal when one killed it).
    pub fn record(&self, pod_uid: &str, id: &str, exit_code: i32, finished_at: SystemTime) {
        let mut s = self.inner.lock().unwrap();
        let oom_killed =
            s.ooms.remove(id).is_some_and(|t| finished_at.duration_since(t).unwrap_or_default() < OOM_WINDOW);
        s.seq += 1;
        let seq = s.seq;
        s.exits.insert(
            id.to_string(),
            KernelExit { pod_uid: pod_uid.to_string(), exit_code, finished_at, oom_killed, seq },
        );
        if s.exits.len() > MAX_RECORDS
            && let Some(oldest) = s.exits.iter().min_by_key(|(_, e)| e.seq).map(|(k, _)| k.clone())
        {
            s.exits.remove(&oldest);
        }
    }

    /// The record of `id`, if any.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<KernelExit> {
        self.inner.lock().unwrap().exits.get(id).cloned()
    }

    /// Says that the exit of container `id` of pod `pod_uid` is to be reported only once
    /// the runtime has recorded it: its termination message may be the end of its log,
    /// which the runtime writes out before it records the exit.
    pub fn await_runtime(&self, pod_uid: &str, id: &str) {
        self.inner.lock().unwrap().awaiting_runtime.insert(id.to_string(), pod_uid.to_string());
    }

    /// Whether the exit of container `id` is to be reported only once the runtime has
    /// recorded it ([`Self::await_runtime`]).
    #[must_use]
    pub fn awaits_runtime(&self, id: &str) -> bool {
        self.inner.lock().unwrap().awaiting_runtime.contains_key(id)
    }

    /// Forgets `id` (it left the runtime).
    pub fn forget(&self, id: &str) {
        let mut s = self.inner.lock().unwrap();
        s.exits.remove(id);
        s.awaiting_runtime.remove(id);
    }

    /// Number of records.
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().exits.len()
    }

    /// Whether there are no records.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lays the records over a pod status fetched from CRI: a container the runtime
    /// still shows running is exited, with the kernel's code, reason and time and the
    /// termination message it wrote; a sandbox whose init exited is not ready. A
    /// container whose message is the end of its log stays as the runtime shows it
    /// until the runtime records the exit. Drops the records of this pod whose
    /// container or sandbox the runtime no longer has.
    pub fn apply(&self, status: &mut RuntimePodStatus) {
        let mut s = self.inner.lock().unwrap();
        let uid = status.uid.clone();
        let here =
            |id: &str| status.containers.iter().any(|c| c.id == id) || status.sandboxes.iter().any(|sb| sb.id == id);
        s.awaiting_runtime.retain(|id, pod| *pod != uid || here(id));
        // Marked here too for containers started before this agent (and its marks).
        for c in &status.containers {
            if c.termination_message.may_need_log()
                && c.state != ContainerState::Exited
                && !s.awaiting_runtime.contains_key(&c.id)
            {
                s.awaiting_runtime.insert(c.id.clone(), uid.clone());
            }
        }
        if s.exits.is_empty() {
            return;
        }
        s.exits.retain(|id, e| e.pod_uid != uid || here(id));
        let containers: Vec<(usize, KernelExit)> =
            status.containers.iter().enumerate().filter_map(|(i, c)| Some((i, s.exits.get(&c.id)?.clone()))).collect();
        for sb in &mut status.sandboxes {
            if sb.ready && s.exits.contains_key(&sb.id) {
                sb.ready = false;
                sb.ips.clear();
            }
        }
        // The messages are read from the pod's files without the lock the PLEG waits on.
        drop(s);
        for (i, e) in containers {
            let c = &mut status.containers[i];
            if c.state != ContainerState::Exited {
                let Some(message) = c.termination_message.message_without_log(e.exit_code) else { continue };
                c.state = ContainerState::Exited;
                c.exit_code = e.exit_code;
                c.reason = if e.oom_killed {
                    "OOMKilled"
                } else if e.exit_code == 0 {
                    "Completed"
                } else {
                    "Error"
                }
                .to_string();
                c.message = message;
            }
            c.finished_at = Some(e.finished_at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::RuntimeContainerStatus;
    use crate::container::pod_status::SandboxStatus;

    fn ctr(id: &str, state: ContainerState) -> RuntimeContainerStatus {
        RuntimeContainerStatus {
            state,
            started_at: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(10)),
            ..RuntimeContainerStatus::running_for_test("c", id)
        }
    }

    fn pod(containers: Vec<RuntimeContainerStatus>) -> RuntimePodStatus {
        RuntimePodStatus {
            uid: "u1".into(),
            sandboxes: vec![SandboxStatus {
                id: "sb".into(),
                ready: true,
                attempt: 0,
                created_at: 0,
                ips: vec!["10.0.0.2".into()],
                host_network: false,
            }],
            containers,
            ..Default::default()
        }
    }

    #[test]
    fn a_running_container_the_kernel_saw_exit_is_exited() {
        let exits = KernelExits::default();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(20);
        exits.record("u1", "a", 137, at);
        exits.record("u1", "b", 0, at);
        exits.record("u1", "c", 3, at);
        let mut st = pod(vec![
            ctr("a", ContainerState::Running),
            ctr("b", ContainerState::Running),
            ctr("c", ContainerState::Running),
            ctr("d", ContainerState::Running),
        ]);
        exits.apply(&mut st);
        let got: Vec<_> =
            st.containers.iter().map(|c| (c.state, c.exit_code, c.reason.as_str(), c.finished_at)).collect();
        assert_eq!(
            got,
            [
                (ContainerState::Exited, 137, "Error", Some(at)),
                (ContainerState::Exited, 0, "Completed", Some(at)),
                (ContainerState::Exited, 3, "Error", Some(at)),
                (ContainerState::Running, 0, "", None),
            ]
        );
        assert!(st.sandboxes[0].ready, "the sandbox's init did not exit");
    }

    #[test]
    fn the_runtime_wins_once_it_agrees_but_the_kernel_time_stays() {
        let exits = KernelExits::default();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(20);
        exits.record("u1", "a", 137, at);
        let mut c = ctr("a", ContainerState::Exited);
        c.exit_code = 137;
        c.reason = "Error".into();
        c.finished_at = Some(at + Duration::from_millis(40));
        let mut st = pod(vec![c]);
        exits.apply(&mut st);
        assert_eq!(st.containers[0].finished_at, Some(at));
        assert_eq!(st.containers[0].exit_code, 137);
    }

    #[test]
    fn oom_kills_sandboxes_and_cleanup() {
        let exits = KernelExits::default();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(20);
        exits.record_oom("a", at - Duration::from_millis(1));
        exits.record("u1", "a", 137, at);
        exits.record_oom("old", at - OOM_WINDOW - Duration::from_secs(1));
        exits.record("u1", "old", 137, at);
        exits.record("u1", "sb", 137, at);
        exits.record("u2", "other-pod", 137, at);
        let mut st = pod(vec![ctr("a", ContainerState::Running), ctr("old", ContainerState::Running)]);
        exits.apply(&mut st);
        assert_eq!(st.containers[0].reason, "OOMKilled");
        assert_eq!(st.containers[1].reason, "Error", "an OOM kill long before is not this exit's cause");
        assert!(!st.sandboxes[0].ready);
        assert!(st.sandboxes[0].ips.is_empty());
        // The container leaves the runtime: its record goes; other pods' records stay.
        let mut st = pod(vec![ctr("a", ContainerState::Exited)]);
        exits.apply(&mut st);
        assert!(exits.get("old").is_none());
        assert!(exits.get("a").is_some());
        assert!(exits.get("other-pod").is_some());
        exits.forget("a");
        assert!(exits.get("a").is_none());
    }

    #[test]
    fn records_are_bounded() {
        let exits = KernelExits::default();
        for i in 0..=MAX_RECORDS {
            exits.record("u", &format!("c{i}"), 0, SystemTime::UNIX_EPOCH);
        }
        assert_eq!(exits.len(), MAX_RECORDS);
        assert!(exits.get("c0").is_none(), "the oldest went first");
    }
}
