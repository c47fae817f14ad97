//! Local container images, built without a registry as OCI image-layout tarballs (the
//! layout itself is `swiftlet_oci`'s) and imported into containerd's `k8s.io` namespace
//! with `ctr images import`.
//!
//! - `localhost/pause:3.10`: a static pause binary compiled from `xtask/assets/pause.c`.
//! - `localhost/busybox:latest`: the host's static `/bin/busybox` plus a symlink for
//!   every applet, a minimal `/etc/passwd` and `/etc/group` (root also in `wheel`, 10),
//!   and `/tmp`.
//!
//! Facts about containerd 1.6 learned here:
//! - `ctr images import` names an image from the `io.containerd.image.name` annotation of
//!   its `index.json` entry; without it, `org.opencontainers.image.ref.name` is used and,
//!   when that is a bare tag, prefixed with `import-<date>` — so set the full name.
//! - An uncompressed layer (`application/vnd.oci.image.layer.v1.tar`) imports and unpacks
//!   into overlayfs fine; the CRI image id is the config digest.
//! - Images imported with `ctr` into `k8s.io` become visible to CRI `ImageStatus` after a
//!   short delay (CRI syncs its image store from containerd events), so poll. CRI labels
//!   them `io.cri-containerd.image=managed` and adds a `sha256:<config digest>` ref.
//!   Re-importing a changed image under the same name re-points the name; the CRI id
//!   follows after the same short delay.
//! - `PullImage` always contacts a registry: tests must check `ImageStatus` first.

use std::{
    collections::BTreeMap,
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};
use sha2::{Digest as _, Sha256};
pub use swiftlet_oci::{
    BUILDER_VERSION, DEFAULT_PATH, HostProgram, Layer, OciArchive, OciBlobs, RunConfig, digest, oci_archive, oci_blobs,
};

pub const PAUSE_IMAGE: &str = "localhost/pause:3.10";
pub const BUSYBOX_IMAGE: &str = "localhost/busybox:latest";

/// The minimal busybox root filesystem around `busybox` (the binary's bytes), with one
/// symlink per applet path from `busybox --list-full` (e.g. `usr/bin/awk`).
pub fn busybox_layer(busybox: &[u8], applets: &str) -> Layer {
    let mut layer = Layer::default();
    layer
        .file("bin/busybox", 0o755, busybox)
        .dir("tmp", 0o1777)
        .dir("root", 0o700)
        .dir("etc", 0o755)
        .file(
            "etc/passwd",
            0o644,
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        )
        // root is a member of `wheel`: under `supplementalGroupsPolicy: Merge` (the
        // default) its processes get group 10 from here; under `Strict` they do not.
        .file("etc/group", 0o644, "root:x:0:\nwheel:x:10:root\nnobody:x:65534:\n");
    for applet in applets.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let applet = applet.trim_start_matches('/');
        if applet != "bin/busybox" {
            layer.symlink(applet, "/bin/busybox");
        }
    }
    layer
}

pub fn pause_layer(pause: &[u8]) -> Layer {
    let mut layer = Layer::default();
    layer.file("pause", 0o755, pause);
    layer
}

/// A built image ready to import.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub name: String,
    pub tar_path: PathBuf,
    pub image_id: String,
}

/// The image tarball cache: `<target>/xtask/images`, kept across `testbed down` like
/// any build output; every image built here (the test bed's, the registries' copies, the
/// conformance suite's) is cached there.
pub fn cache_dir(ctx: &crate::Ctx) -> PathBuf {
    ctx.target_dir.join("xtask/images")
}

/// Builds (or finds in `cache_dir`) the test bed's images.
pub fn build_all(workspace: &Path, cache_dir: &Path) -> Result<Vec<BuiltImage>> {
    fs::create_dir_all(cache_dir).with_context(|| format!("creating image cache {}", cache_dir.display()))?;
    Ok(vec![build_pause(workspace, cache_dir)?, build_busybox(cache_dir)?])
}

/// The cache key: a hash of everything the image is made of.
pub fn cache_key(name: &str, inputs: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    h.update(BUILDER_VERSION);
    h.update([0]);
    h.update(name);
    for input in inputs {
        h.update([0]);
        h.update((input.len() as u64).to_le_bytes());
        h.update(input);
    }
    hex::encode(h.finalize())
}

