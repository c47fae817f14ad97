//! containerd 2.x and runc for the node container, built from the Go modules by name:
//! `upstream/containerd2/go.mod` names `containerd`, `containerd-shim-runc-v2` and `ctr`
//! of `github.com/containerd/containerd/v2` at [`VERSION`] and runc at [`RUNC_VERSION`]
//! as tools. No upstream source is in the repository.
//!
//! Output: `<target>/upstream/containerd2/{containerd,containerd-shim-runc-v2,ctr,runc}`
//! and a stamp (SHA-256 of go.mod, go.sum, the flags and the Go version): a build is
//! skipped while it matches, so CI pays the cold build (about two minutes on two cores,
//! the module downloads included) once per change of the module files. runc is built
//! with cgo and the `seccomp` tag, as its release is (libseccomp-dev from apt; the node's
//! root filesystem has libseccomp2).

use std::{fs, path::PathBuf, process::Command, time::Instant};

use anyhow::{Context as _, Result, bail, ensure};
use sha2::{Digest as _, Sha256};

use crate::{Ctx, images, upstream};

/// The containerd release built.
pub const VERSION: &str = "2.4.2";
/// The runc release built.
pub const RUNC_VERSION: &str = "1.5.3";

/// (binary, package).
const BINARIES: [(&str, &str); 4] = [
    ("containerd", "github.com/containerd/containerd/v2/cmd/containerd"),
    ("containerd-shim-runc-v2", "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"),
    ("ctr", "github.com/containerd/containerd/v2/cmd/ctr"),
    ("runc", "github.com/opencontainers/runc"),
];

fn ldflags() -> String {
    format!("-X github.com/containerd/containerd/v2/version.Version=v{VERSION} -X main.version={RUNC_VERSION} -s -w")
}

/// The module and its binaries.
#[derive(Debug, Clone)]
pub struct Containerd2 {
    module_dir: PathBuf,
    bin_dir: PathBuf,
}

impl Containerd2 {
    pub fn new(ctx: &Ctx) -> Self {
        Self {
            module_dir: ctx.workspace.join("upstream/containerd2"),
            bin_dir: ctx.target_dir.join("upstream/containerd2"),
        }
    }

    /// Path of one built binary.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    /// The binaries' names.
    pub fn names() -> impl Iterator<Item = &'static str> {
        BINARIES.iter().map(|(name, _)| *name)
    }

    fn stamp_file(&self) -> PathBuf {
        self.bin_dir.join("stamp")
    }

    fn fingerprint(&self) -> Result<String> {
        let mut h = Sha256::new();
        for f in ["go.mod", "go.sum"] {
            let path = self.module_dir.join(f);
            h.update(f.as_bytes());
            h.update(fs::read(&path).with_context(|| format!("reading {}", path.display()))?);
        }
        h.update(ldflags().as_bytes());
        h.update(b"-tags seccomp");
        h.update(upstream::go_version()?.as_bytes());
        Ok(hex::encode(h.finalize()))
    }

    /// Builds the binaries unless the stamp says they are current.
    pub fn build(&self) -> Result<()> {
        let fingerprint = self.fingerprint()?;
        let stamp = fs::read_to_string(self.stamp_file()).unwrap_or_default();
        if stamp.trim() == fingerprint && Self::names().all(|n| self.bin(n).is_file()) {
            eprintln!("containerd {VERSION} and runc {RUNC_VERSION}: current in {}", self.bin_dir.display());
            return Ok(());
        }
        let started = Instant::now();
        fs::create_dir_all(&self.bin_dir).with_context(|| format!("creating {}", self.bin_dir.display()))?;
        let _ = fs::remove_file(self.stamp_file());
        eprintln!("containerd {VERSION} and runc {RUNC_VERSION}: building into {}", self.bin_dir.display());
        let mut cmd = upstream::go()?;
        cmd.current_dir(&self.module_dir)
            .args(["build", "-mod=readonly", "-trimpath", "-tags", "seccomp", "-ldflags", &ldflags(), "-o"])
            .arg(format!("{}/", self.bin_dir.display()))
            .args(BINARIES.iter().map(|(_, pkg)| *pkg));
        let status = cmd.status().context("running go build")?;
        if !status.success() {
            bail!("go build of containerd {VERSION} and runc {RUNC_VERSION} failed ({status})");
        }
        for name in Self::names() {
            ensure!(self.bin(name).is_file(), "go build left no {}", self.bin(name).display());
        }
        let version = Command::new(self.bin("containerd")).arg("--version").output()?;
        let version = String::from_utf8_lossy(&version.stdout);
        ensure!(version.contains(&format!("v{VERSION}")), "containerd --version says {:?}", version.trim());
        images::write_atomic(&self.stamp_file(), fingerprint.as_bytes())?;
        eprintln!("containerd {VERSION} and runc {RUNC_VERSION}: built in {:.0} s", started.elapsed().as_secs_f64());
        Ok(())
    }
}
