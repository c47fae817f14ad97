//! What the node is: CPUs, memory, disk, kernel, OS image, ids and addresses, read from
//! the host the way the kubelet (cAdvisor) reads them. Pure parsers are separated from
//! the file reads so they are tested on fixtures.

use std::net::IpAddr;
use std::path::Path;

/// Facts about the machine for the Node object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineFacts {
    pub cpus: u64,
    pub memory_bytes: u64,
    /// Size of the filesystem holding the root dir (`ephemeral-storage` capacity).
    pub ephemeral_storage_bytes: u64,
    pub kernel_version: String,
    pub os_image: String,
    pub boot_id: String,
    pub machine_id: String,
    pub system_uuid: String,
    /// Kubernetes architecture name (`amd64`, `arm64`, ...).
    pub architecture: String,
    /// Huge pages: page size in bytes → bytes preallocated (`/sys/kernel/mm/hugepages`).
    pub hugepages: std::collections::BTreeMap<u64, u64>,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
#[must_use]
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemTotal:")?;
        let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kib * 1024)
    })
}

/// `PRETTY_NAME` of an os-release file.
#[must_use]
pub fn parse_os_release(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix("PRETTY_NAME=")?;
        Some(v.trim_matches('"').to_string())
    })
}

/// Maps Rust's architecture names to Kubernetes' (`GOARCH`).
#[must_use]
pub fn kube_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn statvfs_size(path: &Path) -> u64 {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return 0 };
    let mut st: libc::statvfs = unsafe_zeroed();
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &raw mut st) };
    if rc != 0 {
        return 0;
    }
    st.f_blocks * st.f_frsize
}

fn unsafe_zeroed() -> libc::statvfs {
    // SAFETY: statvfs is a plain C struct of integers; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

impl MachineFacts {
    /// Reads the facts of this machine; `root_dir` decides which filesystem counts as
    /// ephemeral storage (it is created if missing).
    #[must_use]
    pub fn detect(root_dir: &Path) -> Self {
        let _ = std::fs::create_dir_all(root_dir);
        Self {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
            memory_bytes: parse_mem_total(&read("/proc/meminfo")).unwrap_or(0),
            ephemeral_storage_bytes: statvfs_size(root_dir),
            kernel_version: read("/proc/sys/kernel/osrelease"),
            os_image: parse_os_release(&read("/etc/os-release")).unwrap_or_else(|| "Linux".into()),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            machine_id: read("/etc/machine-id"),
            system_uuid: read("/sys/class/dmi/id/product_uuid").to_lowercase(),
            architecture: kube_arch(std::env::consts::ARCH).to_string(),
            hugepages: crate::cm::resources::host_hugepages(Path::new("/sys/kernel/mm/hugepages")),
        }
    }
}

/// The node's `InternalIP` when `--node-ip` is not given: the source address the host would
/// use to reach the outside (found with a UDP "connect", which sends nothing).
#[must_use]
pub fn default_node_ip() -> Option<IpAddr> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    // 192.0.2.1 is TEST-NET-1: connect() on UDP only picks a route, no packet leaves.
    sock.connect("192.0.2.1:9").ok()?;
    let ip = sock.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers() {
        assert_eq!(parse_mem_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"), Some(24_576_000 * 1024));
        assert_eq!(parse_mem_total("nothing"), None);
        assert_eq!(
            parse_os_release("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n").as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(kube_arch("x86_64"), "amd64");
        assert_eq!(kube_arch("aarch64"), "arm64");
    }

    #[test]
    fn detects_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        let f = MachineFacts::detect(dir.path());
        assert!(f.cpus >= 1);
        assert!(f.memory_bytes > 0);
        assert!(f.ephemeral_storage_bytes > 0);
        assert!(!f.kernel_version.is_empty());
    }
}