/// `localhost/pause:3.10` -> `localhost_pause_3_10`: the file name prefix of its entries.
fn cache_stem(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

fn cache_paths(cache_dir: &Path, name: &str, key: &str) -> (PathBuf, PathBuf) {
    let base = format!("{}-{}", cache_stem(name), &key[..16]);
    (cache_dir.join(format!("{base}.tar")), cache_dir.join(format!("{base}.id")))
}

/// Returns the cached image for `key`, or builds it with `build` and caches it.
pub fn cached(
    cache_dir: &Path,
    name: &str,
    key: &str,
    build: impl FnOnce() -> Result<OciArchive>,
) -> Result<BuiltImage> {
    let (tar_path, id_path) = cache_paths(cache_dir, name, key);
    if let (true, Ok(image_id)) = (tar_path.is_file(), fs::read_to_string(&id_path)) {
        eprintln!("image {name}: cached {}", tar_path.display());
        return Ok(BuiltImage { name: name.to_owned(), tar_path, image_id: image_id.trim().to_owned() });
    }
    let archive = build()?;
    // Earlier builds of this image are stale now: keep the cache from growing.
    let prefix = format!("{}-", cache_stem(name));
    for entry in fs::read_dir(cache_dir)?.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            fs::remove_file(entry.path()).ok();
        }
    }
    // Write then rename, so an interrupted build never leaves a truncated cache entry.
    write_atomic(&tar_path, &archive.tar)?;
    write_atomic(&id_path, archive.image_id.as_bytes())?;
    eprintln!("image {name}: built {} ({} bytes, id {})", tar_path.display(), archive.tar.len(), archive.image_id);
    Ok(BuiltImage { name: name.to_owned(), tar_path, image_id: archive.image_id })
}

/// The JSON record at `path`, or `None` when there is no such file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(data).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

/// Prefix of the registry copies' names (see [`build_registry_copies`]).
const REGISTRY_COPY_PREFIX: &str = "localhost/registry-copy/";

/// The label that sets a registry copy apart from the image it copies.
fn labels(name: &str) -> BTreeMap<String, String> {
    if let Some(copy) = name.strip_prefix(REGISTRY_COPY_PREFIX) {
        let mut labels = BTreeMap::from([("io.swiftlet.testbed.copy".to_owned(), "registry".to_owned())]);
        if let Some(tag) = SPARE_TAGS.iter().find(|t| copy.ends_with(&format!(":{t}"))) {
            labels.insert("io.swiftlet.testbed.spare".to_owned(), (*tag).to_owned());
        }
        labels
    } else {
        BTreeMap::new()
    }
}

/// The images to push to the test registries: the same files as [`build_all`]'s, with a
/// label, so that their image ids differ from the imported images'. containerd removes
/// an image by id with all its names: a test that removes a pulled copy must not take
/// the node's `localhost/...` image (the sandbox image!) with it. Pairs of (the local
/// image's name, its copy).
pub fn build_registry_copies(workspace: &Path, cache_dir: &Path) -> Result<Vec<(String, BuiltImage)>> {
    fs::create_dir_all(cache_dir).with_context(|| format!("creating image cache {}", cache_dir.display()))?;
    let pause = build_pause_named(workspace, cache_dir, &format!("{REGISTRY_COPY_PREFIX}pause:3.10"))?;
    let busybox = build_busybox_named(cache_dir, &format!("{REGISTRY_COPY_PREFIX}busybox:latest"))?;
    let mut copies = vec![(PAUSE_IMAGE.to_owned(), pause), (BUSYBOX_IMAGE.to_owned(), busybox)];
    // Images of their own (own ids, shared layers) that tests may pull and have
    // garbage-collected; no local image has their names.
    for tag in SPARE_TAGS {
        let spare = build_busybox_named(cache_dir, &format!("{REGISTRY_COPY_PREFIX}busybox:{tag}"))?;
        copies.push((format!("localhost/busybox:{tag}"), spare));
    }
    Ok(copies)
}

/// Tags of the registries' spare busybox images (see [`build_registry_copies`]).
const SPARE_TAGS: [&str; 2] = ["spare-1", "spare-2"];

fn build_pause(workspace: &Path, cache_dir: &Path) -> Result<BuiltImage> {
    build_pause_named(workspace, cache_dir, PAUSE_IMAGE)
}

fn build_busybox(cache_dir: &Path) -> Result<BuiltImage> {
    build_busybox_named(cache_dir, BUSYBOX_IMAGE)
}

fn build_pause_named(workspace: &Path, cache_dir: &Path, name: &str) -> Result<BuiltImage> {
    let source_path = workspace.join(PAUSE_SOURCE);
    let source = fs::read(&source_path).with_context(|| format!("reading {}", source_path.display()))?;
    let key = cache_key(name, &[&source]);
    cached(cache_dir, name, &key, || {
        let binary = pause_binary(workspace, cache_dir)?;
        oci_archive(
            name,
            &pause_layer(&binary),
            &RunConfig {
                env: vec![DEFAULT_PATH.into()],
                entrypoint: Some(vec!["/pause".into()]),
                cmd: None,
                working_dir: "/".into(),
                labels: labels(name),
                user: String::new(),
            },
        )
    })
}

