//! What every part of the kubelet that talks to the container runtime shares
//! (upstream `pkg/kubelet/container` and the `cri-client` staging module): the CRI client
//! ([`RemoteRuntime`]) behind the [`RuntimeService`] trait and its in-memory double
//! ([`fake::FakeRuntime`]), the CRI types ([`api`]), the runtime's view of a pod
//! ([`RuntimePodStatus`]), the labels that tie CRI objects back to pods ([`labels`]) and
//! the crash-loop [`Backoff`].
//!
//! It sits below the subsystems: `runtime` (the kuberuntime manager), `pleg`, `prober`,
//! `images`, `cm`, `allocation`, `stats`, `server` and the rest use it, and it uses none of
//! them (only `metrics` and `telemetry`, for the CRI call metrics and trace spans). Before
//! it was split out of `runtime`, every one of those subsystems and `runtime` used each
//! other (ARCHITECTURE.md, issue 28 item 2).

pub mod backoff;
pub mod cache;
pub mod cgroup_driver;
pub mod cri;
pub mod ephemeral;
pub mod exits;
pub mod fake;
pub mod helpers;
pub mod labels;
pub mod metrics;
pub mod pod_status;
pub mod runtime_state;
pub mod starts;
pub mod termination_message;

/// Waiting reasons of containers that the runtime manager gives and the status shows
/// (upstream `kubecontainer` errors, `sync_result.go`, and `ContainerCreating` /
/// `PodInitializing` of `kubelet_pods.go`); the image manager's are in
/// `images::puller::reasons`.
pub mod reasons {
    pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
    pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
    pub const CREATE_CONTAINER_ERROR: &str = "CreateContainerError";
    pub const RUN_CONTAINER_ERROR: &str = "RunContainerError";
    /// The postStart hook failed (upstream `ErrPostStartHook`); the container was killed.
    pub const POST_START_HOOK_ERROR: &str = "PostStartHookError";
    pub const CONTAINER_CREATING: &str = "ContainerCreating";
    pub const POD_INITIALIZING: &str = "PodInitializing";
}

use std::time::Duration;

use async_trait::async_trait;
pub use k8s_cri::v1 as api;

pub use backoff::Backoff;
pub use cri::RemoteRuntime;
pub use pod_status::{ContainerState, RuntimeContainerStatus, RuntimePod, RuntimePodStatus};

/// Errors of runtime (CRI) operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint string is not a unix socket address we can use.
    #[error("invalid container runtime endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: &'static str },
    /// The runtime answered with a gRPC error.
    #[error("CRI {operation} failed: {} ({:?})", status.message(), status.code())]
    Rpc {
        operation: &'static str,
        #[source]
        status: tonic::Status,
    },
    /// The call did not finish within the runtime request timeout.
    #[error("CRI {operation} timed out after {timeout:?}")]
    Timeout { operation: &'static str, timeout: Duration },
    /// The runtime answered, but without a field the CRI contract requires.
    #[error("CRI {operation} returned no {field}")]
    MissingField { operation: &'static str, field: &'static str },
    /// Something the kubelet asked for is invalid before reaching the runtime
    /// (for example an image reference or an environment variable).
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// Whether the runtime said the object does not exist.
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Rpc { status, .. } if status.code() == tonic::Code::NotFound)
    }

    /// The error as upstream's Go CRI client prints it where the kubelet passes it on
    /// (events, hook and probe messages): a gRPC status as [`go_status_text`], anything
    /// else as our own message.
    #[must_use]
    pub fn go_text(&self) -> String {
        match self {
            Error::Rpc { status, .. } => go_status_text(status),
            other => other.to_string(),
        }
    }
}

/// A gRPC status as a Go client's error prints it (grpc-go `status.Error`):
/// `rpc error: code = NotFound desc = container "c1" not found`.
#[must_use]
pub fn go_status_text(status: &tonic::Status) -> String {
    format!("rpc error: code = {} desc = {}", go_code_name(status.code()), status.message())
}

