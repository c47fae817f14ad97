//! Volumes from claims and CSI drivers: a pod's `persistentVolumeClaim` and generic
//! `ephemeral` volumes resolved to their bound `PersistentVolume` (upstream
//! `desired_state_of_world_populator.go`'s `createVolumeSpec`), inline `csi` volumes, and
//! the set-up of CSI volumes with what the API says about their driver.
//!
//! A claim's volume is read from the API server when the pod's volume is first set up;
//! later syncs of the pod keep what was resolved (a bound claim's volume does not change).
//! Persistent volumes served here: `csi`, and `hostPath` and `local` (bind-mounted from
//! their path on the node, without upstream's `local` plugin's block-device support).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, Pod, Volume};

use super::{DEFAULT_TOKEN_EXPIRATION_SECONDS, MountedVolume, Plugin, VolumeManager, pod_namespace};
use crate::types::pod::uid as pod_uid;
use crate::volumes::VolumeError;
use crate::volumes::csi::volume::{SetUpArgs, plugin_dir_name};
use crate::volumes::csi::{CSI_TOKENS_KEY, CsiSpec, LifecycleMode, SecretRef, attachment_name};

fn claim_error(namespace: &str, claim: &str, message: impl std::fmt::Display) -> VolumeError {
    VolumeError::Claim(format!("error processing PVC {namespace}/{claim}: {message}"))
}

/// Whether a container uses the volume by `volumeDevices` (block) rather than mounts.
fn used_as_device(pod: &Pod, name: &str) -> bool {
    let spec = pod.spec.as_ref();
    spec.iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .flat_map(|c| c.volume_devices.iter().flatten())
        .any(|d| d.name == name)
}

