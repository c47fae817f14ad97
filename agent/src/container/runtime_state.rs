//! The container runtime's state as the kubelet sees it (upstream `runtimeState` and
//! `updateRuntimeUp`): CRI `Status` every [`RUNTIME_SYNC_PERIOD`], read for
//!
//! - the node's `Ready` condition: not ready until the first status that says the runtime
//!   is ready ("container runtime status check may not have completed yet"), nor when
//!   none has come for [`MAX_WAIT_FOR_CONTAINER_RUNTIME`] ("container runtime is down"),
//!   nor while `RuntimeReady` or `NetworkReady` is false ("container runtime not ready:
//!   RuntimeReady=false reason:... message:...", "container runtime network not ready:
//!   NetworkReady=false reason:NetworkPluginNotReady message:...", the CNI plugin not yet
//!   set up, say);
//! - pods: one on the pod network does not start while the network is not ready ("network
//!   is not ready: ...", event `NetworkNotReady`, retried every 10 s); host-network pods do;
//! - the runtime's features (`supplemental_groups_policy`): the node status'
//!   `features.supplementalGroupsPolicy`, and the admission of pods asking for
//!   `supplementalGroupsPolicy: Strict`.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_cri::v1 as api;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::container::RuntimeService;

/// How often the runtime's status is asked (upstream: every 5 s).
pub const RUNTIME_SYNC_PERIOD: Duration = Duration::from_secs(5);

/// How long the runtime may go without a ready status before it counts as down
/// (upstream's `maxWaitForContainerRuntime`).
pub const MAX_WAIT_FOR_CONTAINER_RUNTIME: Duration = Duration::from_secs(30);

/// What the agent last learned of the runtime.
#[derive(Debug)]
struct Inner {
    /// When the runtime last said it was ready.
    last_sync: Option<Instant>,
    runtime_error: Option<String>,
    network_error: Option<String>,
    supplemental_groups_policy: bool,
    /// The runtime handlers of the last status; empty for a runtime that does not list
    /// them (containerd 1.6).
    handlers: Vec<RuntimeHandler>,
}

/// A runtime handler (CRI `Status`'s `runtime_handlers`) and its features.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeHandler {
    /// `""` for the default handler.
    pub name: String,
    pub recursive_read_only_mounts: bool,
    pub user_namespaces: bool,
}

/// The runtime's state, shared by the node status, admission and the pod workers.
#[derive(Debug)]
pub struct RuntimeState {
    inner: RwLock<Inner>,
    threshold: Duration,
}

impl Default for RuntimeState {
    fn default() -> Self {
        Self::new(MAX_WAIT_FOR_CONTAINER_RUNTIME)
    }
}

/// A runtime condition as upstream prints it (`%v` of a `*RuntimeCondition`).
fn describe(condition: Option<&api::RuntimeCondition>) -> String {
    condition.map_or_else(
        || "<nil>".to_owned(),
        |c| format!("{}={} reason:{} message:{}", c.r#type, c.status, c.reason, c.message),
    )
}

/// Upstream's error aggregate: nothing is `Ok`, one error is itself, several are
/// `[a, b]` (each message once, in order).
///
/// # Errors
/// The aggregated message when there is any error.
pub fn aggregate(errors: &[String]) -> Result<(), String> {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [] => Ok(()),
        [one] => Err((*one).to_owned()),
        many => Err(format!("[{}]", many.join(", "))),
    }
}

