//! Sysctl admission (upstream `pkg/kubelet/sysctl`): a pod may set only the safe sysctls
//! (namespaced ones that cannot hurt the node or its other pods; some only on kernels
//! new enough to namespace them) and those `allowedUnsafeSysctls` names (a trailing `*`
//! allows a prefix). A sysctl of the IPC, network or user namespace is refused when the
//! pod shares that namespace with the host. A refused pod fails with reason
//! `SysctlForbidden` and upstream's message (`forbidden sysctl: "kernel.msgmax" not
//! allowlisted`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::admission::{PodAdmitHandler, Rejection};

/// The reason of a refused pod (upstream `ForbiddenReason`).
pub const FORBIDDEN_REASON: &str = "SysctlForbidden";

/// Upstream `SafeSysctlAllowlist`: each safe sysctl with the kernel (major, minor) that
/// namespaces it, if any.
const SAFE_SYSCTLS: &[(&str, Option<(u32, u32)>)] = &[
    ("kernel.shm_rmid_forced", None),
    ("net.ipv4.ip_local_port_range", None),
    ("net.ipv4.tcp_syncookies", None),
    ("net.ipv4.ping_group_range", None),
    ("net.ipv4.ip_unprivileged_port_start", None),
    ("net.ipv4.ip_local_reserved_ports", Some((3, 16))),
    ("net.ipv4.tcp_keepalive_time", Some((4, 5))),
    ("net.ipv4.tcp_fin_timeout", Some((4, 6))),
    ("net.ipv4.tcp_keepalive_intvl", Some((4, 5))),
    ("net.ipv4.tcp_keepalive_probes", Some((4, 5))),
    ("net.ipv4.tcp_rmem", Some((4, 15))),
    ("net.ipv4.tcp_wmem", Some((4, 15))),
    ("net.ipv4.tcp_slow_start_after_idle", Some((4, 15))),
    ("net.ipv4.tcp_notsent_lowat", Some((4, 6))),
];

/// The kernel namespace a sysctl belongs to (upstream `utilsysctl.Namespace`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Namespace {
    Ipc,
    Net,
    Uts,
    User,
}

impl Namespace {
    /// Upstream's names, as its messages print them.
    fn as_str(self) -> &'static str {
        match self {
            Self::Ipc => "IPC",
            Self::Net => "Net",
            Self::Uts => "UTS",
            Self::User => "User",
        }
    }

    /// Upstream `namespaceOf`.
    fn of(name: &str) -> Option<Self> {
        const NAMES: &[(&str, Namespace)] = &[
            ("kernel.domainname", Namespace::Uts),
            ("kernel.sem", Namespace::Ipc),
            ("kernel.shmall", Namespace::Ipc),
            ("kernel.shmmax", Namespace::Ipc),
            ("kernel.shmmni", Namespace::Ipc),
            ("kernel.shm_rmid_forced", Namespace::Ipc),
            ("kernel.shm", Namespace::Ipc),
            ("kernel.msgmax", Namespace::Ipc),
            ("kernel.msgmnb", Namespace::Ipc),
            ("kernel.msgmni", Namespace::Ipc),
            ("kernel.msg", Namespace::Ipc),
        ];
        const PREFIXES: &[(&str, Namespace)] =
            &[("net", Namespace::Net), ("fs.mqueue", Namespace::Ipc), ("user", Namespace::User)];
        if let Some((_, ns)) = NAMES.iter().find(|(n, _)| *n == name) {
            return Some(*ns);
        }
        PREFIXES.iter().find(|(p, _)| name.strip_prefix(p).is_some_and(|rest| rest.starts_with('.'))).map(|(_, ns)| *ns)
    }
}

