//! [`KubeObjectSource`]: `ConfigMap`s, `Secret`s and service-account tokens from the API
//! server, for volumes and environment variables in API-server mode.
//!
//! Objects are read with a GET on each pod sync (upstream's `Get` change-detection
//! strategy), so an updated `ConfigMap` reaches mounted files on the next sync of the pods
//! that use it. Tokens come from the `TokenRequest` API, bound to the pod.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use kube::Api;
use kube::api::PostParams;

use crate::volumes::source::{BoundPod, Error, ObjectSource, Result, ServiceAccountToken};

/// Object source backed by the API server.
#[derive(Clone)]
pub struct KubeObjectSource {
    client: kube::Client,
}

impl std::fmt::Debug for KubeObjectSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeObjectSource").finish_non_exhaustive()
    }
}

impl KubeObjectSource {
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

fn api_err(kind: &'static str, namespace: &str, name: &str, e: &kube::Error) -> Error {
    Error::Api { kind, namespace: namespace.into(), name: name.into(), message: e.to_string() }
}

#[async_trait]
impl ObjectSource for KubeObjectSource {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| api_err("ConfigMap", namespace, name, &e))
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>> {
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
}
