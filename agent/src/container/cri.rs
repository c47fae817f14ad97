//! [`RemoteRuntime`]: the CRI client over a unix socket (tonic).
//!
//! Every call carries the runtime request timeout (`runtimeRequestTimeout`, 2m by
//! default; `StopContainer` gets its grace period on top and `ExecSync` its command
//! timeout on top, image pulls and `ExecSync` without a timeout get none, as upstream)
//! and is recorded in `kubelet_runtime_operations_total`,
//! `kubelet_runtime_operations_duration_seconds` and
//! `kubelet_runtime_operations_errors_total` under the upstream `operation_type` names.
//! The channel connects lazily and reconnects on its own, so a runtime restart only
//! fails the calls made while it is down.
//!
//! Each call is also a trace span named after its gRPC method
//! (`runtime.v1.RuntimeService/RunPodSandbox`, with `rpc.*` attributes and the status
//! code; see [`crate::telemetry::cri_span`]) and sends its trace context to the runtime
//! (`traceparent`), as upstream's otelgrpc interceptor does. Both cost nothing when
//! tracing is off.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::Instrument as _;

mod image_sub_path;

use super::metrics::RuntimeOperationMetrics;
use super::{Error, Result, RuntimeService, api};
use crate::telemetry::{self, PropagateTraceContext};

/// The channel of both clients: each request carries its span's trace context.
type TracedChannel = InterceptedService<Channel, PropagateTraceContext>;

/// The kubelet's maximum gRPC message size for CRI (16 MiB).
const MAX_MSG_SIZE: usize = 16 * 1024 * 1024;

