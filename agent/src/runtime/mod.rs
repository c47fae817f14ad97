//! The container runtime side of the kubelet (`pkg/kubelet/kuberuntime`): a CRI client
//! ([`RemoteRuntime`]) behind the [`RuntimeService`] trait, the runtime view of a pod
//! ([`RuntimePodStatus`]), the labels that tie CRI objects back to pods, the
//! crash-loop [`Backoff`], and the [`RuntimeManager`] that turns a pod spec plus the
//! runtime's state into CRI calls (`SyncPod`, `KillPod`).

pub mod backoff;
pub mod cri;
pub mod fake;
pub mod labels;
pub mod manager;
pub mod pod_status;

use std::time::Duration;

use async_trait::async_trait;
pub use k8s_cri::v1 as api;

pub use backoff::Backoff;
pub use cri::RemoteRuntime;
pub use manager::{RuntimeManager, SyncResult};
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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The CRI calls the kubelet makes, one method per RPC. The real implementation is
/// [`RemoteRuntime`]; [`fake::FakeRuntime`] keeps state in memory for unit tests.
#[async_trait]
pub trait RuntimeService: Send + Sync + std::fmt::Debug {
    async fn version(&self) -> Result<api::VersionResponse>;
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
    /// Runs `cmd` in a container and waits for it (`ExecSync`). `timeout` is the runtime's
    /// limit on the command (sent in whole seconds; zero means none); a non-zero exit code
    /// is a normal response, not an error.
    async fn exec_sync(&self, id: &str, cmd: Vec<String>, timeout: Duration) -> Result<api::ExecSyncResponse>;
    /// The runtime's image (and, if separate, container) filesystems (`ImageFsInfo`).
    /// Runtimes that do not answer it report `Unimplemented`.
    async fn image_fs_info(&self) -> Result<api::ImageFsInfoResponse> {
        Err(Error::Rpc { operation: "image_fs_info", status: tonic::Status::unimplemented("ImageFsInfo") })
    }
    /// Pulls an image; returns the image reference the runtime stored it under.
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String>;
}