/// Upstream `NormalizeName`: `net/ipv4/conf/eno2.100/rp_filter` becomes
/// `net.ipv4.conf.eno2/100.rp_filter` (slashes separate, dots are part of a segment);
/// a name whose first separator is a dot is kept.
#[must_use]
pub fn normalize_name(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

/// Upstream `IsValidSysctlPattern`: segments of `[a-z0-9]([-_a-z0-9]*[a-z0-9])?` joined by
/// `.` or `/`, the last of which may end in `*`; at most 253 characters.
fn is_valid_pattern(pattern: &str) -> bool {
    let inner = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_';
    let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if pattern.is_empty() || pattern.len() > 253 {
        return false;
    }
    let segments: Vec<&[u8]> = pattern.as_bytes().split(|&c| c == b'.' || c == b'/').collect();
    let (last, rest) = segments.split_last().expect("split yields one segment at least");
    let segment_ok = |s: &[u8]| match s {
        [] => false,
        [one] => edge(*one),
        [first, middle @ .., end] => edge(*first) && edge(*end) && middle.iter().all(|&c| inner(c)),
    };
    let last_ok = match last {
        [] => false,
        [one] => edge(*one) || *one == b'*',
        [first, middle @ .., end] => edge(*first) && (edge(*end) || *end == b'*') && middle.iter().all(|&c| inner(c)),
    };
    rest.iter().all(|s| segment_ok(s)) && last_ok
}

/// The sysctls pods may set on this node (upstream `patternAllowlist`).
#[derive(Debug)]
pub struct SysctlAllowlist {
    names: BTreeMap<String, Namespace>,
    prefixes: BTreeMap<String, Namespace>,
}

impl SysctlAllowlist {
    /// The safe sysctls the running kernel namespaces, and `allowed_unsafe`.
    ///
    /// # Errors
    /// A pattern that is not a sysctl name (with an optional trailing `*`), or a sysctl that
    /// is not known to be namespaced: the message names it (`allowedUnsafeSysctls`).
    pub fn new(allowed_unsafe: &[String]) -> Result<Self, String> {
        Self::with_kernel(allowed_unsafe, kernel_version())
    }

    fn with_kernel(allowed_unsafe: &[String], kernel: Option<(u32, u32)>) -> Result<Self, String> {
        let safe = SAFE_SYSCTLS
            .iter()
            .filter(|(_, min)| min.is_none_or(|min| kernel.is_some_and(|k| k >= min)))
            .map(|(name, _)| (*name).to_owned());
        let mut list = Self { names: BTreeMap::new(), prefixes: BTreeMap::new() };
        for pattern in safe.chain(allowed_unsafe.iter().cloned()) {
            if !is_valid_pattern(&pattern) {
                return Err(format!(
                    "allowedUnsafeSysctls: sysctl {pattern:?} must have at most 253 characters and match regex \
                     ([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]"
                ));
            }
            let normalized = normalize_name(&pattern);
            let (name, prefixed) = match normalized.find('*') {
                Some(i) => (normalized[..i].to_owned(), true),
                None => (normalized, false),
            };
            let Some(ns) = Namespace::of(&name) else {
                return Err(format!("allowedUnsafeSysctls: the sysctls {name:?} are not known to be namespaced"));
            };
            if prefixed {
                list.prefixes.insert(name, ns);
            } else {
                list.names.insert(name, ns);
            }
        }
        Ok(list)
    }

    /// Upstream `validateSysctl`.
    fn validate(&self, sysctl: &str, host_net: bool, host_ipc: bool, host_users: bool) -> Result<(), String> {
        let sysctl = normalize_name(sysctl);
        let ns = self
            .names
            .get(&sysctl)
            .or_else(|| self.prefixes.iter().find(|(p, _)| sysctl.starts_with(p.as_str())).map(|(_, ns)| ns));
        let Some(ns) = ns else { return Err(format!("{sysctl:?} not allowlisted")) };
        let shared = match ns {
            Namespace::Ipc => host_ipc,
            Namespace::Net => host_net,
            Namespace::User => host_users,
            Namespace::Uts => false,
        };
        if shared {
            return Err(format!("{sysctl:?} not allowed with host {} enabled", ns.as_str()));
        }
        Ok(())
    }
}

impl PodAdmitHandler for SysctlAllowlist {
    fn admit(&self, pod: &Pod, _active: &[Pod]) -> Result<(), Rejection> {
        let Some(spec) = pod.spec.as_ref() else { return Ok(()) };
        let sysctls = spec.security_context.as_ref().and_then(|s| s.sysctls.as_deref()).unwrap_or_default();
        let host_users = spec.host_users.unwrap_or(true);
        for s in sysctls {
            if let Err(why) =
                self.validate(&s.name, spec.host_network.unwrap_or(false), spec.host_ipc.unwrap_or(false), host_users)
            {
                return Err(Rejection { reason: FORBIDDEN_REASON.into(), message: format!("forbidden sysctl: {why}") });
            }
        }
        Ok(())
    }
}

/// The running kernel's (major, minor), from `/proc/sys/kernel/osrelease`.
fn kernel_version() -> Option<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut parts = release.trim().split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, Sysctl};

    use super::*;

    fn pod(sysctls: &[&str], host_net: bool, host_ipc: bool, host_users: Option<bool>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                host_network: Some(host_net),
                host_ipc: Some(host_ipc),
                host_users,
                security_context: Some(PodSecurityContext {
                    sysctls: Some(sysctls.iter().map(|n| Sysctl { name: (*n).into(), value: "1".into() }).collect()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn message(list: &SysctlAllowlist, p: &Pod) -> Option<String> {
        list.admit(p, &[]).err().map(|r| {
            assert_eq!(r.reason, "SysctlForbidden");
            r.message
        })
    }

    #[test]
    fn safe_sysctls_pass_and_others_are_refused_with_upstreams_message() {
        let list = SysctlAllowlist::with_kernel(&[], Some((6, 18))).unwrap();
        assert_eq!(message(&list, &pod(&["kernel.shm_rmid_forced", "net.ipv4.tcp_rmem"], false, false, None)), None);
        assert_eq!(
            message(&list, &pod(&["kernel.shm_rmid_forced", "kernel.msgmax"], false, false, None)).as_deref(),
            Some("forbidden sysctl: \"kernel.msgmax\" not allowlisted")
        );
        // The slash form names the same sysctl.
        assert_eq!(message(&list, &pod(&["net/ipv4/tcp_syncookies"], false, false, None)), None);
        // A safe net sysctl is refused when the pod uses the host's network.
        assert_eq!(
            message(&list, &pod(&["net.ipv4.tcp_syncookies"], true, false, None)).as_deref(),
            Some("forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host Net enabled")
        );
        // An old kernel does not namespace the newer ones.
        let old = SysctlAllowlist::with_kernel(&[], Some((4, 4))).unwrap();
        assert!(message(&old, &pod(&["net.ipv4.tcp_keepalive_time"], false, false, None)).is_some());
        assert_eq!(message(&old, &pod(&["net.ipv4.ip_local_reserved_ports"], false, false, None)), None);
    }

    #[test]
    fn allowed_unsafe_sysctls_and_prefixes() {
        let allowed = ["kernel.msg*".to_owned(), "net.core.somaxconn".to_owned(), "user.max_user_namespaces".into()];
        let list = SysctlAllowlist::with_kernel(&allowed, Some((6, 18))).unwrap();
        assert_eq!(
            message(&list, &pod(&["kernel.msgmax", "kernel.msgmnb", "net.core.somaxconn"], false, false, None)),
            None
        );
        assert_eq!(
            message(&list, &pod(&["kernel.msgmax"], false, true, None)).as_deref(),
            Some("forbidden sysctl: \"kernel.msgmax\" not allowed with host IPC enabled")
        );
        // User-namespace sysctls need a pod in its own user namespace.
        assert!(message(&list, &pod(&["user.max_user_namespaces"], false, false, None)).is_some());
        assert_eq!(message(&list, &pod(&["user.max_user_namespaces"], false, false, Some(false))), None);
    }

    #[test]
    fn bad_patterns_are_refused_with_the_field_named() {
        for (pattern, want) in [
            ("Kernel.msgmax", "must have at most 253 characters"),
            ("kernel..msgmax", "must have at most 253 characters"),
            ("kernel.*.msg", "must have at most 253 characters"),
            ("vm.swappiness", "are not known to be namespaced"),
        ] {
            let e = SysctlAllowlist::with_kernel(&[pattern.to_owned()], Some((6, 18))).unwrap_err();
            assert!(e.starts_with("allowedUnsafeSysctls: ") && e.contains(want), "{pattern}: {e}");
        }
        assert!(is_valid_pattern("net.ipv4.conf.eno2/100.rp_filter"));
        assert!(is_valid_pattern("kernel.shm*") && is_valid_pattern("*") && is_valid_pattern("a"));
        assert_eq!(normalize_name("net/ipv4/conf/eno2.100/rp_filter"), "net.ipv4.conf.eno2/100.rp_filter");
        assert_eq!(normalize_name("net.ipv4.conf.eno2/100.rp_filter"), "net.ipv4.conf.eno2/100.rp_filter");
    }
}