/// grpc-go's name of a status code (`codes.Code.String()`): tonic's, but `OK` and
/// `Canceled` (one l).
#[must_use]
pub fn go_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The sandbox (pause) image the runtime uses, from its verbose status (containerd's
/// `info.config.sandboxImage`).
#[must_use]
pub fn sandbox_image_of(status: &api::StatusResponse) -> Option<String> {
    let config: serde_json::Value = serde_json::from_str(status.info.get("config")?).ok()?;
    config.get("sandboxImage")?.as_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

/// CRI `Mount.image_sub_path` (field 10, CRI since 1.33) of a container's image volume
/// mounts, as `(index into ContainerConfig.mounts, sub path)`. The CRI bindings
/// (k8s-cri 0.11) predate the field, so it travels beside the config:
/// [`RuntimeService::create_container_with_image_sub_paths`].
pub type ImageSubPaths = Vec<(usize, String)>;

/// The events of `GetContainerEvents`, as the runtime sends them.
pub type ContainerEventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<api::ContainerEventResponse>> + Send>>;

/// The CRI calls the kubelet makes, one method per RPC. The real implementation is
/// [`RemoteRuntime`]; [`fake::FakeRuntime`] keeps state in memory for unit tests.
#[async_trait]
pub trait RuntimeService: Send + Sync + std::fmt::Debug {
    async fn version(&self) -> Result<api::VersionResponse>;
    /// The runtime's conditions; `verbose` adds its `info` (containerd: its CRI config as
    /// JSON under `config`).
    async fn status(&self, verbose: bool) -> Result<api::StatusResponse>;
    /// The runtime's container event stream (`GetContainerEvents`). Default: the runtime
    /// does not implement it (containerd 1.6).
    async fn container_events(&self) -> Result<ContainerEventStream> {
        Err(Error::Rpc {
            operation: "get_container_events",
            status: tonic::Status::unimplemented("GetContainerEvents"),
        })
    }
    /// The runtime's own configuration (`RuntimeConfig`: its cgroup driver). Default: the
    /// runtime does not implement it (containerd before 1.7).
    async fn runtime_config(&self) -> Result<api::RuntimeConfigResponse> {
        Err(Error::Rpc { operation: "runtime_config", status: tonic::Status::unimplemented("RuntimeConfig") })
    }
    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig, runtime_handler: String) -> Result<String>;
    async fn stop_pod_sandbox(&self, id: &str) -> Result<()>;
    async fn remove_pod_sandbox(&self, id: &str) -> Result<()>;
    async fn pod_sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus>;
    async fn list_pod_sandbox(&self, filter: Option<api::PodSandboxFilter>) -> Result<Vec<api::PodSandbox>>;
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String>;
    /// `CreateContainer` whose image volume mounts carry `image_sub_paths`
    /// ([`ImageSubPaths`]). Default: none may (a runtime double without the field).
    async fn create_container_with_image_sub_paths(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
        image_sub_paths: &ImageSubPaths,
    ) -> Result<String> {
        if image_sub_paths.is_empty() {
            return self.create_container(sandbox_id, config, sandbox_config).await;
        }
        Err(Error::Invalid("this runtime client cannot send an image volume's subPath (Mount.image_sub_path)".into()))
    }
    async fn start_container(&self, id: &str) -> Result<()>;
    /// Stops a container, giving it `timeout_secs` between SIGTERM and SIGKILL.
    async fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<()>;
    async fn remove_container(&self, id: &str) -> Result<()>;
    async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>>;
    async fn container_status(&self, id: &str) -> Result<api::ContainerStatus>;
    /// `None` when the image is not present (the CRI answers with an empty response).
    async fn image_status(&self, image: &str) -> Result<Option<api::Image>>;
    /// Every image the runtime has.
    async fn list_images(&self) -> Result<Vec<api::Image>>;
    /// Removes an image by id or reference (`RemoveImage`); an image that is already gone
    /// is not an error.
    async fn remove_image(&self, image: &str) -> Result<()>;
    /// The filesystems the runtime keeps images on (`ImageFsInfo`).
    async fn image_fs_info(&self) -> Result<api::ImageFsInfoResponse>;
    /// Runs `cmd` in a container and waits for it (`ExecSync`). `timeout` is the runtime's
    /// limit on the command (sent in whole seconds; zero means none); a non-zero exit code
    /// is a normal response, not an error.
    async fn exec_sync(&self, id: &str, cmd: Vec<String>, timeout: Duration) -> Result<api::ExecSyncResponse>;
    /// Asks the runtime to reopen a container's log file (`ReopenContainerLog`), after the
    /// kubelet renamed it for rotation: new output goes to a new file at the log path.
    async fn reopen_container_log(&self, id: &str) -> Result<()>;
    /// Changes the resources of a running container (`UpdateContainerResources`): in-place
    /// resize, the CPU manager's cpuset updates.
    async fn update_container_resources(&self, id: &str, linux: api::LinuxContainerResources) -> Result<()>;
    /// Prepares a streaming exec (`Exec`): the URL of the runtime's streaming server that
    /// serves it (SPDY or WebSocket, see [`crate::server`]).
    async fn exec(&self, request: api::ExecRequest) -> Result<String>;
    /// Prepares a streaming attach (`Attach`): the URL that serves it.
    async fn attach(&self, request: api::AttachRequest) -> Result<String>;
    /// Prepares port forwarding into a sandbox (`PortForward`): the URL that serves it.
    /// `ports` may be empty (SPDY clients name ports per stream).
    async fn port_forward(&self, sandbox_id: &str, ports: Vec<i32>) -> Result<String>;
    /// Pulls an image; returns the image reference the runtime stored it under.
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String>;
}
