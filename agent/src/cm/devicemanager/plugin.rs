//! The gRPC side of the device manager: the `Registration` service on `kubelet.sock`
//! (upstream `plugin/v1beta1/server.go`) and one client per registered plugin, whose
//! `ListAndWatch` stream feeds the manager's device lists (upstream `client.go`,
//! `endpoint.go`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint as TonicEndpoint, Server, Uri};
use tonic::{Request, Response, Status};

use super::proto::device_plugin_client::DevicePluginClient;
use super::proto::registration_server::{Registration, RegistrationServer};
use super::proto::{self, Empty, RegisterRequest};
use super::state::Endpoint;
use super::{Inner, VERSION};
use crate::types::resource_names::is_extended_resource_name;

/// How long dialing a plugin and each call to it may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The calls the manager makes to a plugin; the gRPC client, or a fake in tests.
#[async_trait::async_trait]
pub trait PluginApi: Send + Sync {
    /// `GetPreferredAllocation` for one container: the preferred device ids.
    async fn get_preferred_allocation(
        &self,
        req: proto::ContainerPreferredAllocationRequest,
    ) -> Result<Vec<String>, Status>;
    /// `Allocate` for one container.
    async fn allocate(&self, devices: Vec<String>) -> Result<proto::AllocateResponse, Status>;
    /// `PreStartContainer` for one container.
    async fn pre_start_container(&self, devices: Vec<String>) -> Result<(), Status>;
}

#[async_trait::async_trait]
impl PluginApi for DevicePluginClient<Channel> {
    async fn get_preferred_allocation(
        &self,
        req: proto::ContainerPreferredAllocationRequest,
    ) -> Result<Vec<String>, Status> {
        let mut c = self.clone();
        let req = timeout(proto::PreferredAllocationRequest { container_requests: vec![req] });
        let r = DevicePluginClient::get_preferred_allocation(&mut c, req).await?.into_inner();
        Ok(r.container_responses.into_iter().next().map(|c| c.device_i_ds).unwrap_or_default())
    }

    async fn allocate(&self, devices: Vec<String>) -> Result<proto::AllocateResponse, Status> {
        let mut c = self.clone();
        let req = proto::AllocateRequest {
            container_requests: vec![proto::ContainerAllocateRequest { devices_ids: devices }],
        };
        Ok(DevicePluginClient::allocate(&mut c, timeout(req)).await?.into_inner())
    }

    async fn pre_start_container(&self, devices: Vec<String>) -> Result<(), Status> {
        let mut c = self.clone();
        DevicePluginClient::pre_start_container(
            &mut c,
            timeout(proto::PreStartContainerRequest { devices_ids: devices }),
        )
        .await?;
        Ok(())
    }
}

fn timeout<T>(msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.set_timeout(CALL_TIMEOUT);
    r
}

