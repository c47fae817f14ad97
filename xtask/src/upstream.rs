//! `cargo xtask upstream build`: the upstream Kubernetes binaries swiftlet is tested
//! against and measured with, built from the Go modules by name.
//!
//! `upstream/go.mod` requires `k8s.io/kubernetes` at [`VERSION`] and maps every staging
//! module it lists at v0.0.0 to its published release; its `tool` lines name the
//! commands. `upstream/etcd` is a three-line main over `go.etcd.io/etcd/server/v3`'s
//! `etcdmain` at the release k8s.io/kubernetes itself requires (Debian 12's etcd 3.4 is
//! older than kube-apiserver 1.37 supports). No upstream source is in the repository:
//! `go build` takes it from the module cache (`go env GOMODCACHE`), which the module proxy
//! fills on first use.
//!
//! Output: `<target>/upstream/{kube-apiserver,kube-controller-manager,kube-scheduler,
//! kubelet,kubectl,etcd}` and `<target>/upstream/stamp`, the SHA-256 of go.mod, go.sum,
//! the etcd main and the build flags. A build is skipped when the stamp matches and every
//! binary is there, so CI and a developer pay the cold build (about 20 minutes on two
//! cores, most of it kube-apiserver's dependencies) once per change of go.mod/go.sum.
//!
//! The CSI sidecars of the test bed's host-path driver ([`CSI_BINARIES`]:
//! external-provisioner's `csi-provisioner`, external-resizer's `csi-resizer` from the
//! module `upstream/csi`, external-attacher's `csi-attacher` from `upstream/csi-attacher`,
//! whose Kubernetes client release differs) come from modules of their own into the same
//! `<target>/upstream/`, with a stamp of their own (`csi-stamp`).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result, bail, ensure};
use sha2::{Digest as _, Sha256};

use crate::{Ctx, images};

/// The Kubernetes release built (k8s.io/kubernetes and its staging modules at v0.x of it).
pub const VERSION: &str = "v1.37.2";

/// The binaries and the package each is built from (relative to `upstream/`).
pub const BINARIES: &[(&str, &str)] = &[
    ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
    ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    ("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
    ("kubelet", "k8s.io/kubernetes/cmd/kubelet"),
    ("kubectl", "k8s.io/kubernetes/cmd/kubectl"),
    ("etcd", "./etcd"),
    // Upstream's DRA test driver (its kubelet plugin publishes ResourceSlices and prepares
    // claims with CDI devices); `go build` names it after its directory.
    ("test-driver", "k8s.io/kubernetes/test/e2e/dra/test-driver"),
];

/// The CSI sidecars beside the test bed's host-path driver (`tests/src/csi_driver.rs`),
/// built from modules of their own under `upstream/` (their Kubernetes client releases
/// are not the control plane's, nor all the same): (binary, module directory, package,
/// release). The release is the one the module's go.mod requires; `--version` says it.
pub const CSI_BINARIES: &[(&str, &str, &str, &str)] = &[
    ("csi-provisioner", "csi", "github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner", "v5.3.0"),
    ("csi-resizer", "csi", "github.com/kubernetes-csi/external-resizer/cmd/csi-resizer", "v1.14.0"),
    ("csi-attacher", "csi-attacher", "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher", "v4.13.0"),
];

/// The modules [`CSI_BINARIES`] are built from, each once.
fn csi_modules() -> Vec<&'static str> {
    let mut dirs: Vec<&str> = CSI_BINARIES.iter().map(|(_, dir, _, _)| *dir).collect();
    dirs.dedup();
    dirs
}

/// The node conformance suite's binaries (`cargo xtask conformance`) and the package each
/// is built from: the e2e suite as a test binary, the ginkgo runner, and the programs of
/// the suite's test images, agnhost and nonewprivs' `nnp` (static: they run in images
/// without a libc).
pub const E2E_BINARIES: &[(&str, &str)] = &[
    ("e2e.test", "k8s.io/kubernetes/test/e2e"),
    ("ginkgo", "github.com/onsi/ginkgo/v2/ginkgo"),
    ("agnhost", "k8s.io/kubernetes/test/images/agnhost"),
    ("nnp", "k8s.io/kubernetes/test/images/nonewprivs"),
];

/// Where the Go module lives and where the binaries go.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub module_dir: PathBuf,
    pub bin_dir: PathBuf,
}

