//! Where volumes and environment variables get API objects from: `ConfigMap`s, `Secret`s and
//! service account tokens (upstream: the kubelet's `configmap.Manager`, `secret.Manager` and
//! the `TokenRequest` call of `token.Manager`).
//!
//! [`ObjectSource`] is the boundary: [`NoApiServer`] is the standalone implementation
//! (every call fails with an error that says why), [`FakeObjectSource`] keeps objects in
//! memory for tests, and an API-server-backed implementation plugs in behind the same trait.
//! "Not found" is `Ok(None)`, so that callers apply `optional` exactly as upstream does: only
//! a missing object is excused, never a failure to ask.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

use crate::container::backoff::{Clock, SystemClock};

/// Errors of an [`ObjectSource`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// There is no API server to ask (standalone mode: static pods only).
    #[error("{kind} {namespace}/{name}: no API server (standalone mode)")]
    NoApiServer {
        /// `ConfigMap`, `Secret` or `ServiceAccount`.
        kind: &'static str,
        /// The pod's namespace.
        namespace: String,
        /// The object's name.
        name: String,
    },
    /// The API server answered with an error (or a fake was told to fail).
    #[error("{kind} {namespace}/{name}: {message}")]
    Api {
        /// `ConfigMap`, `Secret` or `ServiceAccount`.
        kind: &'static str,
        /// The pod's namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// What the API server said.
        message: String,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The pod a service account token is bound to (upstream `BoundObjectReference` of kind Pod):
/// the token stops being valid when this pod is deleted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BoundPod {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
}

/// A token from the `TokenRequest` API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountToken {
    /// The token (a JWT).
    pub token: String,
    /// When it expires (`status.expirationTimestamp`).
    pub expiration: SystemTime,
}

/// Reads the API objects that pods refer to.
#[async_trait]
pub trait ObjectSource: Send + Sync + std::fmt::Debug {
    /// The `ConfigMap` `namespace/name`; `Ok(None)` when it does not exist.
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>>;
    /// The `Secret` `namespace/name`; `Ok(None)` when it does not exist.
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>>;
    /// A token for `namespace/service_account` (`TokenRequest`), with the given audiences
    /// (empty: the API server's default) and lifetime, bound to `pod`.
    async fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        audiences: &[String],
        expiration_seconds: i64,
        pod: &BoundPod,
    ) -> Result<ServiceAccountToken>;
    /// Every `Service` of the cluster, for service-link environment variables (upstream's
    /// service lister); `None` while the first list has not completed.
    fn services(&self) -> Option<Vec<Arc<Service>>>;
    /// The `PersistentVolumeClaim` `namespace/name`; `Ok(None)` when it does not exist.
    async fn persistent_volume_claim(&self, namespace: &str, name: &str) -> Result<Option<PersistentVolumeClaim>>;
    /// The `PersistentVolume` `name`; `Ok(None)` when it does not exist.
    async fn persistent_volume(&self, name: &str) -> Result<Option<PersistentVolume>>;
    /// The `CSIDriver` `name`; `Ok(None)` when it does not exist.
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>>;
    /// The `VolumeAttachment` `name`; `Ok(None)` when it does not exist.
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>>;
    /// Applies a JSON merge patch to the status of claim `namespace/name` (the node
    /// finishing a volume expansion).
    async fn patch_claim_status(&self, namespace: &str, name: &str, patch: &serde_json::Value) -> Result<()>;
}

/// The standalone source: there is no API server, so every object is unavailable. Static
/// pods that only use emptyDir/hostPath volumes and plain env values never ask it.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoApiServer;

#[async_trait]
impl ObjectSource for NoApiServer {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>> {
        Err(Error::NoApiServer { kind: "ConfigMap", namespace: namespace.into(), name: name.into() })
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>> {
        Err(Error::NoApiServer { kind: "Secret", namespace: namespace.into(), name: name.into() })
    }

