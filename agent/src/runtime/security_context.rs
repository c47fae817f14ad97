//! Pod and container security contexts as the runtime sees them (upstream
//! `kuberuntime/security_context.go`, `security_context_others.go`, the seccomp and
//! `AppArmor` helpers of `kuberuntime/helpers.go`, `pkg/securitycontext/util.go` and the
//! sandbox half of `kuberuntime_sandbox.go`): pure functions from a pod, a container,
//! the image's user and the node's [`SecuritySettings`] to the CRI security contexts,
//! the `runAsNonRoot` check, and the `AppArmor` admit handler.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, Container, Pod, PodSecurityContext, SELinuxOptions, SeccompProfile, SecurityContext,
};

use crate::container::api;
use crate::lifecycle::admission::{PodAdmitHandler, Rejection};
use crate::types::pod::pod_full_name;

/// Where the kernel says whether `AppArmor` is enabled (runc's `apparmor.IsEnabled`).
pub const APPARMOR_ENABLED_PATH: &str = "/sys/module/apparmor/parameters/enabled";
/// The deprecated per-container `AppArmor` annotation (`container.apparmor...` + name).
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
/// Admission rejection reason when `AppArmor` cannot be enforced (upstream
/// `AppArmorNotAdmittedReason`).
pub const APPARMOR_NOT_ADMITTED_REASON: &str = "AppArmor";

/// Masked `/proc` and `/sys` paths of a container with the `Default` procMount (upstream
/// `defaultMaskedPaths`, kept in step with moby's defaults).
pub const DEFAULT_MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// Read-only `/proc` paths of a container with the `Default` procMount (upstream
/// `defaultReadonlyPaths`).
pub const DEFAULT_READONLY_PATHS: [&str; 5] =
    ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// A pod or container security context the runtime cannot be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A `Localhost` profile without its `localhostProfile`.
    #[error("{field}.localhostProfile must be set if {field}.type is Localhost")]
    MissingLocalhostProfile { field: String },
    /// A profile type the kubelet does not know.
    #[error("{field}.type: unknown profile type {value:?}")]
    UnknownProfileType { field: String, value: String },
    /// A `supplementalGroupsPolicy` other than Merge or Strict.
    #[error("spec.securityContext.supplementalGroupsPolicy: unknown policy {0:?} (want Merge or Strict)")]
    UnknownSupplementalGroupsPolicy(String),
    /// A `procMount` other than Default or Unmasked.
    #[error("{field}: unknown procMount {value:?} (want Default or Unmasked)")]
    UnknownProcMount { field: String, value: String },
    /// `runAsNonRoot` cannot be honoured (upstream `verifyRunAsNonRoot` messages).
    #[error("{0}")]
    RunAsNonRoot(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the node contributes to security contexts.
#[derive(Clone, Debug)]
pub struct SecuritySettings {
    /// `KubeletConfiguration` `seccompDefault`: an unset seccomp profile means
    /// `RuntimeDefault` instead of `Unconfined`. Default false.
    pub seccomp_default: bool,
    /// Where `Localhost` seccomp profiles live (upstream `seccompProfileRoot`,
    /// `<root-dir>/seccomp`). Default `/var/lib/kubelet/seccomp`.
    pub seccomp_profile_root: PathBuf,
    /// Whether the host enforces `AppArmor`. Default false.
    pub apparmor_enabled: bool,
}

impl Default for SecuritySettings {
    fn default() -> Self {
        Self::new(false, Path::new("/var/lib/kubelet"), false)
    }
}

impl SecuritySettings {
    /// Settings of a kubelet whose root dir is `root_dir`.
    #[must_use]
    pub fn new(seccomp_default: bool, root_dir: &Path, apparmor_enabled: bool) -> Self {
        Self { seccomp_default, seccomp_profile_root: root_dir.join("seccomp"), apparmor_enabled }
    }
}

/// Whether the host enforces `AppArmor`: the module parameter reads `Y`.
#[must_use]
pub fn apparmor_enabled_on_host() -> bool {
    apparmor_enabled_at(Path::new(APPARMOR_ENABLED_PATH))
}

fn apparmor_enabled_at(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.starts_with(b"Y"))
}

/// The image's user as `ImageStatus` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageUser {
    pub uid: Option<i64>,
    pub username: String,
}

