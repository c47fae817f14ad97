//! Installing the Debian packages the project needs on a fresh machine (CI's included):
//! check each with `dpkg -s`, then one `apt-get update` and one `apt-get install` of only
//! what is missing.

use std::{fs, os::unix::fs::PermissionsExt as _, path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};

/// Everything the build (protoc, clang for eBPF), the test bed and the tests use.
pub const PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "busybox-static",
    "clang",
    "llvm",
    "libbpf-dev",
    "protobuf-compiler",
    "bpftool",
    "jq",
    // The control plane's health checks (`cluster`).
    "curl",
    "prometheus",
    "iproute2",
    "gcc",
    "libc6-dev",
    // The test registries (`registry`).
    "docker-registry",
    "skopeo",
    // The private system bus of the node shutdown tests (`tests/src/logind.rs`).
    "dbus-daemon",
    // OpenBSD's netcat in the conformance suite's agnhost image (`conformance::images`).
    "netcat-openbsd",
    // Building busybox from source for the conformance suite's images (`conformance::busybox`).
    "make",
    "bzip2",
    // runc's seccomp support, built from the Go modules for the node container (`containerd2`).
    "libseccomp-dev",
    "pkg-config",
];

/// Parses `dpkg -s` output: installed means a `Status: install ok installed` line.
pub fn status_says_installed(dpkg_status: &str) -> bool {
    dpkg_status.lines().any(|l| l.trim() == "Status: install ok installed")
}

pub fn is_installed(package: &str) -> bool {
    Command::new("dpkg")
        .args(["-s", package])
        .output()
        .is_ok_and(|o| o.status.success() && status_says_installed(&String::from_utf8_lossy(&o.stdout)))
}

/// Keeps package maintainer scripts from starting daemons (containerd, prometheus) while
/// it lives: on a machine without systemd, `invoke-rc.d` would start them through their
/// `SysV` scripts. Removed on drop, and only if this guard created it.
struct NoDaemonStarts {
    created: bool,
}

const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

impl NoDaemonStarts {
    fn new() -> Result<Self> {
        if Path::new(POLICY_RC_D).exists() {
            return Ok(Self { created: false });
        }
        // Exit code 101 = "action forbidden by policy" (invoke-rc.d(8)).
        fs::write(
            POLICY_RC_D,
            "#!/bin/sh\n# written by cargo xtask for the duration of an apt-get install\nexit 101\n",
        )
        .with_context(|| format!("writing {POLICY_RC_D}"))?;
        fs::set_permissions(POLICY_RC_D, fs::Permissions::from_mode(0o755))
            .with_context(|| format!("chmod {POLICY_RC_D}"))?;
        Ok(Self { created: true })
    }
}

impl Drop for NoDaemonStarts {
    fn drop(&mut self) {
        if self.created {
            let _ = fs::remove_file(POLICY_RC_D);
        }
    }
}

/// Installs whichever of `packages` are missing.
pub fn ensure(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !is_installed(p)).collect();
    if missing.is_empty() {
        eprintln!("apt: all {} packages installed", packages.len());
        return Ok(());
    }
    eprintln!("apt: installing {}", missing.join(" "));
    let _guard = NoDaemonStarts::new()?;
    let apt = |args: &[&str]| -> Result<()> {
        let status = Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=300"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            // Progress goes to stderr: stdout is reserved for the command's result.
            .stdout(std::io::stderr())
            .status()
            .context("running apt-get")?;
        ensure!(status.success(), "apt-get {} failed", args.join(" "));
        Ok(())
    };
    apt(&["update"])?;
    // With recommends, as developers' machines were set up: e.g. protobuf-compiler's
    // well-known `.proto` files come from its recommended libprotobuf-dev.
    let mut install = vec!["install", "-y"];
    install.extend(&missing);
    apt(&install)?;
    let still: Vec<&str> = missing.into_iter().filter(|p| !is_installed(p)).collect();
    ensure!(still.is_empty(), "apt: still not installed: {}", still.join(" "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_dpkg_status() {
        assert!(status_says_installed("Package: jq\nStatus: install ok installed\nPriority: optional\n"));
        assert!(!status_says_installed("Package: jq\nStatus: deinstall ok config-files\n"));
        assert!(!status_says_installed(""));
    }
}
