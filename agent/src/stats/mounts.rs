//! The mount table, block devices and disk statistics, read the way cAdvisor reads them
//! (`fs/fs.go` `processMounts`/`GetFsInfoForPath`/`getDiskStatsMap`,
//! `machine.GetBlockDeviceInfo`, `container/common` `MachineInfoNamer`), plus the overlay
//! upper directory of a container's root mount (its writable layer).
//!
//! - [`parse_mountinfo`]: `/proc/<pid>/mountinfo` lines, octal escapes (`\040`) decoded.
//! - [`root_overlay_upperdir`]: the `upperdir=` of the overlay mounted at `/` in a
//!   container's mount namespace: containerd's overlayfs snapshot of the container, i.e.
//!   its writable layer, as a path of the host (containerd passes host paths to mount(2)).
//! - [`partitions`]: cAdvisor's "partitions": mounts of type `ext*`, `nfs*`, `btrfs`,
//!   `overlay`, `tmpfs`, `xfs`, `zfs`, one per source (bind mounts of a device are skipped,
//!   tmpfs mounts are all kept and named by their mount point, overlay mounts are named
//!   `<source>_<major>-<minor>`), plus the mount of `/` under its raw source. These are
//!   the `device` label values of the node's `container_fs_*` rows.
//! - [`parse_diskstats`]: `/proc/diskstats` rows of the devices cAdvisor keeps
//!   (`sd*`, `vd*`, `xvd*`, `dm-*`).
//! - [`block_devices`]: `/sys/block` disks (not `loop*`, `ram*`, `sr*`, nor hidden ones),
//!   named `/dev/<name>`: the names of the per-cgroup block I/O rows.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One line of a mountinfo file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Device major number of the filesystem.
    pub major: u32,
    /// Device minor number.
    pub minor: u32,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Filesystem type (`ext4`, `overlay`, ...).
    pub fs_type: String,
    /// Mount source (`/dev/vda1`, `tmpfs`, `overlay`).
    pub source: String,
    /// Per-superblock options (`rw,lowerdir=...,upperdir=...`), escapes kept.
    pub super_options: String,
}

/// Decodes the octal escapes of mountinfo fields (`\040` space, `\011` tab, `\012`
/// newline, `\134` backslash, `\054` comma in options).
#[must_use]
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            let v = (u32::from(bytes[i + 1] - b'0') << 6)
                | (u32::from(bytes[i + 2] - b'0') << 3)
                | u32::from(bytes[i + 3] - b'0');
            if let Ok(b) = u8::try_from(v) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses a mountinfo file; malformed lines are skipped.
#[must_use]
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_mountinfo_line).collect()
}

fn parse_mountinfo_line(line: &str) -> Option<Mount> {
    // id parent major:minor root mount-point options [optional...] - type source super
    let (head, tail) = line.split_once(" - ")?;
    let head: Vec<&str> = head.split(' ').collect();
    if head.len() < 6 {
        return None;
    }
    let (major, minor) = head[2].split_once(':')?;
    let mut tail = tail.splitn(3, ' ');
    let fs_type = tail.next()?;
    let source = tail.next()?;
    let super_options = tail.next().unwrap_or("");
    Some(Mount {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        mount_point: PathBuf::from(unescape(head[4])),
        fs_type: unescape(fs_type),
        source: unescape(source),
        super_options: super_options.to_owned(),
    })
}

/// The value of one option of a comma-separated option list (escapes decoded).
#[must_use]
pub fn option(options: &str, key: &str) -> Option<String> {
    options.split(',').find_map(|o| o.strip_prefix(key)?.strip_prefix('=')).map(unescape)
}

/// The writable layer of a container: `upperdir=` of the overlay mounted at `/` in its
/// mount namespace (the last such mount when several are stacked). `None` when the root
/// is not an overlay (another snapshotter) or names no upper directory (read-only).
#[must_use]
pub fn root_overlay_upperdir(mountinfo: &str) -> Option<PathBuf> {
    let root = parse_mountinfo(mountinfo).into_iter().rev().find(|m| m.mount_point == Path::new("/"))?;
    if root.fs_type != "overlay" {
        return None;
    }
    let upper = option(&root.super_options, "upperdir")?;
    let upper = PathBuf::from(upper);
    upper.is_absolute().then_some(upper)
}

/// A filesystem cAdvisor reports on (one `device` of the node's `container_fs_*` rows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// The `device` label: the mount source, the mount point for tmpfs,
    /// `<source>_<major>-<minor>` for overlay.
    pub device: String,
    /// Where it is mounted (statfs target).
    pub mount_point: PathBuf,
    /// Filesystem type.
    pub fs_type: String,
    /// Device major number.
    pub major: u32,
    /// Device minor number.
    pub minor: u32,
}

fn supported_fs_type(t: &str) -> bool {
    t.starts_with("ext") || t.starts_with("nfs") || matches!(t, "btrfs" | "overlay" | "tmpfs" | "xfs" | "zfs")
}

