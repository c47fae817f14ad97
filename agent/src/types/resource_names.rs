//! Resource names (`cpu`, `memory`, `hugepages-2Mi`, `vendor.example/gpu`) and the tests
//! on them that admission, the resource managers, eviction and the downward API share.

/// Resource name of CPU.
pub const CPU: &str = "cpu";
/// Resource name of memory.
pub const MEMORY: &str = "memory";
/// Resource name of local ephemeral storage.
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// Prefix of huge page resource names (`hugepages-2Mi`).
pub const HUGEPAGES_PREFIX: &str = "hugepages-";

/// Whether `name` is a huge page resource (`hugepages-<size>`; upstream
/// `IsHugePageResourceName`).
#[must_use]
pub fn is_hugepage_resource_name(name: &str) -> bool {
    name.starts_with(HUGEPAGES_PREFIX)
}

/// Upstream `IsExtendedResourceName`: a qualified name outside `kubernetes.io/` (and not
/// `requests.*`), e.g. `vendor.example/gpu`.
#[must_use]
pub fn is_extended_resource_name(name: &str) -> bool {
    if !name.contains('/') || name.contains("kubernetes.io/") || name.starts_with("requests.") {
        return false;
    }
    // Upstream checks "requests.<name>" is a qualified name (the quota form).
    let Some((prefix, local)) = format!("requests.{name}").rsplit_once('/').map(|(p, l)| (p.to_owned(), l.to_owned()))
    else {
        return false;
    };
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    let subdomain = prefix.len() <= 253 && prefix.split('.').all(label);
    let name_ok = !local.is_empty()
        && local.len() <= 63
        && local.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && local.as_bytes()[0].is_ascii_alphanumeric()
        && local.as_bytes()[local.len() - 1].is_ascii_alphanumeric();
    subdomain && name_ok
}

/// The prefix of a device class's implicit extended resource name
/// (`deviceclass.resource.kubernetes.io/<class>`, upstream `ResourceDeviceClassPrefix`).
pub const DEVICE_CLASS_RESOURCE_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// Upstream `IsDRAExtendedResourceName`: an extended resource name, or the implicit one of
/// a device class ([`DEVICE_CLASS_RESOURCE_PREFIX`]).
#[must_use]
pub fn is_dra_extended_resource_name(name: &str) -> bool {
    is_extended_resource_name(name) || name.starts_with(DEVICE_CLASS_RESOURCE_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_resource_names() {
        assert!(is_extended_resource_name("nvidia.com/gpu"));
        assert!(is_extended_resource_name("example.com/fake_dev.1"));
        assert!(is_extended_resource_name("vendor.example/gpu"));
        assert!(!is_extended_resource_name("cpu"));
        assert!(!is_extended_resource_name("hugepages-2Mi"));
        assert!(!is_extended_resource_name("kubernetes.io/gpu"));
        assert!(!is_extended_resource_name("x.kubernetes.io/gpu"));
        assert!(!is_extended_resource_name("requests.example.com/gpu"));
        assert!(!is_extended_resource_name("example.com/"));
        assert!(!is_extended_resource_name("example.com/-gpu"));
        assert!(!is_extended_resource_name("Example.com/gpu"));
        assert!(!is_extended_resource_name(&format!("{}.com/gpu", "a".repeat(64))));
    }

    #[test]
    fn hugepage_names() {
        assert!(is_hugepage_resource_name("hugepages-2Mi"));
        assert!(!is_hugepage_resource_name(MEMORY));
    }
}