    async fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        _audiences: &[String],
        _expiration_seconds: i64,
        _pod: &BoundPod,
    ) -> Result<ServiceAccountToken> {
        Err(Error::NoApiServer { kind: "ServiceAccount", namespace: namespace.into(), name: service_account.into() })
    }

    /// Without an API server there are no services (upstream: no service env vars).
    fn services(&self) -> Option<Vec<Arc<Service>>> {
        Some(Vec::new())
    }

    async fn persistent_volume_claim(&self, namespace: &str, name: &str) -> Result<Option<PersistentVolumeClaim>> {
        Err(Error::NoApiServer { kind: "PersistentVolumeClaim", namespace: namespace.into(), name: name.into() })
    }

    async fn persistent_volume(&self, name: &str) -> Result<Option<PersistentVolume>> {
        Err(Error::NoApiServer { kind: "PersistentVolume", namespace: String::new(), name: name.into() })
    }

    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>> {
        Err(Error::NoApiServer { kind: "CSIDriver", namespace: String::new(), name: name.into() })
    }

    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>> {
        Err(Error::NoApiServer { kind: "VolumeAttachment", namespace: String::new(), name: name.into() })
    }

    async fn patch_claim_status(&self, namespace: &str, name: &str, _patch: &serde_json::Value) -> Result<()> {
        Err(Error::NoApiServer { kind: "PersistentVolumeClaim", namespace: namespace.into(), name: name.into() })
    }
}

/// One `TokenRequest` a [`FakeObjectSource`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequestRecord {
    /// Namespace of the service account.
    pub namespace: String,
    /// Service account name.
    pub service_account: String,
    /// Requested audiences.
    pub audiences: Vec<String>,
    /// Requested lifetime.
    pub expiration_seconds: i64,
    /// The pod the token is bound to.
    pub pod: BoundPod,
}

#[derive(Debug)]
struct FakeState {
    config_maps: HashMap<(String, String), ConfigMap>,
    secrets: HashMap<(String, String), Secret>,
    tokens: Vec<TokenRequestRecord>,
    failure: Option<String>,
    /// Token requests fail with this (an API error) while it is set.
    token_failure: Option<String>,
    /// `None`: the service list has not synced.
    services: Option<Vec<Arc<Service>>>,
    /// Storage objects by (namespace, kind, name); cluster-scoped ones with namespace "".
    storage: HashMap<(String, &'static str, String), serde_json::Value>,
}

impl Default for FakeState {
    fn default() -> Self {
        Self {
            config_maps: HashMap::new(),
            secrets: HashMap::new(),
            tokens: Vec::new(),
            failure: None,
            token_failure: None,
            services: Some(Vec::new()),
            storage: HashMap::new(),
        }
    }
}

/// In-memory [`ObjectSource`] for tests: objects are set and removed at will; tokens are
/// `token-<n>` strings that expire `expiration_seconds` after the injected clock's now.
#[derive(Debug, Clone)]
pub struct FakeObjectSource {
    state: Arc<Mutex<FakeState>>,
    clock: Arc<dyn Clock>,
}

impl Default for FakeObjectSource {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeObjectSource {
    /// An empty source on the wall clock.
    #[must_use]
    pub fn new() -> Self {
        Self { state: Arc::default(), clock: Arc::new(SystemClock) }
    }

    /// Issues tokens relative to `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Adds or replaces a `ConfigMap` (keyed by its metadata namespace and name).
    pub fn set_config_map(&self, cm: ConfigMap) {
        let key = (cm.metadata.namespace.clone().unwrap_or_default(), cm.metadata.name.clone().unwrap_or_default());
        self.state.lock().unwrap().config_maps.insert(key, cm);
    }

    /// Deletes a `ConfigMap`.
    pub fn remove_config_map(&self, namespace: &str, name: &str) {
        self.state.lock().unwrap().config_maps.remove(&(namespace.into(), name.into()));
    }