/// CRI client for one runtime endpoint.
#[derive(Clone, Debug)]
pub struct RemoteRuntime {
    runtime: RuntimeServiceClient<TracedChannel>,
    images: ImageServiceClient<TracedChannel>,
    /// The channel itself, for the call the bindings cannot make ([`image_sub_path`]).
    channel: TracedChannel,
    timeout: Duration,
    metrics: Arc<RuntimeOperationMetrics>,
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

/// The id a `CreateContainer` answered, which CRI requires.
fn created_id(resp: api::CreateContainerResponse) -> Result<String> {
    if resp.container_id.is_empty() {
        return Err(Error::MissingField { operation: "create_container", field: "container_id" });
    }
    Ok(resp.container_id)
}

impl RemoteRuntime {
    /// Creates a client for `endpoint` (e.g. `unix:///run/containerd/containerd.sock`).
    /// Connecting is lazy: this does not fail when the runtime is not up yet.
    pub fn new(endpoint: &str, timeout: Duration, metrics: Arc<RuntimeOperationMetrics>) -> Result<Self> {
        let path = socket_path(endpoint)?;
        // The URI is ignored by the connector; tonic needs a syntactically valid one.
        let channel = Endpoint::from_static("http://cri.invalid")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { tokio::net::UnixStream::connect(path).await.map(TokioIo::new) }
            }));
        let channel = InterceptedService::new(channel, PropagateTraceContext);
        Ok(Self {
            runtime: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MSG_SIZE)
                .max_encoding_message_size(MAX_MSG_SIZE),
            images: ImageServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MSG_SIZE)
                .max_encoding_message_size(MAX_MSG_SIZE),
            channel,
            timeout,
            metrics,
        })
    }

    /// Runs one CRI call with a deadline and records it: `operation` is the metrics'
    /// `operation_type`, `method` the full gRPC method (the span's name).
    async fn call<T, F>(
        &self,
        operation: &'static str,
        method: &'static str,
        timeout: Option<Duration>,
        fut: F,
    ) -> Result<T>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let span = telemetry::cri_span(method);
        let start = Instant::now();
        let result = async {
            match timeout {
                Some(t) => match tokio::time::timeout(t, fut).await {
                    Ok(r) => r.map_err(|status| Error::Rpc { operation, status }),
                    Err(_) => Err(Error::Timeout { operation, timeout: t }),
                },
                None => fut.await.map_err(|status| Error::Rpc { operation, status }),
            }
        }
        .instrument(span.clone())
        .await;
        self.metrics.observe_runtime_operation(operation, start.elapsed().as_secs_f64(), result.is_err());
        if !span.is_disabled() {
            match &result {
                Ok(_) => telemetry::record_grpc_status(&span, tonic::Code::Ok, ""),
                Err(Error::Rpc { status, .. }) => telemetry::record_grpc_status(&span, status.code(), status.message()),
                // Our own deadline: what a gRPC client deadline reports.
                Err(e) => telemetry::record_grpc_status(&span, tonic::Code::DeadlineExceeded, &e.to_string()),
            }
        }
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
        self.call("version", "runtime.v1.RuntimeService/Version", Some(self.timeout), c.version(req)).await
    }

    async fn status(&self, verbose: bool) -> Result<api::StatusResponse> {
        let mut c = self.runtime.clone();
        let req = api::StatusRequest { verbose };
        self.call("status", "runtime.v1.RuntimeService/Status", Some(self.timeout), c.status(req)).await
    }

    async fn container_events(&self) -> Result<super::ContainerEventStream> {
        use futures::StreamExt as _;
        let mut c = self.runtime.clone();
        // A stream lives as long as the agent: no deadline on it, only on opening it.
        let stream = self
            .call(
                "get_container_events",
                "runtime.v1.RuntimeService/GetContainerEvents",
                Some(self.timeout),
                c.get_container_events(api::GetEventsRequest {}),
            )
            .await?;
        Ok(Box::pin(stream.map(|item| item.map_err(|status| Error::Rpc { operation: "get_container_events", status }))))
    }

    async fn runtime_config(&self) -> Result<api::RuntimeConfigResponse> {
        let mut c = self.runtime.clone();
        let req = api::RuntimeConfigRequest {};
        self.call(
            "runtime_config",
            "runtime.v1.RuntimeService/RuntimeConfig",
            Some(self.timeout),
            c.runtime_config(req),
        )
        .await
    }

    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig, runtime_handler: String) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = api::RunPodSandboxRequest { config: Some(config), runtime_handler };
        // Upstream gives RunPodSandbox twice the normal timeout: CNI setup can be slow.
        let resp = self
            .call(
                "run_podsandbox",
                "runtime.v1.RuntimeService/RunPodSandbox",
                Some(self.timeout * 2),
                Box::pin(c.run_pod_sandbox(req)),
            )
            .await?;
        if resp.pod_sandbox_id.is_empty() {
            return Err(Error::MissingField { operation: "run_podsandbox", field: "pod_sandbox_id" });
        }
        Ok(resp.pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::StopPodSandboxRequest { pod_sandbox_id: id.into() };
        self.call(
            "stop_podsandbox",
            "runtime.v1.RuntimeService/StopPodSandbox",
            Some(self.timeout),
            c.stop_pod_sandbox(req),
        )
        .await?;
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::RemovePodSandboxRequest { pod_sandbox_id: id.into() };
        self.call(
            "remove_podsandbox",
            "runtime.v1.RuntimeService/RemovePodSandbox",
            Some(self.timeout),
            c.remove_pod_sandbox(req),
        )
        .await?;
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus> {
        let mut c = self.runtime.clone();
        let req = api::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: false };
        let resp = self
            .call(
                "podsandbox_status",
                "runtime.v1.RuntimeService/PodSandboxStatus",
                Some(self.timeout),
                c.pod_sandbox_status(req),
            )
            .await?;
        resp.status.ok_or(Error::MissingField { operation: "podsandbox_status", field: "status" })
    }

    async fn list_pod_sandbox(&self, filter: Option<api::PodSandboxFilter>) -> Result<Vec<api::PodSandbox>> {
        let mut c = self.runtime.clone();
        let req = api::ListPodSandboxRequest { filter };
        Ok(self
            .call(
                "list_podsandbox",
                "runtime.v1.RuntimeService/ListPodSandbox",
                Some(self.timeout),
                c.list_pod_sandbox(req),
            )
            .await?
            .items)
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
        let resp = self
            .call(
                "create_container",
                "runtime.v1.RuntimeService/CreateContainer",
                Some(self.timeout),
                Box::pin(c.create_container(req)),
            )
            .await?;
        created_id(resp)
    }

    async fn create_container_with_image_sub_paths(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
        image_sub_paths: &super::ImageSubPaths,
    ) -> Result<String> {
        if image_sub_paths.is_empty() {
            return self.create_container(sandbox_id, config, sandbox_config).await;
        }
        let req = image_sub_path::request(sandbox_id, config, sandbox_config, image_sub_paths);
        let mut grpc = tonic::client::Grpc::new(self.channel.clone())
            .max_decoding_message_size(MAX_MSG_SIZE)
            .max_encoding_message_size(MAX_MSG_SIZE);
        let create = async move {
            grpc.ready().await.map_err(|e| tonic::Status::unavailable(format!("CRI channel not ready: {e}")))?;
            let path = http::uri::PathAndQuery::from_static("/runtime.v1.RuntimeService/CreateContainer");
            let codec = tonic_prost::ProstCodec::<_, api::CreateContainerResponse>::default();
            grpc.unary(tonic::Request::new(req), path, codec).await
        };
        let resp = self
            .call("create_container", "runtime.v1.RuntimeService/CreateContainer", Some(self.timeout), Box::pin(create))
            .await?;
        created_id(resp)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::StartContainerRequest { container_id: id.into() };
        self.call(
            "start_container",
            "runtime.v1.RuntimeService/StartContainer",
            Some(self.timeout),
            c.start_container(req),
        )
        .await?;
        Ok(())
    }

    async fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::StopContainerRequest { container_id: id.into(), timeout: timeout_secs };
        let grace = Duration::from_secs(timeout_secs.max(0) as u64);
        self.call(
            "stop_container",
            "runtime.v1.RuntimeService/StopContainer",
            Some(self.timeout + grace),
            c.stop_container(req),
        )
        .await?;
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::RemoveContainerRequest { container_id: id.into() };
        self.call(
            "remove_container",
            "runtime.v1.RuntimeService/RemoveContainer",
            Some(self.timeout),
            c.remove_container(req),
        )
        .await?;
        Ok(())
    }

    async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>> {
        let mut c = self.runtime.clone();
        let req = api::ListContainersRequest { filter };
        Ok(self
            .call(
                "list_containers",
                "runtime.v1.RuntimeService/ListContainers",
                Some(self.timeout),
                c.list_containers(req),
            )
            .await?
            .containers)
    }

    /// Recorded as upstream's instrumented runtime does: operation `update_container`.
    async fn update_container_resources(&self, id: &str, linux: api::LinuxContainerResources) -> Result<()> {
        let mut c = self.runtime.clone();
        let req =
            api::UpdateContainerResourcesRequest { container_id: id.into(), linux: Some(linux), ..Default::default() };
        self.call(
            "update_container",
            "runtime.v1.RuntimeService/UpdateContainerResources",
            Some(self.timeout),
            c.update_container_resources(req),
        )
        .await?;
        Ok(())
    }

    async fn container_status(&self, id: &str) -> Result<api::ContainerStatus> {
        let mut c = self.runtime.clone();
        let req = api::ContainerStatusRequest { container_id: id.into(), verbose: false };
        let resp = self
            .call(
                "container_status",
                "runtime.v1.RuntimeService/ContainerStatus",
                Some(self.timeout),
                c.container_status(req),
            )
            .await?;
        resp.status.ok_or(Error::MissingField { operation: "container_status", field: "status" })
    }

    async fn image_status(&self, image: &str) -> Result<Option<api::Image>> {
        let mut c = self.images.clone();
        let req = api::ImageStatusRequest {
            image: Some(api::ImageSpec { image: image.into(), ..Default::default() }),
            verbose: false,
        };
        // containerd answers a missing image with an empty response, not NOT_FOUND.
        Ok(self
            .call("image_status", "runtime.v1.ImageService/ImageStatus", Some(self.timeout), c.image_status(req))
            .await?
            .image)
    }

    async fn list_images(&self) -> Result<Vec<api::Image>> {
        let mut c = self.images.clone();
        let req = api::ListImagesRequest { filter: None };
        Ok(self
            .call("list_images", "runtime.v1.ImageService/ListImages", Some(self.timeout), c.list_images(req))
            .await?
            .images)
    }

    async fn reopen_container_log(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::ReopenContainerLogRequest { container_id: id.into() };
        self.call(
            "reopen_container_log",
            "runtime.v1.RuntimeService/ReopenContainerLog",
            Some(self.timeout),
            c.reopen_container_log(req),
        )
        .await?;
        Ok(())
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        let mut c = self.images.clone();
        let req = api::RemoveImageRequest { image: Some(api::ImageSpec { image: image.into(), ..Default::default() }) };
        self.call("remove_image", "runtime.v1.ImageService/RemoveImage", Some(self.timeout), c.remove_image(req))
            .await
            .map(|_| ())
    }

    async fn image_fs_info(&self) -> Result<api::ImageFsInfoResponse> {
        let mut c = self.images.clone();
        self.call(
            "image_fs_info",
            "runtime.v1.ImageService/ImageFsInfo",
            Some(self.timeout),
            c.image_fs_info(api::ImageFsInfoRequest {}),
        )
        .await
    }

    async fn exec_sync(&self, id: &str, cmd: Vec<String>, timeout: Duration) -> Result<api::ExecSyncResponse> {
        let mut c = self.runtime.clone();
        let req = api::ExecSyncRequest { container_id: id.into(), cmd, timeout: timeout.as_secs() as i64 };
        // As upstream: the runtime enforces the command's timeout; the call itself gets the
        // request timeout on top so the runtime's DeadlineExceeded arrives before ours. No
        // timeout (lifecycle hooks) means no deadline at all.
        let deadline = (!timeout.is_zero()).then(|| self.timeout + timeout);
        let mut request = tonic::Request::new(req);
        if let Some(d) = deadline {
            request.set_timeout(d);
        }
        self.call("exec_sync", "runtime.v1.RuntimeService/ExecSync", deadline, c.exec_sync(request)).await
    }

    async fn exec(&self, request: api::ExecRequest) -> Result<String> {
        let mut c = self.runtime.clone();
        let resp = self.call("exec", "runtime.v1.RuntimeService/Exec", Some(self.timeout), c.exec(request)).await?;
        non_empty_url("exec", resp.url)
    }

    async fn attach(&self, request: api::AttachRequest) -> Result<String> {
        let mut c = self.runtime.clone();
        let resp =
            self.call("attach", "runtime.v1.RuntimeService/Attach", Some(self.timeout), c.attach(request)).await?;
        non_empty_url("attach", resp.url)
    }

    async fn port_forward(&self, sandbox_id: &str, ports: Vec<i32>) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = api::PortForwardRequest { pod_sandbox_id: sandbox_id.into(), port: ports };
        let resp = self
            .call("port_forward", "runtime.v1.RuntimeService/PortForward", Some(self.timeout), c.port_forward(req))
            .await?;
        non_empty_url("port_forward", resp.url)
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
        Ok(self
            .call("pull_image", "runtime.v1.ImageService/PullImage", None, Box::pin(c.pull_image(req)))
            .await?
            .image_ref)
    }
}

