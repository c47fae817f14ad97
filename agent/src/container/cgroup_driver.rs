//! Which cgroup driver the node runs with: the runtime's, when it says (upstream
//! `getCgroupDriverFromCRI`).
//!
//! - The runtime answers `RuntimeConfig` (containerd 1.7+/2.x, CRI-O): its driver is used,
//!   whatever `cgroupDriver` says, as upstream does ("Using cgroup driver setting received
//!   from the CRI runtime").
//! - The runtime does not implement it (containerd 1.6): upstream falls back to
//!   `cgroupDriver` blindly, and a mismatch shows up later as every pod failing in runc.
//!   swiftlet reads what containerd's verbose `Status` shows of its CRI configuration
//!   (the default runtime's `SystemdCgroup` option) and refuses to start on a mismatch,
//!   naming both settings (a deliberate deviation, documented in the README). When that is
//!   not known either, `cgroupDriver` is used, as upstream.
//! - Other errors are retried three times, then stop the start (upstream too).

use std::time::Duration;

use k8s_cri::v1 as api;

use super::{Error, RuntimeService};

/// Where the driver came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `RuntimeConfig`.
    Runtime,
    /// `cgroupDriver`: `RuntimeConfig` answered without a Linux part.
    ConfigNoLinux,
    /// `cgroupDriver`, checked against the runtime's configuration (no `RuntimeConfig`).
    ConfigChecked,
    /// `cgroupDriver`, the runtime saying nothing about its own (no `RuntimeConfig`).
    Config,
}

impl Source {
    /// Whether the runtime lacks `RuntimeConfig` (upstream then sets
    /// `kubelet_cri_losing_support{version="1.38.0"}`).
    #[must_use]
    pub const fn runtime_config_unimplemented(&self) -> bool {
        matches!(self, Self::ConfigChecked | Self::Config)
    }
}

/// The driver to run with, or why the node cannot start.
///
/// # Errors
/// A driver the runtime names but swiftlet does not know, or a configured driver that
/// differs from the one the runtime's configuration shows.
pub fn resolve(
    configured: &str,
    runtime_config: Result<api::RuntimeConfigResponse, tonic::Code>,
    status_config: Option<&str>,
) -> Result<(String, Source), String> {
    match runtime_config {
        Ok(resp) => {
            let Some(linux) = resp.linux else {
                return Ok((configured.to_owned(), Source::ConfigNoLinux));
            };
            let driver = match api::CgroupDriver::try_from(linux.cgroup_driver) {
                Ok(api::CgroupDriver::Systemd) => "systemd",
                Ok(api::CgroupDriver::Cgroupfs) => "cgroupfs",
                Err(_) => return Err(format!("runtime returned an unknown cgroup driver {}", linux.cgroup_driver)),
            };
            Ok((driver.to_owned(), Source::Runtime))
        }
        Err(tonic::Code::Unimplemented) => match status_config.and_then(systemd_cgroup_option) {
            Some(systemd) => {
                let runtime = if systemd { "systemd" } else { "cgroupfs" };
                if runtime == configured {
                    Ok((configured.to_owned(), Source::ConfigChecked))
                } else {
                    Err(format!(
                        "cgroupDriver is {configured:?} but the container runtime runs containers with the \
                         {runtime:?} driver (its default runtime's SystemdCgroup = {systemd}); set cgroupDriver: \
                         {runtime} or change the runtime's configuration"
                    ))
                }
            }
            None => Ok((configured.to_owned(), Source::Config)),
        },
        Err(code) => Err(format!("RuntimeConfig failed: {code:?}")),
    }
}

/// The default runtime's `SystemdCgroup` option in containerd's CRI configuration as its
/// verbose `Status` shows it (`containerd.defaultRuntimeName`,
/// `containerd.runtimes.<name>.options.SystemdCgroup`); `None` when it is not there.
#[must_use]
pub fn systemd_cgroup_option(config_json: &str) -> Option<bool> {
    let config: serde_json::Value = serde_json::from_str(config_json).ok()?;
    let containerd = config.get("containerd")?;
    let name = containerd.get("defaultRuntimeName")?.as_str()?;
    let options = containerd.get("runtimes")?.get(name)?.get("options")?.as_object()?;
    // runc's options without SystemdCgroup mean cgroupfs.
    Some(options.get("SystemdCgroup").and_then(serde_json::Value::as_bool).unwrap_or(false))
}

