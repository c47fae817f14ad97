//! Container images without a registry or a daemon: deterministic one-layer OCI images
//! written as OCI image-layout tarballs, ready for `ctr images import`. Shared by `xtask`
//! (the test bed's images) and the end-to-end tests (images of test drivers built from
//! the workspace's own binaries, made when a test needs them).
//!
//! Everything in a tarball is deterministic (fixed mtimes, owners, order), so the same
//! inputs give the same digests and the same image id, and a rebuilt image is a no-op for
//! containerd.

use std::{collections::BTreeMap, fs, io::Read as _, process::Command};

use anyhow::{Context as _, Result, ensure};
use serde::Serialize;
use sha2::{Digest as _, Sha256};

/// Bump when the image layout code or an image's files change, so cached tarballs are
/// rebuilt (the keys hash the inputs from outside, not what the code writes).
pub const BUILDER_VERSION: &str = "swiftlet-xtask-images-2";

pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
pub const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Fixed creation time: images are content-addressed, a wall-clock time would change ids.
pub const EPOCH: &str = "1970-01-01T00:00:00Z";

/// `sha256:<hex>` of `bytes`, the OCI digest form.
#[must_use]
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

/// A tar's entries by path: type, contents and link target.
pub type TarEntries = BTreeMap<String, (tar::EntryType, Vec<u8>, Option<String>)>;

/// Reads a tar (a layer, an image layout) into its entries.
///
/// # Errors
/// It is not a well-formed tar.
pub fn read_tar(bytes: &[u8]) -> std::io::Result<TarEntries> {
    let mut out = BTreeMap::new();
    let mut archive = tar::Archive::new(bytes);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.display().to_string();
        let kind = entry.header().entry_type();
        let link = entry.link_name()?.map(|l| l.display().to_string());
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        out.insert(path, (kind, data, link));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_each_library_and_the_loader() {
        let out = "\tlinux-vdso.so.1 (0x00007ff1d6562000)\n\
                   \tlibcurl.so.4 => /lib/x86_64-linux-gnu/libcurl.so.4 (0x00007ff1d645d000)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007ff1d625c000)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007ff1d6564000)\n";
        assert_eq!(
            ldd_paths(out),
            ["/lib/x86_64-linux-gnu/libcurl.so.4", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"]
        );
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
        let entries = read_tar(&a).unwrap();
        let names: Vec<_> = entries.keys().cloned().collect();
        assert_eq!(names, ["usr/", "usr/bin/", "usr/bin/x", "usr/sbin/", "usr/sbin/y"]);
        assert_eq!(entries["usr/sbin/y"].0, tar::EntryType::Symlink);
        assert_eq!(entries["usr/sbin/y"].2.as_deref(), Some("/usr/bin/x"));
        assert_eq!(entries["usr/bin/x"].1, b"x");
    }

    fn pause_layer() -> Layer {
        let mut layer = Layer::default();
        layer.file("pause", 0o755, b"\x7fELF".to_vec());
        layer
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
        let archive = oci_archive("localhost/pause:3.10", &pause_layer(), &run).unwrap();
        let files = read_tar(&archive.tar).unwrap();
        let blob = |d: &str| &files[&format!("blobs/sha256/{}", &d["sha256:".len()..])].1;

        assert_eq!(files["oci-layout"].1, br#"{"imageLayoutVersion":"1.0.0"}"#);
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"].1).unwrap();
        assert_eq!(index["schemaVersion"], 2);
        let m = &index["manifests"][0];
        assert_eq!(m["mediaType"], MEDIA_MANIFEST);
        assert_eq!(m["annotations"]["io.containerd.image.name"], "localhost/pause:3.10");
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
        let layer = read_tar(blob(layer_d)).unwrap();
        assert_eq!(layer["pause"].1, b"\x7fELF");

        // Same inputs, same image id: the cache and re-imports rely on it.
        let again = oci_archive("localhost/pause:3.10", &pause_layer(), &run).unwrap();
        assert_eq!(again.image_id, archive.image_id);
        assert_eq!(again.tar, archive.tar);
    }
}
