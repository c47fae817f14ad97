//! Local container images, built without a registry as OCI image-layout tarballs and
//! imported into containerd's `k8s.io` namespace with `ctr images import`.
//!
//! - `localhost/pause:3.10`: a static pause binary compiled from `xtask/assets/pause.c`.
//! - `localhost/busybox:latest`: the host's static `/bin/busybox` plus a symlink for
//!   every applet, a minimal `/etc/passwd` and `/etc/group` (root also in `wheel`, 10),
//!   and `/tmp`.
//!
//! Everything in the tarball is deterministic (fixed mtimes, owners, order), so the same
//! inputs give the same digests and the same image id, and a rebuilt cache entry is a no-op
//! for containerd.
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
use serde::Serialize;
use sha2::{Digest as _, Sha256};

/// Bump when the image layout code or an image's files change, so cached tarballs are
/// rebuilt (the keys hash the inputs from outside, not what the code writes).
const BUILDER_VERSION: &str = "swiftlet-xtask-images-2";

pub const PAUSE_IMAGE: &str = "localhost/pause:3.10";
pub const BUSYBOX_IMAGE: &str = "localhost/busybox:latest";

const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
pub const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Fixed creation time: images are content-addressed, a wall-clock time would change ids.
const EPOCH: &str = "1970-01-01T00:00:00Z";

/// `sha256:<hex>` of `bytes`, the OCI digest form.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// One filesystem entry of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Dir { mode: u32 },
    File { mode: u32, data: Vec<u8> },
    Symlink { target: String },
}

/// A deterministic single-layer root filesystem.
///
/// Paths are relative (`bin/sh`); missing parent directories are added with mode 0755.
/// A `BTreeMap` gives a stable order in which every parent sorts before its children.
#[derive(Debug, Default)]
pub struct Layer {
    entries: BTreeMap<String, Entry>,
}

impl Layer {
    fn add_parents(&mut self, path: &str) {
        let mut prefix = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            self.entries.entry(prefix.clone()).or_insert(Entry::Dir { mode: 0o755 });
        }
    }

    fn insert(&mut self, path: &str, entry: Entry) {
        let path = path.trim_matches('/');
        self.add_parents(path);
        self.entries.insert(path.to_owned(), entry);
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        self.insert(path, Entry::Dir { mode });
        self
    }

    pub fn file(&mut self, path: &str, mode: u32, data: impl Into<Vec<u8>>) -> &mut Self {
        self.insert(path, Entry::File { mode, data: data.into() });
        self
    }

    /// A symlink at `path` unless the layer already has something there.
    pub fn symlink_if_absent(&mut self, path: &str, target: &str) -> &mut Self {
        if !self.entries.contains_key(path.trim_matches('/')) {
            self.symlink(path, target);
        }
        self
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.insert(path, Entry::Symlink { target: target.to_owned() });
        self
    }

    /// The layer as an uncompressed tar: root-owned, mtime 0, sorted.
    pub fn to_tar(&self) -> Result<Vec<u8>> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_gnu();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            match entry {
                Entry::Dir { mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_size(0);
                    builder.append_data(&mut header, format!("{path}/"), &[][..])
                }
                Entry::File { mode, data } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    builder.append_data(&mut header, path, &data[..])
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    builder.append_link(&mut header, path, target)
                }
            }
            .with_context(|| format!("adding {path} to layer tar"))?;
        }
        builder.into_inner().context("finishing layer tar")
    }
}

/// The runtime part of an OCI image config (`config` in the config JSON).
#[derive(Debug, Default, Clone, Serialize)]
pub struct RunConfig {
    #[serde(rename = "Env")]
    pub env: Vec<String>,
    #[serde(rename = "Entrypoint", skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(rename = "WorkingDir")]
    pub working_dir: String,
    #[serde(rename = "Labels", skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The image's user (`USER 1234`); empty: root.
    #[serde(rename = "User", skip_serializing_if = "String::is_empty")]
    pub user: String,
}

#[derive(Serialize)]
struct Descriptor<'a> {
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    digest: String,
    size: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    platform: Option<Platform>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<&'a str, String>,
}

#[derive(Serialize)]
struct Platform {
    architecture: &'static str,
    os: &'static str,
}

/// An image written as an OCI image layout, in one tarball.
#[derive(Debug)]
pub struct OciArchive {
    pub tar: Vec<u8>,
    /// Digest of the image config: what CRI reports as the image id.
    pub image_id: String,
}

/// The documents and blobs of a one-layer image.
#[derive(Debug)]
pub struct OciBlobs {
    /// The image index (with its `mediaType`): one linux/amd64 manifest, annotated with
    /// the image's name.
    pub index: Vec<u8>,
    pub manifest: Vec<u8>,
    pub config: Vec<u8>,
    /// The uncompressed layer tar.
    pub layer: Vec<u8>,
}

