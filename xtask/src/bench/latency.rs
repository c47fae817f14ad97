//! Turning kills and the agent's records into latencies, and latencies into percentiles.
//!
//! For each kill (at `t_kill`, `CLOCK_MONOTONIC`):
//! - the *dispatch* is the first `ContainerDied` of the killed container's id that reached
//!   the pod worker at or after `t_kill`;
//! - the *status* is the first status of its pod computed after `t_kill` in which the
//!   container is no longer running or its restart count went up;
//! - the *restart* is the first status after `t_kill` in which it runs again with a higher
//!   restart count.

use crate::bench::records::{Record, State};

/// One container killed by the bench.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
    pub pod_uid: String,
    pub container: String,
    pub container_id: String,
    /// The container's restart count before the kill.
    pub restarts_before: u32,
    /// `CLOCK_MONOTONIC` ns just before `kill(2)`.
    pub t_kill_ns: u64,
}

/// What the agent's records say about one kill. All times are ns since `t_kill` except
/// `exit_to_worker_ns`.
#[expect(clippy::struct_field_names, reason = "every field is a time in nanoseconds: the unit belongs in the name")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KillOutcome {
    /// Kernel exit → pod worker, when the event carried the kernel's time.
    pub exit_to_worker_ns: Option<u64>,
    /// Kill → kernel exit, when the event carried the kernel's time.
    pub kill_to_exit_ns: Option<u64>,
    /// Kill → pod worker (the `ContainerDied` dispatch).
    pub kill_to_worker_ns: Option<u64>,
    /// Kill → first status that shows the exit (or the restart).
    pub kill_to_status_ns: Option<u64>,
    /// Kill → first status that shows the container running again.
    pub kill_to_running_ns: Option<u64>,
}

impl KillOutcome {
    /// Everything the bench waits for before the next kill has been seen.
    pub fn complete(&self) -> bool {
        self.kill_to_worker_ns.is_some() && self.kill_to_status_ns.is_some() && self.kill_to_running_ns.is_some()
    }

    /// The dispatch came without a kernel time (a relist found the exit).
    pub fn dispatched_without_kernel_time(&self) -> bool {
        self.kill_to_worker_ns.is_some() && self.exit_to_worker_ns.is_none()
    }
}

/// Matches one kill against `records` (in log order; earlier records are skipped by time).
pub fn outcome(kill: &Kill, records: &[Record]) -> KillOutcome {
    let t = kill.t_kill_ns;
    let mut out = KillOutcome::default();
    for r in records {
        match r {
            Record::Dispatch(d)
                if out.kill_to_worker_ns.is_none()
                    && d.kind == "ContainerDied"
                    && d.id == kill.container_id
                    && d.mono_ns >= t =>
            {
                out.kill_to_worker_ns = Some(d.mono_ns - t);
                if d.kernel_ns != 0 {
                    out.exit_to_worker_ns = Some(d.mono_ns.saturating_sub(d.kernel_ns));
                    out.kill_to_exit_ns = Some(d.kernel_ns.saturating_sub(t));
                }
            }
            Record::Status(s) if s.uid == kill.pod_uid && s.mono_ns > t => {
                let Some(c) = s.container(&kill.container) else { continue };
                let restarted = c.restarts > kill.restarts_before;
                if out.kill_to_status_ns.is_none() && (c.state != State::Running || restarted) {
                    out.kill_to_status_ns = Some(s.mono_ns - t);
                }
                if out.kill_to_running_ns.is_none() && c.state == State::Running && restarted {
                    out.kill_to_running_ns = Some(s.mono_ns - t);
                }
            }
            _ => {}
        }
    }
    out
}

/// Percentiles of a set of latencies (ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub n: usize,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

