//! A host-path CSI driver for the test bed (`swiftlet-test-csi-driver`): the identity,
//! controller and node services of CSI v1 on one unix socket, and, like a CSI driver's
//! node-driver-registrar beside it, the kubelet's plugin registration API on
//! `<registration-dir>/<name>-reg.sock`.
//!
//! Volumes live in the state directory: `<state>/<id>` (a directory) for a filesystem
//! volume, `<state>/<id>.img` (a sparse file of the volume's size) for a block volume,
//! and `<state>/<id>.json`, the volume's record (name, capacity, mode), so a restarted
//! driver knows its volumes. The node service does real mounts:
//!
//! - stage: a filesystem volume's directory is bind-mounted on the staging path; a block
//!   volume's image is attached to a loop device (`losetup`);
//! - publish: the staging path (or the loop device) is bind-mounted on the target path,
//!   then remounted read-only when asked; an ephemeral inline volume
//!   (`csi.storage.k8s.io/ephemeral=true`, never staged) gets a directory
//!   `<state>/ephemeral-<id>` of its own, removed when it is unpublished; when the
//!   `CSIDriver` asks for the pod's service-account tokens (`tokenRequests`), the driver
//!   writes what they say of themselves into that directory ([`TOKENS_FILE`]), as a
//!   secrets driver would hand a pod what it fetched with them, so the pod can see it;
//! - unpublish/unstage: unmount (and detach the loop device), idempotently.
//!
//! The controller service also attaches (`PUBLISH_UNPUBLISH_VOLUME`, for
//! external-attacher when the `CSIDriver` says `attachRequired`): `ControllerPublishVolume`
//! records the node in the volume's record and answers the publish context
//! [`ATTACHED_TO_KEY`]` = <node id>`; a volume attached so must be staged with that
//! context (`FailedPrecondition` otherwise), as a real attachable driver needs the device
//! its attach gave. `ControllerUnpublishVolume` forgets the node.
//!
//! Every call can be written as one JSON line ([`CsiCall`]) to a calls log, so a test can
//! check what the kubelet asked. Errors carry the codes the CSI spec names:
//! `InvalidArgument` for a missing id, path or capability, `NotFound` for an unknown
//! volume or a volume path that is not mounted.

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use swiftlet::pluginmanager::proto as reg;
use swiftlet::pluginmanager::proto::registration_server::{Registration, RegistrationServer};
use swiftlet::volumes::csi::proto as csi;
use swiftlet::volumes::csi::proto::controller_server::{Controller, ControllerServer};
use swiftlet::volumes::csi::proto::identity_server::{Identity, IdentityServer};
use swiftlet::volumes::csi::proto::node_server::{Node, NodeServer};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

/// The driver's name unless `--name` says otherwise.
pub const DEFAULT_NAME: &str = "hostpath.csi.swiftlet.test";

/// The volume context key that marks an ephemeral inline volume's publish.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// The volume context key of the pod's service-account tokens (JSON: audience →
/// `{"token", "expirationTimestamp"}`), when the `CSIDriver` has `tokenRequests`.
pub const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// The file an ephemeral inline volume gets when its publish carries tokens: a line
/// `<audience> <namespace>/<pod> <service account>` for each, from the token's own
/// claims (never the token itself).
pub const TOKENS_FILE: &str = "serviceaccount-tokens";

/// The volume context key of an ephemeral inline volume's size (a quantity such as
/// `10Mi`, or bytes); without it the volume has [`DEFAULT_CAPACITY`].
pub const EPHEMERAL_SIZE_KEY: &str = "size";

/// The publish context key `ControllerPublishVolume` answers: the node the volume is
/// attached to.
pub const ATTACHED_TO_KEY: &str = "attachedTo";

/// The capacity of a volume created without a capacity range, and of an ephemeral
/// inline volume without a size.
pub const DEFAULT_CAPACITY: i64 = 100 << 20;

/// What the plugin registration API says the driver serves.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// How the driver runs.
#[derive(Clone, Debug)]
pub struct DriverOptions {
    /// The driver's name (`GetPluginInfo`, the registration's name).
    pub name: String,
    /// `NodeGetInfo`'s node id: the node's name.
    pub node_id: String,
    /// The CSI socket.
    pub endpoint: PathBuf,
    /// Where the volumes and their records live.
    pub state_dir: PathBuf,
    /// Serve the plugin registration API on `<dir>/<name>-reg.sock`.
    pub registration_dir: Option<PathBuf>,
    /// The CSI endpoint the registration names (default: [`DriverOptions::endpoint`]),
    /// for an agent that sees the socket at another path.
    pub registration_endpoint: Option<String>,
    /// Append one JSON line per call ([`CsiCall`]) here.
    pub calls_log: Option<PathBuf>,
    /// `NodeGetInfo`'s `max_volumes_per_node` (0: no limit).
    pub max_volumes_per_node: i64,
}

impl DriverOptions {
    /// The registration socket, when the driver serves the registration API.
    #[must_use]
    pub fn registration_socket(&self) -> Option<PathBuf> {
        self.registration_dir.as_ref().map(|d| d.join(format!("{}-reg.sock", self.name)))
    }
}

/// One call, as written to the calls log. Fields a method does not have stay empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CsiCall {
    /// The CSI method (`NodePublishVolume`, ...), or `GetInfo` /
    /// `NotifyRegistrationStatus` of the registration API.
    pub method: String,
    /// The volume id (`CreateVolume`: the id it answered).
    pub volume_id: String,
    /// `CreateVolume`'s name.
    pub name: String,
    pub staging_target_path: String,
    /// `target_path` of publish and unpublish, `volume_path` of stats and expansion.
    pub target_path: String,
    pub readonly: bool,
    /// `mount` or `block` (empty: no capability in the request).
    pub access_type: String,
    /// The access mode's name (`SINGLE_NODE_WRITER`, ...).
    pub access_mode: String,
    pub fs_type: String,
    pub mount_flags: Vec<String>,
    pub volume_mount_group: String,
    pub volume_context: BTreeMap<String, String>,
    pub publish_context: BTreeMap<String, String>,
    /// `CreateVolume`'s parameters.
    pub parameters: BTreeMap<String, String>,
    /// The node of `ControllerPublishVolume` and `ControllerUnpublishVolume`.
    pub node_id: String,
    /// The required bytes of a capacity range; the capacity answered by create/expand.
    pub required_bytes: i64,
    pub capacity_bytes: i64,
    /// `NotifyRegistrationStatus`'s outcome.
    pub registered: bool,
    /// The gRPC code answered (`Ok`, `NotFound`, ...) and the error's message.
    pub code: String,
    pub message: String,
}

/// A volume's record (`<state>/<id>.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: String,
    /// `CreateVolume`'s name (empty for an ephemeral volume).
    #[serde(default)]
    pub name: String,
    pub capacity_bytes: i64,
    /// A block volume (an image file) rather than a directory.
    #[serde(default)]
    pub block: bool,
    /// An ephemeral inline volume, removed when unpublished.
    #[serde(default)]
    pub ephemeral: bool,
    /// The nodes it is attached to (`ControllerPublishVolume`).
    #[serde(default)]
    pub attached_to: Vec<String>,
}

/// The id of the volume `CreateVolume` makes for `name`: the same name always gives the
/// same id (so a retried create finds its volume), and the id is a safe file name.
#[must_use]
pub fn volume_id(name: &str) -> String {
    use std::fmt::Write as _;
    let digest = Sha256::digest(name.as_bytes());
    digest.iter().take(10).fold(String::from("hp-"), |mut id, b| {
        let _ = write!(id, "{b:02x}");
        id
    })
}