/// The pause program's source, in the workspace.
pub const PAUSE_SOURCE: &str = "xtask/assets/pause.c";

/// The static pause binary, compiled from [`PAUSE_SOURCE`] with gcc (in `scratch`, which
/// it leaves as it found it).
pub fn pause_binary(workspace: &Path, scratch: &Path) -> Result<Vec<u8>> {
    let source_path = workspace.join(PAUSE_SOURCE);
    let out = scratch.join("pause.bin");
    let status = Command::new("gcc")
        .args(["-static", "-O2", "-s", "-Wall", "-o"])
        .arg(&out)
        .arg(&source_path)
        .stdout(std::io::stderr())
        .status()
        .context("running gcc (apt package gcc, libc6-dev)")?;
    ensure!(status.success(), "gcc failed to compile {}", source_path.display());
    let binary = fs::read(&out).with_context(|| format!("reading {}", out.display()))?;
    fs::remove_file(&out).ok();
    Ok(binary)
}

fn build_busybox_named(cache_dir: &Path, name: &str) -> Result<BuiltImage> {
    let binary = host_busybox()?;
    let key = cache_key(name, &[&binary]);
    cached(cache_dir, name, &key, || {
        oci_archive(
            name,
            &host_busybox_layer(&binary)?,
            &RunConfig {
                env: vec![DEFAULT_PATH.into()],
                entrypoint: None,
                cmd: Some(vec!["sh".into()]),
                working_dir: "/".into(),
                labels: labels(name),
                user: String::new(),
            },
        )
    })
}

/// busybox-static installs /bin/busybox; a dynamically linked busybox would not run in an
/// image without a libc.
const HOST_BUSYBOX: &str = "/bin/busybox";

/// The host's static busybox: its bytes (an image's cache key).
pub fn host_busybox() -> Result<Vec<u8>> {
    fs::read(HOST_BUSYBOX).with_context(|| format!("reading {HOST_BUSYBOX} (apt package busybox-static)"))
}

/// [`busybox_layer`] around `binary` (the host's busybox, [`host_busybox`]) with the
/// applets it lists (`busybox --list-full`): asked only when an image is built.
pub fn host_busybox_layer(binary: &[u8]) -> Result<Layer> {
    Ok(busybox_layer(binary, &host_busybox_applets()?))
}

/// The host busybox's applets with their paths (`busybox --list-full`: `bin/sh`,
/// `sbin/sysctl`, ...), one per line.
pub fn host_busybox_applets() -> Result<String> {
    busybox_applets(Path::new(HOST_BUSYBOX))
}

/// The applets of the busybox at `path`, as [`host_busybox_applets`].
pub fn busybox_applets(path: &Path) -> Result<String> {
    let out = Command::new(path)
        .arg("--list-full")
        .output()
        .with_context(|| format!("running {} --list-full", path.display()))?;
    ensure!(out.status.success(), "busybox --list-full failed");
    let applets = String::from_utf8(out.stdout).context("busybox applet list")?;
    if applets.lines().count() < 50 {
        bail!("busybox lists too few applets; is it busybox-static?");
    }
    Ok(applets)
}

/// Imports `image` into the `k8s.io` namespace of the containerd at `socket`.
pub fn import(socket: &Path, image: &BuiltImage) -> Result<()> {
    let status = Command::new("ctr")
        .arg("-a")
        .arg(socket)
        .args(["-n", "k8s.io", "images", "import"])
        .arg(&image.tar_path)
        .stdout(std::io::stderr())
        .status()
        .context("running ctr (apt package containerd)")?;
    ensure!(status.success(), "ctr images import {} failed", image.tar_path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busybox_layer_links_applets_but_not_itself() {
        let layer = busybox_layer(b"BB", "bin/sh\nusr/bin/awk\nbin/busybox\n\n");
        let entries = swiftlet_oci::read_tar(&layer.to_tar().unwrap()).unwrap();
        assert_eq!(entries["bin/busybox"].1, b"BB");
        assert_eq!(entries["bin/sh"].2.as_deref(), Some("/bin/busybox"));
        assert_eq!(entries["usr/bin/awk"].2.as_deref(), Some("/bin/busybox"));
        assert!(entries.contains_key("tmp/"));
        assert!(String::from_utf8_lossy(&entries["etc/passwd"].1).starts_with("root:x:0:0:"));
    }

    #[test]
    fn cache_key_depends_on_every_input() {
        let a = cache_key("n", &[b"ab", b"c"]);
        assert_ne!(a, cache_key("n", &[b"a", b"bc"]));
        assert_ne!(a, cache_key("m", &[b"ab", b"c"]));
        assert_eq!(a, cache_key("n", &[b"ab", b"c"]));
    }
}
