//! [`KubeObjectSource`]: `ConfigMap`s, `Secret`s and service-account tokens from the API
//! server, for volumes and environment variables in API-server mode.
//!
//! `ConfigMap`s and `Secret`s come from a watch-based cache (upstream's default `Watch`
//! change-detection strategy): the first read of an object starts a watch of that one
//! object (`fieldSelector=metadata.name=<name>`, so the node never lists secrets it does
//! not use), later reads are served from the cache, and an update reaches the mounted
//! files on the next sync of the pods that use it. A watch unused for
//! [`CACHE_IDLE`] is stopped. Tokens come from the `TokenRequest` API, bound to the pod.
//! Services are listed and watched cluster-wide from the start, as upstream's service
//! informer does, for the service-link environment variables; `CSIDriver`s too, from the
//! first read of one (upstream's `CSIDriver` informer starts with the agent).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret, Service, ServiceAccount};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{reflector, watcher};

use crate::volumes::source::{BoundPod, Error, ObjectSource, Result, ServiceAccountToken};

/// How long a cached object's watch lives without a read (pods read their objects on
/// every sync, at least once per `syncFrequency`).
pub const CACHE_IDLE: Duration = Duration::from_mins(5);

/// What the cache knows of one object.
#[derive(Clone, Debug)]
enum Cached<K> {
    /// The watch has not listed yet (or is recovering from an error).
    Unsynced,
    Absent,
    Present(K),
}

struct CacheEntry<K> {
    value: Arc<std::sync::RwLock<Cached<K>>>,
    task: tokio::task::JoinHandle<()>,
    last_used: tokio::time::Instant,
}

/// Watch-backed cache of one kind of namespaced object.
struct ObjectCache<K> {
    entries: std::sync::Mutex<std::collections::HashMap<(String, String), CacheEntry<K>>>,
}

impl<K> Default for ObjectCache<K> {
    fn default() -> Self {
        Self { entries: std::sync::Mutex::default() }
    }
}

impl<K> ObjectCache<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default,
{
    /// The cached object once its watch has synced; `None` (not cached yet) otherwise,
    /// after starting the watch.
    fn cached(&self, client: &kube::Client, namespace: &str, name: &str) -> Cached<K> {
        use futures::StreamExt as _;
        let mut entries = self.entries.lock().unwrap();
        let now = tokio::time::Instant::now();
        entries.retain(|_, e| {
            let keep = now.duration_since(e.last_used) < CACHE_IDLE;
            if !keep {
                e.task.abort();
            }
            keep
        });
        let key = (namespace.to_string(), name.to_string());
        if let Some(e) = entries.get_mut(&key) {
            e.last_used = now;
            return e.value.read().unwrap().clone();
        }
        let value = Arc::new(std::sync::RwLock::new(Cached::Unsynced));
        let slot = value.clone();
        let api: Api<K> = Api::namespaced(client.clone(), namespace);
        let cfg = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = tokio::spawn(async move {
            let mut stream = kube::runtime::watcher(api, cfg).boxed();
            let mut listed: Option<K> = None;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(kube::runtime::watcher::Event::Init) => listed = None,
                    Ok(kube::runtime::watcher::Event::InitApply(o)) => listed = Some(o),
                    Ok(kube::runtime::watcher::Event::InitDone) => {
                        *slot.write().unwrap() = listed.take().map_or(Cached::Absent, Cached::Present);
                    }
                    Ok(kube::runtime::watcher::Event::Apply(o)) => *slot.write().unwrap() = Cached::Present(o),
                    Ok(kube::runtime::watcher::Event::Delete(_)) => *slot.write().unwrap() = Cached::Absent,
                    // kube-runtime backs off and retries; until it recovers, reads fall
                    // back to GETs.
                    Err(_) => *slot.write().unwrap() = Cached::Unsynced,
                }
            }
        });
        entries.insert(key, CacheEntry { value, task, last_used: now });
        Cached::Unsynced
    }
}

/// Every object of one kind in the cluster, from a reflector (upstream's informers): the
/// kubelet lists and watches every service, for the service-link environment variables,
/// and every `CSIDriver`, for its CSI volumes.
struct Lister<K: kube::Resource + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store: reflector::Store<K>,
    synced: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Lister<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    /// Starts the reflector; needs a tokio runtime. `what` names the kind in warnings.
    fn start(client: kube::Client, what: &'static str) -> Self {
        use futures::StreamExt as _;
        use kube::runtime::WatchStreamExt as _;
        let (store, writer) = reflector::store();
        let synced = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = synced.clone();
        let api: Api<K> = Api::all(client);
        let task = tokio::spawn(async move {
            let stream = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .modify(|o: &mut K| o.meta_mut().managed_fields = None)
                .reflect(writer);
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => flag.store(true, std::sync::atomic::Ordering::Release),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "watching {what}"),
                }
            }
        });
        Self { store, synced, task }
    }

    /// Whether the first list has completed.
    fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl<K: kube::Resource + Clone + 'static> Drop for Lister<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Object source backed by the API server.