/// Whether a publish's volume context is that of an ephemeral inline volume.
#[must_use]
pub fn is_ephemeral<S: std::hash::BuildHasher>(volume_context: &HashMap<String, String, S>) -> bool {
    volume_context.get(EPHEMERAL_KEY).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// [`TOKENS_FILE`]'s text for the volume context's [`TOKENS_KEY`] value: each token's
/// audience, and the pod and service account its claims bind it to, sorted by audience.
///
/// # Errors
/// Not the JSON the kubelet sends, or a token that is not a JWT with the claims of a
/// pod-bound service-account token.
pub fn token_lines(tokens: &str) -> Result<String> {
    use base64::Engine as _;
    use std::fmt::Write as _;
    let tokens: BTreeMap<String, serde_json::Value> = serde_json::from_str(tokens).context("not a JSON object")?;
    let mut text = String::new();
    for (audience, t) in tokens {
        let token = t["token"].as_str().with_context(|| format!("{audience}: no token"))?;
        let payload = token.split('.').nth(1).with_context(|| format!("{audience}: not a JWT"))?;
        let claims: serde_json::Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload.trim_end_matches('='))
                .with_context(|| format!("{audience}: the claims are not base64url"))?,
        )
        .with_context(|| format!("{audience}: the claims are not JSON"))?;
        let k8s = &claims["kubernetes.io"];
        let field = |v: &serde_json::Value, what: &str| {
            v.as_str().map(str::to_owned).with_context(|| format!("{audience}: no {what} in the claims"))
        };
        let namespace = field(&k8s["namespace"], "namespace")?;
        let pod = field(&k8s["pod"]["name"], "pod")?;
        let account = field(&k8s["serviceaccount"]["name"], "service account")?;
        writeln!(text, "{audience} {namespace}/{pod} {account}")?;
    }
    Ok(text)
}

/// An ephemeral inline volume's capacity from its volume context's `size` (`10Mi`,
/// `1G`, `4096`), else [`DEFAULT_CAPACITY`].
///
/// # Errors
/// A size that is not a quantity.
pub fn ephemeral_capacity<S: std::hash::BuildHasher>(
    volume_context: &HashMap<String, String, S>,
) -> Result<i64, Status> {
    match volume_context.get(EPHEMERAL_SIZE_KEY) {
        None => Ok(DEFAULT_CAPACITY),
        Some(s) => parse_quantity(s).ok_or_else(|| invalid(format!("volume context size {s:?} is not a quantity"))),
    }
}

/// A Kubernetes quantity of bytes: digits with an optional binary (`Ki`..`Ei`) or
/// decimal (`k`, `M`..`E`) suffix.
#[must_use]
pub fn parse_quantity(s: &str) -> Option<i64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    let n: i64 = digits.parse().ok()?;
    let factor: i64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return None,
    };
    n.checked_mul(factor)
}

/// The capacity a create asks for: the required bytes, else the limit, else
/// [`DEFAULT_CAPACITY`].
///
/// # Errors
/// A negative range, or a limit below the required bytes.
pub fn requested_capacity(range: Option<&csi::CapacityRange>) -> Result<i64, Status> {
    let Some(r) = range else { return Ok(DEFAULT_CAPACITY) };
    if r.required_bytes < 0 || r.limit_bytes < 0 {
        return Err(Status::out_of_range("negative capacity"));
    }
    if r.limit_bytes > 0 && r.required_bytes > r.limit_bytes {
        return Err(Status::out_of_range(format!(
            "required {} bytes is above the limit of {}",
            r.required_bytes, r.limit_bytes
        )));
    }
    Ok(if r.required_bytes > 0 {
        r.required_bytes
    } else if r.limit_bytes > 0 {
        r.limit_bytes
    } else {
        DEFAULT_CAPACITY
    })
}

fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg)
}

fn internal(context: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("{context}: {e}"))
}

/// A volume id that is also a safe file name in the state directory.
fn checked_id(id: &str) -> Result<&str, Status> {
    if id.is_empty() {
        return Err(invalid("volume id missing"));
    }
    if id.contains('/') || id == "." || id == ".." || id.contains('\0') {
        return Err(invalid(format!("volume id {id:?} is not a file name")));
    }
    Ok(id)
}

fn required_path<'a>(what: &str, path: &'a str) -> Result<&'a Path, Status> {
    if path.is_empty() {
        return Err(invalid(format!("{what} missing")));
    }
    if !path.starts_with('/') {
        return Err(invalid(format!("{what} {path:?} is not absolute")));
    }
    Ok(Path::new(path))
}

/// The volumes on disk.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    #[must_use]
    pub fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// A filesystem volume's directory.
    #[must_use]
    pub fn dir_path(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// A block volume's image.
    #[must_use]
    pub fn image_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.img"))
    }

    /// An ephemeral inline volume's directory.
    #[must_use]
    pub fn ephemeral_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("ephemeral-{id}"))
    }

    /// Where a volume's data is.
    #[must_use]
    pub fn data_path(&self, r: &VolumeRecord) -> PathBuf {
        if r.ephemeral {
            self.ephemeral_path(&r.id)
        } else if r.block {
            self.image_path(&r.id)
        } else {
            self.dir_path(&r.id)
        }
    }

    /// The record of `id`, if the volume exists.
    ///
    /// # Errors
    /// The record is unreadable or malformed.
    pub fn load(&self, id: &str) -> Result<Option<VolumeRecord>> {
        let path = self.record_path(id);
        match std::fs::read(&path) {
            Ok(bytes) => {
                Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes the record (atomically: a driver killed half-way leaves the old one).
    ///
    /// # Errors
    /// The state directory is not writable.
    pub fn save(&self, r: &VolumeRecord) -> Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.record_path(&r.id);
        let tmp = self.dir.join(format!(".{}.json.tmp", r.id));
        std::fs::write(&tmp, serde_json::to_vec(r)?)?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }

    /// Removes the volume's data and record; a missing volume is not an error.
    ///
    /// # Errors
    /// A file could not be removed.
    pub fn remove(&self, id: &str) -> Result<()> {
        for p in [self.dir_path(id), self.ephemeral_path(id)] {
            match std::fs::remove_dir_all(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", p.display())),
            }
        }
        for p in [self.image_path(id), self.record_path(id)] {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", p.display())),
            }
        }
        Ok(())
    }

    /// Every volume's record.
    #[must_use]
    pub fn all(&self) -> Vec<VolumeRecord> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut out: Vec<VolumeRecord> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(str::to_owned))
            .filter(|id| !id.starts_with('.'))
            .filter_map(|id| self.load(&id).ok().flatten())
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// The file system's device (`major:minor`).
    pub dev: (u32, u32),
    /// The file system's directory that is mounted (a bind mount's source).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// Undoes mountinfo's octal escapes (`\040` is a space).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses a mountinfo text.
#[must_use]
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let f: Vec<&str> = before.split(' ').collect();
            let a: Vec<&str> = after.split(' ').collect();
            let (major, minor) = f.get(2)?.split_once(':')?;
            Some(MountEntry {
                dev: (major.parse().ok()?, minor.parse().ok()?),
                root: PathBuf::from(unescape_mountinfo(f.get(3)?)),
                mount_point: PathBuf::from(unescape_mountinfo(f.get(4)?)),
                fs_type: (*a.first()?).to_owned(),
                source: unescape_mountinfo(a.get(1)?),
            })
        })
        .collect()
}

/// This process's mounts.
#[must_use]
pub fn mounts() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo").map(|t| parse_mountinfo(&t)).unwrap_or_default()
}