/// Builds the OCI layout tarball (oci-layout, index.json, blobs/sha256/*) of a one-layer
/// image named `name` (a full reference such as `localhost/pause:3.10`).
pub fn oci_archive(name: &str, layer: &Layer, run: &RunConfig) -> Result<OciArchive> {
    let blobs = oci_blobs(name, layer, run)?;
    let mut outer = Layer::default();
    outer.file("oci-layout", 0o644, r#"{"imageLayoutVersion":"1.0.0"}"#);
    outer.file("index.json", 0o644, blobs.index);
    for blob in [&blobs.manifest, &blobs.config, &blobs.layer] {
        let hex = &digest(blob)["sha256:".len()..];
        outer.file(&format!("blobs/sha256/{hex}"), 0o644, blob.clone());
    }
    Ok(OciArchive { tar: outer.to_tar()?, image_id: digest(&blobs.config) })
}

/// The index, manifest, config and layer of a one-layer image named `name`.
pub fn oci_blobs(name: &str, layer: &Layer, run: &RunConfig) -> Result<OciBlobs> {
    let layer_tar = layer.to_tar()?;
    let layer_digest = digest(&layer_tar);

    let config = serde_json::to_vec(&serde_json::json!({
        "created": EPOCH,
        "architecture": "amd64",
        "os": "linux",
        "config": run,
        // Uncompressed layer: its diff id is its own digest.
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        "history": [{ "created": EPOCH, "created_by": BUILDER_VERSION }],
    }))?;
    let config_digest = digest(&config);

    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": Descriptor {
            media_type: MEDIA_CONFIG,
            digest: config_digest,
            size: config.len(),
            platform: None,
            annotations: BTreeMap::new(),
        },
        "layers": [Descriptor {
            media_type: MEDIA_LAYER,
            digest: layer_digest.clone(),
            size: layer_tar.len(),
            platform: None,
            annotations: BTreeMap::new(),
        }],
    }))?;
    let manifest_digest = digest(&manifest);

    let tag = name.rsplit_once(':').filter(|(repo, _)| !repo.is_empty()).map_or("latest", |(_, tag)| tag);
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [Descriptor {
            media_type: MEDIA_MANIFEST,
            digest: manifest_digest,
            size: manifest.len(),
            platform: Some(Platform { architecture: "amd64", os: "linux" }),
            annotations: BTreeMap::from([
                ("io.containerd.image.name", name.to_owned()),
                ("org.opencontainers.image.ref.name", tag.to_owned()),
            ]),
        }],
    }))?;

    Ok(OciBlobs { index, manifest, config, layer: layer_tar })
}

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

/// A dynamically linked host program with the shared libraries `ldd` names, as files at
/// their host paths (for an image that needs a tool busybox lacks, e.g. agnhost's curl).
#[derive(Debug)]
pub struct HostProgram {
    files: Vec<(String, Vec<u8>)>,
}