#[derive(Clone)]
pub struct KubeObjectSource {
    client: kube::Client,
    config_maps: Arc<ObjectCache<ConfigMap>>,
    secrets: Arc<ObjectCache<Secret>>,
    services: Arc<Lister<Service>>,
    /// Started by the first read of a `CSIDriver`: a node without CSI volumes never
    /// watches them.
    csi_drivers: Arc<std::sync::OnceLock<Lister<CSIDriver>>>,
}

impl std::fmt::Debug for KubeObjectSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeObjectSource").finish_non_exhaustive()
    }
}

impl KubeObjectSource {
    /// A source on `client`; starts the service reflector, so it needs a tokio runtime.
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        let services = Arc::new(Lister::start(client.clone(), "services"));
        Self { client, config_maps: Arc::default(), secrets: Arc::default(), services, csi_drivers: Arc::default() }
    }
}

fn api_err(kind: &'static str, namespace: &str, name: &str, e: &kube::Error) -> Error {
    Error::Api { kind, namespace: namespace.into(), name: name.into(), message: e.to_string() }
}

#[async_trait]
impl ObjectSource for KubeObjectSource {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>> {
        match self.config_maps.cached(&self.client, namespace, name) {
            Cached::Present(c) => return Ok(Some(c)),
            Cached::Absent => return Ok(None),
            Cached::Unsynced => {}
        }
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| api_err("ConfigMap", namespace, name, &e))
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>> {
        match self.secrets.cached(&self.client, namespace, name) {
            Cached::Present(s) => return Ok(Some(s)),
            Cached::Absent => return Ok(None),
            Cached::Unsynced => {}
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| api_err("Secret", namespace, name, &e))
    }

    async fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        audiences: &[String],
        expiration_seconds: i64,
        pod: &BoundPod,
    ) -> Result<ServiceAccountToken> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let req = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: (!audiences.is_empty()).then(|| audiences.to_vec()),
                expiration_seconds: Some(expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name.clone()),
                    uid: Some(pod.uid.clone()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let out: TokenRequest = api
            .create_subresource("token", service_account, &PostParams::default(), &req)
            .await
            .map_err(|e| api_err("ServiceAccount", namespace, service_account, &e))?;
        let status = out.status.ok_or_else(|| Error::Api {
            kind: "ServiceAccount",
            namespace: namespace.into(),
            name: service_account.into(),
            message: "TokenRequest returned no status".into(),
        })?;
        let secs = status.expiration_timestamp.map_or(0, |t| t.0.as_second());
        let expiration = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        Ok(ServiceAccountToken { token: status.token.unwrap_or_default(), expiration })
    }

    fn services(&self) -> Option<Vec<Arc<Service>>> {
        self.services.synced().then(|| self.services.store.state())
    }

    /// Read from the API server on every call, as upstream's volume manager does when
    /// it adds a pod's claims: a claim's binding must be current, not cached.
    async fn persistent_volume_claim(&self, namespace: &str, name: &str) -> Result<Option<PersistentVolumeClaim>> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| api_err("PersistentVolumeClaim", namespace, name, &e))
    }

    async fn persistent_volume(&self, name: &str) -> Result<Option<PersistentVolume>> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        api.get_opt(name).await.map_err(|e| api_err("PersistentVolume", "", name, &e))
    }

    /// From the `CSIDriver` lister once it has listed (upstream reads its informer's
    /// lister; pods with CSI volumes read it at every sync), a GET until then.
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>> {
        let lister = self.csi_drivers.get_or_init(|| Lister::start(self.client.clone(), "CSIDrivers"));
        if lister.synced() {
            return Ok(lister.store.get(&reflector::ObjectRef::new(name)).map(|d| (*d).clone()));
        }
        let api: Api<CSIDriver> = Api::all(self.client.clone());
        api.get_opt(name).await.map_err(|e| api_err("CSIDriver", "", name, &e))
    }

    /// A node may read only the attachments the node authorizer relates to it (those whose
    /// `spec.nodeName` is this node): one the attach/detach controller has not made yet is
    /// `Forbidden`, not `NotFound`, and means the same, not attached yet.
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        match api.get_opt(name).await {
            Err(kube::Error::Api(status)) if status.code == 403 => Ok(None),
            other => other.map_err(|e| api_err("VolumeAttachment", "", name, &e)),
        }
    }

    async fn patch_claim_status(&self, namespace: &str, name: &str, patch: &serde_json::Value) -> Result<()> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        api.patch_status(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(|e| api_err("PersistentVolumeClaim", namespace, name, &e))
    }
}