impl Upstream {
    pub fn new(ctx: &Ctx) -> Self {
        Self { module_dir: ctx.workspace.join("upstream"), bin_dir: ctx.target_dir.join("upstream") }
    }

    /// Path of one built binary (`kube-apiserver`, `etcd`, ...).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    fn stamp_file(&self) -> PathBuf {
        self.bin_dir.join("stamp")
    }

    /// What a build depends on: the module files, the etcd main and the flags.
    fn fingerprint(&self) -> Result<String> {
        let mut h = Sha256::new();
        for f in ["go.mod", "go.sum", "etcd/main.go"] {
            let path = self.module_dir.join(f);
            h.update(f.as_bytes());
            h.update(fs::read(&path).with_context(|| format!("reading {}", path.display()))?);
        }
        h.update(ldflags().as_bytes());
        h.update(go_version()?.as_bytes());
        Ok(hex::encode(h.finalize()))
    }

    /// Whether the binaries are there and were built from the current module files.
    pub fn is_current(&self) -> Result<bool> {
        let fingerprint = self.fingerprint()?;
        let stamp = fs::read_to_string(self.stamp_file()).unwrap_or_default();
        Ok(stamp.trim() == fingerprint && BINARIES.iter().all(|(name, _)| self.bin(name).is_file()))
    }

    /// Builds the control plane's binaries unless [`Upstream::is_current`], and the CSI
    /// sidecars unless [`Upstream::csi_is_current`].
    pub fn build(&self) -> Result<()> {
        self.build_control_plane()?;
        self.build_csi()
    }

    fn build_control_plane(&self) -> Result<()> {
        if self.is_current()? {
            eprintln!("upstream: {VERSION} binaries are current in {}", self.bin_dir.display());
            return Ok(());
        }
        let started = Instant::now();
        fs::create_dir_all(&self.bin_dir).with_context(|| format!("creating {}", self.bin_dir.display()))?;
        // A stale stamp must not survive a failed build.
        let _ = fs::remove_file(self.stamp_file());
        eprintln!(
            "upstream: building kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, \
             the DRA test driver {VERSION} and etcd into {} (cold: about 20 minutes on two cores)",
            self.bin_dir.display()
        );
        // One `go build` for all: the packages they share compile once.
        let mut cmd = go()?;
        cmd.current_dir(&self.module_dir)
            .args(["build", "-mod=readonly", "-trimpath", "-ldflags", &ldflags(), "-o"])
            .arg(format!("{}/", self.bin_dir.display()))
            .args(BINARIES.iter().map(|(_, pkg)| *pkg));
        let status = cmd.status().context("running go build")?;
        if !status.success() {
            bail!("go build of the upstream binaries failed ({status})");
        }
        for (name, _) in BINARIES {
            ensure!(self.bin(name).is_file(), "go build left no {}", self.bin(name).display());
        }
        let version = Command::new(self.bin("kube-apiserver")).arg("--version").output()?;
        let version = String::from_utf8_lossy(&version.stdout);
        ensure!(
            version.trim() == format!("Kubernetes {VERSION}"),
            "kube-apiserver --version says {:?}, not Kubernetes {VERSION}",
            version.trim()
        );
        images::write_atomic(&self.stamp_file(), self.fingerprint()?.as_bytes())?;
        eprintln!("upstream: built in {:.0} s", started.elapsed().as_secs_f64());
        Ok(())
    }
}

impl Upstream {
    /// A CSI sidecar's module (`csi`, `csi-attacher`).
    fn csi_module_dir(&self, dir: &str) -> PathBuf {
        self.module_dir.join(dir)
    }

    fn csi_stamp_file(&self) -> PathBuf {
        self.bin_dir.join("csi-stamp")
    }

    /// What the sidecars' build depends on: their module files, the flags, the Go version.
    fn csi_fingerprint(&self) -> Result<String> {
        let mut h = Sha256::new();
        for dir in csi_modules() {
            for f in ["go.mod", "go.sum"] {
                let path = self.csi_module_dir(dir).join(f);
                h.update(format!("{dir}/{f}").as_bytes());
                h.update(fs::read(&path).with_context(|| format!("reading {}", path.display()))?);
            }
        }
        for (_, _, _, release) in CSI_BINARIES {
            h.update(csi_ldflags(release).as_bytes());
        }
        h.update(go_version()?.as_bytes());
        Ok(hex::encode(h.finalize()))
    }