/// Whether `path` (or what it resolves to) is a mount point.
#[must_use]
pub fn is_mount_point(path: &Path) -> bool {
    let resolved = std::fs::canonicalize(path).ok();
    mounts().iter().any(|m| m.mount_point == path || resolved.as_deref() == Some(m.mount_point.as_path()))
}

fn cstring(path: &Path) -> Result<CString, Status> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| invalid(format!("{} has a NUL", path.display())))
}

/// `mount --bind source target`, then read-only when asked (a bind mount takes
/// `MS_RDONLY` only on a remount).
fn bind_mount(source: &Path, target: &Path, readonly: bool) -> Result<(), Status> {
    let (s, t) = (cstring(source)?, cstring(target)?);
    // SAFETY: mount(2) with NUL-terminated paths that outlive the call and no data.
    let rc = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(internal(&format!("bind-mounting {} on {}", source.display(), target.display()), e));
    }
    if readonly {
        let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY;
        // SAFETY: as above; a remount of the bind mount just made.
        let rc = unsafe { libc::mount(std::ptr::null(), t.as_ptr(), std::ptr::null(), flags, std::ptr::null()) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            let _ = unmount(target);
            return Err(internal(&format!("remounting {} read-only", target.display()), e));
        }
    }
    Ok(())
}

/// Unmounts `target` (every mount stacked there); a path that is not a mount point is
/// left alone.
fn unmount(target: &Path) -> Result<(), Status> {
    let t = cstring(target)?;
    // Bounded: a mount that neither unmounts nor detaches must not spin for ever.
    for _ in 0..16 {
        if !is_mount_point(target) {
            return Ok(());
        }
        // SAFETY: umount2(2) with a NUL-terminated path.
        if unsafe { libc::umount2(t.as_ptr(), 0) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EBUSY) {
                // Still in use (a container that has not quite gone): detach it.
                // SAFETY: as above.
                unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
                continue;
            }
            return Err(internal(&format!("unmounting {}", target.display()), e));
        }
    }
    Err(Status::internal(format!("{} stays mounted", target.display())))
}

