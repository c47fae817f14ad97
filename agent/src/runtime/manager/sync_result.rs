//! What one `SyncPod` did (upstream `kubecontainer.PodSyncResult` and `SyncResult`,
//! `pkg/kubelet/container/sync_result.go`): a result per action the sync took, on what, and
//! why it failed, plus an error of the pod as a whole.
//!
//! The pod worker reads it: it logs each failure (as [`SyncResult::error_line`] prints it),
//! counts the sync as failed when anything failed, and syncs again within the earliest
//! back-off a failure gave ([`PodSyncResult::requeue_after`], upstream's
//! `MinBackoffExpiration`).

use std::time::Duration;

use super::StartError;

/// An action of a sync (upstream `kubecontainer.SyncAction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncAction {
    /// Start a container (init, app or ephemeral), back-off included; the target is its name.
    StartContainer,
    /// Stop one container the pod actions named; the target is its name.
    KillContainer,
    /// Remove a container (stopping it first if it runs) before the pod restarts all its
    /// containers in place; the target is its name.
    RemoveContainer,
    /// Stop the whole pod, containers then sandboxes; the target is the pod's full name.
    /// Upstream records a `KillContainer` per container and a `KillPodSandbox` per sandbox;
    /// [`super::RuntimeManager::kill_pod`] stops at the first error and reports that one.
    KillPod,
    /// Generate the CRI sandbox config; the target is the pod's full name. Recorded only
    /// when it fails, as upstream.
    ConfigPodSandbox,
    /// Create the sandbox (`RunPodSandbox`); the target is the pod's full name.
    CreatePodSandbox,
    /// Resize containers in place; the target is the pod's full name.
    ResizePodInPlace,
}

impl SyncAction {
    /// The action as a failure of it is logged: `StartContainer`, `KillContainer`, `KillPod`,
    /// `CreatePodSandboxConfig`, `CreatePodSandbox`, `ResizePod` (the words swiftlet's logs
    /// have always used; upstream's names differ for the sandbox config and the resize).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            SyncAction::StartContainer => "StartContainer",
            SyncAction::KillContainer => "KillContainer",
            SyncAction::RemoveContainer => "RemoveContainer",
            SyncAction::KillPod => "KillPod",
            SyncAction::ConfigPodSandbox => "CreatePodSandboxConfig",
            SyncAction::CreatePodSandbox => "CreatePodSandbox",
            SyncAction::ResizePodInPlace => "ResizePod",
        }
    }

    /// The error of a failure of the action other than a container start (upstream
    /// `ErrKillContainer`, `ErrCreatePodSandbox`, ...; `KillPodError` is swiftlet's). A
    /// failed start carries its waiting reason instead.
    #[must_use]
    pub fn error(self) -> &'static str {
        match self {
            SyncAction::StartContainer => "RunContainerError",
            SyncAction::KillContainer => "KillContainerError",
            SyncAction::RemoveContainer => "RemoveContainerError",
            SyncAction::KillPod => "KillPodError",
            SyncAction::ConfigPodSandbox => "ConfigPodSandboxError",
            SyncAction::CreatePodSandbox => "CreatePodSandboxError",
            SyncAction::ResizePodInPlace => "ResizePodInPlaceError",
        }
    }
}

/// The result of one action (upstream `kubecontainer.SyncResult`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncResult {
    pub action: SyncAction,
    /// What the action was on: a container's name, or the pod's full name.
    pub target: String,
    /// `None` when the action succeeded; else what went wrong: the container's waiting
    /// reason for a start (`CrashLoopBackOff`, `ErrImagePull`, ...), the action's
    /// [`SyncAction::error`] for the others.
    pub error: Option<&'static str>,
    /// The failure in words (empty when the action succeeded).
    pub message: String,
    /// When the action may be tried again, if its failure said (a back-off expiry).
    pub retry_after: Option<Duration>,
}

impl SyncResult {
    /// The action succeeded.
    #[must_use]
    pub fn ok(action: SyncAction, target: impl Into<String>) -> Self {
        Self { action, target: target.into(), error: None, message: String::new(), retry_after: None }
    }