impl ImageUser {
    /// Upstream `getImageUser`: the numeric uid if there is one, else the user name; an
    /// image without either (or unknown to the runtime) runs as root.
    #[must_use]
    pub fn from_image(image: Option<&api::Image>) -> Self {
        if let Some(i) = image {
            if let Some(uid) = &i.uid {
                return Self { uid: Some(uid.value), username: String::new() };
            }
            if !i.username.is_empty() {
                return Self { uid: None, username: i.username.clone() };
            }
        }
        Self { uid: Some(0), username: String::new() }
    }
}

/// The container's security context with the pod's defaults filled in (upstream
/// `DetermineEffectiveSecurityContext`): the container's field wins where set.
#[must_use]
pub fn effective(pod: &Pod, container: &Container) -> SecurityContext {
    let mut sc = container.security_context.clone().unwrap_or_default();
    if let Some(p) = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()) {
        sc.se_linux_options = sc.se_linux_options.or_else(|| p.se_linux_options.clone());
        sc.windows_options = sc.windows_options.or_else(|| p.windows_options.clone());
        sc.run_as_user = sc.run_as_user.or(p.run_as_user);
        sc.run_as_group = sc.run_as_group.or(p.run_as_group);
        sc.run_as_non_root = sc.run_as_non_root.or(p.run_as_non_root);
        sc.seccomp_profile = sc.seccomp_profile.or_else(|| p.seccomp_profile.clone());
        sc.app_armor_profile = sc.app_armor_profile.or_else(|| p.app_armor_profile.clone());
    }
    sc
}

/// Upstream `verifyRunAsNonRoot`, with its messages.
///
/// # Errors
/// [`Error::RunAsNonRoot`] when the container would (or might) run as root.
pub fn verify_run_as_non_root(pod: &Pod, container: &Container, image: &ImageUser) -> Result<()> {
    let sc = effective(pod, container);
    if sc.run_as_non_root != Some(true) {
        return Ok(());
    }
    let who = || format!("(pod: {:?}, container: {})", pod_full_name(pod), container.name);
    if let Some(uid) = sc.run_as_user {
        if uid == 0 {
            return Err(Error::RunAsNonRoot(format!("container's runAsUser breaks non-root policy {}", who())));
        }
        return Ok(());
    }
    match image.uid {
        None if !image.username.is_empty() => Err(Error::RunAsNonRoot(format!(
            "container has runAsNonRoot and image has non-numeric user ({}), cannot verify user is non-root {}",
            image.username,
            who()
        ))),
        Some(0) => Err(Error::RunAsNonRoot(format!("container has runAsNonRoot and image will run as root {}", who()))),
        Some(uid) if !(1..=i64::from(i32::MAX)).contains(&uid) => Err(Error::RunAsNonRoot(format!(
            "container has runAsNonRoot and image has an invalid user id ({uid}). (Must be 1-({})): must be between 0 and {}, inclusive {}",
            i32::MAX,
            i32::MAX,
            who()
        ))),
        _ => Ok(()),
    }
}

fn security_profile(profile_type: api::security_profile::ProfileType, localhost_ref: String) -> api::SecurityProfile {
    api::SecurityProfile { profile_type: profile_type as i32, localhost_ref }
}

/// Upstream `fieldSeccompProfile`: one profile field to the CRI profile; a `Localhost`
/// file is resolved under the seccomp root.
fn field_seccomp_profile(p: &SeccompProfile, field: &str, root: &Path) -> Result<api::SecurityProfile> {
    use api::security_profile::ProfileType;
    match p.type_.as_str() {
        "RuntimeDefault" => Ok(security_profile(ProfileType::RuntimeDefault, String::new())),
        "Unconfined" => Ok(security_profile(ProfileType::Unconfined, String::new())),
        "Localhost" => match p.localhost_profile.as_deref() {
            Some(name) if !name.is_empty() => {
                Ok(security_profile(ProfileType::Localhost, root.join(name).to_string_lossy().into_owned()))
            }
            _ => Err(Error::MissingLocalhostProfile { field: field.into() }),
        },
        other => Err(Error::UnknownProfileType { field: field.into(), value: other.into() }),
    }
}