/// A streaming call's URL; the CRI contract requires one.
fn non_empty_url(operation: &'static str, url: String) -> Result<String> {
    if url.is_empty() { Err(Error::MissingField { operation, field: "url" }) } else { Ok(url) }
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

    /// A CRI runtime that only answers `ExecSync`: after `delay`, with `reply`; it records
    /// each request and its `grpc-timeout` header.
    #[derive(Clone)]
    struct ExecOnlyRuntime {
        delay: Duration,
        reply: Result<api::ExecSyncResponse, tonic::Status>,
        seen: Arc<std::sync::Mutex<Vec<SeenExec>>>,
        /// The `traceparent` of each request.
        traceparents: Arc<std::sync::Mutex<Vec<Option<String>>>>,
    }

    /// A request and its `grpc-timeout` header.
    type SeenExec = (api::ExecSyncRequest, Option<String>);

    type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

    impl tonic::server::UnaryService<api::ExecSyncRequest> for ExecOnlyRuntime {
        type Response = api::ExecSyncResponse;
        type Future = BoxFuture<Result<tonic::Response<Self::Response>, tonic::Status>>;

        fn call(&mut self, request: tonic::Request<api::ExecSyncRequest>) -> Self::Future {
            let this = self.clone();
            Box::pin(async move {
                let deadline = request.metadata().get("grpc-timeout").map(|v| v.to_str().unwrap().to_string());
                let traceparent = request.metadata().get("traceparent").map(|v| v.to_str().unwrap().to_string());
                this.traceparents.lock().unwrap().push(traceparent);
                this.seen.lock().unwrap().push((request.into_inner(), deadline));
                tokio::time::sleep(this.delay).await;
                this.reply.clone().map(tonic::Response::new)
            })
        }
    }

    impl tower::Service<http::Request<tonic::body::Body>> for ExecOnlyRuntime {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = BoxFuture<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            assert_eq!(req.uri().path(), "/runtime.v1.RuntimeService/ExecSync");
            let this = self.clone();
            Box::pin(
                async move { Ok(tonic::server::Grpc::new(tonic_prost::ProstCodec::default()).unary(this, req).await) },
            )
        }
    }

    /// Serves `runtime` on a socket in `dir`; returns a client with request timeout `timeout`.
    fn serve(
        dir: &std::path::Path,
        runtime: ExecOnlyRuntime,
        timeout: Duration,
    ) -> (RemoteRuntime, Arc<RuntimeOperationMetrics>) {
        let path = dir.join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .serve_with_incoming(runtime, tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let metrics = Arc::new(RuntimeOperationMetrics::default());
        let rt = RemoteRuntime::new(&format!("unix://{}", path.display()), timeout, metrics.clone()).unwrap();
        (rt, metrics)
    }

    fn exec_only(delay: Duration, reply: Result<api::ExecSyncResponse, tonic::Status>) -> ExecOnlyRuntime {
        ExecOnlyRuntime { delay, reply, seen: Arc::default(), traceparents: Arc::default() }
    }

    #[tokio::test]
    async fn exec_sync_sends_the_timeout_and_returns_the_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let reply = api::ExecSyncResponse { stdout: b"out".to_vec(), stderr: b"err".to_vec(), exit_code: 3 };
        let runtime = exec_only(Duration::ZERO, Ok(reply.clone()));
        let (rt, metrics) = serve(dir.path(), runtime.clone(), Duration::from_secs(2));
        let cmd = vec!["cat".to_string(), "/tmp/x".to_string()];
        assert_eq!(rt.exec_sync("c1", cmd.clone(), Duration::from_secs(3)).await.unwrap(), reply);
        assert_eq!(rt.exec_sync("c1", cmd.clone(), Duration::ZERO).await.unwrap(), reply);
        let seen = runtime.seen.lock().unwrap().clone();
        assert_eq!(seen[0].0, api::ExecSyncRequest { container_id: "c1".into(), cmd: cmd.clone(), timeout: 3 });
        // The call's deadline is the command timeout plus the request timeout (5s).
        let deadline = seen[0].1.as_deref().expect("a deadline is sent");
        let deadline_ms: u64 = match deadline.split_at(deadline.len() - 1) {
            (n, "m") => n.parse().unwrap(),
            (n, "u") => n.parse::<u64>().unwrap() / 1000,
            (n, "n") => n.parse::<u64>().unwrap() / 1_000_000,
            (n, "S") => n.parse::<u64>().unwrap() * 1000,
            other => panic!("unexpected grpc-timeout {other:?}"),
        };
        assert!((4_900..=5_000).contains(&deadline_ms), "{deadline}");
        assert_eq!(seen[1], (api::ExecSyncRequest { container_id: "c1".into(), cmd, timeout: 0 }, None));
        let labels = crate::metrics::OperationLabels { operation_type: "exec_sync".into() };
        assert_eq!(metrics.runtime_operations.get_or_create(&labels).get(), 2);
    }

    #[tokio::test]
    async fn exec_sync_deadlines() {
        let dir = tempfile::tempdir().unwrap();
        // The runtime's own DeadlineExceeded comes back as such.
        let runtime = exec_only(Duration::ZERO, Err(tonic::Status::deadline_exceeded("timeout 1s exceeded")));
        let (rt, _) = serve(dir.path(), runtime, Duration::from_millis(100));
        let err = rt.exec_sync("c1", vec!["sleep".into()], Duration::from_secs(1)).await.unwrap_err();
        assert!(matches!(&err, Error::Rpc { status, .. } if status.code() == tonic::Code::DeadlineExceeded), "{err}");

        // A runtime slower than the command timeout still answers within the call's
        // deadline (command timeout + request timeout)...
        let dir = tempfile::tempdir().unwrap();
        let slow = exec_only(Duration::from_millis(900), Ok(api::ExecSyncResponse::default()));
        let (rt, _) = serve(dir.path(), slow, Duration::from_millis(300));
        assert!(rt.exec_sync("c1", vec!["x".into()], Duration::from_secs(1)).await.is_ok());
        // ...but not past it.
        let dir = tempfile::tempdir().unwrap();
        let stuck = exec_only(Duration::from_secs(3), Ok(api::ExecSyncResponse::default()));
        let (rt, _) = serve(dir.path(), stuck, Duration::from_millis(300));
        let start = Instant::now();
        let err = rt.exec_sync("c1", vec!["x".into()], Duration::from_secs(1)).await.unwrap_err();
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(1_250) && took < Duration::from_secs(3), "{took:?} {err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_are_client_spans_that_send_their_trace_context() {
        use crate::telemetry::test_collector::{TestCollector, flush, pipeline, subscriber};
        let (collector, addr) = TestCollector::start().await;
        let telemetry = pipeline(addr, 1_000_000);
        let dir = tempfile::tempdir().unwrap();
        let runtime = exec_only(Duration::ZERO, Err(tonic::Status::deadline_exceeded("timeout 1s exceeded")));
        let (rt, metrics) = serve(dir.path(), runtime.clone(), Duration::from_secs(2));
        {
            let _subscriber = tracing::subscriber::set_default(subscriber(&telemetry));
            let sync = telemetry::sync_pod_span("uid-1", None, "sync");
            let err =
                rt.exec_sync("c1", vec!["true".into()], Duration::from_secs(1)).instrument(sync).await.unwrap_err();
            assert!(matches!(err, Error::Rpc { .. }), "{err}");
        }
        flush(&telemetry);
        let spans = collector.wait_for(2).await;
        let sync = spans.iter().find(|s| s.name == "syncPod").expect("syncPod");
        let exec = spans.iter().find(|s| s.name == "runtime.v1.RuntimeService/ExecSync").expect("the CRI span");
        assert_eq!(
            (exec.trace_id.as_str(), exec.parent_span_id.as_str()),
            (sync.trace_id.as_str(), sync.span_id.as_str())
        );
        assert_eq!(exec.kind, 3, "client");
        let int = |v| opentelemetry_proto::tonic::common::v1::any_value::Value::IntValue(v);
        let string = |v: &str| opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(v.to_owned());
        assert_eq!(exec.attributes["rpc.system"], string("grpc"));
        assert_eq!(exec.attributes["rpc.service"], string("runtime.v1.RuntimeService"));
        assert_eq!(exec.attributes["rpc.method"], string("ExecSync"));
        assert_eq!(exec.attributes["rpc.grpc.status_code"], int(4));
        assert_eq!(exec.status, (2, "timeout 1s exceeded".to_owned()));
        // The runtime received the CRI span's context.
        let sent = runtime.traceparents.lock().unwrap().clone();
        assert_eq!(sent, [Some(format!("00-{}-{}-01", exec.trace_id, exec.span_id))]);
        // The metrics are as before.
        let labels = crate::metrics::OperationLabels { operation_type: "exec_sync".into() };
        assert_eq!(metrics.runtime_operations_errors.get_or_create(&labels).get(), 1);
        tokio::task::block_in_place(|| telemetry.shutdown());
    }

    #[tokio::test]
    async fn without_tracing_no_trace_context_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = exec_only(Duration::ZERO, Ok(api::ExecSyncResponse::default()));
        let (rt, _) = serve(dir.path(), runtime.clone(), Duration::from_secs(2));
        rt.exec_sync("c1", vec!["true".into()], Duration::ZERO).await.unwrap();
        assert_eq!(runtime.traceparents.lock().unwrap().clone(), [None]);
    }

    #[tokio::test]
    async fn unreachable_runtime_is_an_error_and_counted() {
        let metrics = Arc::new(RuntimeOperationMetrics::default());
        let rt = RemoteRuntime::new("unix:///nonexistent/cri.sock", Duration::from_secs(2), metrics.clone()).unwrap();
        let err = rt.version().await.unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
        let labels = crate::metrics::OperationLabels { operation_type: "version".into() };
        assert_eq!(metrics.runtime_operations_errors.get_or_create(&labels).get(), 1);
    }
}