/// Asks the runtime ([`resolve`]), retrying errors other than `Unimplemented` three times.
///
/// # Errors
/// As [`resolve`], or the runtime failing three times.
pub async fn detect(rt: &dyn RuntimeService, configured: &str) -> Result<(String, Source), String> {
    let mut last = None;
    for attempt in 0..3 {
        match rt.runtime_config().await {
            Ok(resp) => return resolve(configured, Ok(resp), None),
            Err(Error::Rpc { status, .. }) if status.code() == tonic::Code::Unimplemented => {
                let status = rt.status(true).await.ok();
                let config = status.as_ref().and_then(|s| s.info.get("config")).map(String::as_str);
                return resolve(configured, Err(tonic::Code::Unimplemented), config);
            }
            Err(e) => {
                tracing::warn!(error = %e, attempt, "CRI RuntimeConfig failed; retrying");
                last = Some(e);
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
    Err(format!("CRI RuntimeConfig: {}", last.map(|e| e.to_string()).unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(driver: api::CgroupDriver) -> api::RuntimeConfigResponse {
        api::RuntimeConfigResponse { linux: Some(api::LinuxRuntimeConfiguration { cgroup_driver: driver as i32 }) }
    }

    #[test]
    fn the_runtimes_driver_wins_as_upstream() {
        assert_eq!(
            resolve("cgroupfs", Ok(answer(api::CgroupDriver::Systemd)), None),
            Ok(("systemd".to_owned(), Source::Runtime))
        );
        assert_eq!(
            resolve("systemd", Ok(answer(api::CgroupDriver::Cgroupfs)), None),
            Ok(("cgroupfs".to_owned(), Source::Runtime))
        );
        let unknown = api::RuntimeConfigResponse { linux: Some(api::LinuxRuntimeConfiguration { cgroup_driver: 7 }) };
        assert_eq!(resolve("systemd", Ok(unknown), None), Err("runtime returned an unknown cgroup driver 7".into()));
        let empty = api::RuntimeConfigResponse { linux: None };
        assert_eq!(resolve("systemd", Ok(empty), None), Ok(("systemd".to_owned(), Source::ConfigNoLinux)));
        assert!(
            !Source::ConfigNoLinux.runtime_config_unimplemented() && !Source::Runtime.runtime_config_unimplemented()
        );
    }

    /// What containerd 1.6's verbose Status shows (trimmed), with and without the option.
    #[test]
    fn containerd_1_6_is_checked_from_its_status() {
        let systemd = r#"{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"runtimeType":"io.containerd.runc.v2","options":{"SystemdCgroup":true}}}}}"#;
        let plain = r#"{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"options":{"BinaryName":""}}}}}"#;
        assert_eq!(systemd_cgroup_option(systemd), Some(true));
        assert_eq!(systemd_cgroup_option(plain), Some(false));
        assert_eq!(systemd_cgroup_option(r#"{"containerd":{"defaultRuntimeName":"runc","runtimes":{}}}"#), None);
        assert_eq!(systemd_cgroup_option("not json"), None);

        let unimplemented = Err(tonic::Code::Unimplemented);
        assert_eq!(resolve("systemd", unimplemented, Some(systemd)), Ok(("systemd".into(), Source::ConfigChecked)));
        let err = resolve("cgroupfs", unimplemented, Some(systemd)).unwrap_err();
        assert_eq!(
            err,
            "cgroupDriver is \"cgroupfs\" but the container runtime runs containers with the \"systemd\" driver \
             (its default runtime's SystemdCgroup = true); set cgroupDriver: systemd or change the runtime's \
             configuration"
        );
        assert!(resolve("systemd", unimplemented, Some(plain)).unwrap_err().contains("\"cgroupfs\" driver"));
        assert_eq!(resolve("systemd", unimplemented, None), Ok(("systemd".into(), Source::Config)));
        assert!(Source::Config.runtime_config_unimplemented() && Source::ConfigChecked.runtime_config_unimplemented());
        assert_eq!(
            resolve("systemd", Err(tonic::Code::Unavailable), None),
            Err("RuntimeConfig failed: Unavailable".into())
        );
    }

    #[tokio::test]
    async fn the_fake_runtime_is_containerd_1_6_without_the_option() {
        let rt = crate::container::fake::FakeRuntime::default();
        assert_eq!(detect(&rt, "cgroupfs").await, Ok(("cgroupfs".into(), Source::Config)));
    }
}