fn run(cmd: &mut Command) -> Result<String, Status> {
    let out = cmd.output().map_err(|e| internal(&format!("running {cmd:?}"), e))?;
    if !out.status.success() {
        return Err(Status::internal(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The loop devices `image` is attached to (`losetup -j`).
///
/// # Errors
/// losetup failed.
pub fn loop_devices_of(image: &Path) -> Result<Vec<PathBuf>, Status> {
    let out = run(Command::new("losetup").arg("-j").arg(image))?;
    Ok(parse_losetup_j(&out))
}

/// The devices of `losetup -j`'s lines (`/dev/loop3: [2049]:1234 (/path)`).
#[must_use]
pub fn parse_losetup_j(out: &str) -> Vec<PathBuf> {
    out.lines().filter_map(|l| l.split_once(':')).map(|(dev, _)| PathBuf::from(dev.trim())).collect()
}

/// Detaches every loop device of `image`.
///
/// # Errors
/// losetup failed.
pub fn detach_loops(image: &Path) -> Result<(), Status> {
    for dev in loop_devices_of(image)? {
        run(Command::new("losetup").arg("-d").arg(&dev))?;
    }
    Ok(())
}

/// Bytes used under `dir` (allocated blocks, as `du`), not following symbolic links nor
/// leaving the file system; and how many files and directories.
fn usage(dir: &Path) -> (u64, u64) {
    let Ok(top) = std::fs::symlink_metadata(dir) else { return (0, 0) };
    let dev = top.dev();
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.filter_map(Result::ok) {
            let Ok(m) = e.path().symlink_metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            bytes += m.blocks() * 512;
            inodes += 1;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, inodes)
}

fn statvfs(path: &Path) -> Result<libc::statvfs, Status> {
    let p = cstring(path)?;
    // SAFETY: statvfs(3) fills the zeroed struct it is given; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(p.as_ptr(), &raw mut st) != 0 {
            return Err(internal(&format!("statvfs {}", path.display()), std::io::Error::last_os_error()));
        }
        Ok(st)
    }
}

fn access_type(cap: Option<&csi::VolumeCapability>) -> (&'static str, String, Vec<String>, String) {
    match cap.and_then(|c| c.access_type.as_ref()) {
        Some(csi::volume_capability::AccessType::Block(_)) => ("block", String::new(), Vec::new(), String::new()),
        Some(csi::volume_capability::AccessType::Mount(m)) => {
            ("mount", m.fs_type.clone(), m.mount_flags.clone(), m.volume_mount_group.clone())
        }
        None => ("", String::new(), Vec::new(), String::new()),
    }
}

fn access_mode(cap: Option<&csi::VolumeCapability>) -> String {
    cap.and_then(|c| c.access_mode.as_ref())
        .and_then(|m| csi::volume_capability::access_mode::Mode::try_from(m.mode).ok())
        .map(|m| m.as_str_name().to_owned())
        .unwrap_or_default()
}

fn sorted(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A call's fields from its volume capability.
fn with_capability(mut call: CsiCall, cap: Option<&csi::VolumeCapability>) -> CsiCall {
    let (kind, fs_type, flags, group) = access_type(cap);
    kind.clone_into(&mut call.access_type);
    call.fs_type = fs_type;
    call.mount_flags = flags;
    call.volume_mount_group = group;
    call.access_mode = access_mode(cap);
    call
}

fn is_block(cap: Option<&csi::VolumeCapability>) -> Result<bool, Status> {
    match cap.and_then(|c| c.access_type.as_ref()) {
        Some(csi::volume_capability::AccessType::Block(_)) => Ok(true),
        Some(csi::volume_capability::AccessType::Mount(_)) => Ok(false),
        None => Err(invalid("volume capability missing")),
    }
}

/// The driver: its options, its volumes, and one lock that makes its operations one at
/// a time (mounts and loop devices of one volume never race).
#[derive(Debug)]
pub struct Driver {
    opts: DriverOptions,
    store: Store,
    lock: Mutex<()>,
    log: Mutex<()>,
}

impl Driver {
    #[must_use]
    pub fn new(opts: DriverOptions) -> Arc<Self> {
        let store = Store::new(&opts.state_dir);
        Arc::new(Self { opts, store, lock: Mutex::new(()), log: Mutex::new(()) })
    }

    fn record(&self, mut call: CsiCall, result: &Result<CsiCall, Status>) {
        match result {
            Ok(done) => {
                call = done.clone();
                call.code = format!("{:?}", Code::Ok);
            }
            Err(s) => {
                call.code = format!("{:?}", s.code());
                s.message().clone_into(&mut call.message);
            }
        }
        eprintln!(
            "csi-driver: {} {} -> {}{}",
            call.method,
            call.volume_id,
            call.code,
            if call.message.is_empty() { String::new() } else { format!(": {}", call.message) }
        );
        let Some(path) = &self.opts.calls_log else { return };
        let Ok(mut line) = serde_json::to_vec(&call) else { return };
        line.push(b'\n');
        let _guard = self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = f.write_all(&line);
        }
    }

    /// Logs a call that answered OK without touching any volume.
    fn record_ok(&self, call: CsiCall) {
        self.record(call.clone(), &Ok(call));
    }

    /// Runs `op` on a blocking thread under the driver's lock and logs the call.
    async fn call<T: Send + 'static>(
        self: &Arc<Self>,
        call: CsiCall,
        op: impl FnOnce(&Self, CsiCall) -> Result<(T, CsiCall), Status> + Send + 'static,
    ) -> Result<Response<T>, Status> {
        let this = self.clone();
        let logged = call.clone();
        let result = tokio::task::spawn_blocking(move || {
            let _guard = this.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            op(&this, call)
        })
        .await
        .map_err(|e| internal("driver task", e))
        .and_then(|r| r);
        let (reply, result) = match result {
            Ok((reply, done)) => (Ok(reply), Ok(done)),
            Err(s) => (Err(s.clone()), Err(s)),
        };
        self.record(logged, &result);
        reply.map(Response::new)
    }

    fn load(&self, id: &str) -> Result<VolumeRecord, Status> {
        self.store
            .load(id)
            .map_err(|e| internal("reading the volume record", format!("{e:#}")))?
            .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))
    }

    fn save(&self, r: &VolumeRecord) -> Result<(), Status> {
        self.store.save(r).map_err(|e| internal("writing the volume record", format!("{e:#}")))
    }

    // Controller.

    fn create_volume(&self, req: &csi::CreateVolumeRequest) -> Result<csi::Volume, Status> {
        if req.name.is_empty() {
            return Err(invalid("name missing"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(invalid("volume capabilities missing"));
        }
        let kinds: Vec<bool> = req.volume_capabilities.iter().map(|c| is_block(Some(c))).collect::<Result<_, _>>()?;
        let block = kinds[0];
        if kinds.iter().any(|k| *k != block) {
            return Err(invalid("both block and mount access asked for"));
        }
        let capacity = requested_capacity(req.capacity_range.as_ref())?;
        let id = volume_id(&req.name);
        if let Some(r) = self.store.load(&id).map_err(|e| internal("reading the volume record", format!("{e:#}")))? {
            let required = req.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
            if r.block != block || r.capacity_bytes < required {
                return Err(Status::already_exists(format!(
                    "volume {} exists with another mode or a smaller capacity",
                    req.name
                )));
            }
            return Ok(csi::Volume { capacity_bytes: r.capacity_bytes, volume_id: id, ..Default::default() });
        }
        let r = VolumeRecord {
            id: id.clone(),
            name: req.name.clone(),
            capacity_bytes: capacity,
            block,
            ..VolumeRecord::default()
        };
        let data = self.store.data_path(&r);
        std::fs::create_dir_all(&self.opts.state_dir).map_err(|e| internal("creating the state directory", e))?;
        if block {
            let f = std::fs::File::create(&data).map_err(|e| internal(&format!("creating {}", data.display()), e))?;
            f.set_len(capacity as u64).map_err(|e| internal(&format!("sizing {}", data.display()), e))?;
        } else {
            std::fs::create_dir_all(&data).map_err(|e| internal(&format!("creating {}", data.display()), e))?;
        }
        self.save(&r)?;
        Ok(csi::Volume { capacity_bytes: capacity, volume_id: id, ..Default::default() })
    }

    fn delete_volume(&self, id: &str) -> Result<(), Status> {
        let id = checked_id(id)?;
        if let Some(r) = self.store.load(id).ok().flatten()
            && r.block
        {
            detach_loops(&self.store.image_path(id))?;
        }
        self.store.remove(id).map_err(|e| internal("removing the volume", format!("{e:#}")))
    }

    /// Attaches a volume to a node: records it and answers the publish context.
    fn controller_publish(&self, req: &csi::ControllerPublishVolumeRequest) -> Result<HashMap<String, String>, Status> {
        let id = checked_id(&req.volume_id)?;
        if req.node_id.is_empty() {
            return Err(invalid("node id missing"));
        }
        let block = is_block(req.volume_capability.as_ref())?;
        let mut r = self.load(id)?;
        if r.block != block {
            return Err(invalid(format!("volume {id} is not a {} volume", if block { "block" } else { "filesystem" })));
        }
        if !r.attached_to.contains(&req.node_id) {
            r.attached_to.push(req.node_id.clone());
            self.save(&r)?;
        }
        Ok([(ATTACHED_TO_KEY.to_owned(), req.node_id.clone())].into())
    }

    /// Detaches a volume from a node (all nodes without one); a volume that is gone is
    /// detached already.
    fn controller_unpublish(&self, req: &csi::ControllerUnpublishVolumeRequest) -> Result<(), Status> {
        let id = checked_id(&req.volume_id)?;
        let Some(mut r) = self.store.load(id).ok().flatten() else { return Ok(()) };
        let before = r.attached_to.len();
        r.attached_to.retain(|n| !req.node_id.is_empty() && *n != req.node_id);
        if r.attached_to.len() != before {
            self.save(&r)?;
        }
        Ok(())
    }

    fn expand(&self, id: &str, range: Option<&csi::CapacityRange>) -> Result<VolumeRecord, Status> {
        let id = checked_id(id)?;
        let range = range.ok_or_else(|| invalid("capacity range missing"))?;
        let mut r = self.load(id)?;
        if range.limit_bytes > 0 && range.required_bytes > range.limit_bytes {
            return Err(Status::out_of_range("required bytes above the limit"));
        }
        let wanted = if range.required_bytes > 0 { range.required_bytes } else { range.limit_bytes };
        if wanted > r.capacity_bytes {
            r.capacity_bytes = wanted;
            if r.block {
                let image = self.store.image_path(id);
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&image)
                    .map_err(|e| internal(&format!("opening {}", image.display()), e))?;
                f.set_len(wanted as u64).map_err(|e| internal(&format!("growing {}", image.display()), e))?;
            }
            self.save(&r)?;
        }
        Ok(r)
    }

    // Node.

    fn stage(&self, req: &csi::NodeStageVolumeRequest) -> Result<(), Status> {
        let id = checked_id(&req.volume_id)?;
        let staging = required_path("staging target path", &req.staging_target_path)?;
        let block = is_block(req.volume_capability.as_ref())?;
        let r = self.load(id)?;
        if r.block != block {
            return Err(invalid(format!("volume {id} is not a {} volume", if block { "block" } else { "filesystem" })));
        }
        if !r.attached_to.is_empty() {
            let node = req.publish_context.get(ATTACHED_TO_KEY).map(String::as_str);
            if node != Some(self.opts.node_id.as_str()) {
                return Err(Status::failed_precondition(format!(
                    "volume {id} is attached to {:?}, but the publish context names {node:?} for node {}",
                    r.attached_to, self.opts.node_id
                )));
            }
        }
        if block {
            let image = self.store.image_path(id);
            if loop_devices_of(&image)?.is_empty() {
                run(Command::new("losetup").args(["--find", "--show"]).arg(&image))?;
            }
            return Ok(());
        }
        if is_mount_point(staging) {
            return Ok(());
        }
        std::fs::create_dir_all(staging).map_err(|e| internal(&format!("creating {}", staging.display()), e))?;
        bind_mount(&self.store.dir_path(id), staging, false)
    }

    fn unstage(&self, req: &csi::NodeUnstageVolumeRequest) -> Result<(), Status> {
        let id = checked_id(&req.volume_id)?;
        let staging = required_path("staging target path", &req.staging_target_path)?;
        unmount(staging)?;
        if self.store.load(id).ok().flatten().is_some_and(|r| r.block) {
            detach_loops(&self.store.image_path(id))?;
        }
        Ok(())
    }

    fn publish(&self, req: &csi::NodePublishVolumeRequest) -> Result<(), Status> {
        let id = checked_id(&req.volume_id)?;
        let target = required_path("target path", &req.target_path)?;
        let block = is_block(req.volume_capability.as_ref())?;
        let source = if is_ephemeral(&req.volume_context) {
            if block {
                return Err(invalid("an ephemeral inline volume cannot be a block volume"));
            }
            let r = if let Some(r) = self.store.load(id).ok().flatten() {
                r
            } else {
                let r = VolumeRecord {
                    id: id.to_owned(),
                    name: String::new(),
                    capacity_bytes: ephemeral_capacity(&req.volume_context)?,
                    block: false,
                    ephemeral: true,
                    attached_to: Vec::new(),
                };
                self.save(&r)?;
                r
            };
            let dir = self.store.data_path(&r);
            std::fs::create_dir_all(&dir).map_err(|e| internal(&format!("creating {}", dir.display()), e))?;
            if let Some(tokens) = req.volume_context.get(TOKENS_KEY) {
                let text = token_lines(tokens).map_err(|e| invalid(format!("{TOKENS_KEY}: {e:#}")))?;
                let file = dir.join(TOKENS_FILE);
                let tmp = dir.join(format!(".{TOKENS_FILE}.tmp"));
                std::fs::write(&tmp, text)
                    .and_then(|()| std::fs::rename(&tmp, &file))
                    .map_err(|e| internal(&format!("writing {}", file.display()), e))?;
            }
            dir
        } else {
            let staging = required_path("staging target path", &req.staging_target_path)?;
            let r = self.load(id)?;
            if r.block != block {
                return Err(invalid(format!(
                    "volume {id} is not a {} volume",
                    if block { "block" } else { "filesystem" }
                )));
            }
            if block {
                loop_devices_of(&self.store.image_path(id))?
                    .into_iter()
                    .next()
                    .ok_or_else(|| Status::failed_precondition(format!("volume {id} is not staged")))?
            } else {
                if !is_mount_point(staging) {
                    return Err(Status::failed_precondition(format!(
                        "volume {id} is not staged at {}",
                        staging.display()
                    )));
                }
                staging.to_path_buf()
            }
        };
        if is_mount_point(target) {
            return Ok(());
        }
        if block {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| internal(&format!("creating {}", parent.display()), e))?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(target)
                .map_err(|e| internal(&format!("creating {}", target.display()), e))?;
        } else {
            std::fs::create_dir_all(target).map_err(|e| internal(&format!("creating {}", target.display()), e))?;
        }
        bind_mount(&source, target, req.readonly)
    }

    fn unpublish(&self, req: &csi::NodeUnpublishVolumeRequest) -> Result<(), Status> {
        let id = checked_id(&req.volume_id)?;
        let target = required_path("target path", &req.target_path)?;
        unmount(target)?;
        match std::fs::symlink_metadata(target) {
            Ok(m) if m.is_dir() => {
                // Not ours to empty: a directory with files in it is left (and logged).
                if let Err(e) = std::fs::remove_dir(target) {
                    eprintln!("csi-driver: leaving {}: {e}", target.display());
                }
            }
            Ok(_) => {
                let _ = std::fs::remove_file(target);
            }
            Err(_) => {}
        }
        if self.store.load(id).ok().flatten().is_some_and(|r| r.ephemeral) {
            self.store.remove(id).map_err(|e| internal("removing the ephemeral volume", format!("{e:#}")))?;
        }
        Ok(())
    }

    fn stats(&self, req: &csi::NodeGetVolumeStatsRequest) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
        let id = checked_id(&req.volume_id)?;
        let path = required_path("volume path", &req.volume_path)?;
        let r = self.load(id)?;
        if !path.exists() {
            return Err(Status::not_found(format!("{} does not exist", path.display())));
        }
        if !is_mount_point(path) {
            return Err(Status::not_found(format!("{} is not mounted", path.display())));
        }
        let total = r.capacity_bytes;
        if r.block {
            return Ok(csi::NodeGetVolumeStatsResponse {
                usage: vec![csi::VolumeUsage {
                    total,
                    unit: csi::volume_usage::Unit::Bytes.into(),
                    ..Default::default()
                }],
            });
        }
        let (used, _) = usage(path);
        let used = used as i64;
        let st = statvfs(path)?;
        let files = st.f_files as i64;
        let free_files = st.f_ffree as i64;
        Ok(csi::NodeGetVolumeStatsResponse {
            usage: vec![
                csi::VolumeUsage {
                    available: (total - used).max(0),
                    total,
                    used,
                    unit: csi::volume_usage::Unit::Bytes.into(),
                },
                csi::VolumeUsage {
                    available: free_files,
                    total: files,
                    used: files - free_files,
                    unit: csi::volume_usage::Unit::Inodes.into(),
                },
            ],
        })
    }

    fn node_expand(&self, req: &csi::NodeExpandVolumeRequest) -> Result<i64, Status> {
        let id = checked_id(&req.volume_id)?;
        required_path("volume path", &req.volume_path)?;
        let mut r = self.load(id)?;
        let wanted = req.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
        if wanted > r.capacity_bytes {
            r.capacity_bytes = wanted;
            self.save(&r)?;
        }
        if r.block {
            // The loop device learns its image's new size.
            for dev in loop_devices_of(&self.store.image_path(id))? {
                run(Command::new("losetup").arg("-c").arg(&dev))?;
            }
        }
        Ok(r.capacity_bytes)
    }
}