impl HostProgram {
    /// Reads `path` and what `ldd` says it loads (the loader included).
    pub fn read(path: &str) -> Result<Self> {
        let out = Command::new("ldd").arg(path).output().with_context(|| format!("running ldd {path}"))?;
        ensure!(out.status.success(), "ldd {path} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        let mut files = vec![(path.to_owned(), fs::read(path).with_context(|| format!("reading {path}"))?)];
        for lib in ldd_paths(&String::from_utf8_lossy(&out.stdout)) {
            let data = fs::read(&lib).with_context(|| format!("reading {lib} (a library of {path})"))?;
            files.push((lib, data));
        }
        Ok(Self { files })
    }

    /// Every byte of the program and its libraries, for an image's cache key.
    #[must_use]
    pub fn key_inputs(&self) -> Vec<&[u8]> {
        self.files.iter().flat_map(|(p, d)| [p.as_bytes(), d.as_slice()]).collect()
    }

    /// Adds the program and its libraries to `layer` at their host paths.
    pub fn add_to(&self, layer: &mut Layer) {
        for (path, data) in &self.files {
            layer.file(path, 0o755, data.clone());
        }
    }

    /// [`Self::add_to`], with the program at `path` instead of its host path (Debian's
    /// `/bin/nc.openbsd` is `nc` in an image).
    pub fn add_to_at(&self, layer: &mut Layer, path: &str) {
        for (i, (host_path, data)) in self.files.iter().enumerate() {
            layer.file(if i == 0 { path } else { host_path }, 0o755, data.clone());
        }
    }
}

/// The libraries in `ldd` output: `name => /path (addr)` lines and the loader's
/// `/path (addr)` line; the vDSO has no file.
fn ldd_paths(ldd: &str) -> Vec<String> {
    ldd.lines()
        .filter_map(|line| {
            let target = line.split_once("=>").map_or(line, |(_, t)| t).trim();
            let path = target.split_whitespace().next()?;
            path.starts_with('/').then(|| path.to_owned())
        })
        .collect()
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
    use std::io::Read as _;

    #[test]
    fn ldd_output_gives_each_library_and_the_loader() {
        let out = "\tlinux-vdso.so.1 (0x00007ff1d6562000)\n\
                   \tlibcurl.so.4 => /lib/x86_64-linux-gnu/libcurl.so.4 (0x00007ff1d645d000)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007ff1d625c000)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007ff1d6564000)\n";
        assert_eq!(
            super::ldd_paths(out),
            ["/lib/x86_64-linux-gnu/libcurl.so.4", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"]
        );
    }

    use super::*;

    fn read_tar(bytes: &[u8]) -> BTreeMap<String, (tar::EntryType, Vec<u8>, Option<String>)> {
        let mut out = BTreeMap::new();
        let mut archive = tar::Archive::new(bytes);
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let kind = entry.header().entry_type();
            let link = entry.link_name().unwrap().map(|l| l.display().to_string());
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            out.insert(path, (kind, data, link));
        }
        out
    }

    #[test]
    fn digest_is_oci_sha256() {
        assert_eq!(digest(b""), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn layer_adds_parents_and_is_deterministic() {
        let mut layer = Layer::default();
        layer.file("usr/bin/x", 0o755, "x").symlink("usr/sbin/y", "/usr/bin/x");
        let a = layer.to_tar().unwrap();
        assert_eq!(a, layer.to_tar().unwrap());
        let entries = read_tar(&a);
        let names: Vec<_> = entries.keys().cloned().collect();
        assert_eq!(names, ["usr/", "usr/bin/", "usr/bin/x", "usr/sbin/", "usr/sbin/y"]);
        assert_eq!(entries["usr/sbin/y"].0, tar::EntryType::Symlink);
        assert_eq!(entries["usr/sbin/y"].2.as_deref(), Some("/usr/bin/x"));
        assert_eq!(entries["usr/bin/x"].1, b"x");
    }

    #[test]
    fn busybox_layer_links_applets_but_not_itself() {
        let layer = busybox_layer(b"BB", "bin/sh\nusr/bin/awk\nbin/busybox\n\n");
        let entries = read_tar(&layer.to_tar().unwrap());
        assert_eq!(entries["bin/busybox"].1, b"BB");
        assert_eq!(entries["bin/sh"].2.as_deref(), Some("/bin/busybox"));
        assert_eq!(entries["usr/bin/awk"].2.as_deref(), Some("/bin/busybox"));
        assert!(entries.contains_key("tmp/"));
        assert!(String::from_utf8_lossy(&entries["etc/passwd"].1).starts_with("root:x:0:0:"));
    }

    #[test]
    fn oci_archive_is_a_consistent_layout() {
        let run = RunConfig {
            env: vec![DEFAULT_PATH.into()],
            entrypoint: Some(vec!["/pause".into()]),
            cmd: None,
            working_dir: "/".into(),
            labels: BTreeMap::new(),
            user: String::new(),
        };
        let archive = oci_archive(PAUSE_IMAGE, &pause_layer(b"\x7fELF"), &run).unwrap();
        let files = read_tar(&archive.tar);
        let blob = |d: &str| &files[&format!("blobs/sha256/{}", &d["sha256:".len()..])].1;

        assert_eq!(files["oci-layout"].1, br#"{"imageLayoutVersion":"1.0.0"}"#);
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"].1).unwrap();
        assert_eq!(index["schemaVersion"], 2);
        let m = &index["manifests"][0];
        assert_eq!(m["mediaType"], MEDIA_MANIFEST);
        assert_eq!(m["annotations"]["io.containerd.image.name"], PAUSE_IMAGE);
        assert_eq!(m["annotations"]["org.opencontainers.image.ref.name"], "3.10");
        assert_eq!(m["platform"]["os"], "linux");

        // Every descriptor's digest and size match the blob it names.
        let manifest_bytes = blob(m["digest"].as_str().unwrap());
        assert_eq!(digest(manifest_bytes), m["digest"]);
        assert_eq!(manifest_bytes.len() as u64, m["size"].as_u64().unwrap());
        let manifest: serde_json::Value = serde_json::from_slice(manifest_bytes).unwrap();
        let config_d = manifest["config"]["digest"].as_str().unwrap();
        assert_eq!(config_d, archive.image_id);
        let config: serde_json::Value = serde_json::from_slice(blob(config_d)).unwrap();
        assert_eq!(config["config"]["Entrypoint"][0], "/pause");
        assert!(config["config"].get("Cmd").is_none());
        let layer_d = manifest["layers"][0]["digest"].as_str().unwrap();
        assert_eq!(manifest["layers"][0]["mediaType"], MEDIA_LAYER);
        assert_eq!(config["rootfs"]["diff_ids"][0], layer_d);
        let layer = read_tar(blob(layer_d));
        assert_eq!(layer["pause"].1, b"\x7fELF");

        // Same inputs, same image id: the cache and re-imports rely on it.
        let again = oci_archive(PAUSE_IMAGE, &pause_layer(b"\x7fELF"), &run).unwrap();
        assert_eq!(again.image_id, archive.image_id);
        assert_eq!(again.tar, archive.tar);
    }

    #[test]
    fn cache_key_depends_on_every_input() {
        let a = cache_key("n", &[b"ab", b"c"]);
        assert_ne!(a, cache_key("n", &[b"a", b"bc"]));
        assert_ne!(a, cache_key("m", &[b"ab", b"c"]));
        assert_eq!(a, cache_key("n", &[b"ab", b"c"]));
    }
}
