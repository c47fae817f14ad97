//! Cgroup names under `cgroupDriver: systemd`: the kubelet's internal cgroup names (a list
//! of components, upstream's `CgroupName`, such as `["kubepods", "burstable",
//! "pod<uid>"]`) as systemd slices, and back (upstream `cgroup_manager_linux.go`:
//! `ToSystemd`, `ParseSystemdToCgroupName`, `IsSystemdStyleName`; runc's `ExpandSlice`).
//!
//! systemd nests a slice in the one its name extends: `kubepods-burstable.slice` lives in
//! `kubepods.slice`, so `-` separates levels and a component's own `-` is written `_`
//! (the kubelet forbids `_` in its components, so the mapping can be reversed):
//!
//! ```text
//! ["kubepods", "burstable", "pod12-ab"]
//!   unit  kubepods-burstable-pod12_ab.slice
//!   path  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_ab.slice
//! ```
//!
//! The slices themselves are made through systemd's D-Bus API ([`super::systemd_dbus`]).

/// A name that is not a systemd slice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid slice name: {0}")]
pub struct InvalidSlice(pub String);

const SLICE: &str = ".slice";

/// The slice unit of the cgroup named by `components` (`kubepods-burstable.slice`); the
/// root slice `-.slice` for none.
///
/// # Errors
/// A component that is empty or holds `/` or `_` cannot name a slice (upstream panics
/// on such a name).
pub fn unit_name(components: &[&str]) -> Result<String, InvalidSlice> {
    if components.is_empty() || components == [""] {
        return Ok(format!("-{SLICE}"));
    }
    if let Some(bad) = components.iter().find(|c| c.is_empty() || c.contains(['/', '_'])) {
        return Err(InvalidSlice(format!("component {bad:?} of {components:?}")));
    }
    let escaped: Vec<String> = components.iter().map(|c| c.replace('-', "_")).collect();
    Ok(format!("{}{SLICE}", escaped.join("-")))
}

/// The cgroup path of the cgroup named by `components` under systemd
/// (`/kubepods.slice/kubepods-burstable.slice`), `/` for none (upstream `ToSystemd`).
///
/// # Errors
/// As [`unit_name`].
pub fn to_systemd(components: &[&str]) -> Result<String, InvalidSlice> {
    expand_slice(&unit_name(components)?)
}

/// The cgroup path of slice unit `slice` (runc's `ExpandSlice`): `a-b.slice` is
/// `/a.slice/a-b.slice`, `-.slice` is `/`.
///
/// # Errors
/// Not a slice name: no `.slice` suffix, a `/`, or an empty level (`a--b.slice`,
/// `-a.slice`).
pub fn expand_slice(slice: &str) -> Result<String, InvalidSlice> {
    let invalid = || InvalidSlice(slice.to_owned());
    let name = slice.strip_suffix(SLICE).ok_or_else(invalid)?;
    if slice.contains('/') {
        return Err(invalid());
    }
    if name == "-" {
        return Ok("/".to_owned());
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for level in name.split('-') {
        if level.is_empty() {
            return Err(invalid());
        }
        path.push('/');
        path.push_str(&prefix);
        path.push_str(level);
        path.push_str(SLICE);
        prefix.push_str(level);
        prefix.push('-');
    }
    Ok(path)
}

/// The components of a systemd cgroup name, from its last slice
/// (`/kubepods.slice/kubepods-burstable.slice` → `["kubepods", "burstable"]`; upstream
/// `ParseSystemdToCgroupName`).
#[must_use]
pub fn from_systemd(name: &str) -> Vec<String> {
    let base = name.rsplit('/').next().unwrap_or(name);
    let base = base.strip_suffix(SLICE).unwrap_or(base);
    base.split('-').map(|c| c.replace('_', "-")).collect()
}

/// Whether `name` is written the systemd way (upstream `IsSystemdStyleName`).
#[must_use]
pub fn is_systemd_style(name: &str) -> bool {
    name.ends_with(SLICE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's own examples (`ToSystemd`'s doc, `cgroup_manager_linux_test.go`).
    #[test]
    fn names_become_nested_slices() {
        for (components, want) in [
            (
                &["kubepods", "burstable", "pod1234-abcd-5678-efgh"][..],
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd_5678_efgh.slice",
            ),
            (&["kubepods"][..], "/kubepods.slice"),
            (&["kubepods", "pod12"][..], "/kubepods.slice/kubepods-pod12.slice"),
            (&["system"][..], "/system.slice"),
            (&["system", "Burstable"][..], "/system.slice/system-Burstable.slice"),
            (&[][..], "/"),
            (&[""][..], "/"),
        ] {
            assert_eq!(to_systemd(components).unwrap(), want, "{components:?}");
        }
        assert_eq!(unit_name(&["kubepods", "besteffort", "pod1-2"]).unwrap(), "kubepods-besteffort-pod1_2.slice");
        assert_eq!(unit_name(&[]).unwrap(), "-.slice");
    }

    #[test]
    fn components_that_cannot_be_reversed_are_refused() {
        for bad in [&["a_b"][..], &["a/b"][..], &["kubepods", ""][..]] {
            assert!(to_systemd(bad).is_err(), "{bad:?}");
        }
    }

    /// runc's `TestExpandSlice` cases.
    #[test]
    fn slices_expand_as_runc_does() {
        for (slice, want) in [
            ("-.slice", Some("/")),
            ("machine.slice", Some("/machine.slice")),
            ("test-a.slice", Some("/test.slice/test-a.slice")),
            ("test-a-b.slice", Some("/test.slice/test-a.slice/test-a-b.slice")),
            ("test-a-b-c.slice", Some("/test.slice/test-a.slice/test-a-b.slice/test-a-b-c.slice")),
            ("test-a--b.slice", None),
            ("-test.slice", None),
            ("test-.slice", None),
            (".slice", None),
            ("a/b.slice", None),
            ("test", None),
            ("", None),
        ] {
            assert_eq!(expand_slice(slice).ok().as_deref(), want, "{slice:?}");
        }
        assert_eq!(expand_slice("x").unwrap_err().to_string(), "invalid slice name: x");
    }

    #[test]
    fn systemd_names_read_back_as_components() {
        let path = to_systemd(&["kubepods", "burstable", "pod12-ab"]).unwrap();
        assert_eq!(from_systemd(&path), ["kubepods", "burstable", "pod12-ab"]);
        assert_eq!(from_systemd("kubepods-besteffort.slice"), ["kubepods", "besteffort"]);
        assert!(is_systemd_style("/system.slice") && !is_systemd_style("/kubepods/burstable"));
    }
}