/// The CSI services over one [`Driver`].
#[derive(Clone, Debug)]
pub struct Services(pub Arc<Driver>);

fn call(method: &str, volume_id: &str) -> CsiCall {
    CsiCall { method: method.to_owned(), volume_id: volume_id.to_owned(), ..Default::default() }
}

#[tonic::async_trait]
impl Identity for Services {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        self.0.record_ok(call("GetPluginInfo", ""));
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.0.opts.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
        self.0.record_ok(call("GetPluginCapabilities", ""));
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![
                csi::PluginCapability {
                    r#type: Some(Type::Service(Service { r#type: service::Type::ControllerService.into() })),
                },
                csi::PluginCapability {
                    r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                        r#type: volume_expansion::Type::Online.into(),
                    })),
                },
            ],
        }))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        self.0.record_ok(call("Probe", ""));
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Controller for Services {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut c = with_capability(call("CreateVolume", ""), req.volume_capabilities.first());
        c.name.clone_from(&req.name);
        c.parameters = sorted(&req.parameters);
        c.required_bytes = req.capacity_range.as_ref().map_or(0, |r| r.required_bytes);
        self.0
            .call(c, move |d, mut c| {
                let volume = d.create_volume(&req)?;
                c.volume_id.clone_from(&volume.volume_id);
                c.capacity_bytes = volume.capacity_bytes;
                Ok((csi::CreateVolumeResponse { volume: Some(volume) }, c))
            })
            .await
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let req = request.into_inner();
        self.0
            .call(call("DeleteVolume", &req.volume_id), move |d, c| {
                d.delete_volume(&req.volume_id)?;
                Ok((csi::DeleteVolumeResponse {}, c))
            })
            .await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        let c = with_capability(call("ValidateVolumeCapabilities", &req.volume_id), req.volume_capabilities.first());
        self.0
            .call(c, move |d, c| {
                let id = checked_id(&req.volume_id)?;
                if req.volume_capabilities.is_empty() {
                    return Err(invalid("volume capabilities missing"));
                }
                let r = d.load(id)?;
                for cap in &req.volume_capabilities {
                    if is_block(Some(cap))? != r.block {
                        let message =
                            format!("volume {id} is not a {} volume", if r.block { "filesystem" } else { "block" });
                        return Ok((csi::ValidateVolumeCapabilitiesResponse { confirmed: None, message }, c));
                    }
                }
                let confirmed = csi::validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context.clone(),
                    volume_capabilities: req.volume_capabilities.clone(),
                    parameters: req.parameters.clone(),
                    mutable_parameters: HashMap::new(),
                };
                Ok((csi::ValidateVolumeCapabilitiesResponse { confirmed: Some(confirmed), message: String::new() }, c))
            })
            .await
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use csi::controller_service_capability::{Rpc, Type, rpc};
        self.0.record_ok(call("ControllerGetCapabilities", ""));
        let cap = |t: rpc::Type| csi::ControllerServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: t.into() })) };
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: vec![
                cap(rpc::Type::CreateDeleteVolume),
                cap(rpc::Type::PublishUnpublishVolume),
                cap(rpc::Type::ExpandVolume),
            ],
        }))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut c = with_capability(call("ControllerPublishVolume", &req.volume_id), req.volume_capability.as_ref());
        c.node_id.clone_from(&req.node_id);
        c.readonly = req.readonly;
        c.volume_context = sorted(&req.volume_context);
        self.0
            .call(c, move |d, mut c| {
                let publish_context = d.controller_publish(&req)?;
                c.publish_context = sorted(&publish_context);
                Ok((csi::ControllerPublishVolumeResponse { publish_context }, c))
            })
            .await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut c = call("ControllerUnpublishVolume", &req.volume_id);
        c.node_id.clone_from(&req.node_id);
        self.0
            .call(c, move |d, c| {
                d.controller_unpublish(&req)?;
                Ok((csi::ControllerUnpublishVolumeResponse {}, c))
            })
            .await
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut c = with_capability(call("ControllerExpandVolume", &req.volume_id), req.volume_capability.as_ref());
        c.required_bytes = req.capacity_range.as_ref().map_or(0, |r| r.required_bytes);
        self.0
            .call(c, move |d, mut c| {
                let r = d.expand(&req.volume_id, req.capacity_range.as_ref())?;
                c.capacity_bytes = r.capacity_bytes;
                Ok((
                    csi::ControllerExpandVolumeResponse {
                        capacity_bytes: r.capacity_bytes,
                        node_expansion_required: true,
                    },
                    c,
                ))
            })
            .await
    }
}

