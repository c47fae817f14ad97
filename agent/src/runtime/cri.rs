//! [`RemoteRuntime`]: the CRI client over a unix socket (tonic).
//!
//! Every call carries the runtime request timeout (`runtimeRequestTimeout`, 2m by
//! default; `StopContainer` gets its grace period on top, image pulls have none, as
//! upstream) and is recorded in `kubelet_runtime_operations_total`,
//! `kubelet_runtime_operations_duration_seconds` and
//! `kubelet_runtime_operations_errors_total` under the upstream `operation_type` names.
//! The channel connects lazily and reconnects on its own, so a runtime restart only
//! fails the calls made while it is down.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

use super::{Error, Result, RuntimeService, api};
use crate::metrics::KubeletMetrics;

/// The kubelet's maximum gRPC message size for CRI (16 MiB).
const MAX_MSG_SIZE: usize = 16 * 1024 * 1024;

/// CRI client for one runtime endpoint.
#[derive(Clone, Debug)]
pub struct RemoteRuntime {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    timeout: Duration,
    metrics: Arc<KubeletMetrics>,
}

/// Turns `unix:///path` (or a bare absolute path) into the socket path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if endpoint.contains("://") {
        return Err(Error::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            reason: "only unix:// endpoints are supported on Linux",
        });
    } else {
        endpoint
    };
    if !path.starts_with('/') {
        return Err(Error::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            reason: "the socket path must be absolute",
        });
    }
    Ok(PathBuf::from(path))
}

impl RemoteRuntime {
    /// Creates a client for `endpoint` (e.g. `unix:///run/containerd/containerd.sock`).
    /// Connecting is lazy: this does not fail when the runtime is not up yet.
    pub fn new(endpoint: &str, timeout: Duration, metrics: Arc<KubeletMetrics>) -> Result<Self> {
        let path = socket_path(endpoint)?;
        // The URI is ignored by the connector; tonic needs a syntactically valid one.
        let channel = Endpoint::from_static("http://cri.invalid")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { tokio::net::UnixStream::connect(path).await.map(TokioIo::new) }
            }));
        Ok(Self {
            runtime: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MSG_SIZE)
                .max_encoding_message_size(MAX_MSG_SIZE),
            images: ImageServiceClient::new(channel)
                .max_decoding_message_size(MAX_MSG_SIZE)
                .max_encoding_message_size(MAX_MSG_SIZE),
            timeout,
            metrics,
        })
    }

    /// Runs one CRI call with a deadline and records it.
    async fn call<T, F>(&self, operation: &'static str, timeout: Option<Duration>, fut: F) -> Result<T>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let start = Instant::now();
        let result = match timeout {
            Some(t) => match tokio::time::timeout(t, fut).await {
                Ok(r) => r.map_err(|status| Error::Rpc { operation, status }),
                Err(_) => Err(Error::Timeout { operation, timeout: t }),
            },
            None => fut.await.map_err(|status| Error::Rpc { operation, status }),
        };
        self.metrics.observe_runtime_operation(operation, start.elapsed().as_secs_f64(), result.is_err());
        if let Err(e) = &result {
            tracing::debug!(operation, error = %e, "CRI call failed");
        }
        result.map(tonic::Response::into_inner)
    }
}

