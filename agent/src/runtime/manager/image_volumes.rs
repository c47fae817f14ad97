//! Image volumes (upstream `getImageVolumes`, `toKubeContainerImageVolumes` and
//! `incrementImageVolumeMetrics` of `kuberuntime_manager.go`).
//!
//! A sync that starts any container first pulls the image of every image volume of the
//! pod, each with the volume's `pullPolicy`, the pod's pull secrets and the sandbox
//! config, its events on the pod itself (`Pulling`, `Pulled`, `Failed`, `BackOff`, ...).
//! A failed pull holds back only the containers that mount the volume: each of them fails
//! to start with the pull's reason (`ErrImagePull`, `ImagePullBackOff`,
//! `ErrImageNeverPull`, ...) and a `Failed` event "Error: <reason>" on the container, as
//! upstream, which fails them late so that their status says `ErrImagePull` or
//! `ImagePullBackOff`.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::RuntimeManager;
use super::container::StartError;
use crate::container::api;
use crate::events::EventType;
use crate::volumes::manager::ImageVolumes;

/// The outcome of each image volume's pull, by volume name (upstream `imageVolumePulls`).
pub(super) type ImageVolumePulls = HashMap<String, Result<api::ImageSpec, StartError>>;

impl RuntimeManager {
    /// Pulls the image of every image volume of `pod` (upstream `getImageVolumes`).
    pub(super) async fn pull_image_volumes(
        &self,
        pod: &Pod,
        sandbox_config: &api::PodSandboxConfig,
    ) -> ImageVolumePulls {
        let mut pulls = ImageVolumePulls::new();
        let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
        let handler = self.runtime_classes.cached(pod);
        for (name, source) in volumes.filter_map(|v| Some((&v.name, v.image.as_ref()?))) {
            let reference = source.reference.as_deref().unwrap_or_default();
            let credentials = self.image_credentials(pod, reference).await;
            let pulled = self.images.ensure_volume_image(pod, source, credentials, Some(sandbox_config)).await;
            let outcome = pulled.map_err(StartError::from).map(|ensured| api::ImageSpec {
                image: ensured.image_ref,
                user_specified_image: reference.to_owned(),
                runtime_handler: handler.clone(),
                annotations: pod.metadata.annotations.clone().unwrap_or_default().into_iter().collect(),
            });
            if let Err(e) = &outcome {
                tracing::warn!(pod = %super::pod_full_name(pod), volume = %name, error = %e, "image volume not pulled");
            }
            pulls.insert(name.clone(), outcome);
        }
        pulls
    }

    /// The pulled images of the image volumes `container` mounts, or the failure of the
    /// last one that was not pulled, each failure recorded on the container (upstream
    /// `toKubeContainerImageVolumes`).
    pub(super) fn container_image_volumes(
        &self,
        pod: &Pod,
        container: &Container,
        pulls: &ImageVolumePulls,
    ) -> Result<ImageVolumes, StartError> {
        let mut images = ImageVolumes::new();
        let mut failed = None;
        for m in container.volume_mounts.iter().flatten() {
            match pulls.get(&m.name) {
                None => {}
                Some(Ok(spec)) => {
                    images.insert(m.name.clone(), spec.clone());
                }
                Some(Err(e)) => {
                    self.container_event(
                        pod,
                        &container.name,
                        EventType::Warning,
                        "Failed",
                        format!("Error: {}", e.reason),
                    );
                    failed = Some(e.clone());
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(images),
        }
    }

    /// Upstream `incrementImageVolumeMetrics`, after a start attempt of `container` that
    /// had `images` (its image volumes): each mount of one counts as mounted unless the
    /// runtime said it failed to mount an image volume.
    pub(super) fn count_image_volume_mounts(
        &self,
        container: &Container,
        images: &ImageVolumes,
        outcome: &Result<(), StartError>,
    ) {
        let m = &self.metrics;
        m.image_volume_requested.inc_by(images.len() as u64);
        let mount_failed = matches!(outcome, Err(e) if runtime_failed_to_mount_image_volume(e));
        for _ in container.volume_mounts.iter().flatten().filter(|v| images.contains_key(&v.name)) {
            if mount_failed {
                m.image_volume_mounted_errors.inc();
            } else {
                m.image_volume_mounted_succeeded.inc();
            }
        }
    }
}

/// Whether a start failed because the runtime could not mount an image volume: a
/// `CreateContainerError` whose gRPC message starts with CRI's
/// `ErrImageVolumeMountFailed` (`ImageVolumeMountFailed`), upstream's test. (containerd
/// 2.4 puts "failed to mount image volume: " before it, which upstream's test, and so
/// this one, counts as mounted.)
fn runtime_failed_to_mount_image_volume(e: &StartError) -> bool {
    // The message is the CRI error's text ([`crate::container::Error::Rpc`]).
    let grpc_message = e.message.strip_prefix("CRI create_container failed: ").unwrap_or(&e.message);
    e.reason == super::reasons::CREATE_CONTAINER_ERROR && grpc_message.starts_with("ImageVolumeMountFailed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_runtimes_image_volume_mount_failure_counts_as_one() {
        let create_error = |message: &str| {
            let e =
                crate::container::Error::Rpc { operation: "create_container", status: tonic::Status::unknown(message) };
            StartError::new(super::super::reasons::CREATE_CONTAINER_ERROR, e.to_string())
        };
        assert!(runtime_failed_to_mount_image_volume(&create_error("ImageVolumeMountFailed: no such path")));
        assert!(!runtime_failed_to_mount_image_volume(&create_error(
            "failed to mount image volume: ImageVolumeMountFailed: x"
        )));
        let config = StartError::new(super::super::reasons::CREATE_CONTAINER_CONFIG_ERROR, "ImageVolumeMountFailed");
        assert!(!runtime_failed_to_mount_image_volume(&config));
    }
}