impl RuntimeState {
    /// A state that has heard nothing yet (network state unknown), counting the runtime
    /// as down after `threshold` without a ready status.
    #[must_use]
    pub fn new(threshold: Duration) -> Self {
        Self {
            inner: RwLock::new(Inner {
                last_sync: None,
                runtime_error: None,
                network_error: Some("network state unknown".to_owned()),
                supplemental_groups_policy: false,
                handlers: Vec::new(),
            }),
            threshold,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes in one answer to CRI `Status` (upstream `updateRuntimeUp`): a failed call
    /// changes nothing (the runtime goes "down" once the last ready status is too old).
    pub fn apply(&self, status: Result<&api::StatusResponse, &str>) {
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "container runtime sanity check failed");
                return;
            }
        };
        let conditions = status.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let find = |t: &str| conditions.iter().find(|c| c.r#type == t);
        let mut inner = self.inner.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let network = find("NetworkReady");
        inner.network_error = if network.is_some_and(|c| c.status) {
            None
        } else {
            let e = format!("container runtime network not ready: {}", describe(network));
            if inner.network_error.as_ref() != Some(&e) {
                tracing::error!(error = %e, "container runtime network not ready");
            }
            Some(e)
        };
        let runtime = find("RuntimeReady");
        if !runtime.is_some_and(|c| c.status) {
            let e = format!("container runtime not ready: {}", describe(runtime));
            if inner.runtime_error.as_ref() != Some(&e) {
                tracing::error!(error = %e, "container runtime not ready");
            }
            inner.runtime_error = Some(e);
            return;
        }
        inner.runtime_error = None;
        inner.supplemental_groups_policy = status.features.is_some_and(|f| f.supplemental_groups_policy);
        inner.handlers = status
            .runtime_handlers
            .iter()
            .map(|h| RuntimeHandler {
                name: h.name.clone(),
                recursive_read_only_mounts: h.features.is_some_and(|f| f.recursive_read_only_mounts),
                user_namespaces: h.features.is_some_and(|f| f.user_namespaces),
            })
            .collect();
        inner.last_sync = Some(Instant::now());
    }

    /// The runtime's errors in upstream's order: the status check's (none yet, or the
    /// last too long ago), then `health_checks`' (the PLEG's), then `RuntimeReady`'s.
    #[must_use]
    pub fn runtime_errors(&self, health_checks: impl IntoIterator<Item = String>) -> Vec<String> {
        let inner = self.read();
        let mut errors = Vec::new();
        match inner.last_sync {
            None => errors.push("container runtime status check may not have completed yet".to_owned()),
            Some(t) if t.elapsed() >= self.threshold => errors.push("container runtime is down".to_owned()),
            Some(_) => {}
        }
        errors.extend(health_checks);
        errors.extend(inner.runtime_error.clone());
        errors
    }

    /// Why the pod network is not ready, if it is not.
    #[must_use]
    pub fn network_error(&self) -> Option<String> {
        self.read().network_error.clone()
    }

    /// Whether the runtime supports `supplementalGroupsPolicy` (its `Status` features).
    #[must_use]
    pub fn supports_supplemental_groups_policy(&self) -> bool {
        self.read().supplemental_groups_policy
    }

    /// Whether the runtime handler `name` (`""`: the default) supports user namespaces
    /// (upstream `HandlerSupportsUserNamespaces`): not when the runtime lists no
    /// handlers (an older runtime).
    ///
    /// # Errors
    /// The runtime lists handlers, and not this one.
    pub fn handler_supports_user_namespaces(&self, name: &str) -> Result<bool, String> {
        let inner = self.read();
        if inner.handlers.is_empty() {
            return Ok(false);
        }
        inner
            .handlers
            .iter()
            .find(|h| h.name == name)
            .map(|h| h.user_namespaces)
            .ok_or_else(|| format!("the handler {name:?} is not known"))
    }

    /// The runtime handlers and their features, as the last status listed them (the
    /// node status' `runtimeHandlers`).
    #[must_use]
    pub fn runtime_handlers(&self) -> Vec<RuntimeHandler> {
        self.read().handlers.clone()
    }

    /// Asks the runtime once.
    pub async fn update(&self, rt: &dyn RuntimeService) {
        match rt.status(false).await {
            Ok(status) => self.apply(Ok(&status)),
            Err(e) => self.apply(Err(&e.to_string())),
        }
    }