#[async_trait]
impl RuntimeService for RemoteRuntime {
    async fn version(&self) -> Result<api::VersionResponse> {
        let mut c = self.runtime.clone();
        let req = api::VersionRequest { version: "v1".into() };
        self.call("version", Some(self.timeout), c.version(req)).await
    }

    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig, runtime_handler: String) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = api::RunPodSandboxRequest { config: Some(config), runtime_handler };
        // Upstream gives RunPodSandbox twice the normal timeout: CNI setup can be slow.
        let resp = self.call("run_podsandbox", Some(self.timeout * 2), c.run_pod_sandbox(req)).await?;
        if resp.pod_sandbox_id.is_empty() {
            return Err(Error::MissingField { operation: "run_podsandbox", field: "pod_sandbox_id" });
        }
        Ok(resp.pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::StopPodSandboxRequest { pod_sandbox_id: id.into() };
        self.call("stop_podsandbox", Some(self.timeout), c.stop_pod_sandbox(req)).await?;
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::RemovePodSandboxRequest { pod_sandbox_id: id.into() };
        self.call("remove_podsandbox", Some(self.timeout), c.remove_pod_sandbox(req)).await?;
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus> {
        let mut c = self.runtime.clone();
        let req = api::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: false };
        let resp = self.call("podsandbox_status", Some(self.timeout), c.pod_sandbox_status(req)).await?;
        resp.status.ok_or(Error::MissingField { operation: "podsandbox_status", field: "status" })
    }

    async fn list_pod_sandbox(&self, filter: Option<api::PodSandboxFilter>) -> Result<Vec<api::PodSandbox>> {
        let mut c = self.runtime.clone();
        let req = api::ListPodSandboxRequest { filter };
        Ok(self.call("list_podsandbox", Some(self.timeout), c.list_pod_sandbox(req)).await?.items)
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let resp = self.call("create_container", Some(self.timeout), Box::pin(c.create_container(req))).await?;
        if resp.container_id.is_empty() {
            return Err(Error::MissingField { operation: "create_container", field: "container_id" });
        }
        Ok(resp.container_id)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::StartContainerRequest { container_id: id.into() };
        self.call("start_container", Some(self.timeout), c.start_container(req)).await?;
        Ok(())
    }

    async fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::StopContainerRequest { container_id: id.into(), timeout: timeout_secs };
        let grace = Duration::from_secs(timeout_secs.max(0) as u64);
        self.call("stop_container", Some(self.timeout + grace), c.stop_container(req)).await?;
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::RemoveContainerRequest { container_id: id.into() };
        self.call("remove_container", Some(self.timeout), c.remove_container(req)).await?;
        Ok(())
    }

    async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>> {
        let mut c = self.runtime.clone();
        let req = api::ListContainersRequest { filter };
        Ok(self.call("list_containers", Some(self.timeout), c.list_containers(req)).await?.containers)
    }

    async fn container_status(&self, id: &str) -> Result<api::ContainerStatus> {
        let mut c = self.runtime.clone();
        let req = api::ContainerStatusRequest { container_id: id.into(), verbose: false };
        let resp = self.call("container_status", Some(self.timeout), c.container_status(req)).await?;
        resp.status.ok_or(Error::MissingField { operation: "container_status", field: "status" })
    }

    async fn image_status(&self, image: &str) -> Result<Option<api::Image>> {
        let mut c = self.images.clone();
        let req = api::ImageStatusRequest {
            image: Some(api::ImageSpec { image: image.into(), ..Default::default() }),
            verbose: false,
        };
        // containerd answers a missing image with an empty response, not NOT_FOUND.
        Ok(self.call("image_status", Some(self.timeout), c.image_status(req)).await?.image)
    }

    async fn list_images(&self) -> Result<Vec<api::Image>> {
        let mut c = self.images.clone();
        let req = api::ListImagesRequest { filter: None };
        Ok(self.call("list_images", Some(self.timeout), c.list_images(req)).await?.images)
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String> {
        let mut c = self.images.clone();
        let req = api::PullImageRequest {
            image: Some(api::ImageSpec { image: image.into(), ..Default::default() }),
            auth,
            sandbox_config,
        };
        // Pulls have no deadline upstream: a large image on a slow link is not an error.
        Ok(self.call("pull_image", None, Box::pin(c.pull_image(req))).await?.image_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(socket_path("unix:///run/c.sock").unwrap(), PathBuf::from("/run/c.sock"));
        assert_eq!(socket_path("/run/c.sock").unwrap(), PathBuf::from("/run/c.sock"));
        assert!(socket_path("tcp://1.2.3.4:5").unwrap_err().to_string().contains("unix://"));
        assert!(socket_path("relative.sock").is_err());
    }

    #[tokio::test]
    async fn unreachable_runtime_is_an_error_and_counted() {
        let metrics = Arc::new(KubeletMetrics::unregistered());
        let rt = RemoteRuntime::new("unix:///nonexistent/cri.sock", Duration::from_secs(2), metrics.clone()).unwrap();
        let err = rt.version().await.unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
        let labels = crate::metrics::OperationLabels { operation_type: "version".into() };
        assert_eq!(metrics.runtime_operations_errors.get_or_create(&labels).get(), 1);
    }
}
