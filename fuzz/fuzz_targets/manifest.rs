//! The static pod manifest decoder of the file source (`sources::file::parse_manifest`:
//! one YAML or JSON document per file, API defaults and the static pod rules applied), and
//! then what the agent works out from every pod it admits before anything reaches the
//! runtime: `QoS` class, resource sums, the first sync's actions, labels and spec hashes,
//! image references, security contexts, hostname and domain.
//!
//! The input is the text of one manifest file. Besides never panicking, these must hold:
//! - decoding is deterministic (the UID is a hash of the manifest: the same file must
//!   always give the same pod, or every agent restart would restart the pod);
//! - an accepted pod carries what the static pod rules promise: a UID, the name suffixed
//!   with the node name, the node name, phase `Pending`, and the `NoExecute` toleration;
//! - a `Localhost` seccomp profile the runtime is handed lies below the seccomp root
//!   (upstream validates static pods as the API server validates a create: the profile
//!   must be a relative path without `..`).

#![no_main]

use std::path::{Component, Path};

use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use swiftlet::types::{pod_resources, qos};
use swiftlet::images::puller::{ImageReference, PullPolicy};
use swiftlet::container::api::security_profile::ProfileType;
use swiftlet::container::labels::{self, ContainerKind};
use swiftlet::container::pod_status::RuntimePodStatus;
use swiftlet::runtime::{manager, security_context};
use swiftlet::sources::file::parse_manifest;

const PATH: &str = "/etc/kubernetes/manifests/fuzz.yaml";
const NODE: &str = "Fuzz-Node";

fuzz_target!(|data: &[u8]| {
    // The file source reads manifests as UTF-8 text.
    let Ok(text) = std::str::from_utf8(data) else { return };
    let pod = match parse_manifest(text, PATH, NODE) {
        Ok(pod) => pod,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert_eq!(parse_manifest(text, PATH, NODE).as_ref(), Ok(&pod), "decoding is not deterministic");
    static_pod_rules(&pod);
    what_the_agent_derives(&pod);
});

fn static_pod_rules(pod: &Pod) {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    // A manifest may set its own UID; otherwise it is the MD5 of the manifest.
    assert!(!uid.is_empty(), "no UID");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    assert!(name.ends_with(&format!("-{}", NODE.to_lowercase())), "name {name:?}");
    let spec = pod.spec.as_ref().expect("an accepted pod has a spec");
    assert_eq!(spec.node_name.as_deref(), Some(NODE));
    assert!(!spec.containers.is_empty());
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    assert!(
        tolerations.iter().any(|t| t.operator.as_deref() == Some("Exists") && t.effect.as_deref() == Some("NoExecute")),
        "the NoExecute toleration"
    );
    assert_eq!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"));
}

fn what_the_agent_derives(pod: &Pod) {
    let _ = qos::qos_class(pod);
    let _ = pod_resources::validate_pod_resources(pod);
    let _ = pod_resources::pod_requests(pod);
    let _ = pod_resources::pod_limits(pod);
    let _ = manager::compute_pod_actions(pod, &RuntimePodStatus::default());
    let _ = swiftlet::types::pod::pod_full_name(pod);
    let _ = manager::dns::pod_hostname_and_domain(pod, "cluster.local");
    let _ = labels::sandbox_labels(pod);
    let _ = labels::sandbox_annotations(pod);
    let _ = security_context::sandbox_security_context(pod);
    let _ = security_context::apparmor_required(pod);
    let spec = pod.spec.as_ref().expect("an accepted pod has a spec");
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| (c, ContainerKind::Init))
        .chain(spec.containers.iter().map(|c| (c, ContainerKind::Regular)));
    let settings = security_context::SecuritySettings::default();
    for (container, kind) in containers {
        let _ = labels::container_labels(pod, container, kind);
        let _ = labels::container_annotations(pod, container, 0);
        let _ = labels::container_hash(container);
        let _ = PullPolicy::of(container);
        let _ =
            ImageReference::parse(container.image.as_deref().unwrap_or_default()).map(|r| r.effective_tag().is_some());
        let _ = security_context::effective(pod, container);
        if let Ok(profile) = security_context::seccomp_profile(pod, container, &settings)
            && profile.profile_type == ProfileType::Localhost as i32
        {
            let path = Path::new(&profile.localhost_ref);
            assert!(
                path.starts_with(&settings.seccomp_profile_root)
                    && !path.components().any(|c| c == Component::ParentDir),
                "container {:?}: the Localhost seccomp profile {path:?} is not below {:?}",
                container.name,
                settings.seccomp_profile_root
            );
        }
        let _ = security_context::apparmor_profile(pod, container);
        let _ = security_context::proc_mount_paths(container);
        let _ = pod_resources::container_requests(container);
        let _ = pod_resources::container_limits(container);
    }
}