    /// Adds or replaces a `Secret` (keyed by its metadata namespace and name).
    pub fn set_secret(&self, secret: Secret) {
        let key =
            (secret.metadata.namespace.clone().unwrap_or_default(), secret.metadata.name.clone().unwrap_or_default());
        self.state.lock().unwrap().secrets.insert(key, secret);
    }

    /// Deletes a `Secret`.
    pub fn remove_secret(&self, namespace: &str, name: &str) {
        self.state.lock().unwrap().secrets.remove(&(namespace.into(), name.into()));
    }

    /// Replaces the services; `None` makes the service list unsynced.
    pub fn set_services(&self, services: Option<Vec<Service>>) {
        self.state.lock().unwrap().services = services.map(|v| v.into_iter().map(Arc::new).collect());
    }

    /// Adds or replaces a storage object (`PersistentVolumeClaim`, `PersistentVolume`,
    /// `CSIDriver`, `VolumeAttachment`), keyed by its namespace and name.
    pub fn set_storage_object<K: kube::Resource<DynamicType = ()> + serde::Serialize>(&self, object: &K) {
        let meta = object.meta();
        let key = (meta.namespace.clone().unwrap_or_default(), kind_of::<K>(), meta.name.clone().unwrap_or_default());
        let value = serde_json::to_value(object).expect("API objects serialize");
        self.state.lock().unwrap().storage.insert(key, value);
    }

    /// Deletes a storage object.
    pub fn remove_storage_object<K: kube::Resource<DynamicType = ()>>(&self, namespace: &str, name: &str) {
        self.state.lock().unwrap().storage.remove(&(namespace.into(), kind_of::<K>(), name.into()));
    }

    fn storage_object<K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<K>> {
        let kind = kind_of::<K>();
        self.check(kind, namespace, name)?;
        let state = self.state.lock().unwrap();
        let found = state.storage.get(&(namespace.into(), kind, name.into()));
        Ok(found.map(|v| serde_json::from_value(v.clone()).expect("stored from the same type")))
    }

    /// Makes every call fail with `message` (an API error) until cleared with `None`.
    pub fn set_failure(&self, message: Option<&str>) {
        self.state.lock().unwrap().failure = message.map(str::to_owned);
    }

    /// Makes token requests fail with `message` (an API error) until cleared with `None`.
    pub fn set_token_failure(&self, message: Option<&str>) {
        self.state.lock().unwrap().token_failure = message.map(str::to_owned);
    }

    /// The token requests answered so far, oldest first.
    #[must_use]
    pub fn token_requests(&self) -> Vec<TokenRequestRecord> {
        self.state.lock().unwrap().tokens.clone()
    }

    fn check(&self, kind: &'static str, namespace: &str, name: &str) -> Result<()> {
        match &self.state.lock().unwrap().failure {
            Some(message) => {
                Err(Error::Api { kind, namespace: namespace.into(), name: name.into(), message: message.clone() })
            }
            None => Ok(()),
        }
    }
}

#[async_trait]
impl ObjectSource for FakeObjectSource {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>> {
        self.check("ConfigMap", namespace, name)?;
        Ok(self.state.lock().unwrap().config_maps.get(&(namespace.into(), name.into())).cloned())
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>> {
        self.check("Secret", namespace, name)?;
        Ok(self.state.lock().unwrap().secrets.get(&(namespace.into(), name.into())).cloned())
    }

    async fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        audiences: &[String],
        expiration_seconds: i64,
        pod: &BoundPod,
    ) -> Result<ServiceAccountToken> {
        self.check("ServiceAccount", namespace, service_account)?;
        let mut state = self.state.lock().unwrap();
        if let Some(message) = state.token_failure.clone() {
            let (namespace, name) = (namespace.into(), service_account.into());
            return Err(Error::Api { kind: "ServiceAccount", namespace, name, message });
        }
        state.tokens.push(TokenRequestRecord {
            namespace: namespace.into(),
            service_account: service_account.into(),
            audiences: audiences.to_vec(),
            expiration_seconds,
            pod: pod.clone(),
        });
        let n = state.tokens.len();
        Ok(ServiceAccountToken {
            token: format!("token-{n}"),
            expiration: self.clock.now() + Duration::from_secs(expiration_seconds.max(0).unsigned_abs()),
        })
    }