#[tonic::async_trait]
impl Node for Services {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut c = with_capability(call("NodeStageVolume", &req.volume_id), req.volume_capability.as_ref());
        c.staging_target_path.clone_from(&req.staging_target_path);
        c.volume_context = sorted(&req.volume_context);
        c.publish_context = sorted(&req.publish_context);
        self.0
            .call(c, move |d, c| {
                d.stage(&req)?;
                Ok((csi::NodeStageVolumeResponse {}, c))
            })
            .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut c = call("NodeUnstageVolume", &req.volume_id);
        c.staging_target_path.clone_from(&req.staging_target_path);
        self.0
            .call(c, move |d, c| {
                d.unstage(&req)?;
                Ok((csi::NodeUnstageVolumeResponse {}, c))
            })
            .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut c = with_capability(call("NodePublishVolume", &req.volume_id), req.volume_capability.as_ref());
        c.staging_target_path.clone_from(&req.staging_target_path);
        c.target_path.clone_from(&req.target_path);
        c.readonly = req.readonly;
        c.volume_context = sorted(&req.volume_context);
        c.publish_context = sorted(&req.publish_context);
        self.0
            .call(c, move |d, c| {
                d.publish(&req)?;
                Ok((csi::NodePublishVolumeResponse {}, c))
            })
            .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut c = call("NodeUnpublishVolume", &req.volume_id);
        c.target_path.clone_from(&req.target_path);
        self.0
            .call(c, move |d, c| {
                d.unpublish(&req)?;
                Ok((csi::NodeUnpublishVolumeResponse {}, c))
            })
            .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        let mut c = call("NodeGetVolumeStats", &req.volume_id);
        c.target_path.clone_from(&req.volume_path);
        c.staging_target_path.clone_from(&req.staging_target_path);
        self.0.call(c, move |d, c| Ok((d.stats(&req)?, c))).await
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut c = with_capability(call("NodeExpandVolume", &req.volume_id), req.volume_capability.as_ref());
        c.target_path.clone_from(&req.volume_path);
        c.staging_target_path.clone_from(&req.staging_target_path);
        c.required_bytes = req.capacity_range.as_ref().map_or(0, |r| r.required_bytes);
        self.0
            .call(c, move |d, mut c| {
                let capacity_bytes = d.node_expand(&req)?;
                c.capacity_bytes = capacity_bytes;
                Ok((csi::NodeExpandVolumeResponse { capacity_bytes }, c))
            })
            .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{Rpc, Type, rpc};
        self.0.record_ok(call("NodeGetCapabilities", ""));
        let cap = |t: rpc::Type| csi::NodeServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: t.into() })) };
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![
                cap(rpc::Type::StageUnstageVolume),
                cap(rpc::Type::GetVolumeStats),
                cap(rpc::Type::ExpandVolume),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        self.0.record_ok(call("NodeGetInfo", ""));
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.0.opts.node_id.clone(),
            max_volumes_per_node: self.0.opts.max_volumes_per_node,
            accessible_topology: None,
        }))
    }
}

/// The plugin registration API, as node-driver-registrar serves it for a CSI driver.
#[derive(Clone, Debug)]
struct Registrar(Arc<Driver>);

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<reg::InfoRequest>) -> Result<Response<reg::PluginInfo>, Status> {
        let opts = &self.0.opts;
        let endpoint = opts.registration_endpoint.clone().unwrap_or_else(|| opts.endpoint.display().to_string());
        self.0.record_ok(call("GetInfo", ""));
        Ok(Response::new(reg::PluginInfo {
            r#type: "CSIPlugin".into(),
            name: opts.name.clone(),
            endpoint,
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let mut c = call("NotifyRegistrationStatus", "");
        c.registered = status.plugin_registered;
        c.message.clone_from(&status.error);
        self.0.record_ok(c);
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// Binds a unix socket at `path` (a stale file there is removed first).
fn bind(path: &Path) -> Result<tokio::net::UnixListener> {
    anyhow::ensure!(
        path.as_os_str().len() < 108,
        "{} is longer than a unix socket's path may be (107 bytes)",
        path.display()
    );
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let _ = std::fs::remove_file(path);
    tokio::net::UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

/// One socket file from the next (a new file may get the inode of the one removed).
fn identity(path: &Path) -> Option<(u64, i64, i64)> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Serves the registration API on `socket`, and serves it anew whenever the socket file
/// is removed or replaced (an agent that wiped its plugin registry directory), until
/// `shutdown`.
async fn serve_registration(driver: Arc<Driver>, socket: PathBuf, shutdown: CancellationToken) -> Result<()> {
    loop {
        let listener = bind(&socket)?;
        let file = identity(&socket);
        eprintln!("csi-driver: registration API on {}", socket.display());
        let instance = shutdown.child_token();
        // The upstream kubelet dials this socket by its path, which grpc-go then sends as
        // the `:authority` that h2 refuses (see `crate::h2_authority`).
        let incoming = UnixListenerStream::new(listener).map(|conn| conn.map(crate::h2_authority::LocalAuthority::new));
        let server = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Registrar(driver.clone())))
            .serve_with_incoming_shutdown(incoming, instance.clone().cancelled_owned());
        let server = tokio::spawn(server);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => {
                    instance.cancel();
                    let _ = server.await;
                    if identity(&socket) == file {
                        let _ = std::fs::remove_file(&socket);
                    }
                    return Ok(());
                }
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            if identity(&socket) != file {
                eprintln!("csi-driver: {} went away; serving it again", socket.display());
                instance.cancel();
                let _ = server.await;
                break;
            }
        }
    }
}

/// Serves the driver (and the registration API, when asked) until `shutdown`; removes
/// its sockets then. Mounts and loop devices stay, as a real driver's do.
///
/// # Errors
/// A socket could not be bound.
pub async fn serve(opts: DriverOptions, shutdown: CancellationToken) -> Result<()> {
    std::fs::create_dir_all(&opts.state_dir).with_context(|| format!("creating {}", opts.state_dir.display()))?;
    let listener = bind(&opts.endpoint)?;
    let driver = Driver::new(opts.clone());
    let services = Services(driver.clone());
    let csi_server = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(services.clone()))
        .add_service(ControllerServer::new(services.clone()))
        .add_service(NodeServer::new(services))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown.clone().cancelled_owned());
    eprintln!("csi-driver: {} serving CSI on {}", opts.name, opts.endpoint.display());
    let registration = async {
        match opts.registration_socket() {
            Some(socket) => serve_registration(driver.clone(), socket, shutdown.clone()).await,
            None => Ok(()),
        }
    };
    let (served, registered) = tokio::join!(csi_server, registration);
    let _ = std::fs::remove_file(&opts.endpoint);
    served.context("serving CSI")?;
    registered
}