/// Connects to the plugin (or kubelet) socket at `socket`.
///
/// # Errors
/// The transport error when nothing answers within the call timeout.
pub async fn connect_plugin(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_owned();
    // The URI is ignored by the connector; tonic needs a syntactically valid one.
    TonicEndpoint::from_static("http://device-plugin.invalid")
        .connect_timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

struct RegistrationService {
    inner: Arc<Inner>,
}

/// Upstream's checks of a registration request.
pub fn validate(r: &RegisterRequest) -> Result<(), String> {
    if r.version != VERSION {
        return Err(format!(
            "requested API version {:?} is not supported by kubelet. Supported version is [{VERSION:?}]",
            r.version
        ));
    }
    if !is_extended_resource_name(&r.resource_name) {
        return Err(format!("the ResourceName {:?} is invalid", r.resource_name));
    }
    // Upstream only joins the endpoint to the directory; a path that leaves the
    // directory is refused here too.
    let p = Path::new(&r.endpoint);
    if r.endpoint.is_empty() || p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir) {
        return Err(format!(
            "the endpoint {:?} is invalid: a socket path within the device plugin directory",
            r.endpoint
        ));
    }
    Ok(())
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        tracing::info!(resource = %r.resource_name, endpoint = %r.endpoint, "device plugin registration request");
        self.inner
            .metrics
            .registrations
            .get_or_create(&super::metrics::DevicePluginMetrics::labels(&r.resource_name))
            .inc();
        if let Err(e) = validate(&r) {
            tracing::warn!(resource = %r.resource_name, error = %e, "bad device plugin registration request");
            // A plain error, as upstream returns it (gRPC code Unknown).
            return Err(Status::unknown(e));
        }
        let socket = self.inner.dir.join(&r.endpoint);
        let channel = connect_plugin(&socket).await.map_err(|e| {
            tracing::warn!(socket = %socket.display(), error = %e, "cannot connect to the device plugin");
            Status::unavailable(format!("cannot connect to device plugin at {}: {e}", socket.display()))
        })?;
        let mut client = DevicePluginClient::new(channel);
        let options = client
            .get_device_plugin_options(timeout(Empty {}))
            .await
            .map_err(|e| Status::unavailable(format!("GetDevicePluginOptions failed: {}", e.message())))?
            .into_inner();
        let generation = {
            let mut s = self.inner.state.lock().unwrap();
            s.next_generation += 1;
            let generation = s.next_generation;
            // A second registration of a resource replaces the first plugin.
            s.endpoints.insert(
                r.resource_name.clone(),
                Endpoint { api: Some(Arc::new(client.clone())), options, stopped_at: None, generation },
            );
            s.healthy.entry(r.resource_name.clone()).or_default();
            s.unhealthy.entry(r.resource_name.clone()).or_default();
            generation
        };
        tokio::spawn(list_and_watch(self.inner.clone(), r.resource_name, client, generation));
        Ok(Response::new(Empty {}))
    }
}

/// Follows a plugin's device list until its stream ends (or the agent stops); then its
/// devices become unhealthy, unless a newer registration replaced it.
async fn list_and_watch(inner: Arc<Inner>, resource: String, mut client: DevicePluginClient<Channel>, generation: u64) {
    let current = |inner: &Inner| inner.state.lock().unwrap().endpoints.get(&resource).map(|e| e.generation);
    let stream = tokio::select! {
        () = inner.shutdown.cancelled() => return,
        s = client.list_and_watch(Empty {}) => s,
    };
    match stream {
        Ok(stream) => {
            let mut stream = stream.into_inner();
            loop {
                let msg = tokio::select! {
                    () = inner.shutdown.cancelled() => return,
                    m = stream.message() => m,
                };
                match msg {
                    Ok(Some(list)) => {
                        if current(&inner) != Some(generation) {
                            return;
                        }
                        tracing::info!(%resource, devices = list.devices.len(), "device plugin reported its devices");
                        let mut s = inner.state.lock().unwrap();
                        let changed = s.update_devices(&resource, list.devices);
                        inner.write_checkpoint(&s);
                        drop(s);
                        inner.health_changed(changed);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(%resource, error = %e, "device plugin ListAndWatch failed");
                        break;
                    }
                }
            }
        }
        Err(e) => tracing::warn!(%resource, error = %e, "device plugin ListAndWatch failed"),
    }
    let mut s = inner.state.lock().unwrap();
    if s.endpoints.get(&resource).map(|e| e.generation) == Some(generation) {
        tracing::warn!(%resource, "device plugin disconnected; its devices are unhealthy now");
        s.plugin_gone(&resource, Instant::now());
        inner.write_checkpoint(&s);
    }
}

/// Serves `Registration` on `listener` until the manager stops; then removes the socket.
pub async fn serve_registration(inner: Arc<Inner>, listener: std::os::unix::net::UnixListener) {
    let path = inner.dir.join(super::KUBELET_SOCKET);
    let listener = match UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "device plugin registration socket unusable");
            return;
        }
    };
    let shutdown = inner.shutdown.clone();
    let svc = RegistrationServer::new(RegistrationService { inner });
    if let Err(e) = Server::builder()
        .serve_with_incoming_shutdown(svc, UnixListenerStream::new(listener), shutdown.cancelled_owned())
        .await
    {
        tracing::error!(error = %e, "device plugin registration server failed");
    }
    let _ = std::fs::remove_file(&path);
}