/// The nearest-rank percentile of sorted values: the smallest value with at least `p` %
/// of the values at or below it. `sorted` must not be empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    /// `None` for no values.
    pub fn of(values: impl IntoIterator<Item = u64>) -> Option<Self> {
        let mut v: Vec<u64> = values.into_iter().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        Some(Self {
            n: v.len(),
            p50: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            p99: percentile(&v, 99.0),
            max: v[v.len() - 1],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::records::{ContainerSummary, Dispatch, StatusUpdate};

    fn dispatch(mono: u64, kernel: u64, id: &str, kind: &str) -> Record {
        Record::Dispatch(Dispatch {
            mono_ns: mono,
            kernel_ns: kernel,
            uid: "u".into(),
            id: id.into(),
            kind: kind.into(),
        })
    }

    fn status(mono: u64, uid: &str, c0: (State, u32)) -> Record {
        Record::Status(StatusUpdate {
            mono_ns: mono,
            uid: uid.into(),
            containers: vec![
                ContainerSummary { name: "c0".into(), state: c0.0, restarts: c0.1 },
                ContainerSummary { name: "c1".into(), state: State::Running, restarts: 0 },
            ],
        })
    }

    fn kill() -> Kill {
        Kill {
            pod_uid: "u".into(),
            container: "c0".into(),
            container_id: "abc".into(),
            restarts_before: 0,
            t_kill_ns: 1_000,
        }
    }

    #[test]
    fn evented_kill_is_matched_step_by_step() {
        let records = vec![
            // Before the kill: ignored.
            status(900, "u", (State::Running, 0)),
            dispatch(950, 940, "abc", "ContainerDied"),
            // Other pods, containers and kinds: ignored.
            dispatch(1_100, 1_050, "other", "ContainerDied"),
            dispatch(1_150, 1_050, "abc", "ContainerStarted"),
            status(1_150, "v", (State::Terminated, 0)),
            status(1_160, "u", (State::Running, 0)),
            // The exit, then the restart.
            dispatch(1_200, 1_080, "abc", "ContainerDied"),
            dispatch(1_250, 1_240, "abc", "ContainerDied"),
            status(1_300, "u", (State::Terminated, 0)),
            status(1_500, "u", (State::Running, 1)),
        ];
        let o = outcome(&kill(), &records);
        assert_eq!(o.kill_to_worker_ns, Some(200));
        assert_eq!(o.exit_to_worker_ns, Some(120));
        assert_eq!(o.kill_to_exit_ns, Some(80));
        assert_eq!(o.kill_to_status_ns, Some(300));
        assert_eq!(o.kill_to_running_ns, Some(500));
        assert!(o.complete());
        assert!(!o.dispatched_without_kernel_time());
    }

    #[test]
    fn a_restart_seen_first_counts_as_the_status_update() {
        // The exit was never shown: the first status after the kill already runs again.
        let records = vec![dispatch(1_900, 0, "abc", "ContainerDied"), status(2_000, "u", (State::Running, 1))];
        let o = outcome(&kill(), &records);
        assert_eq!(o.kill_to_status_ns, Some(1_000));
        assert_eq!(o.kill_to_running_ns, Some(1_000));
        assert_eq!(o.exit_to_worker_ns, None, "a relist event has no kernel time");
        assert!(o.dispatched_without_kernel_time());
    }

    #[test]
    fn incomplete_without_a_restart() {
        let records = vec![dispatch(1_100, 1_050, "abc", "ContainerDied"), status(1_200, "u", (State::Waiting, 0))];
        let o = outcome(&kill(), &records);
        assert_eq!(o.kill_to_status_ns, Some(200));
        assert_eq!(o.kill_to_running_ns, None);
        assert!(!o.complete());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=200).collect();
        let s = Summary::of(v.iter().rev().copied()).unwrap();
        assert_eq!((s.n, s.p50, s.p90, s.p99, s.max), (200, 100, 180, 198, 200));
        let one = Summary::of([7]).unwrap();
        assert_eq!((one.p50, one.p99, one.max), (7, 7, 7));
        assert_eq!(percentile(&[1, 2, 3, 4], 0.0), 1);
        assert_eq!(percentile(&[1, 2, 3, 4], 100.0), 4);
        assert_eq!(percentile(&[1, 2, 3, 4], 75.0), 3);
        assert_eq!(percentile(&[1, 2, 3, 4], 76.0), 4);
        assert!(Summary::of([]).is_none());
    }
}