/// A gRPC channel to a driver's unix socket (for [`csi::identity_client`],
/// [`csi::controller_client`] and [`csi::node_client`]).
///
/// # Errors
/// The socket does not answer.
pub async fn connect(socket: &Path) -> Result<tonic::transport::Channel> {
    let path = socket.to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://csi.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { tokio::net::UnixStream::connect(path).await.map(hyper_util::rt::TokioIo::new) }
        }))
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    Ok(channel)
}

/// Reads a calls log (lines that do not parse are skipped: one may be half-written).
#[must_use]
pub fn read_calls(path: &Path) -> Vec<CsiCall> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_is_always_one_id_and_a_file_name() {
        let a = volume_id("pvc-1b4e28ba-2fa1-11d2-883f-0016d3cca427");
        assert_eq!(a, volume_id("pvc-1b4e28ba-2fa1-11d2-883f-0016d3cca427"));
        assert_ne!(a, volume_id("pvc-other"));
        assert!(a.starts_with("hp-") && a.len() == 23, "{a}");
        assert!(checked_id(&a).is_ok());
        for bad in ["", ".", "..", "a/b"] {
            assert_eq!(checked_id(bad).unwrap_err().code(), Code::InvalidArgument, "{bad:?}");
        }
    }

    /// What a pod-bound token says of itself, one line per audience; a token that is not
    /// one is refused with its audience named.
    #[test]
    fn token_lines_name_each_audience_pod_and_account() {
        use base64::Engine as _;
        let jwt = |claims: serde_json::Value| {
            let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
            format!("{}.{}.sig", b64(br#"{"alg":"RS256"}"#), b64(claims.to_string().as_bytes()))
        };
        let bound = |pod: &str| {
            jwt(serde_json::json!({"aud": ["x"], "kubernetes.io": {
                "namespace": "ns1", "pod": {"name": pod, "uid": "u"}, "serviceaccount": {"name": "default", "uid": "v"}
            }}))
        };
        let tokens = serde_json::json!({
            "vault": {"token": bound("web-0"), "expirationTimestamp": "2026-12-07T15:00:00Z"},
            "aws": {"token": bound("web-0"), "expirationTimestamp": "2026-12-07T15:00:00Z"},
        });
        assert_eq!(token_lines(&tokens.to_string()).unwrap(), "aws ns1/web-0 default\nvault ns1/web-0 default\n");
        assert_eq!(token_lines("{}").unwrap(), "");
        let unbound = serde_json::json!({"a": {"token": jwt(serde_json::json!({"sub": "x"}))}});
        assert!(format!("{:#}", token_lines(&unbound.to_string()).unwrap_err()).contains("a: no namespace"));
        let opaque = serde_json::json!({"a": {"token": "opaque"}});
        assert!(format!("{:#}", token_lines(&opaque.to_string()).unwrap_err()).contains("a: not a JWT"));
        assert!(token_lines("[]").is_err());
    }

    #[test]
    fn records_survive_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        let r = VolumeRecord {
            id: "hp-1".into(),
            name: "pvc-1".into(),
            capacity_bytes: 5 << 20,
            block: true,
            ephemeral: false,
            attached_to: vec!["n1".into()],
        };
        Store::new(dir.path()).save(&r).unwrap();
        let again = Store::new(dir.path());
        assert_eq!(again.load("hp-1").unwrap(), Some(r.clone()));
        assert_eq!(again.load("hp-2").unwrap(), None);
        assert_eq!(again.all(), vec![r]);
        again.remove("hp-1").unwrap();
        again.remove("hp-1").unwrap();
        assert_eq!(again.load("hp-1").unwrap(), None);
    }

    fn driver(dir: &Path) -> Arc<Driver> {
        Driver::new(DriverOptions {
            name: DEFAULT_NAME.into(),
            node_id: "n".into(),
            endpoint: dir.join("csi.sock"),
            state_dir: dir.join("state"),
            registration_dir: None,
            registration_endpoint: None,
            calls_log: None,
            max_volumes_per_node: 0,
        })
    }

    fn mount_cap() -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(
                csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume::default()),
            ),
            access_mode: None,
        }
    }

    fn block_cap() -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(
                csi::volume_capability::AccessType::Block(csi::volume_capability::BlockVolume::default()),
            ),
            access_mode: None,
        }
    }

    #[test]
    fn create_is_idempotent_by_name_and_delete_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let d = driver(dir.path());
        let req = csi::CreateVolumeRequest {
            name: "pvc-a".into(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 10 << 20, limit_bytes: 0 }),
            volume_capabilities: vec![mount_cap()],
            ..Default::default()
        };
        let v = d.create_volume(&req).unwrap();
        assert_eq!(v.capacity_bytes, 10 << 20);
        assert!(d.store.dir_path(&v.volume_id).is_dir());
        assert_eq!(d.create_volume(&req).unwrap().volume_id, v.volume_id);
        let bigger = csi::CreateVolumeRequest {
            capacity_range: Some(csi::CapacityRange { required_bytes: 20 << 20, limit_bytes: 0 }),
            ..req.clone()
        };
        assert_eq!(d.create_volume(&bigger).unwrap_err().code(), Code::AlreadyExists);
        let block = csi::CreateVolumeRequest { name: "pvc-b".into(), volume_capabilities: vec![block_cap()], ..req };
        let b = d.create_volume(&block).unwrap();
        let image = d.store.image_path(&b.volume_id);
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 10 << 20);
        // Sparse: the image holds no blocks yet.
        assert_eq!(std::fs::metadata(&image).unwrap().blocks(), 0);
        d.delete_volume(&v.volume_id).unwrap();
        d.delete_volume(&v.volume_id).unwrap();
        assert!(!d.store.dir_path(&v.volume_id).exists());
        assert_eq!(d.delete_volume("").unwrap_err().code(), Code::InvalidArgument);
    }

    #[test]
    fn expansion_grows_the_record_and_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let d = driver(dir.path());
        let v = d
            .create_volume(&csi::CreateVolumeRequest {
                name: "pvc-c".into(),
                capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 20, limit_bytes: 0 }),
                volume_capabilities: vec![block_cap()],
                ..Default::default()
            })
            .unwrap();
        let r = d.expand(&v.volume_id, Some(&csi::CapacityRange { required_bytes: 3 << 20, limit_bytes: 0 })).unwrap();
        assert_eq!(r.capacity_bytes, 3 << 20);
        assert_eq!(std::fs::metadata(d.store.image_path(&v.volume_id)).unwrap().len(), 3 << 20);
        assert_eq!(driver(dir.path()).load(&v.volume_id).unwrap().capacity_bytes, 3 << 20);
        assert_eq!(
            d.expand("hp-none", Some(&csi::CapacityRange { required_bytes: 1, limit_bytes: 0 })).unwrap_err().code(),
            Code::NotFound
        );
        assert_eq!(d.expand(&v.volume_id, None).unwrap_err().code(), Code::InvalidArgument);
    }

    #[test]
    fn an_attached_volume_is_staged_only_with_its_publish_context() {
        let dir = tempfile::tempdir().unwrap();
        let d = driver(dir.path());
        let v = d
            .create_volume(&csi::CreateVolumeRequest {
                name: "pvc-att".into(),
                volume_capabilities: vec![mount_cap()],
                ..Default::default()
            })
            .unwrap();
        let publish = csi::ControllerPublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            node_id: "n".into(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        };
        let context = d.controller_publish(&publish).unwrap();
        assert_eq!(context, HashMap::from([(ATTACHED_TO_KEY.to_owned(), "n".to_owned())]));
        // Idempotent; recorded once.
        d.controller_publish(&publish).unwrap();
        assert_eq!(d.load(&v.volume_id).unwrap().attached_to, ["n"]);
        let wrong = csi::ControllerPublishVolumeRequest { volume_capability: Some(block_cap()), ..publish.clone() };
        assert_eq!(d.controller_publish(&wrong).unwrap_err().code(), Code::InvalidArgument);
        let no_node = csi::ControllerPublishVolumeRequest { node_id: String::new(), ..publish };
        assert_eq!(d.controller_publish(&no_node).unwrap_err().code(), Code::InvalidArgument);

        // Staged without the context the attach gave: refused before anything is mounted.
        let stage = csi::NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: dir.path().join("staging").display().to_string(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        };
        assert_eq!(d.stage(&stage).unwrap_err().code(), Code::FailedPrecondition);
        let other = csi::NodeStageVolumeRequest {
            publish_context: HashMap::from([(ATTACHED_TO_KEY.to_owned(), "elsewhere".to_owned())]),
            ..stage
        };
        assert_eq!(d.stage(&other).unwrap_err().code(), Code::FailedPrecondition);
        assert!(!dir.path().join("staging").exists());

        let unpublish = csi::ControllerUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            node_id: "n".into(),
            ..Default::default()
        };
        d.controller_unpublish(&unpublish).unwrap();
        d.controller_unpublish(&unpublish).unwrap();
        assert!(d.load(&v.volume_id).unwrap().attached_to.is_empty());
        // A volume that is gone is detached already.
        let gone = csi::ControllerUnpublishVolumeRequest { volume_id: "hp-gone".into(), ..unpublish };
        d.controller_unpublish(&gone).unwrap();
    }

    #[test]
    fn missing_ids_paths_and_unknown_volumes_have_their_codes() {
        let dir = tempfile::tempdir().unwrap();
        let d = driver(dir.path());
        let stage = csi::NodeStageVolumeRequest {
            volume_id: "hp-x".into(),
            staging_target_path: "/nonexistent/staging".into(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        };
        assert_eq!(d.stage(&stage).unwrap_err().code(), Code::NotFound);
        let no_path = csi::NodeStageVolumeRequest { staging_target_path: String::new(), ..stage.clone() };
        assert_eq!(d.stage(&no_path).unwrap_err().code(), Code::InvalidArgument);
        let no_cap = csi::NodeStageVolumeRequest { volume_capability: None, ..stage };
        assert_eq!(d.stage(&no_cap).unwrap_err().code(), Code::InvalidArgument);
        let stats = csi::NodeGetVolumeStatsRequest {
            volume_id: "hp-x".into(),
            volume_path: "/nonexistent".into(),
            ..Default::default()
        };
        assert_eq!(d.stats(&stats).unwrap_err().code(), Code::NotFound);
        let publish = csi::NodePublishVolumeRequest {
            volume_id: "hp-x".into(),
            target_path: String::new(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        };
        assert_eq!(d.publish(&publish).unwrap_err().code(), Code::InvalidArgument);
    }

    #[test]
    fn ephemeral_volumes_are_told_by_their_context() {
        let mut ctx = HashMap::new();
        assert!(!is_ephemeral(&ctx));
        ctx.insert(EPHEMERAL_KEY.to_owned(), "true".to_owned());
        assert!(is_ephemeral(&ctx));
        assert_eq!(ephemeral_capacity(&ctx).unwrap(), DEFAULT_CAPACITY);
        ctx.insert(EPHEMERAL_SIZE_KEY.to_owned(), "5Mi".to_owned());
        assert_eq!(ephemeral_capacity(&ctx).unwrap(), 5 << 20);
        ctx.insert(EPHEMERAL_SIZE_KEY.to_owned(), "lots".to_owned());
        assert_eq!(ephemeral_capacity(&ctx).unwrap_err().code(), Code::InvalidArgument);
        ctx.insert(EPHEMERAL_KEY.to_owned(), "false".to_owned());
        assert!(!is_ephemeral(&ctx));
    }

    #[test]
    fn quantities_and_capacity_ranges() {
        assert_eq!(parse_quantity("1Gi"), Some(1 << 30));
        assert_eq!(parse_quantity("2k"), Some(2000));
        assert_eq!(parse_quantity("4096"), Some(4096));
        assert_eq!(parse_quantity("1.5Gi"), None);
        assert_eq!(requested_capacity(None).unwrap(), DEFAULT_CAPACITY);
        let r = |required_bytes, limit_bytes| csi::CapacityRange { required_bytes, limit_bytes };
        assert_eq!(requested_capacity(Some(&r(0, 7))).unwrap(), 7);
        assert_eq!(requested_capacity(Some(&r(5, 7))).unwrap(), 5);
        assert_eq!(requested_capacity(Some(&r(9, 7))).unwrap_err().code(), Code::OutOfRange);
    }

    #[test]
    fn mountinfo_lines_are_parsed_with_their_escapes() {
        let text = "27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
                    300 27 254:0 /tmp/s/hp-1 /var/lib/k\\040x/vol rw - ext4 /dev/vda rw\n\
                    301 24 0:6 /loop3 /var/lib/k/dev/p rw - devtmpfs devtmpfs rw\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].dev, (254, 0));
        assert_eq!(m[1].root, Path::new("/tmp/s/hp-1"));
        assert_eq!(m[1].mount_point, Path::new("/var/lib/k x/vol"));
        assert_eq!(m[2].fs_type, "devtmpfs");
        assert_eq!(m[2].root, Path::new("/loop3"));
    }

    #[test]
    fn losetup_j_lines_give_their_devices() {
        let out = "/dev/loop3: [65024]:1234 (/tmp/s/hp-1.img)\n/dev/loop7: [65024]:1234 (/tmp/s/hp-1.img)\n";
        assert_eq!(parse_losetup_j(out), vec![PathBuf::from("/dev/loop3"), PathBuf::from("/dev/loop7")]);
        assert!(parse_losetup_j("").is_empty());
    }

    #[test]
    fn calls_round_trip_through_json_lines() {
        let c = CsiCall { method: "NodePublishVolume".into(), readonly: true, ..Default::default() };
        let line = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<CsiCall>(&line).unwrap(), c);
        // Fields a line lacks stay empty.
        let short: CsiCall = serde_json::from_str(r#"{"method":"Probe"}"#).unwrap();
        assert_eq!(short.method, "Probe");
    }
}