    /// The action failed with `message`.
    #[must_use]
    pub fn failed(action: SyncAction, target: impl Into<String>, message: impl Into<String>) -> Self {
        Self { action, target: target.into(), error: Some(action.error()), message: message.into(), retry_after: None }
    }

    /// The start of the container `target` failed as `e` says.
    #[must_use]
    pub fn start_failed(target: impl Into<String>, e: StartError) -> Self {
        Self {
            action: SyncAction::StartContainer,
            target: target.into(),
            error: Some(e.reason),
            message: e.message,
            retry_after: e.retry_after,
        }
    }

    /// Whether the action failed.
    #[must_use]
    pub fn is_failed(&self) -> bool {
        self.error.is_some()
    }

    /// The failure as one line, `None` when the action succeeded: `<reason>: <message>`
    /// for a container start, `KillContainer <name>: <message>` for a container kill (and
    /// `RemoveContainer <name>: ...` for a removal),
    /// `<action>: <message>` for the others.
    #[must_use]
    pub fn error_line(&self) -> Option<String> {
        let error = self.error?;
        Some(match self.action {
            SyncAction::StartContainer => format!("{error}: {}", self.message),
            SyncAction::KillContainer | SyncAction::RemoveContainer => {
                format!("{} {}: {}", self.action.as_str(), self.target, self.message)
            }
            other => format!("{}: {}", other.as_str(), self.message),
        })
    }
}

/// Everything one sync did (upstream `kubecontainer.PodSyncResult`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSyncResult {
    /// One result per action taken, in order.
    pub results: Vec<SyncResult>,
    /// An error of the pod itself, before any action (upstream `SyncError`): a pod that
    /// came without a spec.
    pub sync_error: Option<String>,
    /// The runtime was asked to change the pod: a kill, a removal, a resize, a sandbox or a
    /// container start (even one that failed). When false the pod's runtime state is still
    /// the status the sync was given, and the caller need not ask the runtime again.
    pub touched_runtime: bool,
}

impl PodSyncResult {
    /// The names of the containers this sync started.
    pub fn started(&self) -> impl Iterator<Item = &str> {
        self.results
            .iter()
            .filter(|r| r.action == SyncAction::StartContainer && !r.is_failed())
            .map(|r| r.target.as_str())
    }

    /// Whether a container was removed (a `RestartAllContainers` reset).
    #[must_use]
    pub fn removed_any(&self) -> bool {
        self.results.iter().any(|r| r.action == SyncAction::RemoveContainer && !r.is_failed())
    }

    /// A sync that failed before any action.
    #[must_use]
    pub fn sync_failed(error: impl Into<String>) -> Self {
        Self { sync_error: Some(error.into()), ..Self::default() }
    }

    /// Adds the result of an action (upstream `AddSyncResult`).
    pub fn add(&mut self, result: SyncResult) {
        self.results.push(result);
    }

    /// Whether anything failed.
    #[must_use]
    pub fn failed(&self) -> bool {
        self.sync_error.is_some() || self.results.iter().any(SyncResult::is_failed)
    }

    /// The failures, one line each (see [`SyncResult::error_line`]), the pod's own error
    /// first; empty when nothing failed.
    #[must_use]
    pub fn errors(&self) -> Vec<String> {
        self.sync_error.iter().cloned().chain(self.results.iter().filter_map(SyncResult::error_line)).collect()
    }

