//! `CreateContainer` with CRI `Mount.image_sub_path` (field 10 of `Mount`, CRI since
//! Kubernetes 1.33), which the k8s-cri 0.11 bindings predate.
//!
//! Protobuf lets a message be written in parts: a length-delimited field holds the same
//! bytes whether it is declared a message or `bytes`, fields may come in any order, and a
//! repeated field's elements keep the order they come in. So the request is encoded with
//! the bindings' own types except where the field must be added: the container config
//! without its mounts, then each mount (`ContainerConfig.mounts`, field 7) as its own
//! encoding followed by field 10. The runtime decodes exactly the message upstream's
//! kubelet sends. When the bindings gain the field, this module goes away.

use prost::Message as _;

use crate::container::{ImageSubPaths, api};

/// `runtime.v1.CreateContainerRequest` with its config already encoded.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct CreateContainerRequestWire {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    /// `ContainerConfig` (a message on the wire).
    #[prost(bytes = "vec", tag = "2")]
    pub config: Vec<u8>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<api::PodSandboxConfig>,
}

/// `ContainerConfig.mounts`, each mount already encoded.
#[derive(Clone, PartialEq, prost::Message)]
struct ConfigMounts {
    #[prost(bytes = "vec", repeated, tag = "7")]
    mounts: Vec<Vec<u8>>,
}

/// The field of `Mount` the bindings lack.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct MountImageSubPath {
    #[prost(string, tag = "10")]
    pub image_sub_path: String,
}

/// The request for `CreateContainer` of `config`, whose mount at each index of
/// `image_sub_paths` gets that sub path.
pub(super) fn request(
    sandbox_id: &str,
    mut config: api::ContainerConfig,
    sandbox_config: api::PodSandboxConfig,
    image_sub_paths: &ImageSubPaths,
) -> CreateContainerRequestWire {
    let mounts = std::mem::take(&mut config.mounts)
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let mut bytes = m.encode_to_vec();
            for (_, path) in image_sub_paths.iter().filter(|(at, _)| *at == i) {
                MountImageSubPath { image_sub_path: path.clone() }.encode(&mut bytes).expect("a Vec grows as needed");
            }
            bytes
        })
        .collect();
    let mut encoded = config.encode_to_vec();
    ConfigMounts { mounts }.encode(&mut encoded).expect("a Vec grows as needed");
    CreateContainerRequestWire {
        pod_sandbox_id: sandbox_id.to_owned(),
        config: encoded,
        sandbox_config: Some(sandbox_config),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(path: &str, image: Option<&str>) -> api::Mount {
        api::Mount {
            container_path: path.into(),
            host_path: if image.is_none() { format!("/host{path}") } else { String::new() },
            readonly: image.is_some(),
            image: image.map(|i| api::ImageSpec { image: i.into(), ..Default::default() }),
            ..Default::default()
        }
    }

    /// The mounts' `image_sub_path` as a runtime with the current CRI reads them.
    fn sub_paths_on_the_wire(config: &[u8]) -> Vec<String> {
        let mounts = ConfigMounts::decode(config).unwrap().mounts;
        mounts.iter().map(|m| MountImageSubPath::decode(m.as_slice()).unwrap().image_sub_path).collect()
    }

    #[test]
    fn the_runtime_reads_the_same_request_with_each_sub_path_on_its_mount() {
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: "c".into(), attempt: 2 }),
            image: Some(api::ImageSpec { image: "sha256:abc".into(), ..Default::default() }),
            command: vec!["sh".into()],
            mounts: vec![mount("/data", None), mount("/img", Some("sha256:1")), mount("/etc/x", Some("sha256:2"))],
            log_path: "c/2.log".into(),
            ..Default::default()
        };
        let sandbox = api::PodSandboxConfig { hostname: "p".into(), ..Default::default() };
        let subs = vec![(2, "etc/app".to_owned())];
        let wire = request("sb1", config.clone(), sandbox.clone(), &subs).encode_to_vec();

        // What the bindings decode (field 10 unknown to them) is the request as given.
        let decoded = api::CreateContainerRequest::decode(wire.as_slice()).unwrap();
        assert_eq!(decoded.pod_sandbox_id, "sb1");
        assert_eq!(decoded.config.as_ref(), Some(&config));
        assert_eq!(decoded.sandbox_config, Some(sandbox));
        // And the field is on the third mount only.
        let raw = CreateContainerRequestWire::decode(wire.as_slice()).unwrap();
        assert_eq!(sub_paths_on_the_wire(&raw.config), ["", "", "etc/app"]);
    }

    #[test]
    fn without_sub_paths_the_request_is_the_bindings_own() {
        let config = api::ContainerConfig { mounts: vec![mount("/img", Some("sha256:1"))], ..Default::default() };
        let wire = request("sb", config.clone(), api::PodSandboxConfig::default(), &Vec::new()).encode_to_vec();
        let plain = api::CreateContainerRequest {
            pod_sandbox_id: "sb".into(),
            config: Some(config),
            sandbox_config: Some(api::PodSandboxConfig::default()),
        };
        assert_eq!(
            api::CreateContainerRequest::decode(wire.as_slice()).unwrap(),
            api::CreateContainerRequest::decode(plain.encode_to_vec().as_slice()).unwrap()
        );
    }
}
