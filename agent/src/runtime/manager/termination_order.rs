//! The order in which a pod with sidecars stops (upstream `terminationOrdering`,
//! `kuberuntime_termination_order.go`). Every container's preStop hook starts at once;
//! then each sidecar (restartable init container) waits, within what is left of its grace
//! period, until every app container has stopped and every sidecar after it in the spec
//! has stopped. Sidecars so outlive the app containers they serve and stop in reverse
//! order. Containers not running when the kill starts are not waited for.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::types::pod_resources::is_restartable_init_container;

/// Who waits for whom while one pod stops.
pub(super) struct TerminationOrder {
    /// Container name -> whether it has stopped.
    stopped: HashMap<String, watch::Sender<bool>>,
    /// Container name -> the containers it waits for.
    waits_for: HashMap<String, Vec<String>>,
}

impl TerminationOrder {
    /// The order for `pod` with these containers running; `None` when the pod has no
    /// sidecar (every container then stops at once).
    pub(super) fn new(pod: &Pod, running: &[&str]) -> Option<Self> {
        let spec = pod.spec.as_ref()?;
        let inits = spec.init_containers.as_deref().unwrap_or_default();
        if !inits.iter().any(is_restartable_init_container) {
            return None;
        }
        let mut order = Self { stopped: HashMap::new(), waits_for: HashMap::new() };
        for name in spec.containers.iter().chain(inits).map(|c| &c.name) {
            let (tx, _) = watch::channel(!running.contains(&name.as_str()));
            order.stopped.insert(name.clone(), tx);
        }
        let apps: Vec<String> = spec.containers.iter().map(|c| c.name.clone()).collect();
        let mut later_sidecar: Option<&str> = None;
        for c in inits.iter().rev().filter(|c| is_restartable_init_container(c)) {
            let mut waits = apps.clone();
            waits.extend(later_sidecar.map(str::to_owned));
            order.waits_for.insert(c.name.clone(), waits);
            later_sidecar = Some(&c.name);
        }
        Some(order)
    }

    /// Waits until it is `name`'s turn to stop, at most `grace_secs`; returns the whole
    /// seconds waited (upstream truncates them off the grace period).
    pub(super) async fn wait_for_turn(&self, name: &str, grace_secs: i64) -> i64 {
        if grace_secs <= 0 {
            return 0;
        }
        let start = Instant::now();
        let waits = self.waits_for.get(name).map(Vec::as_slice).unwrap_or_default();
        let all_stopped = async {
            for other in waits {
                if let Some(tx) = self.stopped.get(other) {
                    // The sender lives as long as `self`, so this ends only when it is set.
                    let _ = tx.subscribe().wait_for(|stopped| *stopped).await;
                }
            }
        };
        let limit = Duration::from_secs(u64::try_from(grace_secs).unwrap_or(0));
        let _ = tokio::time::timeout(limit, all_stopped).await;
        i64::try_from(start.elapsed().as_secs()).unwrap_or(i64::MAX)
    }

    /// Records that `name` has stopped, letting those who wait for it go on.
    pub(super) fn stopped(&self, name: &str) {
        if let Some(tx) = self.stopped.get(name) {
            tx.send_replace(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    use super::*;

    fn pod(inits: &[(&str, bool)], apps: &[&str]) -> Pod {
        let mk = |name: &str, sidecar: bool| Container {
            name: name.into(),
            restart_policy: sidecar.then(|| "Always".into()),
            ..Default::default()
        };
        Pod {
            spec: Some(PodSpec {
                init_containers: Some(inits.iter().map(|(n, s)| mk(n, *s)).collect()),
                containers: apps.iter().map(|n| mk(n, false)).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_without_sidecars_has_no_order() {
        assert!(TerminationOrder::new(&pod(&[("init", false)], &["a"]), &["a"]).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn sidecars_wait_for_the_apps_then_for_later_sidecars() {
        let p = pod(&[("s1", true), ("init", false), ("s2", true)], &["a", "b"]);
        let order = TerminationOrder::new(&p, &["s1", "s2", "a", "b"]).unwrap();
        let log = std::sync::Mutex::new(Vec::new());
        let stop = |name: &'static str, delay: u64| {
            let (order, log) = (&order, &log);
            async move {
                let waited = order.wait_for_turn(name, 30).await;
                tokio::time::sleep(Duration::from_secs(delay)).await;
                log.lock().unwrap().push((name, waited));
                order.stopped(name);
            }
        };
        // The apps take 3 and 5 s to stop; each sidecar takes 1 s.
        tokio::join!(stop("s1", 1), stop("a", 3), stop("s2", 1), stop("b", 5));
        let log = log.into_inner().unwrap();
        assert_eq!(log, [("a", 0), ("b", 0), ("s2", 5), ("s1", 6)]);
        // An app container waits for nobody.
        assert!(!order.waits_for.contains_key("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_with_the_grace_period_and_skips_stopped_containers() {
        let p = pod(&[("s1", true)], &["a", "gone"]);
        let order = TerminationOrder::new(&p, &["s1", "a"]).unwrap();
        // "a" never reports: the sidecar goes when its 4 s are up.
        assert_eq!(order.wait_for_turn("s1", 4).await, 4);
        // With no grace left, nobody waits.
        assert_eq!(order.wait_for_turn("s1", 0).await, 0);
        // "gone" was not running, so only "a" is waited for.
        order.stopped("a");
        assert_eq!(order.wait_for_turn("s1", 30).await, 0);
    }
}