    /// When to sync again for the failures' sake: the earliest back-off expiry among the
    /// failed actions, `None` when none said.
    #[must_use]
    pub fn requeue_after(&self) -> Option<Duration> {
        self.results.iter().filter(|r| r.is_failed()).filter_map(|r| r.retry_after).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::manager::reasons;

    #[test]
    fn a_failure_prints_as_the_sync_logs_it() {
        let start = StartError::new(reasons::CREATE_CONTAINER_ERROR, "no such image");
        let lines: Vec<_> = [
            SyncResult::start_failed("app", start),
            SyncResult::failed(SyncAction::KillContainer, "app", "context deadline exceeded"),
            SyncResult::failed(SyncAction::KillPod, "web_shop(u1)", "stop failed"),
            SyncResult::failed(SyncAction::ConfigPodSandbox, "web_shop(u1)", "bad hostname"),
            SyncResult::failed(SyncAction::CreatePodSandbox, "web_shop(u1)", "no network"),
            SyncResult::failed(SyncAction::ResizePodInPlace, "web_shop(u1)", "not enough CPU"),
        ]
        .iter()
        .map(|r| r.error_line().unwrap())
        .collect();
        assert_eq!(
            lines,
            [
                "CreateContainerError: no such image",
                "KillContainer app: context deadline exceeded",
                "KillPod: stop failed",
                "CreatePodSandboxConfig: bad hostname",
                "CreatePodSandbox: no network",
                "ResizePod: not enough CPU",
            ]
        );
        assert_eq!(SyncResult::ok(SyncAction::StartContainer, "app").error_line(), None);
        let failed = SyncResult::failed(SyncAction::KillContainer, "app", "gone wrong");
        assert_eq!((failed.error, failed.retry_after), (Some("KillContainerError"), None));
    }

    #[test]
    fn a_start_failure_keeps_its_reason_and_back_off() {
        let back_off = StartError {
            reason: reasons::CRASH_LOOP_BACK_OFF,
            message: "back-off 10s restarting failed container=app pod=web_shop(u1)".into(),
            retry_after: Some(Duration::from_secs(7)),
        };
        let r = SyncResult::start_failed("app", back_off);
        assert_eq!(r.action, SyncAction::StartContainer);
        assert_eq!(r.target, "app");
        assert_eq!(r.error, Some("CrashLoopBackOff"));
        assert_eq!(r.retry_after, Some(Duration::from_secs(7)));
        assert_eq!(
            r.error_line().unwrap(),
            "CrashLoopBackOff: back-off 10s restarting failed container=app pod=web_shop(u1)"
        );
    }

    #[test]
    fn a_pod_sync_fails_when_any_action_fails_and_requeues_at_the_earliest_back_off() {
        let mut sync = PodSyncResult::default();
        assert!(!sync.failed() && sync.errors().is_empty() && sync.requeue_after().is_none());
        sync.add(SyncResult::ok(SyncAction::CreatePodSandbox, "web_shop(u1)"));
        sync.add(SyncResult::ok(SyncAction::StartContainer, "a"));
        assert!(!sync.failed(), "successes are results too");
        let retry = |secs| StartError {
            reason: reasons::IMAGE_PULL_BACK_OFF,
            message: "Back-off pulling image".into(),
            retry_after: Some(Duration::from_secs(secs)),
        };
        sync.add(SyncResult::start_failed("b", retry(20)));
        sync.add(SyncResult::start_failed("c", StartError::new(reasons::RUN_CONTAINER_ERROR, "exec failed")));
        sync.add(SyncResult::start_failed("d", retry(5)));
        // A success that said when to come back does not count (none does today).
        sync.add(SyncResult {
            retry_after: Some(Duration::from_secs(1)),
            ..SyncResult::ok(SyncAction::StartContainer, "e")
        });
        assert!(sync.failed());
        assert_eq!(sync.requeue_after(), Some(Duration::from_secs(5)));
        assert_eq!(
            sync.errors(),
            [
                "ImagePullBackOff: Back-off pulling image",
                "RunContainerError: exec failed",
                "ImagePullBackOff: Back-off pulling image"
            ]
        );
    }

    #[test]
    fn a_pod_error_fails_the_sync_and_comes_first() {
        let mut sync = PodSyncResult::sync_failed("pod web_shop(u1) has no spec");
        assert!(sync.failed());
        assert_eq!(sync.errors(), ["pod web_shop(u1) has no spec"]);
        assert_eq!(sync.requeue_after(), None);
        sync.add(SyncResult::failed(SyncAction::KillPod, "web_shop(u1)", "stop failed"));
        assert_eq!(sync.errors(), ["pod web_shop(u1) has no spec", "KillPod: stop failed"]);
    }
}
