//! Registry credentials for image pulls: the pod's `imagePullSecrets` (upstream
//! `getPullSecretsForPod` in `kubelet_pods.go`) ahead of the node's docker config files,
//! looked up for the image as upstream's union keyring does (`kuberuntime_image.go`
//! `PullImage`).

use k8s_openapi::api::core::v1::Pod;

use super::{RuntimeManager, pod_full_name};
use crate::container::api;
use crate::events::EventType;

impl RuntimeManager {
    /// The registry credentials to try for `image`, in order (upstream
    /// `getPullSecretsForPod` + the union keyring): the pod's `imagePullSecrets` first,
    /// then the node's docker config. A pull secret that cannot be read is a
    /// `FailedToRetrieveImagePullSecret` warning and the pull goes on without it, as
    /// upstream; a malformed one is logged and skipped. Empty: an anonymous pull.
    pub(super) async fn image_credentials(&self, pod: &Pod, image: &str) -> Vec<api::AuthConfig> {
        use crate::images::credentials::{Keyring, credentials_for_image};
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let names: Vec<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|r| r.name.as_str())
            .filter(|n| !n.is_empty())
            .collect();
        let mut secrets = Vec::new();
        let mut missing = Vec::new();
        for name in names {
            match self.volumes.object_source().secret(namespace, name).await {
                Ok(Some(secret)) => secrets.push(secret),
                Ok(None) => missing.push(name),
                Err(e) => {
                    tracing::warn!(pod = %pod_full_name(pod), secret = name, error = %e, "reading an image pull secret");
                    missing.push(name);
                }
            }
        }
        if !missing.is_empty() {
            self.event(
                pod,
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    missing.join(", ")
                ),
            );
        }
        let (pod_keyring, errors) = Keyring::from_pull_secrets(&secrets);
        for e in errors {
            tracing::warn!(pod = %pod_full_name(pod), error = %e, "image pull secret");
        }
        let node_keyring = self.node_credentials.keyring();
        match credentials_for_image(image, &[&pod_keyring, &node_keyring]) {
            Ok(found) => found.iter().map(crate::images::credentials::Credential::auth_config).collect(),
            // The image manager reports the bad name.
            Err(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use serde_json::json;

    use super::*;
    use crate::runtime::manager::dns::DnsSettings;
    use crate::runtime::manager::testing::{env, events};

    const IMAGE: &str = "registry.swiftlet.test/app:1";

    fn pull_secret(name: &str, username: &str) -> Secret {
        let config = json!({"auths": {"registry.swiftlet.test": {"username": username, "password": "pw"}}});
        Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            type_: Some(crate::images::credentials::SECRET_TYPE_DOCKER_CONFIG_JSON.into()),
            data: Some(
                [(
                    crate::images::credentials::DOCKER_CONFIG_JSON_KEY.to_owned(),
                    ByteString(config.to_string().into()),
                )]
                .into(),
            ),
            ..Default::default()
        }
    }

    fn pod(secrets: &[&str]) -> Pod {
        let secrets: Vec<_> = secrets.iter().map(|s| json!({"name": s})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
            "spec": {"imagePullSecrets": secrets, "containers": [{"name": "c", "image": IMAGE}]}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn pull_secrets_come_before_the_node_credentials() {
        let e = env(DnsSettings::default());
        e.src.set_secret(pull_secret("first", "from-secret"));
        let node = json!({"auths": {"registry.swiftlet.test": {"username": "from-node", "password": "pw"}}});
        std::fs::create_dir_all(e.dir.path().join("root")).unwrap();
        std::fs::write(e.dir.path().join("root/config.json"), node.to_string()).unwrap();
        let found = e.rm.image_credentials(&pod(&["first"]), IMAGE).await;
        let users: Vec<&str> = found.iter().map(|a| a.username.as_str()).collect();
        assert_eq!(users, ["from-secret", "from-node"]);
        assert!(events(&e.recorder, "FailedToRetrieveImagePullSecret").is_empty());
    }

    #[tokio::test]
    async fn a_missing_pull_secret_is_a_warning_and_the_pull_goes_on() {
        let e = env(DnsSettings::default());
        e.src.set_secret(pull_secret("present", "from-secret"));
        let found = e.rm.image_credentials(&pod(&["gone", "present", "also-gone"]), IMAGE).await;
        assert_eq!(found.iter().map(|a| a.username.as_str()).collect::<Vec<_>>(), ["from-secret"]);
        assert_eq!(
            events(&e.recorder, "FailedToRetrieveImagePullSecret"),
            ["Unable to retrieve some image pull secrets (gone, also-gone); attempting to pull the image may not \
                 succeed."]
        );
        // An image of a registry nobody has credentials for: an anonymous pull.
        assert!(e.rm.image_credentials(&pod(&[]), "registry.other.test/app:1").await.is_empty());
    }
}
