//! busybox as upstream builds it, for the suite's images.
//!
//! Upstream's e2e images sit on busybox built from its own source (Docker's `busybox`
//! image, alpine's busybox). Debian's `busybox-static` is patched and configured apart
//! from that in two ways the suite sees:
//! - its `ash` drops environment variables whose names are not shell names (Debian
//!   reverts upstream's 9c143ce, "ash: preserve environment variables with invalid
//!   names"), so `sh -c env` never prints `data-1=value-1` from a `ConfigMap`'s `envFrom`
//!   (4 node conformance specs);
//! - it runs its own applets ahead of `PATH` (`FEATURE_SH_STANDALONE`), so a program an
//!   image puts on `PATH` (agnhost's OpenBSD `nc`) is never run by `sh`.
//!
//! So the suite's images get busybox [`VERSION`] built here from the upstream release
//! tarball (Debian's `.orig.tar.bz2` is upstream's, unpatched; fetched from the Debian
//! mirror the machine installs its packages from, and checked against [`SOURCE_SHA256`])
//! with `make defconfig`, linked statically ([`CONFIG_EDITS`]). About a minute of CPU, once:
//! the binary is cached beside the image tarballs, keyed by the source and the edits.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{containerd, images};

/// The busybox release upstream's busybox image (`e2e-test-images/busybox:1.37.0-2`) has.
pub const VERSION: &str = "1.37.0";

/// Debian's copy of the upstream release tarball.
const SOURCE_URL: &str = "http://deb.debian.org/debian/pool/main/b/busybox/busybox_1.37.0.orig.tar.bz2";
const SOURCE_SHA256: &str = "3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4";

/// Changes to `defconfig`: a static binary (an image has no libc), and no `tc` (it does not
/// build against kernel headers without CBQ; no spec runs it).
const CONFIG_EDITS: [(&str, bool); 2] = [("CONFIG_STATIC", true), ("CONFIG_TC", false)];

/// The built binary's bytes and its applets with their paths (`bin/sh`, `sbin/sysctl`, ...,
/// one per line, as `busybox --list-full` prints them).
pub struct Busybox {
    pub binary: Vec<u8>,
    pub applets: String,
}

/// Builds busybox (or finds it in `cache_dir`).
pub fn build(cache_dir: &Path) -> Result<Busybox> {
    let key = images::cache_key("busybox", &[SOURCE_SHA256.as_bytes(), edits_key().as_bytes()]);
    let path = cache_dir.join(format!("busybox-{VERSION}-{}.bin", &key[..16]));
    if !path.is_file() {
        let binary = compile(cache_dir)?;
        images::write_atomic(&path, &binary)?;
        make_executable(&path)?;
        eprintln!("busybox {VERSION}: built {}", path.display());
    }
    let binary = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let applets = images::busybox_applets(&path)?;
    Ok(Busybox { binary, applets })
}

fn edits_key() -> String {
    CONFIG_EDITS.iter().fold(String::new(), |mut key, (name, on)| {
        let _ = writeln!(key, "{name}={on}");
        key
    })
}

fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).with_context(|| format!("chmod {}", path.display()))
}

/// Downloads, checks, unpacks and compiles the source in a scratch directory under
/// `cache_dir`, removed afterwards.
fn compile(cache_dir: &Path) -> Result<Vec<u8>> {
    let scratch = cache_dir.join("busybox-build");
    if scratch.exists() {
        fs::remove_dir_all(&scratch).with_context(|| format!("removing {}", scratch.display()))?;
    }
    fs::create_dir_all(&scratch)?;
    let result = compile_in(&scratch);
    fs::remove_dir_all(&scratch).ok();
    result
}

fn compile_in(scratch: &Path) -> Result<Vec<u8>> {
    let tarball = scratch.join("source.tar.bz2");
    eprintln!("busybox {VERSION}: fetching {SOURCE_URL}");
    let status = Command::new("curl")
        .args(["-fsSL", "--retry", "3", "-o"])
        .arg(&tarball)
        .arg(SOURCE_URL)
        .status()
        .context("running curl (apt package curl)")?;
    ensure!(status.success(), "fetching busybox's source from {SOURCE_URL} failed (curl: {status})");
    let source = fs::read(&tarball).with_context(|| format!("reading {}", tarball.display()))?;
    let got = images::digest(&source);
    ensure!(
        got.strip_prefix("sha256:") == Some(SOURCE_SHA256),
        "busybox's source from {SOURCE_URL} has {got}, expected sha256:{SOURCE_SHA256}"
    );
    containerd::run_checked(
        Command::new("tar").arg("-xjf").arg(&tarball).arg("-C").arg(scratch),
        "tar (apt package bzip2)",
    )?;
    let dir = scratch.join(format!("busybox-{VERSION}"));
    containerd::run_checked(
        Command::new("make").arg("defconfig").current_dir(&dir),
        "make defconfig (apt package make)",
    )?;
    let config_path = dir.join(".config");
    let config = fs::read_to_string(&config_path).with_context(|| format!("reading {}", config_path.display()))?;
    fs::write(&config_path, edit_config(&config)?)?;
    let jobs = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    eprintln!("busybox {VERSION}: compiling ({jobs} jobs)");
    containerd::run_checked(
        Command::new("make").arg(format!("-j{jobs}")).current_dir(&dir),
        "make (apt packages make, gcc, libc6-dev)",
    )?;
    let binary: PathBuf = dir.join("busybox");
    fs::read(&binary).with_context(|| format!("reading {}", binary.display()))
}

/// `config` (a kconfig `.config`) with [`CONFIG_EDITS`] applied; each edited option must
/// be there, set or not.
fn edit_config(config: &str) -> Result<String> {
    let mut out = String::with_capacity(config.len());
    let mut seen = vec![false; CONFIG_EDITS.len()];
    for line in config.lines() {
        let name = line
            .strip_prefix("# ")
            .and_then(|l| l.strip_suffix(" is not set"))
            .or_else(|| line.split_once('=').map(|(name, _)| name));
        match name.and_then(|n| CONFIG_EDITS.iter().position(|(edit, _)| *edit == n)) {
            Some(i) => {
                seen[i] = true;
                let (name, on) = CONFIG_EDITS[i];
                let _ = if on { write!(out, "{name}=y") } else { write!(out, "# {name} is not set") };
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        bail!("busybox's defconfig has no {}", CONFIG_EDITS[i].0);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_edits_switch_options_on_and_off() {
        let config = "CONFIG_DESKTOP=y\n# CONFIG_STATIC is not set\nCONFIG_TC=y\nCONFIG_FEATURE_TC_INGRESS=y\n";
        assert_eq!(
            edit_config(config).unwrap(),
            "CONFIG_DESKTOP=y\nCONFIG_STATIC=y\n# CONFIG_TC is not set\nCONFIG_FEATURE_TC_INGRESS=y\n"
        );
    }

    #[test]
    fn a_missing_option_is_an_error() {
        let err = edit_config("CONFIG_DESKTOP=y\nCONFIG_TC=y\n").unwrap_err();
        assert_eq!(err.to_string(), "busybox's defconfig has no CONFIG_STATIC");
    }
}
