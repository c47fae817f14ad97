//! The DRA drivers' kubelet plugins registered on this node (upstream
//! `cm/dra/plugin`): which gRPC service each speaks, a lazily dialled channel to its
//! socket, the runtime the calls run on, and the calls themselves with their
//! `dra_grpc_operations_duration_seconds`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use tonic::transport::Channel;

use super::metrics::{DraMetrics, GrpcLabels};
use super::proto;

/// The `DRAPlugin` gRPC services the agent calls, newest first (upstream
/// `servicesSupportedByKubelet`). A plugin names the services it serves in the
/// registration's version list (`<proto package suffix>.<service>`).
pub const SUPPORTED_SERVICES: [&str; 2] = [Service::V1.name(), Service::V1Beta1.name()];

/// One `DRAPlugin` service version. v1beta1's messages are v1's without `Device.share_id`
/// (field 5), so one set of messages serves both; only the method paths differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    V1,
    V1Beta1,
}

impl Service {
    /// The name plugins register with (`v1.DRAPlugin`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::V1 => "v1.DRAPlugin",
            Self::V1Beta1 => "v1beta1.DRAPlugin",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::V1, Self::V1Beta1].into_iter().find(|s| s.name() == name)
    }

    /// The full gRPC method path of `method` (`NodePrepareResources`).
    #[must_use]
    pub fn path(self, method: &str) -> String {
        let package = match self {
            Self::V1 => "k8s.io.kubelet.pkg.apis.dra.v1",
            Self::V1Beta1 => "k8s.io.kubelet.pkg.apis.dra.v1beta1",
        };
        format!("/{package}.DRAPlugin/{method}")
    }
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_quoted(list: &[impl AsRef<str>]) -> String {
    let items: Vec<String> = list.iter().map(|s| format!("{:?}", s.as_ref())).collect();
    format!("[{}]", items.join(" "))
}

/// The service to call a plugin with: the first of the plugin's list that the agent
/// speaks (upstream `validateSupportedServices`; the plugin lists newest first).
///
/// # Errors
/// Upstream's message when the list is empty or has nothing the agent speaks.
pub fn choose_service(services: &[String]) -> Result<Service, String> {
    if services.is_empty() {
        return Err("empty list of supported gRPC services (aka supported versions)".into());
    }
    services.iter().find_map(|s| Service::from_name(s)).ok_or_else(|| {
        format!(
            "none of services supported by the plugin ({}) are supported by the kubelet ({})",
            go_quoted(services),
            go_quoted(&SUPPORTED_SERVICES)
        )
    })
}

/// One registered plugin of a driver.
#[derive(Clone, Debug)]
pub struct Plugin {
    pub driver: String,
    pub endpoint: PathBuf,
    pub service: Service,
    channel: Channel,
    /// Stops the watch of its health stream (cancelled when it goes or is replaced).
    pub health_stop: tokio_util::sync::CancellationToken,
}

/// The registered plugins by driver name, in registration order.
#[derive(Debug)]
pub struct Plugins {
    store: Mutex<HashMap<String, Vec<Plugin>>>,
    runtime: OnceLock<crate::pluginmanager::calls::CallRuntime>,
    call_timeout: Duration,
}

impl Plugins {
    pub fn new(call_timeout: Duration) -> Self {
        Self { store: Mutex::default(), runtime: OnceLock::new(), call_timeout }
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.get_or_init(|| crate::pluginmanager::calls::CallRuntime::start("dra-calls")).handle()
    }