    fn services(&self) -> Option<Vec<Arc<Service>>> {
        self.state.lock().unwrap().services.clone()
    }

    async fn persistent_volume_claim(&self, namespace: &str, name: &str) -> Result<Option<PersistentVolumeClaim>> {
        self.storage_object(namespace, name)
    }

    async fn persistent_volume(&self, name: &str) -> Result<Option<PersistentVolume>> {
        self.storage_object("", name)
    }

    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>> {
        self.storage_object("", name)
    }

    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>> {
        self.storage_object("", name)
    }

    async fn patch_claim_status(&self, namespace: &str, name: &str, patch: &serde_json::Value) -> Result<()> {
        self.check("PersistentVolumeClaim", namespace, name)?;
        let mut state = self.state.lock().unwrap();
        let key = (namespace.to_owned(), "PersistentVolumeClaim", name.to_owned());
        let Some(claim) = state.storage.get_mut(&key) else {
            return Err(Error::Api {
                kind: "PersistentVolumeClaim",
                namespace: namespace.into(),
                name: name.into(),
                message: format!("persistentvolumeclaims {name:?} not found"),
            });
        };
        // Only the status may change, as through the status subresource.
        if let Some(status) = patch.get("status") {
            let target =
                claim.as_object_mut().expect("an object").entry("status").or_insert_with(|| serde_json::json!({}));
            merge_patch(target, status);
        }
        Ok(())
    }
}

/// RFC 7386 JSON merge patch: objects merge, `null` removes, anything else replaces.
pub fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    let serde_json::Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = serde_json::json!({});
    }
    let object = target.as_object_mut().expect("made an object");
    for (key, value) in fields {
        if value.is_null() {
            object.remove(key);
        } else {
            merge_patch(object.entry(key.clone()).or_insert(serde_json::Value::Null), value);
        }
    }
}

/// The kind of a typed API object (`PersistentVolumeClaim`).
fn kind_of<K: kube::Resource<DynamicType = ()>>() -> &'static str {
    match K::kind(&()).as_ref() {
        "PersistentVolumeClaim" => "PersistentVolumeClaim",
        "PersistentVolume" => "PersistentVolume",
        "CSIDriver" => "CSIDriver",
        "VolumeAttachment" => "VolumeAttachment",
        _ => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn standalone_source_says_why() {
        let err = NoApiServer.config_map("default", "x").await.unwrap_err();
        assert_eq!(err.to_string(), "ConfigMap default/x: no API server (standalone mode)");
        let err = NoApiServer.secret("kube-system", "s").await.unwrap_err();
        assert_eq!(err.to_string(), "Secret kube-system/s: no API server (standalone mode)");
        let pod = BoundPod { name: "p".into(), uid: "u".into() };
        let err = NoApiServer.service_account_token("default", "default", &[], 3600, &pod).await.unwrap_err();
        assert_eq!(err.to_string(), "ServiceAccount default/default: no API server (standalone mode)");
    }

    #[tokio::test]
    async fn fake_source_sets_removes_and_fails() {
        let src = FakeObjectSource::new();
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some("ns".into());
        cm.metadata.name = Some("c".into());
        src.set_config_map(cm.clone());
        assert_eq!(src.config_map("ns", "c").await.unwrap(), Some(cm));
        assert_eq!(src.config_map("other", "c").await.unwrap(), None);
        src.remove_config_map("ns", "c");
        assert_eq!(src.config_map("ns", "c").await.unwrap(), None);
        src.set_failure(Some("connection refused"));
        assert_eq!(src.secret("ns", "s").await.unwrap_err().to_string(), "Secret ns/s: connection refused");
    }
}
