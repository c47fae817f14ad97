//! A minimal CRI `runtime.v1` client: just the calls the test bed needs to check health,
//! drain pods, find images and run its smoke pod.
//!
//! The messages are written by hand with `#[derive(prost::Message)]` instead of generated,
//! because xtask must build on a machine without `protoc` (it is what installs `protoc`).
//! Field numbers and names follow `kubernetes/cri-api` `pkg/apis/runtime/v1/api.proto`;
//! fields the test bed never reads or sets are simply left out (protobuf skips unknown
//! fields on decode, and absent fields are their defaults on the server side).
//!
//! Facts about containerd 1.6 learned here:
//! - `ImageStatus` of a missing image answers OK with an EMPTY response (no `image`),
//!   not `NOT_FOUND`.
//! - `StopPodSandbox` of an unknown id answers `NOT_FOUND`, `RemovePodSandbox` answers OK.

use std::{collections::HashMap, path::Path, time::Duration};

use anyhow::{Context as _, Result};
use hyper_util::rt::TokioIo;
use tonic::{
    Request,
    codegen::http::uri::PathAndQuery,
    transport::{Channel, Endpoint, Uri},
};

/// Per-call deadline: generous because a loaded 2-core CI box can take seconds to stop a pod.
const CALL_TIMEOUT: Duration = Duration::from_mins(1);

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionRequest {
    #[prost(string, tag = "1")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    /// `PodSandboxState`: 0 = `SANDBOX_READY`, 1 = `SANDBOX_NOTREADY`.
    #[prost(int32, tag = "3")]
    pub state: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopPodSandboxRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopPodSandboxResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemovePodSandboxRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemovePodSandboxResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersResponse {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    /// `ContainerState`: 0 created, 1 running, 2 exited, 3 unknown.
    #[prost(int32, tag = "6")]
    pub state: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpec {
    #[prost(string, tag = "1")]
    pub image: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemoveImageRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemoveImageResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub image: Option<Image>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Image {
    /// The image id: for containerd, the digest of the image config.
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, repeated, tag = "2")]
    pub repo_tags: Vec<String>,
    #[prost(uint64, tag = "4")]
    pub size: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub log_directory: String,
    #[prost(message, repeated, tag = "5")]
    pub port_mappings: Vec<PortMapping>,
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PortMapping {
    /// `Protocol`: 0 = TCP.
    #[prost(int32, tag = "1")]
    pub protocol: i32,
    #[prost(int32, tag = "2")]
    pub container_port: i32,
    #[prost(int32, tag = "3")]
    pub host_port: i32,
    #[prost(string, tag = "4")]
    pub host_ip: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxConfig {
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxSandboxSecurityContext>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxSandboxSecurityContext {
    #[prost(message, optional, tag = "9")]
    pub seccomp: Option<SecurityProfile>,
}

/// `SecurityProfile`; `profile_type` 0 is `RuntimeDefault`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SecurityProfile {
    #[prost(int32, tag = "1")]
    pub profile_type: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(bool, tag = "3")]
    pub readonly: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<PodSandboxStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(message, optional, tag = "5")]
    pub network: Option<PodSandboxNetworkStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxNetworkStatus {
    #[prost(string, tag = "1")]
    pub ip: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    pub image: Option<ImageSpec>,
    #[prost(string, repeated, tag = "3")]
    pub command: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub args: Vec<String>,
    #[prost(message, repeated, tag = "7")]
    pub mounts: Vec<Mount>,
    #[prost(string, tag = "11")]
    pub log_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerResponse {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StartContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StartContainerResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<ContainerStatus>,
    /// Only with `verbose`: runtime-specific JSON values. containerd puts its view of the
    /// container under `"info"` (including the host `pid` of its init process).
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(int32, tag = "7")]
    pub exit_code: i32,
    #[prost(string, tag = "10")]
    pub reason: String,
    #[prost(string, tag = "11")]
    pub message: String,
}

/// `ContainerState::CONTAINER_RUNNING`.
pub const CONTAINER_RUNNING: i32 = 1;

/// A gRPC channel to the unix socket at `socket`, connected within 3 s. The URI `uri` is
/// required by the HTTP/2 layer but never resolved: the connector ignores it and dials the
/// socket.
pub async fn unix_channel(socket: &Path, uri: &'static str) -> Result<Channel> {
    let path = socket.to_path_buf();
    let channel = Endpoint::try_from(uri)?
        .connect_timeout(Duration::from_secs(3))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await?;
    Ok(channel)
}

/// A connection to one CRI endpoint (a unix socket).
#[derive(Debug, Clone)]
pub struct CriClient {
    grpc: tonic::client::Grpc<Channel>,
    socket: String,
}

impl CriClient {
    /// Connects to the unix socket at `socket` (a path, not a `unix://` URI).
    pub async fn connect(socket: &Path) -> Result<Self> {
        let channel = unix_channel(socket, "http://cri.invalid")
            .await
            .with_context(|| format!("connecting to CRI socket {}", socket.display()))?;
        Ok(Self { grpc: tonic::client::Grpc::new(channel), socket: socket.display().to_string() })
    }

    async fn unary<Req, Resp>(&mut self, method: &'static str, request: Req) -> Result<Resp>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let call = async {
            self.grpc.ready().await.map_err(|e| tonic::Status::unavailable(format!("channel not ready: {e}")))?;
            let mut req = Request::new(request);
            req.set_timeout(CALL_TIMEOUT);
            self.grpc
                .unary(req, PathAndQuery::from_static(method), tonic_prost::ProstCodec::<Req, Resp>::default())
                .await
        };
        let response = tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .map_err(|_| anyhow::anyhow!("timed out after {CALL_TIMEOUT:?}"))
            .and_then(|r| r.map_err(anyhow::Error::from))
            .with_context(|| format!("CRI {method} on {}", self.socket))?;
        Ok(response.into_inner())
    }

    pub async fn version(&mut self) -> Result<VersionResponse> {
        self.unary("/runtime.v1.RuntimeService/Version", VersionRequest { version: "v1".into() }).await
    }

    pub async fn list_pod_sandboxes(&mut self) -> Result<Vec<PodSandbox>> {
        let r: ListPodSandboxResponse =
            self.unary("/runtime.v1.RuntimeService/ListPodSandbox", ListPodSandboxRequest {}).await?;
        Ok(r.items)
    }

    pub async fn list_containers(&mut self) -> Result<Vec<Container>> {
        let r: ListContainersResponse =
            self.unary("/runtime.v1.RuntimeService/ListContainers", ListContainersRequest {}).await?;
        Ok(r.containers)
    }

    pub async fn stop_pod_sandbox(&mut self, id: &str) -> Result<()> {
        let _: StopPodSandboxResponse = self
            .unary("/runtime.v1.RuntimeService/StopPodSandbox", StopPodSandboxRequest { pod_sandbox_id: id.into() })
            .await?;
        Ok(())
    }

    pub async fn remove_pod_sandbox(&mut self, id: &str) -> Result<()> {
        let _: RemovePodSandboxResponse = self
            .unary("/runtime.v1.RuntimeService/RemovePodSandbox", RemovePodSandboxRequest { pod_sandbox_id: id.into() })
            .await?;
        Ok(())
    }

    /// Removes an image (by reference: containerd removes the image it names with all
    /// its names).
    pub async fn remove_image(&mut self, image: &str) -> Result<()> {
        let _: RemoveImageResponse = self
            .unary(
                "/runtime.v1.ImageService/RemoveImage",
                RemoveImageRequest { image: Some(ImageSpec { image: image.into() }) },
            )
            .await?;
        Ok(())
    }

    /// The image as CRI sees it, or `None` when CRI does not know it.
    pub async fn image_status(&mut self, image: &str) -> Result<Option<Image>> {
        let r: ImageStatusResponse = self
            .unary(
                "/runtime.v1.ImageService/ImageStatus",
                ImageStatusRequest { image: Some(ImageSpec { image: image.into() }), verbose: false },
            )
            .await?;
        Ok(r.image)
    }

    pub async fn run_pod_sandbox(&mut self, config: PodSandboxConfig) -> Result<String> {
        let r: RunPodSandboxResponse = self
            .unary(
                "/runtime.v1.RuntimeService/RunPodSandbox",
                RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() },
            )
            .await?;
        Ok(r.pod_sandbox_id)
    }

    pub async fn pod_sandbox_status(&mut self, id: &str) -> Result<PodSandboxStatus> {
        let r: PodSandboxStatusResponse = self
            .unary(
                "/runtime.v1.RuntimeService/PodSandboxStatus",
                PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: false },
            )
            .await?;
        r.status.with_context(|| format!("PodSandboxStatus({id}) returned no status"))
    }

    pub async fn create_container(
        &mut self,
        pod_sandbox_id: &str,
        config: ContainerConfig,
        sandbox_config: PodSandboxConfig,
    ) -> Result<String> {
        let r: CreateContainerResponse = self
            .unary(
                "/runtime.v1.RuntimeService/CreateContainer",
                CreateContainerRequest {
                    pod_sandbox_id: pod_sandbox_id.into(),
                    config: Some(config),
                    sandbox_config: Some(sandbox_config),
                },
            )
            .await?;
        Ok(r.container_id)
    }

    pub async fn start_container(&mut self, id: &str) -> Result<()> {
        let _: StartContainerResponse = self
            .unary("/runtime.v1.RuntimeService/StartContainer", StartContainerRequest { container_id: id.into() })
            .await?;
        Ok(())
    }

    pub async fn container_status(&mut self, id: &str) -> Result<ContainerStatus> {
        let r: ContainerStatusResponse = self
            .unary(
                "/runtime.v1.RuntimeService/ContainerStatus",
                ContainerStatusRequest { container_id: id.into(), verbose: false },
            )
            .await?;
        r.status.with_context(|| format!("ContainerStatus({id}) returned no status"))
    }

    /// `ContainerStatus` with `verbose`: the status and the runtime's `info` map.
    pub async fn container_status_verbose(&mut self, id: &str) -> Result<ContainerStatusResponse> {
        self.unary(
            "/runtime.v1.RuntimeService/ContainerStatus",
            ContainerStatusRequest { container_id: id.into(), verbose: true },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    /// Field numbers are the contract with the runtime: pin a few encodings byte by byte.
    #[test]
    fn encodes_with_cri_field_numbers() {
        let req = StopPodSandboxRequest { pod_sandbox_id: "ab".into() };
        // field 1, wire type 2 (length-delimited) = 0x0a.
        assert_eq!(req.encode_to_vec(), vec![0x0a, 2, b'a', b'b']);

        let pm = PortMapping { protocol: 0, container_port: 80, host_port: 8080, host_ip: String::new() };
        // field 2 varint (0x10) = 80, field 3 varint (0x18) = 8080 (0x90 0x3f).
        assert_eq!(pm.encode_to_vec(), vec![0x10, 80, 0x18, 0x90, 0x3f]);
    }

    #[test]
    fn decodes_the_verbose_info_map() {
        // info (field 2) is a map entry message: key (1) "info", value (2) "{}".
        let entry = [0x0a, 4, b'i', b'n', b'f', b'o', 0x12, 2, b'{', b'}'];
        let mut bytes = vec![0x12, entry.len() as u8];
        bytes.extend_from_slice(&entry);
        let r = ContainerStatusResponse::decode(&bytes[..]).unwrap();
        assert_eq!(r.info.get("info").map(String::as_str), Some("{}"));
    }

    #[test]
    fn empty_image_status_means_absent() {
        let r = ImageStatusResponse::decode(&[][..]).unwrap();
        assert!(r.image.is_none());
    }

    #[test]
    fn decodes_sandbox_list_and_skips_unknown_fields() {
        // A PodSandbox with id "x", state 1 and created_at (field 4, not modelled) = 5.
        let sandbox = [0x0a, 1, b'x', 0x18, 1, 0x20, 5];
        let mut list = vec![0x0a, sandbox.len() as u8];
        list.extend_from_slice(&sandbox);
        let r = ListPodSandboxResponse::decode(&list[..]).unwrap();
        assert_eq!(r.items.len(), 1);
        assert_eq!(r.items[0].id, "x");
        assert_eq!(r.items[0].state, 1);
    }
}