    /// Whether the CSI sidecars are there and were built from the current module files.
    pub fn csi_is_current(&self) -> Result<bool> {
        let fingerprint = self.csi_fingerprint()?;
        let stamp = fs::read_to_string(self.csi_stamp_file()).unwrap_or_default();
        Ok(stamp.trim() == fingerprint && CSI_BINARIES.iter().all(|(name, _, _, _)| self.bin(name).is_file()))
    }

    /// Builds [`CSI_BINARIES`] into `<target>/upstream/` unless [`Upstream::csi_is_current`].
    /// Cold (empty module and build caches) about 2.5 minutes on two cores for the
    /// provisioner and resizer; the attacher (another client release) adds its own.
    pub fn build_csi(&self) -> Result<()> {
        if self.csi_is_current()? {
            eprintln!("upstream: the CSI sidecars are current in {}", self.bin_dir.display());
            return Ok(());
        }
        let started = Instant::now();
        fs::create_dir_all(&self.bin_dir).with_context(|| format!("creating {}", self.bin_dir.display()))?;
        let _ = fs::remove_file(self.csi_stamp_file());
        // One `go build` each: each sets its own `main.version`; one of the same module
        // reuses the packages the first compiled.
        for (name, dir, pkg, release) in CSI_BINARIES {
            eprintln!("upstream: building {name} {release} into {}", self.bin_dir.display());
            let mut cmd = go()?;
            cmd.current_dir(self.csi_module_dir(dir))
                .args(["build", "-mod=readonly", "-trimpath", "-ldflags", &csi_ldflags(release), "-o"])
                .arg(self.bin(name))
                .arg(pkg);
            let status = cmd.status().with_context(|| format!("running go build of {pkg}"))?;
            ensure!(status.success(), "go build of {pkg} failed ({status})");
            let out = Command::new(self.bin(name)).arg("--version").output()?;
            let version = String::from_utf8_lossy(&out.stdout);
            ensure!(version.contains(release), "{name} --version says {:?}, not {release}", version.trim());
        }
        images::write_atomic(&self.csi_stamp_file(), self.csi_fingerprint()?.as_bytes())?;
        eprintln!("upstream: CSI sidecars built in {:.0} s", started.elapsed().as_secs_f64());
        Ok(())
    }
}

/// A sidecar's flags: stripped, and `--version` saying its release (as its Makefile sets).
fn csi_ldflags(release: &str) -> String {
    format!("-s -w -X main.version={release}")
}