/// Upstream `getSeccompProfile`: the container's field, else the pod's, else
/// `RuntimeDefault` with `seccompDefault` and `Unconfined` without. Privileged containers
/// get the same answer; the runtime leaves them unconfined.
///
/// # Errors
/// A `Localhost` profile without a name, or an unknown type (the error names the field).
pub fn seccomp_profile(pod: &Pod, container: &Container, settings: &SecuritySettings) -> Result<api::SecurityProfile> {
    use api::security_profile::ProfileType;
    if let Some(p) = container.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref()) {
        let field = format!("containers[{}].securityContext.seccompProfile", container.name);
        return field_seccomp_profile(p, &field, &settings.seccomp_profile_root);
    }
    if let Some(p) =
        pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.seccomp_profile.as_ref())
    {
        return field_seccomp_profile(p, "spec.securityContext.seccompProfile", &settings.seccomp_profile_root);
    }
    let t = if settings.seccomp_default { ProfileType::RuntimeDefault } else { ProfileType::Unconfined };
    Ok(security_profile(t, String::new()))
}

/// The `AppArmor` profile a container asks for and the field it came from (upstream
/// `apparmor.GetProfile`): the container's field, then the deprecated annotation (static
/// pods are not converted by the API server), then the pod's field.
fn apparmor_profile_of(pod: &Pod, container: &Container) -> Option<(AppArmorProfile, String)> {
    if let Some(p) = container.security_context.as_ref().and_then(|s| s.app_armor_profile.as_ref()) {
        return Some((p.clone(), format!("containers[{}].securityContext.appArmorProfile", container.name)));
    }
    let key = format!("{APPARMOR_ANNOTATION_PREFIX}{}", container.name);
    if let Some(v) = pod.metadata.annotations.as_ref().and_then(|a| a.get(&key)) {
        let from_annotation = match v.as_str() {
            "runtime/default" => Some(AppArmorProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
            "unconfined" => Some(AppArmorProfile { type_: "Unconfined".into(), localhost_profile: None }),
            v => v
                .strip_prefix("localhost/")
                .filter(|n| !n.is_empty())
                .map(|n| AppArmorProfile { type_: "Localhost".into(), localhost_profile: Some(n.into()) }),
        };
        // An invalid annotation is ignored, as upstream.
        if let Some(p) = from_annotation {
            return Some((p, format!("metadata.annotations[{key}]")));
        }
    }
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.app_armor_profile.clone())
        .map(|p| (p, "spec.securityContext.appArmorProfile".into()))
}

/// Upstream `getAppArmorProfile`: the CRI profile of the container, `None` when it asks
/// for none (the runtime then applies its own default).
///
/// # Errors
/// A `Localhost` profile without a name, or an unknown type (the error names the field).
pub fn apparmor_profile(pod: &Pod, container: &Container) -> Result<Option<api::SecurityProfile>> {
    use api::security_profile::ProfileType;
    let Some((p, field)) = apparmor_profile_of(pod, container) else { return Ok(None) };
    match p.type_.as_str() {
        "RuntimeDefault" => Ok(Some(security_profile(ProfileType::RuntimeDefault, String::new()))),
        "Unconfined" => Ok(Some(security_profile(ProfileType::Unconfined, String::new()))),
        "Localhost" => match p.localhost_profile {
            Some(name) if !name.is_empty() => Ok(Some(security_profile(ProfileType::Localhost, name))),
            _ => Err(Error::MissingLocalhostProfile { field }),
        },
        other => Err(Error::UnknownProfileType { field, value: other.into() }),
    }
}

/// Upstream `ConvertToRuntimeMaskedPaths` / `ConvertToRuntimeReadonlyPaths`: the default
/// lists, sent explicitly, or none for `Unmasked`.
///
/// # Errors
/// An unknown `procMount` (the error names the field).
pub fn proc_mount_paths(container: &Container) -> Result<(Vec<String>, Vec<String>)> {
    match container.security_context.as_ref().and_then(|s| s.proc_mount.as_deref()) {
        None | Some("Default") => Ok((
            DEFAULT_MASKED_PATHS.iter().map(ToString::to_string).collect(),
            DEFAULT_READONLY_PATHS.iter().map(ToString::to_string).collect(),
        )),
        Some("Unmasked") => Ok((Vec::new(), Vec::new())),
        Some(other) => Err(Error::UnknownProcMount {
            field: format!("containers[{}].securityContext.procMount", container.name),
            value: other.into(),
        }),
    }
}

fn selinux(o: &SELinuxOptions) -> api::SeLinuxOption {
    api::SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    }
}