/// cAdvisor's partitions of a mount table (`processMounts` then `addSystemRootLabel`),
/// sorted by device.
#[must_use]
pub fn partitions(mounts: &[Mount]) -> Vec<Partition> {
    let mut by_device: HashMap<String, Partition> = HashMap::new();
    for m in mounts {
        if !supported_fs_type(&m.fs_type) {
            continue;
        }
        // A second mount of a source already seen is a bind mount (tmpfs excepted: every
        // tmpfs is its own filesystem).
        if by_device.contains_key(&m.source) && m.fs_type != "tmpfs" {
            continue;
        }
        let (mut major, mut minor) = (m.major, m.minor);
        // btrfs reports a wrong device number in mountinfo: take the mount point's.
        if m.fs_type == "btrfs"
            && major == 0
            && m.source.starts_with("/dev/")
            && let Ok(meta) = std::fs::metadata(&m.mount_point)
        {
            (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
        }
        let device = match m.fs_type.as_str() {
            "tmpfs" => m.mount_point.to_string_lossy().into_owned(),
            "overlay" => format!("{}_{major}-{minor}", m.source),
            _ => m.source.clone(),
        };
        by_device.insert(
            device.clone(),
            Partition { device, mount_point: m.mount_point.clone(), fs_type: m.fs_type.clone(), major, minor },
        );
    }
    // The root filesystem, under its raw source, whatever its type.
    if let Some(root) = mounts.iter().find(|m| m.mount_point == Path::new("/")) {
        by_device.insert(
            root.source.clone(),
            Partition {
                device: root.source.clone(),
                mount_point: root.mount_point.clone(),
                fs_type: root.fs_type.clone(),
                major: root.major,
                minor: root.minor,
            },
        );
    }
    let mut out: Vec<Partition> = by_device.into_values().collect();
    out.sort_by(|a, b| a.device.cmp(&b.device));
    out
}

/// One row of `/proc/diskstats` (times in milliseconds, as the kernel counts them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Device major number.
    pub major: u32,
    /// Device minor number.
    pub minor: u32,
    /// Reads completed.
    pub reads_completed: u64,
    /// Reads merged.
    pub reads_merged: u64,
    /// Sectors read.
    pub sectors_read: u64,
    /// Milliseconds spent reading.
    pub read_time_ms: u64,
    /// Writes completed.
    pub writes_completed: u64,
    /// Writes merged.
    pub writes_merged: u64,
    /// Sectors written.
    pub sectors_written: u64,
    /// Milliseconds spent writing.
    pub write_time_ms: u64,
    /// I/Os in progress.
    pub io_in_progress: u64,
    /// Milliseconds spent doing I/Os.
    pub io_time_ms: u64,
    /// Weighted milliseconds spent doing I/Os.
    pub weighted_io_time_ms: u64,
}

/// Whether cAdvisor keeps a diskstats device: `^(?:(?:s|v|xv)d[a-z]+\d*|dm-\d+)$`.
fn kept_disk_name(name: &str) -> bool {
    if let Some(n) = name.strip_prefix("dm-") {
        return !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    }
    let Some(rest) = ["sd", "vd", "xvd"].iter().find_map(|p| name.strip_prefix(p)) else { return false };
    let letters = rest.bytes().take_while(u8::is_ascii_lowercase).count();
    letters > 0 && rest.bytes().skip(letters).all(|b| b.is_ascii_digit())
}

/// `/proc/diskstats` by device name (`/dev/<name>`), for the devices cAdvisor keeps.
/// Lines with fewer than 11 counters are skipped.
#[must_use]
pub fn parse_diskstats(text: &str) -> HashMap<String, DiskStats> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_ascii_whitespace().collect();
        if f.len() < 14 || !kept_disk_name(f[2]) {
            continue;
        }
        let n: Vec<u64> = f[3..14].iter().map(|v| v.parse().unwrap_or(0)).collect();
        let (Ok(major), Ok(minor)) = (f[0].parse(), f[1].parse()) else { continue };
        out.insert(
            format!("/dev/{}", f[2]),
            DiskStats {
                major,
                minor,
                reads_completed: n[0],
                reads_merged: n[1],
                sectors_read: n[2],
                read_time_ms: n[3],
                writes_completed: n[4],
                writes_merged: n[5],
                sectors_written: n[6],
                write_time_ms: n[7],
                io_in_progress: n[8],
                io_time_ms: n[9],
                weighted_io_time_ms: n[10],
            },
        );
    }
    out
}

/// The disk statistics of a partition: by device name, else by device number.
#[must_use]
pub fn disk_stats_of<'a, S: std::hash::BuildHasher>(
    stats: &'a HashMap<String, DiskStats, S>,
    p: &Partition,
) -> Option<&'a DiskStats> {
    stats.get(&p.device).or_else(|| stats.values().find(|d| d.major == p.major && d.minor == p.minor))
}

/// Disks of `/sys/block` by device number, named `/dev/<name>` (cAdvisor's `DiskMap`):
/// `loop*`, `ram*` and `sr*` are left out, and so are hidden devices (`NVMe` paths).
#[must_use]
pub fn block_devices(sys_block: &Path) -> HashMap<(u32, u32), String> {
    let mut out = HashMap::new();
    let Ok(entries) = std::fs::read_dir(sys_block) else { return out };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if ["loop", "ram", "sr"].iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let dir = e.path();
        if std::fs::read_to_string(dir.join("hidden")).is_ok_and(|h| h.trim() == "1") {
            continue;
        }
        let Ok(dev) = std::fs::read_to_string(dir.join("dev")) else { continue };
        let Some((major, minor)) = dev.trim().split_once(':') else { continue };
        if let (Ok(major), Ok(minor)) = (major.parse(), minor.parse()) {
            out.insert((major, minor), format!("/dev/{name}"));
        }
    }
    out
}