    /// Asks the runtime every [`RUNTIME_SYNC_PERIOD`] until `shutdown`.
    pub async fn run(self: Arc<Self>, rt: Arc<dyn RuntimeService>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(RUNTIME_SYNC_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => self.update(rt.as_ref()).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(t: &str, status: bool, reason: &str, message: &str) -> api::RuntimeCondition {
        api::RuntimeCondition { r#type: t.into(), status, reason: reason.into(), message: message.into() }
    }

    fn status(conditions: Vec<api::RuntimeCondition>, sgp: bool) -> api::StatusResponse {
        api::StatusResponse {
            status: Some(api::RuntimeStatus { conditions }),
            features: Some(api::RuntimeFeatures { supplemental_groups_policy: sgp }),
            ..Default::default()
        }
    }

    /// Which handlers support user namespaces: none on a runtime that lists none
    /// (containerd 1.6), an unknown handler named.
    #[test]
    fn handlers_say_whether_they_support_user_namespaces() {
        let state = RuntimeState::default();
        let ready = vec![condition("RuntimeReady", true, "", ""), condition("NetworkReady", true, "", "")];
        state.apply(Ok(&status(ready.clone(), false)));
        assert_eq!(state.handler_supports_user_namespaces(""), Ok(false));
        let handler = |name: &str, userns: bool| api::RuntimeHandler {
            name: name.into(),
            features: Some(api::RuntimeHandlerFeatures { recursive_read_only_mounts: true, user_namespaces: userns }),
        };
        let mut st = status(ready, true);
        st.runtime_handlers = vec![handler("", true), handler("runc", true), handler("kata", false)];
        state.apply(Ok(&st));
        assert_eq!(state.handler_supports_user_namespaces(""), Ok(true));
        assert_eq!(state.handler_supports_user_namespaces("kata"), Ok(false));
        assert_eq!(state.handler_supports_user_namespaces("gvisor"), Err("the handler \"gvisor\" is not known".into()));
    }

    #[test]
    fn errors_aggregate_as_upstreams() {
        assert_eq!(aggregate(&[]), Ok(()));
        assert_eq!(aggregate(&["a".into()]), Err("a".into()));
        assert_eq!(aggregate(&["a".into(), "b".into(), "a".into()]), Err("[a, b]".into()));
        assert_eq!(aggregate(&["a".into(), "a".into()]), Err("a".into()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_runtime_and_the_network_are_ready_only_when_the_runtime_says_so() {
        let state = RuntimeState::default();
        assert_eq!(state.runtime_errors([]), ["container runtime status check may not have completed yet"]);
        assert_eq!(state.network_error().as_deref(), Some("network state unknown"));
        assert!(!state.supports_supplemental_groups_policy());

        // containerd before a CNI config is in place.
        let no_cni = condition(
            "NetworkReady",
            false,
            "NetworkPluginNotReady",
            "Network plugin returns error: cni plugin not initialized",
        );
        state.apply(Ok(&status(vec![condition("RuntimeReady", true, "", ""), no_cni], false)));
        assert!(state.runtime_errors([]).is_empty());
        assert_eq!(
            state.network_error().as_deref(),
            Some(
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady \
                 message:Network plugin returns error: cni plugin not initialized"
            )
        );
        let ready = vec![condition("RuntimeReady", true, "", ""), condition("NetworkReady", true, "", "")];
        state.apply(Ok(&status(ready.clone(), true)));
        assert_eq!(state.network_error(), None);
        assert!(state.supports_supplemental_groups_policy());

        // Not ready: the error says why; a status without the condition is "<nil>".
        state.apply(Ok(&status(vec![condition("RuntimeReady", false, "Broken", "it broke")], true)));
        assert_eq!(
            state.runtime_errors(["PLEG is not healthy: x".to_owned()]),
            [
                "PLEG is not healthy: x",
                "container runtime not ready: RuntimeReady=false reason:Broken message:it broke"
            ]
        );
        assert_eq!(state.network_error().as_deref(), Some("container runtime network not ready: <nil>"));

        // Failed calls change nothing until the last ready status is too old.
        state.apply(Ok(&status(ready, true)));
        state.apply(Err("connection refused"));
        assert!(state.runtime_errors([]).is_empty());
        tokio::time::advance(MAX_WAIT_FOR_CONTAINER_RUNTIME).await;
        assert_eq!(state.runtime_errors([]), ["container runtime is down"]);
    }
}