impl Upstream {
    /// Path of one of [`E2E_BINARIES`].
    pub fn e2e_bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join("e2e").join(name)
    }

    /// Where the module cache holds `k8s.io/kubernetes` (`go list -m`): the agnhost image
    /// takes its porter certificate from there.
    pub fn e2e_module_dir(&self) -> Result<PathBuf> {
        let mut cmd = go()?;
        cmd.current_dir(&self.module_dir).args(["list", "-mod=readonly", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"]);
        let out = cmd.output().context("running go list -m k8s.io/kubernetes")?;
        ensure!(out.status.success(), "go list -m k8s.io/kubernetes: {}", String::from_utf8_lossy(&out.stderr).trim());
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        ensure!(dir.is_dir(), "go list -m k8s.io/kubernetes gave {}, not a directory", dir.display());
        Ok(dir)
    }

    fn e2e_stamp_file(&self) -> PathBuf {
        self.bin_dir.join("e2e").join("stamp")
    }

    /// Builds [`E2E_BINARIES`] into `<target>/upstream/e2e/` unless its stamp (the same
    /// fingerprint as the control plane's) is current: cold, about 10 minutes on two cores
    /// beside the control plane's build (most of it the suite's own packages).
    pub fn build_e2e(&self) -> Result<()> {
        let fingerprint = self.fingerprint()?;
        let current = fs::read_to_string(self.e2e_stamp_file()).is_ok_and(|s| s == fingerprint)
            && E2E_BINARIES.iter().all(|(name, _)| self.e2e_bin(name).is_file());
        if current {
            eprintln!("upstream: the {VERSION} e2e suite is current in {}", self.bin_dir.join("e2e").display());
            return Ok(());
        }
        let started = Instant::now();
        let dir = self.bin_dir.join("e2e");
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let _ = fs::remove_file(self.e2e_stamp_file());
        eprintln!(
            "upstream: building the {VERSION} e2e suite, ginkgo and the test images' programs into {}",
            dir.display()
        );
        for (name, pkg) in E2E_BINARIES {
            let mut cmd = go()?;
            cmd.current_dir(&self.module_dir);
            if *name == "e2e.test" {
                cmd.args(["test", "-c"]);
            } else {
                cmd.arg("build");
            }
            cmd.args(["-mod=readonly", "-trimpath", "-ldflags", &ldflags(), "-o"]).arg(dir.join(name)).arg(pkg);
            if *name == "agnhost" || *name == "nnp" {
                cmd.env("CGO_ENABLED", "0");
            }
            let status = cmd.status().with_context(|| format!("running go build of {pkg}"))?;
            ensure!(status.success(), "go build of {pkg} failed ({status})");
            ensure!(self.e2e_bin(name).is_file(), "go build left no {}", self.e2e_bin(name).display());
        }
        images::write_atomic(&self.e2e_stamp_file(), fingerprint.as_bytes())?;
        eprintln!("upstream: e2e suite built in {:.0} s", started.elapsed().as_secs_f64());
        Ok(())
    }
}

/// `-X` flags that make `--version` say [`VERSION`] (component-base's and client-go's
/// version packages, as upstream's `hack/lib/version.sh` sets them).
fn ldflags() -> String {
    let minor = VERSION.split('.').nth(1).unwrap_or_default();
    let mut flags = String::from("-s -w");
    for pkg in ["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"] {
        for (var, value) in [
            ("gitVersion", VERSION),
            ("gitMajor", "1"),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
            ("buildDate", "1970-01-01T00:00:00Z"),
        ] {
            let _ = write!(flags, " -X {pkg}.{var}={value}");
        }
    }
    flags
}

/// A `go` command: the one on PATH, else the toolchain's usual place. Go keeps its build
/// and module caches under $HOME, which CI may run without: then `/root`.
pub(crate) fn go() -> Result<Command> {
    let on_path =
        std::env::var_os("PATH").iter().flat_map(std::env::split_paths).map(|d| d.join("go")).find(|p| p.is_file());
    let usual = Path::new("/usr/local/go/bin/go");
    let path = if let Some(path) = on_path {
        path
    } else {
        ensure!(usual.is_file(), "no `go` on PATH nor at {}: the upstream binaries need Go 1.26", usual.display());
        usual.to_path_buf()
    };
    let mut cmd = Command::new(path);
    if std::env::var_os("HOME").is_none() {
        cmd.env("HOME", "/root");
    }
    Ok(cmd)
}

pub(crate) fn go_version() -> Result<String> {
    let mut cmd = go()?;
    let out = cmd.arg("version").output().context("running go version")?;
    ensure!(out.status.success(), "go version failed");
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldflags_set_the_release_in_both_version_packages() {
        let f = ldflags();
        assert!(f.contains("-X k8s.io/component-base/version.gitVersion=v1.37.2"));
        assert!(f.contains("-X k8s.io/client-go/pkg/version.gitVersion=v1.37.2"));
        assert!(f.contains("-X k8s.io/component-base/version.gitMinor=37"));
    }

    #[test]
    fn the_csi_modules_require_the_sidecars_at_their_releases() {
        for (name, dir, pkg, release) in CSI_BINARIES {
            let go_mod = match *dir {
                "csi" => include_str!("../../upstream/csi/go.mod"),
                "csi-attacher" => include_str!("../../upstream/csi-attacher/go.mod"),
                other => panic!("{name}: module {other} is not checked here"),
            };
            assert!(go_mod.contains(&format!("\t{pkg}\n")), "{name}: no tool line for {pkg}");
            let module = pkg.split("/cmd/").next().unwrap();
            assert!(go_mod.contains(&format!("\t{module} {release}")), "{module} is not required at {release}");
        }
    }

    #[test]
    fn go_mod_maps_every_staging_module_to_the_release() {
        let go_mod = include_str!("../../upstream/go.mod");
        assert!(
            go_mod.contains(&format!("\tk8s.io/kubernetes {VERSION}")),
            "k8s.io/kubernetes is not required at {VERSION}"
        );
        let release = VERSION.replacen("v1.", "v0.", 1);
        for module in ["k8s.io/api", "k8s.io/apiserver", "k8s.io/client-go", "k8s.io/kubelet", "k8s.io/kubectl"] {
            assert!(
                go_mod.contains(&format!("\t{module} => {module} {release}\n")),
                "{module} is not mapped to {release}"
            );
        }
    }
}