fn capabilities(c: &Capabilities) -> api::Capability {
    api::Capability {
        add_capabilities: c.add.clone().unwrap_or_default(),
        drop_capabilities: c.drop.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// The pod's groups in upstream order: `fsGroup`, then `supplementalGroups`; and the
/// `supplementalGroupsPolicy` (Merge when unset).
fn pod_groups(psc: Option<&PodSecurityContext>) -> Result<(Vec<i64>, i32)> {
    let Some(psc) = psc else { return Ok((Vec::new(), api::SupplementalGroupsPolicy::Merge as i32)) };
    let mut groups: Vec<i64> = psc.fs_group.into_iter().collect();
    groups.extend(psc.supplemental_groups.iter().flatten());
    let policy = match psc.supplemental_groups_policy.as_deref() {
        None | Some("Merge") => api::SupplementalGroupsPolicy::Merge,
        Some("Strict") => api::SupplementalGroupsPolicy::Strict,
        Some(other) => return Err(Error::UnknownSupplementalGroupsPolicy(other.into())),
    };
    Ok((groups, policy as i32))
}

/// Upstream `determineEffectiveSecurityContext` (Linux): the container's CRI security
/// context, without the namespace options (the caller knows the pod's namespaces).
/// `image` fills in the user when neither the pod nor the container sets `runAsUser`.
///
/// # Errors
/// Bad profile fields, procMount or group policy (each error names the field).
pub fn container_security_context(
    pod: &Pod,
    container: &Container,
    image: &ImageUser,
    settings: &SecuritySettings,
) -> Result<api::LinuxContainerSecurityContext> {
    let sc = effective(pod, container);
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let (supplemental_groups, supplemental_groups_policy) = pod_groups(psc)?;
    let (masked_paths, readonly_paths) = proc_mount_paths(container)?;
    let (run_as_user, run_as_username) = match sc.run_as_user {
        Some(uid) => (Some(uid), String::new()),
        None => (image.uid, image.username.clone()),
    };
    Ok(api::LinuxContainerSecurityContext {
        capabilities: sc.capabilities.as_ref().map(capabilities),
        privileged: sc.privileged.unwrap_or(false),
        selinux_options: sc.se_linux_options.as_ref().map(selinux),
        run_as_user: run_as_user.map(|value| api::Int64Value { value }),
        run_as_group: sc.run_as_group.map(|value| api::Int64Value { value }),
        run_as_username,
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups,
        supplemental_groups_policy,
        // Upstream `AddNoNewPrivileges`: only an explicit allowPrivilegeEscalation=false.
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        masked_paths,
        readonly_paths,
        seccomp: Some(seccomp_profile(pod, container, settings)?),
        // Checked either way; sent only where the host enforces AppArmor (a pod that
        // needs it on a host without it is refused at admission).
        apparmor: apparmor_profile(pod, container)?.filter(|_| settings.apparmor_enabled),
        ..Default::default()
    })
}

/// The sandbox's security context fields upstream's `generatePodSandboxLinuxConfig`
/// sets besides namespaces and `privileged`: the pod's user and group, `fsGroup` and
/// supplemental groups, their policy, `SELinux`, and a `RuntimeDefault` seccomp profile
/// (always: the pause process needs nothing more, and it lets a pod-level profile be as
/// tight as the app needs, kubernetes#84623).
///
/// # Errors
/// An unknown `supplementalGroupsPolicy`.
pub fn sandbox_security_context(pod: &Pod) -> Result<api::LinuxSandboxSecurityContext> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let (supplemental_groups, supplemental_groups_policy) = pod_groups(psc)?;
    Ok(api::LinuxSandboxSecurityContext {
        run_as_user: psc.and_then(|s| s.run_as_user).map(|value| api::Int64Value { value }),
        run_as_group: psc.and_then(|s| s.run_as_group).map(|value| api::Int64Value { value }),
        supplemental_groups,
        supplemental_groups_policy,
        selinux_options: psc.and_then(|s| s.se_linux_options.as_ref()).map(selinux),
        seccomp: Some(security_profile(api::security_profile::ProfileType::RuntimeDefault, String::new())),
        ..Default::default()
    })
}

/// Whether the pod needs `AppArmor` enforced (upstream validator `isRequired`): a profile
/// other than `Unconfined` on the pod or any container, or a deprecated annotation not
/// saying `unconfined`.
#[must_use]
pub fn apparmor_required(pod: &Pod) -> bool {
    let confined = |p: Option<&AppArmorProfile>| p.is_some_and(|p| p.type_ != "Unconfined");
    let Some(spec) = pod.spec.as_ref() else { return false };
    if confined(spec.security_context.as_ref().and_then(|s| s.app_armor_profile.as_ref())) {
        return true;
    }
    let containers =
        spec.containers.iter().chain(spec.init_containers.iter().flatten()).map(|c| c.security_context.as_ref());
    let ephemeral = spec.ephemeral_containers.iter().flatten().map(|e| e.security_context.as_ref());
    if containers.chain(ephemeral).any(|s| confined(s.and_then(|s| s.app_armor_profile.as_ref()))) {
        return true;
    }
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .any(|(k, v)| k.starts_with(APPARMOR_ANNOTATION_PREFIX) && v != "unconfined")
}

/// Upstream `appArmorAdmitHandler`: a pending pod that needs `AppArmor` is refused on a
/// host without it ("Cannot enforce `AppArmor`: `AppArmor` is not enabled on the host").
#[derive(Clone, Debug)]
pub struct AppArmorAdmitHandler {
    enabled: bool,
}

impl AppArmorAdmitHandler {
    /// A handler for a host where `AppArmor` is (`enabled`) or is not enforced.
    #[must_use]
    pub fn new(enabled: bool) -> Self {
        Self { enabled }
    }
}

impl PodAdmitHandler for AppArmorAdmitHandler {
    fn admit(&self, pod: &Pod, _active: &[Pod]) -> Result<(), Rejection> {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        if self.enabled || phase != "Pending" || !apparmor_required(pod) {
            return Ok(());
        }
        Err(Rejection {
            reason: APPARMOR_NOT_ADMITTED_REASON.into(),
            message: "Cannot enforce AppArmor: AppArmor is not enabled on the host".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::security_profile::ProfileType;

    fn pod(v: serde_json::Value) -> Pod {
        let mut base = serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        });
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn c(p: &Pod) -> &Container {
        &p.spec.as_ref().unwrap().containers[0]
    }

    fn settings() -> SecuritySettings {
        SecuritySettings::new(false, Path::new("/var/lib/kubelet"), true)
    }

    fn root() -> ImageUser {
        ImageUser { uid: Some(0), username: String::new() }
    }

    fn sc(p: &Pod, s: &SecuritySettings) -> api::LinuxContainerSecurityContext {
        container_security_context(p, c(p), &root(), s).unwrap()
    }

    fn profile(t: ProfileType, r: &str) -> api::SecurityProfile {
        security_profile(t, r.into())
    }

    #[test]
    fn seccomp_container_wins_over_pod() {
        let p = pod(serde_json::json!({"spec": {
            "securityContext": {"seccompProfile": {"type": "Unconfined"}},
            "containers": [{"name": "c", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}]
        }}));
        assert_eq!(sc(&p, &settings()).seccomp, Some(profile(ProfileType::RuntimeDefault, "")));
        let p = pod(serde_json::json!({"spec": {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}}));
        assert_eq!(sc(&p, &settings()).seccomp, Some(profile(ProfileType::RuntimeDefault, "")));
    }

    #[test]
    fn seccomp_unset_is_unconfined_unless_seccomp_default() {
        let p = pod(serde_json::json!({}));
        assert_eq!(sc(&p, &settings()).seccomp, Some(profile(ProfileType::Unconfined, "")));
        let s = SecuritySettings { seccomp_default: true, ..settings() };
        assert_eq!(sc(&p, &s).seccomp, Some(profile(ProfileType::RuntimeDefault, "")));
        // An explicit Unconfined stays Unconfined with seccompDefault, privileged or not.
        let p = pod(serde_json::json!({"spec": {"containers": [{"name": "c",
            "securityContext": {"privileged": true, "seccompProfile": {"type": "Unconfined"}}}]}}));
        assert_eq!(sc(&p, &s).seccomp, Some(profile(ProfileType::Unconfined, "")));
        // A privileged container without a profile gets the same answer as others.
        let p =
            pod(serde_json::json!({"spec": {"containers": [{"name": "c", "securityContext": {"privileged": true}}]}}));
        assert_eq!(sc(&p, &s).seccomp, Some(profile(ProfileType::RuntimeDefault, "")));
    }

    #[test]
    fn seccomp_localhost_resolves_under_root_dir_and_needs_a_name() {
        let p = pod(serde_json::json!({"spec": {"securityContext":
            {"seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/audit.json"}}}}));
        let s = SecuritySettings::new(false, Path::new("/srv/kubelet"), false);
        assert_eq!(
            sc(&p, &s).seccomp,
            Some(profile(ProfileType::Localhost, "/srv/kubelet/seccomp/profiles/audit.json"))
        );
        let p = pod(serde_json::json!({"spec": {"containers": [{"name": "c",
            "securityContext": {"seccompProfile": {"type": "Localhost"}}}]}}));
        let err = container_security_context(&p, c(&p), &root(), &s).unwrap_err();
        assert_eq!(
            err.to_string(),
            "containers[c].securityContext.seccompProfile.localhostProfile must be set if containers[c].securityContext.seccompProfile.type is Localhost"
        );
        let p = pod(serde_json::json!({"spec": {"securityContext": {"seccompProfile": {"type": "Strict"}}}}));
        let err = container_security_context(&p, c(&p), &root(), &s).unwrap_err();
        assert_eq!(err.to_string(), "spec.securityContext.seccompProfile.type: unknown profile type \"Strict\"");
    }

    #[test]
    fn sandbox_seccomp_is_always_runtime_default() {
        let p = pod(serde_json::json!({"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}}));
        assert_eq!(sandbox_security_context(&p).unwrap().seccomp, Some(profile(ProfileType::RuntimeDefault, "")));
    }

    #[test]
    fn apparmor_precedence_container_annotation_pod() {
        let p = pod(serde_json::json!({
            "metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/c": "localhost/from-annotation"}},
            "spec": {"securityContext": {"appArmorProfile": {"type": "Unconfined"}},
                "containers": [{"name": "c", "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}]}
        }));
        assert_eq!(sc(&p, &settings()).apparmor, Some(profile(ProfileType::RuntimeDefault, "")));
        let mut p2 = p.clone();
        p2.spec.as_mut().unwrap().containers[0].security_context = None;
        assert_eq!(sc(&p2, &settings()).apparmor, Some(profile(ProfileType::Localhost, "from-annotation")));
        p2.metadata.annotations = None;
        assert_eq!(sc(&p2, &settings()).apparmor, Some(profile(ProfileType::Unconfined, "")));
        // Annotations: runtime/default, unconfined; an invalid one is ignored.
        for (v, want) in [
            ("runtime/default", Some(profile(ProfileType::RuntimeDefault, ""))),
            ("unconfined", Some(profile(ProfileType::Unconfined, ""))),
            ("localhost/", None),
            ("bogus", None),
        ] {
            let p = pod(
                serde_json::json!({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/c": v}}}),
            );
            assert_eq!(sc(&p, &settings()).apparmor, want, "{v}");
        }
    }

    #[test]
    fn apparmor_only_sent_when_the_host_enforces_it() {
        let p = pod(serde_json::json!({"spec": {"securityContext":
            {"appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-deny"}}}}));
        assert_eq!(sc(&p, &settings()).apparmor, Some(profile(ProfileType::Localhost, "k8s-deny")));
        let off = SecuritySettings { apparmor_enabled: false, ..settings() };
        assert_eq!(sc(&p, &off).apparmor, None);
        let p = pod(serde_json::json!({"spec": {"securityContext": {"appArmorProfile": {"type": "Localhost"}}}}));
        let err = container_security_context(&p, c(&p), &root(), &off).unwrap_err();
        assert!(
            err.to_string().starts_with("spec.securityContext.appArmorProfile.localhostProfile must be set"),
            "{err}"
        );
    }

    #[test]
    fn apparmor_admission_as_upstream() {
        let yes = AppArmorAdmitHandler::new(true);
        let no = AppArmorAdmitHandler::new(false);
        let needs = pod(serde_json::json!({"spec": {"containers": [{"name": "c",
            "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}]}}));
        assert!(yes.admit(&needs, &[]).is_ok());
        let r = no.admit(&needs, &[]).unwrap_err();
        assert_eq!(r.reason, "AppArmor");
        assert_eq!(r.message, "Cannot enforce AppArmor: AppArmor is not enabled on the host");
        // Unconfined everywhere, or nothing: admitted.
        let unconfined =
            pod(serde_json::json!({"spec": {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}}));
        assert!(no.admit(&unconfined, &[]).is_ok());
        assert!(no.admit(&pod(serde_json::json!({})), &[]).is_ok());
        // Deprecated annotation and init containers count.
        let annotated = pod(
            serde_json::json!({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/c": "runtime/default"}}}),
        );
        assert!(no.admit(&annotated, &[]).is_err());
        let init = pod(serde_json::json!({"spec": {"initContainers": [{"name": "i",
            "securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": "x"}}}]}}));
        assert!(no.admit(&init, &[]).is_err());
        // A pod already running is not re-checked.
        let running = pod(
            serde_json::json!({"status": {"phase": "Running"}, "spec": {"securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}}),
        );
        assert!(no.admit(&running, &[]).is_ok());
    }

    #[test]
    fn apparmor_host_detection_reads_the_module_parameter() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("enabled");
        assert!(!apparmor_enabled_at(&f));
        std::fs::write(&f, "Y\n").unwrap();
        assert!(apparmor_enabled_at(&f));
        std::fs::write(&f, "N\n").unwrap();
        assert!(!apparmor_enabled_at(&f));
        // The real host: whatever it says, it agrees with the file.
        let real = std::fs::read(APPARMOR_ENABLED_PATH).is_ok_and(|b| b.starts_with(b"Y"));
        assert_eq!(apparmor_enabled_on_host(), real);
    }

    #[test]
    fn selinux_pod_and_container() {
        let p = pod(
            serde_json::json!({"spec": {"securityContext": {"seLinuxOptions": {"level": "s0:c1,c2", "type": "pod_t"}}}}),
        );
        let want = api::SeLinuxOption { level: "s0:c1,c2".into(), r#type: "pod_t".into(), ..Default::default() };
        assert_eq!(sc(&p, &settings()).selinux_options, Some(want.clone()));
        assert_eq!(sandbox_security_context(&p).unwrap().selinux_options, Some(want));
        let p = pod(serde_json::json!({"spec": {"securityContext": {"seLinuxOptions": {"level": "s0:c1,c2"}},
            "containers": [{"name": "c", "securityContext": {"seLinuxOptions": {"user": "u", "role": "r"}}}]}}));
        // The container's options replace the pod's as a whole, as upstream.
        assert_eq!(
            sc(&p, &settings()).selinux_options,
            Some(api::SeLinuxOption { user: "u".into(), role: "r".into(), ..Default::default() })
        );
    }

    #[test]
    fn run_as_non_root_messages() {
        let p = pod(serde_json::json!({"spec": {"securityContext": {"runAsNonRoot": true}}}));
        let err = verify_run_as_non_root(&p, c(&p), &root()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "container has runAsNonRoot and image will run as root (pod: \"p_ns(u1)\", container: c)"
        );
        let named = ImageUser { uid: None, username: "nobody".into() };
        assert_eq!(
            verify_run_as_non_root(&p, c(&p), &named).unwrap_err().to_string(),
            "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root (pod: \"p_ns(u1)\", container: c)"
        );
        assert!(verify_run_as_non_root(&p, c(&p), &ImageUser { uid: Some(1000), username: String::new() }).is_ok());
        let bad = ImageUser { uid: Some(i64::from(i32::MAX) + 1), username: String::new() };
        assert_eq!(
            verify_run_as_non_root(&p, c(&p), &bad).unwrap_err().to_string(),
            "container has runAsNonRoot and image has an invalid user id (2147483648). (Must be 1-(2147483647)): must be between 0 and 2147483647, inclusive (pod: \"p_ns(u1)\", container: c)"
        );
        // runAsUser decides when set: 0 breaks the policy, anything else passes.
        let p = pod(serde_json::json!({"spec": {"securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "c", "securityContext": {"runAsUser": 0}}]}}));
        assert_eq!(
            verify_run_as_non_root(&p, c(&p), &root()).unwrap_err().to_string(),
            "container's runAsUser breaks non-root policy (pod: \"p_ns(u1)\", container: c)"
        );
        let p = pod(serde_json::json!({"spec": {"containers": [{"name": "c",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000}}]}}));
        assert!(verify_run_as_non_root(&p, c(&p), &root()).is_ok());
        // The container may switch the pod's runAsNonRoot off.
        let p = pod(serde_json::json!({"spec": {"securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "c", "securityContext": {"runAsNonRoot": false}}]}}));
        assert!(verify_run_as_non_root(&p, c(&p), &root()).is_ok());
    }

    #[test]
    fn image_user_fills_in_when_the_pod_sets_none() {
        assert_eq!(ImageUser::from_image(None), root());
        let img = api::Image { uid: Some(api::Int64Value { value: 65534 }), ..Default::default() };
        assert_eq!(ImageUser::from_image(Some(&img)), ImageUser { uid: Some(65534), username: String::new() });
        let img = api::Image { username: "app".into(), ..Default::default() };
        let named = ImageUser::from_image(Some(&img));
        assert_eq!(named, ImageUser { uid: None, username: "app".into() });
        let p = pod(serde_json::json!({}));
        let s = container_security_context(&p, c(&p), &named, &settings()).unwrap();
        assert_eq!((s.run_as_user, s.run_as_username.as_str()), (None, "app"));
        let s = container_security_context(&p, c(&p), &root(), &settings()).unwrap();
        assert_eq!(s.run_as_user, Some(api::Int64Value { value: 0 }));
        // The pod's (or container's) runAsUser wins over the image.
        let p = pod(serde_json::json!({"spec": {"securityContext": {"runAsUser": 1000, "runAsGroup": 3000}}}));
        let s = container_security_context(&p, c(&p), &named, &settings()).unwrap();
        assert_eq!(s.run_as_user, Some(api::Int64Value { value: 1000 }));
        assert_eq!(s.run_as_group, Some(api::Int64Value { value: 3000 }));
        assert_eq!(s.run_as_username, "");
    }

    #[test]
    fn fs_group_joins_supplemental_groups_with_policy() {
        let p = pod(
            serde_json::json!({"spec": {"securityContext": {"fsGroup": 2000, "supplementalGroups": [3000, 4000]}}}),
        );
        let s = sc(&p, &settings());
        assert_eq!(s.supplemental_groups, vec![2000, 3000, 4000]);
        assert_eq!(s.supplemental_groups_policy, api::SupplementalGroupsPolicy::Merge as i32);
        let sb = sandbox_security_context(&p).unwrap();
        assert_eq!(sb.supplemental_groups, vec![2000, 3000, 4000]);
        let p = pod(
            serde_json::json!({"spec": {"securityContext": {"fsGroup": 2000, "supplementalGroupsPolicy": "Strict"}}}),
        );
        assert_eq!(sc(&p, &settings()).supplemental_groups_policy, api::SupplementalGroupsPolicy::Strict as i32);
        assert_eq!(
            sandbox_security_context(&p).unwrap().supplemental_groups_policy,
            api::SupplementalGroupsPolicy::Strict as i32
        );
        let p = pod(serde_json::json!({"spec": {"securityContext": {"supplementalGroupsPolicy": "Loose"}}}));
        assert_eq!(
            container_security_context(&p, c(&p), &root(), &settings()).unwrap_err().to_string(),
            "spec.securityContext.supplementalGroupsPolicy: unknown policy \"Loose\" (want Merge or Strict)"
        );
    }

    #[test]
    fn proc_mount_default_and_unmasked() {
        let p = pod(serde_json::json!({}));
        let s = sc(&p, &settings());
        assert_eq!(s.masked_paths, DEFAULT_MASKED_PATHS.map(String::from).to_vec());
        assert_eq!(s.readonly_paths, DEFAULT_READONLY_PATHS.map(String::from).to_vec());
        let p = pod(
            serde_json::json!({"spec": {"containers": [{"name": "c", "securityContext": {"procMount": "Unmasked"}}]}}),
        );
        let s = sc(&p, &settings());
        assert!(s.masked_paths.is_empty() && s.readonly_paths.is_empty());
        let p =
            pod(serde_json::json!({"spec": {"containers": [{"name": "c", "securityContext": {"procMount": "Open"}}]}}));
        assert_eq!(
            container_security_context(&p, c(&p), &root(), &settings()).unwrap_err().to_string(),
            "containers[c].securityContext.procMount: unknown procMount \"Open\" (want Default or Unmasked)"
        );
    }

    #[test]
    fn privileges_capabilities_and_rootfs() {
        let p = pod(serde_json::json!({"spec": {"containers": [{"name": "c", "securityContext": {
            "privileged": true, "readOnlyRootFilesystem": true,
            "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}}]}}));
        let s = sc(&p, &settings());
        assert!(s.privileged && s.readonly_rootfs && !s.no_new_privs);
        let caps = s.capabilities.unwrap();
        assert_eq!((caps.add_capabilities, caps.drop_capabilities), (vec!["NET_ADMIN".into()], vec!["ALL".into()]));
        let p = pod(
            serde_json::json!({"spec": {"containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": false}}]}}),
        );
        assert!(sc(&p, &settings()).no_new_privs);
        let p = pod(
            serde_json::json!({"spec": {"containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": true}}]}}),
        );
        assert!(!sc(&p, &settings()).no_new_privs);
        // The sandbox does not take a read-only root or the containers' users.
        let sb = sandbox_security_context(&p).unwrap();
        assert!(!sb.readonly_rootfs && sb.run_as_user.is_none());
    }
}