    /// Spawns `task` on the call runtime (a plugin's health stream).
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        drop(self.handle().spawn(task));
    }

    /// Runs `call` on the call runtime.
    pub async fn run<T: Send + 'static>(&self, call: impl Future<Output = T> + Send + 'static) -> T {
        self.handle().spawn(call).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }

    /// Records a plugin of `driver` at `endpoint` speaking `service`. A plugin already
    /// known at that endpoint is replaced (it restarted; its health watch stops). Returns
    /// the token that stops the new plugin's health watch.
    pub fn add(&self, driver: &str, endpoint: &Path, service: Service) -> tokio_util::sync::CancellationToken {
        // The channel's worker is spawned on the call runtime, with the calls. Entering
        // the runtime instead of awaiting a task there keeps registration free of waits.
        let channel = {
            let _runtime = self.handle().enter();
            crate::pluginmanager::calls::unix_channel(endpoint, self.call_timeout)
        };
        let health_stop = tokio_util::sync::CancellationToken::new();
        let plugin = Plugin {
            driver: driver.to_owned(),
            endpoint: endpoint.to_owned(),
            service,
            channel,
            health_stop: health_stop.clone(),
        };
        let mut store = self.store.lock().unwrap();
        let list = store.entry(driver.to_owned()).or_default();
        list.retain(|p| {
            let replaced = p.endpoint == endpoint;
            if replaced {
                p.health_stop.cancel();
            }
            !replaced
        });
        list.push(plugin);
        health_stop
    }

    /// Forgets the oldest plugin of `driver` and returns it (`None`: the driver had none).
    /// The plugin manager names the driver, not the socket: during a rolling update
    /// (new plugin registered before the old one leaves) the one leaving is the older.
    pub fn remove_oldest(&self, driver: &str) -> Option<Plugin> {
        let mut store = self.store.lock().unwrap();
        let list = store.get_mut(driver)?;
        let gone = (!list.is_empty()).then(|| list.remove(0));
        if list.is_empty() {
            store.remove(driver);
        }
        if let Some(p) = &gone {
            p.health_stop.cancel();
        }
        gone
    }

    /// Whether `driver` has a plugin.
    pub fn is_registered(&self, driver: &str) -> bool {
        self.store.lock().unwrap().get(driver).is_some_and(|l| !l.is_empty())
    }

    /// The newest plugin of `driver` (upstream `GetPlugin`).
    pub fn get(&self, driver: &str) -> Result<Plugin, super::ClaimError> {
        if driver.is_empty() {
            return Err(super::ClaimError::EmptyDriverName);
        }
        self.store
            .lock()
            .unwrap()
            .get(driver)
            .and_then(|l| l.last().cloned())
            .ok_or_else(|| super::ClaimError::DriverNotRegistered { driver: driver.to_owned() })
    }

    /// Calls `method` of `plugin` with `request` on the call runtime, and records the
    /// call's duration with its status code (upstream's client interceptor).
    pub async fn call<Req, Resp>(
        &self,
        plugin: &Plugin,
        method: &'static str,
        request: Req,
        metrics: &DraMetrics,
    ) -> Result<Resp, tonic::Status>
    where
        Req: prost::Message + Send + 'static,
        Resp: prost::Message + Default + Send + 'static,
    {
        let path = plugin.service.path(method);
        let channel = plugin.channel.clone();
        let started = Instant::now();
        let uri_path = path.clone();
        let result = self
            .run(async move {
                let path = PathAndQuery::try_from(uri_path).map_err(|e| tonic::Status::internal(e.to_string()))?;
                let mut grpc = tonic::client::Grpc::new(channel);
                grpc.ready().await.map_err(|e| tonic::Status::unavailable(format!("connection error: {e}")))?;
                let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
                grpc.unary(tonic::Request::new(request), path, codec).await.map(tonic::Response::into_inner)
            })
            .await;
        let code = result.as_ref().map_or_else(tonic::Status::code, |_| tonic::Code::Ok);
        let labels = GrpcLabels {
            driver_name: plugin.driver.clone(),
            grpc_status_code: crate::container::go_code_name(code).to_owned(),
            method_name: path,
        };
        metrics.grpc_operations_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
        result
    }

    /// `NodePrepareResources` of `claims`.
    pub async fn node_prepare(
        &self,
        plugin: &Plugin,
        claims: Vec<proto::Claim>,
        metrics: &DraMetrics,
    ) -> Result<proto::NodePrepareResourcesResponse, tonic::Status> {
        self.call(plugin, "NodePrepareResources", proto::NodePrepareResourcesRequest { claims }, metrics).await
    }

    /// `NodeUnprepareResources` of `claims`.
    pub async fn node_unprepare(
        &self,
        plugin: &Plugin,
        claims: Vec<proto::Claim>,
        metrics: &DraMetrics,
    ) -> Result<proto::NodeUnprepareResourcesResponse, tonic::Status> {
        self.call(plugin, "NodeUnprepareResources", proto::NodeUnprepareResourcesRequest { claims }, metrics).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_plugins_first_known_service_is_chosen() {
        // What the kubeletplugin helper advertises by default.
        let helper = list(&["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]);
        assert_eq!(choose_service(&helper), Ok(Service::V1));
        assert_eq!(choose_service(&list(&["v1beta1.DRAPlugin"])), Ok(Service::V1Beta1));
        assert_eq!(choose_service(&list(&["v1alpha4.DRAPlugin", "v1beta1.DRAPlugin"])), Ok(Service::V1Beta1));
        assert_eq!(
            choose_service(&list(&["v1alpha4.DRAPlugin", "1.0.0"])).unwrap_err(),
            "none of services supported by the plugin ([\"v1alpha4.DRAPlugin\" \"1.0.0\"]) are supported by the kubelet ([\"v1.DRAPlugin\" \"v1beta1.DRAPlugin\"])"
        );
        assert_eq!(choose_service(&[]).unwrap_err(), "empty list of supported gRPC services (aka supported versions)");
    }

    #[test]
    fn method_paths() {
        assert_eq!(
            Service::V1.path("NodePrepareResources"),
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
        );
        assert_eq!(
            Service::V1Beta1.path("NodeUnprepareResources"),
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"
        );
    }
}