impl VolumeManager {
    /// What a pod volume is, reading its claim and persistent volume from the API when
    /// it has one. `previous` is the volume as this pod's last sync set it up.
    pub(super) async fn resolve(
        &self,
        pod: &Pod,
        v: &Volume,
        previous: Option<&MountedVolume>,
    ) -> Result<MountedVolume, VolumeError> {
        let uid = pod_uid(pod);
        let namespace = pod_namespace(pod);
        let claim = if let Some(pvc) = &v.persistent_volume_claim {
            Some((pvc.claim_name.clone(), pvc.read_only.unwrap_or(false), false))
        } else if v.ephemeral.is_some() {
            let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
            Some((format!("{pod_name}-{}", v.name), false, true))
        } else {
            None
        };
        if let Some(prev) = previous.filter(|p| p.claim.is_some() || p.csi.is_some())
            && (claim.is_some() || v.csi.is_some())
        {
            return Ok(prev.clone());
        }
        if let Some(csi) = &v.csi {
            let spec = CsiSpec {
                driver: csi.driver.clone(),
                volume_handle: CsiSpec::inline_volume_handle(uid, &v.name),
                spec_name: v.name.clone(),
                mode: LifecycleMode::Ephemeral,
                read_only: csi.read_only.unwrap_or(false),
                fs_type: csi.fs_type.clone().unwrap_or_default(),
                mount_options: Vec::new(),
                attributes: csi.volume_attributes.clone().unwrap_or_default(),
                stage_secret: None,
                publish_secret: csi
                    .node_publish_secret_ref
                    .as_ref()
                    .map(|r| SecretRef { namespace: namespace.to_owned(), name: r.name.clone() }),
                expand_secret: None,
                access_modes: Vec::new(),
                block: false,
                attach_required: false,
            };
            return Ok(self.csi_volume(uid, &v.name, spec, None));
        }
        let Some((claim_name, claim_read_only, ephemeral)) = claim else {
            return self.describe(uid, v);
        };
        let pvc = self.source.persistent_volume_claim(namespace, &claim_name).await?.ok_or_else(|| {
            claim_error(
                namespace,
                &claim_name,
                format!("failed to fetch PVC from API server: persistentvolumeclaims {claim_name:?} not found"),
            )
        })?;
        if ephemeral {
            let owned =
                pvc.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.uid == uid);
            if !owned {
                let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
                return Err(VolumeError::Claim(format!(
                    "PVC {namespace}/{claim_name} was not created for pod {namespace}/{pod_name} (pod is not owner)"
                )));
            }
        }
        let protected = pvc.metadata.finalizers.iter().flatten().any(|f| f == "kubernetes.io/pvc-protection");
        if pvc.metadata.deletion_timestamp.is_some() && !protected {
            return Err(claim_error(namespace, &claim_name, "PVC is being deleted"));
        }
        if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            return Err(claim_error(namespace, &claim_name, "PVC is not bound"));
        }
        let pv_name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
        if pv_name.is_empty() {
            return Err(claim_error(namespace, &claim_name, "PVC has empty pvc.Spec.VolumeName"));
        }
        let pv = self.source.persistent_volume(&pv_name).await?.ok_or_else(|| {
            claim_error(
                namespace,
                &claim_name,
                format!("failed to fetch PV {pv_name} from API server: persistentvolumes {pv_name:?} not found"),
            )
        })?;
        let pvc_uid = pvc.metadata.uid.as_deref().unwrap_or_default();
        match pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
            None => {
                return Err(claim_error(
                    namespace,
                    &claim_name,
                    format!(
                        "found PV object {pv_name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
                    ),
                ));
            }
            Some(r) if r.uid.as_deref().unwrap_or_default() != pvc_uid => {
                return Err(claim_error(
                    namespace,
                    &claim_name,
                    format!(
                        "found PV object {pv_name} but its pv.Spec.ClaimRef.UID {} does not point to claim.UID {pvc_uid}",
                        r.uid.as_deref().unwrap_or_default()
                    ),
                ));
            }
            Some(_) => {}
        }
        let block = pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
        let as_device = used_as_device(pod, &v.name);
        if block != as_device {
            let (mode, used) = if block { ("Block", "volumeMounts") } else { ("Filesystem", "volumeDevices") };
            return Err(VolumeError::Claim(format!(
                "volume {} has volumeMode {mode}, but is specified in {used}",
                v.name
            )));
        }
        let mut mv = self.persistent_volume(pod, v, &pv, claim_read_only)?;
        mv.claim = Some(claim_name);
        if let Some(csi) = mv.csi.as_mut() {
            // Upstream: without a CSIDriver object, a driver needs attaching.
            let object = self.source.csi_driver(&csi.driver).await?;
            Arc::make_mut(csi).attach_required = object.and_then(|o| o.spec.attach_required).unwrap_or(true);
        }
        Ok(mv)
    }

    /// A bound persistent volume of a pod.
    fn persistent_volume(
        &self,
        pod: &Pod,
        v: &Volume,
        pv: &PersistentVolume,
        claim_read_only: bool,
    ) -> Result<MountedVolume, VolumeError> {
        let uid = pod_uid(pod);
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let spec = pv.spec.clone().unwrap_or_default();
        let host = |path: &str, read_only: bool| MountedVolume {
            name: v.name.clone(),
            plugin: Plugin::HostPath,
            path: PathBuf::from(path),
            read_only,
            memory: false,
            size_limit: None,
            claim: None,
            csi: None,
        };
        if let Some(hp) = &spec.host_path {
            return Ok(host(&hp.path, claim_read_only));
        }
        if let Some(local) = &spec.local {
            return Ok(host(&local.path, claim_read_only));
        }
        let Some(csi) = &spec.csi else {
            let kind = serde_json::to_value(&spec)
                .ok()
                .and_then(|s| {
                    s.as_object().and_then(|o| {
                        o.keys()
                            .find(|k| {
                                !matches!(
                                    k.as_str(),
                                    "accessModes"
                                        | "capacity"
                                        | "claimRef"
                                        | "mountOptions"
                                        | "nodeAffinity"
                                        | "persistentVolumeReclaimPolicy"
                                        | "storageClassName"
                                        | "volumeMode"
                                        | "volumeAttributesClassName"
                                )
                            })
                            .cloned()
                    })
                })
                .unwrap_or_else(|| "(empty)".into());
            return Err(VolumeError::Claim(format!(
                "persistent volume {pv_name}: {kind} volumes are not supported by swiftlet (supported: csi, hostPath, local)"
            )));
        };
        let secret = |r: &Option<k8s_openapi::api::core::v1::SecretReference>| {
            r.as_ref().map(|r| SecretRef {
                namespace: r.namespace.clone().unwrap_or_default(),
                name: r.name.clone().unwrap_or_default(),
            })
        };
        let csi_spec = CsiSpec {
            driver: csi.driver.clone(),
            volume_handle: csi.volume_handle.clone(),
            spec_name: pv_name,
            mode: LifecycleMode::Persistent,
            read_only: claim_read_only || csi.read_only.unwrap_or(false),
            fs_type: csi.fs_type.clone().unwrap_or_default(),
            mount_options: spec.mount_options.clone().unwrap_or_default(),
            attributes: csi.volume_attributes.clone().unwrap_or_default(),
            stage_secret: secret(&csi.node_stage_secret_ref),
            publish_secret: secret(&csi.node_publish_secret_ref),
            expand_secret: secret(&csi.node_expand_secret_ref),
            access_modes: spec.access_modes.clone().unwrap_or_default(),
            block: spec.volume_mode.as_deref() == Some("Block"),
            attach_required: true,
        };
        Ok(self.csi_volume(uid, &v.name, csi_spec, None))
    }

    fn csi_volume(&self, uid: &str, name: &str, spec: CsiSpec, claim: Option<String>) -> MountedVolume {
        let dir = self.pod_volumes_dir(uid).join(plugin_dir_name()).join(&spec.spec_name);
        MountedVolume {
            name: name.to_owned(),
            plugin: Plugin::Csi,
            path: crate::volumes::csi::volume::publish_target(&dir),
            read_only: spec.read_only,
            memory: false,
            size_limit: None,
            claim,
            csi: Some(Arc::new(spec)),
        }
    }

    async fn secret_data(&self, r: &SecretRef, what: &str) -> Result<BTreeMap<String, String>, VolumeError> {
        let secret = self.source.secret(&r.namespace, &r.name).await?.ok_or_else(|| {
            VolumeError::Claim(format!(
                "fetching {what} {}/{} failed: secrets {:?} not found",
                r.namespace, r.name, r.name
            ))
        })?;
        let mut data: BTreeMap<String, String> = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect();
        data.extend(secret.string_data.unwrap_or_default());
        Ok(data)
    }

    /// Finishes the expansion of a claim's volume on the node (upstream's online
    /// expansion in the volume manager's reconciler, `NodeExpander`): when the claim says
    /// `allocatedResourceStatuses.storage: NodeResizePending` (the resizer grew the volume
    /// and the node must grow its file system) or `NodeResizeInProgress` (an agent
    /// stopped in the middle), the claim is marked `NodeResizeInProgress`, the driver
    /// gets `NodeExpandVolume` to the allocated size, the pod and the claim a
    /// `FileSystemResizeSuccessful` event, and the claim's status the new capacity, the
    /// resize status and conditions gone. Returns whether it expanded.
    ///
    /// As upstream: a read-only volume is not grown (a `FileSystemResizeFailed` warning on
    /// the pod and the claim, once while the pod runs), nor one whose driver answers
    /// `FailedPrecondition` (it cannot grow a volume in use), until the pod is gone; any
    /// other error the driver gives is final for this try and says so in the claim's
    /// `NodeResizeError` condition, and `InvalidArgument`, `OutOfRange` and `NotFound`
    /// also make the claim `NodeResizeInfeasible` (the resizer's to undo); errors of a
    /// call that may still be running (`Unavailable`, `DeadlineExceeded`, ...) and of an
    /// unregistered driver leave the claim as it is. All but the read-only volume are
    /// tried again at the next sync while the claim asks for it.
    pub(super) async fn expand_if_pending(
        &self,
        pod: &Pod,
        mv: &MountedVolume,
        events: &mut Vec<super::VolumeEvent>,
    ) -> Result<bool, VolumeError> {
        let (Some(claim), Some(spec)) = (&mv.claim, &mv.csi) else { return Ok(false) };
        let namespace = pod_namespace(pod);
        let Some(pvc) = self.source.persistent_volume_claim(namespace, claim).await? else { return Ok(false) };
        let claim_ref = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(namespace.to_owned()),
            name: Some(claim.clone()),
            uid: pvc.metadata.uid.clone(),
            resource_version: pvc.metadata.resource_version.clone(),
            ..Default::default()
        };
        let status = pvc.status.unwrap_or_default();
        let resize_status = status.allocated_resource_statuses.as_ref().and_then(|m| m.get("storage")).cloned();
        if !matches!(resize_status.as_deref(), Some("NodeResizePending" | "NodeResizeInProgress")) {
            return Ok(false);
        }
        let Some(size) = status.allocated_resources.as_ref().and_then(|r| r.get("storage")).cloned() else {
            return Ok(false);
        };
        let bytes = crate::types::quantity::parse_bytes(&size.0)?;
        let settled_key = (pod_uid(pod).to_owned(), mv.name.clone(), bytes);
        if self.expansions_settled.lock().unwrap().contains(&settled_key) {
            return Ok(false);
        }
        // Upstream's `GenerateMsg`: the volume's spec name (the PV's) and the node's.
        let node = self.csi.node_name().to_owned();
        let message = |prefix: &str, suffix: &str| format!("{prefix} for volume {:?} {suffix}", spec.spec_name);
        let mut both = |warning: bool, reason: &'static str, message: String| {
            events.push(super::VolumeEvent { object: None, warning, reason, message: message.clone() });
            events.push(super::VolumeEvent { object: Some(claim_ref.clone()), warning, reason, message });
        };
        // Upstream's `VolumeSpec.ReadOnly`: the pod's claim, not the PV's `csi.readOnly`.
        let claim_read_only =
            pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| {
                v.name == mv.name && v.persistent_volume_claim.as_ref().and_then(|c| c.read_only) == Some(true)
            });
        if claim_read_only {
            self.expansions_settled.lock().unwrap().insert(settled_key);
            both(
                true,
                "FileSystemResizeFailed",
                message("MountVolume.NodeExpandVolume failed", "requested read-only file system"),
            );
            return Ok(false);
        }
        if resize_status.as_deref() == Some("NodeResizePending") {
            let patch =
                serde_json::json!({"status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}}});
            self.source.patch_claim_status(namespace, claim, &patch).await?;
        }
        let secrets = match &spec.expand_secret {
            Some(r) => self.secret_data(r, "NodeExpandSecretRef").await?,
            None => BTreeMap::new(),
        };
        let started = std::time::Instant::now();
        let expanded = self.csi.expand(&self.root_dir, spec, &mv.path, bytes, secrets).await;
        self.metrics.observe(&mv.qualified_plugin(), "volume_fs_resize", expanded.is_ok(), started.elapsed());
        let resize_conditions = ["Resizing", "FileSystemResizePending", "ControllerResizeError", "NodeResizeError"];
        let conditions = status.conditions.unwrap_or_default();
        if let Err(e) = expanded {
            let crate::volumes::csi::Error::Rpc { code, message: desc, .. } = &e else { return Err(e.into()) };
            let code = *code;
            if code == tonic::Code::FailedPrecondition {
                self.expansions_settled.lock().unwrap().insert(settled_key);
                tracing::warn!(volume = %mv.name, claim = %claim, error = %e, "the driver cannot grow the volume while it is in use; not tried again while the pod runs");
                return Ok(false);
            }
            let in_progress = matches!(
                code,
                tonic::Code::Cancelled
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unavailable
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Aborted
            );
            if !in_progress {
                let infeasible =
                    matches!(code, tonic::Code::InvalidArgument | tonic::Code::OutOfRange | tonic::Code::NotFound);
                let rpc = format!("rpc error: code = {code:?} desc = {desc}");
                let cause = if infeasible {
                    format!("Expander.NodeExpand failed to expand the volume {rpc}")
                } else {
                    format!("Expander.NodeExpand failed to expand the volume : {rpc}")
                };
                let now = jiff::Timestamp::try_from(self.clock.now()).unwrap_or_default();
                let mut kept: Vec<_> = conditions.into_iter().filter(|c| c.type_ != "NodeResizeError").collect();
                kept.push(k8s_openapi::api::core::v1::PersistentVolumeClaimCondition {
                    type_: "NodeResizeError".into(),
                    status: "True".into(),
                    last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                    message: Some(format!("failed to expand pvc with {cause}")),
                    ..Default::default()
                });
                let mut patch = serde_json::json!({"status": {"conditions": kept}});
                if infeasible {
                    patch["status"]["allocatedResourceStatuses"] =
                        serde_json::json!({"storage": "NodeResizeInfeasible"});
                }
                if let Err(pe) = self.source.patch_claim_status(namespace, claim, &patch).await {
                    tracing::warn!(claim = %claim, error = %pe, "marking the claim's node expansion as failed");
                }
            }
            return Err(e.into());
        }
        both(false, "FileSystemResizeSuccessful", message("MountVolume.NodeExpandVolume succeeded", &node));
        let conditions: Vec<_> =
            conditions.into_iter().filter(|c| !resize_conditions.contains(&c.type_.as_str())).collect();
        let patch = serde_json::json!({
            "status": {
                "capacity": {"storage": size},
                "allocatedResourceStatuses": {"storage": null},
                "conditions": conditions,
            }
        });
        self.source.patch_claim_status(namespace, claim, &patch).await?;
        tracing::info!(volume = %mv.name, claim = %claim, size = %size.0, "volume expanded on the node");
        Ok(true)
    }

    /// Whether a published CSI volume is published again at each sync of its pod: its
    /// driver's `CSIDriver` says `requiresRepublish` (upstream `RequiresRemount`; read from
    /// the agent's cache of `CSIDriver`s, so a sync costs the API server nothing). A
    /// driver without a `CSIDriver`, or one that cannot be read, is not.
    pub(super) async fn requires_republish(&self, mv: &MountedVolume) -> bool {
        let Some(spec) = &mv.csi else { return false };
        match self.source.csi_driver(&spec.driver).await {
            Ok(object) => object.and_then(|o| o.spec.requires_republish) == Some(true),
            Err(e) => {
                tracing::debug!(driver = %spec.driver, error = %e, "reading the CSIDriver for requiresRepublish");
                false
            }
        }
    }

    /// Upstream `podServiceAccountTokenAttrs`: for a `CSIDriver` with `tokenRequests`, a
    /// token of the pod's service account for each audience, bound to the pod, as the
    /// JSON the drivers read (`{"<audience>": {"token": ..., "expirationTimestamp": ...}}`).
    /// Tokens come through the agent's token cache, so a republish hands over the same
    /// token until 80 % of its lifetime has passed.
    async fn service_account_tokens(
        &self,
        pod: &Pod,
        requests: &[k8s_openapi::api::storage::v1::TokenRequest],
    ) -> Result<Option<String>, VolumeError> {
        #[derive(serde::Serialize)]
        struct Status {
            token: String,
            #[serde(rename = "expirationTimestamp")]
            expiration_timestamp: String,
        }
        if requests.is_empty() {
            return Ok(None);
        }
        let (sa, bound) = super::token_subject(pod);
        let mut out = BTreeMap::new();
        for request in requests {
            let audiences: Vec<String> = Some(request.audience.clone()).filter(|a| !a.is_empty()).into_iter().collect();
            // The API server's default lifetime of a TokenRequest (upstream sends none).
            let expiration = request.expiration_seconds.unwrap_or(DEFAULT_TOKEN_EXPIRATION_SECONDS);
            let token = self
                .tokens
                .get(self.source.as_ref(), pod_namespace(pod), sa, &audiences, expiration, &bound)
                .await
                // Upstream's words, its typo included: drivers' operators grep for them.
                .map_err(|e| {
                    VolumeError::Claim(format!(
                        "kubernetes.io/csi: mounter.SetUpAt failed to get service accoount token attributes: {e}"
                    ))
                })?;
            let secs = token.expiration.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let at = jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(i64::MAX)).unwrap_or_default();
            out.insert(request.audience.clone(), Status { token: token.token, expiration_timestamp: at.to_string() });
        }
        Ok(Some(serde_json::to_string(&out).expect("token statuses serialize")))
    }

    /// Sets up a CSI volume: the `CSIDriver` object's rules, the attachment, the secrets,
    /// then stage and publish through the driver, then the fsGroup. `republish`: the
    /// volume is published already and its driver `requiresRepublish`, so it is only
    /// published again (upstream skips the staging of a staged volume too).
    pub(super) async fn set_up_csi(&self, pod: &Pod, mv: &MountedVolume, republish: bool) -> Result<(), VolumeError> {
        let spec = mv.csi.as_ref().expect("described as csi");
        let object = self.source.csi_driver(&spec.driver).await?;
        let driver_spec = object.map(|o| o.spec).unwrap_or_default();
        if spec.mode == LifecycleMode::Ephemeral {
            let modes = driver_spec.volume_lifecycle_modes.clone().unwrap_or_else(|| vec!["Persistent".into()]);
            if !modes.iter().any(|m| m == "Ephemeral") {
                return Err(VolumeError::Claim(format!(
                    "kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: volume mode \"Ephemeral\" not supported by driver {} (only supports {modes:?})",
                    spec.driver
                )));
            }
        }
        let mut publish_context = BTreeMap::new();
        if spec.attach_required && spec.mode == LifecycleMode::Persistent {
            let name = attachment_name(&spec.volume_handle, &spec.driver, self.csi.node_name());
            let attachment = self.source.volume_attachment(&name).await?;
            let status = attachment.and_then(|a| a.status);
            if !status.as_ref().is_some_and(|s| s.attached) {
                return Err(VolumeError::NotAttached {
                    volume_handle: spec.volume_handle.clone(),
                    node: self.csi.node_name().to_owned(),
                    attachment: name,
                });
            }
            publish_context = status.and_then(|s| s.attachment_metadata).unwrap_or_default();
        }
        let stage_secrets = match &spec.stage_secret {
            Some(r) if !republish => self.secret_data(r, "NodeStageSecretRef").await?,
            _ => BTreeMap::new(),
        };
        let mut publish_secrets = match &spec.publish_secret {
            Some(r) => self.secret_data(r, "NodePublishSecretRef").await?,
            None => BTreeMap::new(),
        };
        let mut pod_attributes = BTreeMap::new();
        if driver_spec.pod_info_on_mount == Some(true) {
            let p = |k: &str| format!("csi.storage.k8s.io/{k}");
            let pod_spec = pod.spec.as_ref();
            pod_attributes.insert(p("pod.name"), pod.metadata.name.clone().unwrap_or_default());
            pod_attributes.insert(p("pod.namespace"), pod_namespace(pod).to_owned());
            pod_attributes.insert(p("pod.uid"), pod_uid(pod).to_owned());
            pod_attributes.insert(
                p("serviceAccount.name"),
                pod_spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
            );
            pod_attributes.insert(p("ephemeral"), (spec.mode == LifecycleMode::Ephemeral).to_string());
        }
        let requests = driver_spec.token_requests.as_deref().unwrap_or_default();
        if let Some(tokens) = self.service_account_tokens(pod, requests).await? {
            // `serviceAccountTokenInSecrets`: in the publish secrets instead of the
            // volume context, where drivers may log them.
            let into = if driver_spec.service_account_token_in_secrets == Some(true) {
                &mut publish_secrets
            } else {
                &mut pod_attributes
            };
            into.insert(CSI_TOKENS_KEY.to_owned(), tokens);
        }
        let fs_group = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.fs_group);
        let publish_dir = mv.path.parent().expect("a publish target has a parent").to_owned();
        let args = SetUpArgs {
            publish_dir,
            publish_context,
            stage_secrets,
            publish_secrets,
            pod_attributes,
            fs_group,
            republish,
        };
        self.csi.set_up(&self.root_dir, spec, args).await?;

        let policy = driver_spec.fs_group_policy.as_deref().unwrap_or("ReadWriteOnceWithFSType");
        let driver_applies = self.csi.get(&spec.driver).is_some_and(|d| d.capabilities.volume_mount_group);
        if let Some(gid) = fs_group.and_then(|g| u32::try_from(g).ok())
            && !spec.block
            && !driver_applies
            && spec.applies_fs_group(policy)
        {
            let path = mv.path.clone();
            let read_only = spec.read_only;
            tokio::task::spawn_blocking(move || super::ownership::set_volume_ownership(&path, gid, read_only))
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
                .map_err(|e| VolumeError::Claim(format!("applying fsGroup {gid} to volume {}: {e}", mv.name)))?;
        }
        Ok(())
    }
}
