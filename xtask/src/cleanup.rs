//! Finding and removing what a test bed leaves on the host outside containerd's own
//! bookkeeping: mounts, network namespaces, the CNI bridge, portmap's iptables chains,
//! pod cgroups, and the CNI result cache.
//!
//! Every remover takes the [`Baseline`] recorded before the first `up`, and removes only
//! what is not in it: the test bed never touches what it did not create.
//!
//! Facts learned on these machines:
//! - iptables is the `nf_tables` backend (`iptables v1.8.9 (nf_tables)`); `-S` output and
//!   `-D <chain> <rulenum>` behave as with the legacy backend. portmap rules carry quoted
//!   comments, so rules are deleted by number, never by re-parsing their text.
//! - cgroups are hybrid: v1 hierarchies under `/sys/fs/cgroup/*` (some co-mounted, e.g.
//!   `cpu,cpuacct`, reachable through symlinks) and cgroup2 at `/sys/fs/cgroup/unified`;
//!   runc creates `<parent>/<container id>` in every one of them and removes only that,
//!   so the pod-level parents (`kubepods/...`) stay behind.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::CString,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};

use crate::containerd::BRIDGE;

/// What existed before the test bed's first `up`: `down` leaves all of it alone.
#[expect(clippy::struct_excessive_bools, reason = "one independent fact per host object, not a state machine")]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    /// Whether the `swiftlet0` bridge existed.
    pub bridge_existed: bool,
    /// Chains named `CNI-*` per `"<command>/<table>"` (e.g. `"iptables/nat"`).
    pub iptables_chains: BTreeMap<String, BTreeSet<String>>,
    /// The `kubepods` cgroups that existed (one per hierarchy at most).
    pub kubepods: BTreeSet<PathBuf>,
    /// Entries of `/run/netns` named `cni-*`.
    pub cni_netns: BTreeSet<String>,
    pub run_netns_existed: bool,
    /// `/var/lib/cni`: libcni's result cache, which containerd 1.6 cannot relocate.
    pub var_lib_cni_existed: bool,
    /// `/run/containerd`: where 1.6 always puts shim sockets.
    pub run_containerd_existed: bool,
    /// `/proc/sys/net/ipv4/ip_forward` (the bridge plugin sets it to 1 for `isGateway`).
    pub ip_forward: Option<String>,
}

pub const RUN_NETNS: &str = "/run/netns";
pub const VAR_LIB_CNI: &str = "/var/lib/cni";
pub const RUN_CONTAINERD: &str = "/run/containerd";
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
/// The (command, table) pairs where CNI plugins create chains.
const IPTABLES_TABLES: [(&str, &str); 4] =
    [("iptables", "nat"), ("iptables", "filter"), ("ip6tables", "nat"), ("ip6tables", "filter")];

impl Baseline {
    /// Records the current state of the host.
    pub fn record() -> Self {
        let mut iptables_chains = BTreeMap::new();
        for (cmd, table) in IPTABLES_TABLES {
            if let Ok(chains) = cni_chains(cmd, table) {
                iptables_chains.insert(format!("{cmd}/{table}"), chains);
            }
        }
        Self {
            bridge_existed: link_exists(BRIDGE),
            iptables_chains,
            kubepods: kubepods_cgroups().into_iter().collect(),
            cni_netns: cni_netns(),
            run_netns_existed: Path::new(RUN_NETNS).exists(),
            var_lib_cni_existed: Path::new(VAR_LIB_CNI).exists(),
            run_containerd_existed: Path::new(RUN_CONTAINERD).exists(),
            ip_forward: fs::read_to_string(IP_FORWARD).ok().map(|s| s.trim().to_owned()),
        }
    }

    /// With no record at all (no state file), assume nothing of ours existed before: the
    /// strict view that `check-clean` takes after `down` has removed the state.
    pub fn strict() -> Self {
        Self::default()
    }
}

// ---------------------------------------------------------------------------------------
// mounts

/// One line of `/proc/self/mountinfo`, the fields the test bed needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..=i + 3].iter().all(|b| (b'0'..=b'7').contains(b)) {
            let v = bytes[i + 1..=i + 3].iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text (see proc(5)): `id parent major:minor root mount-point options
/// [optional fields...] - fstype source super-options`.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            Some(MountInfo {
                mount_point: PathBuf::from(unescape(fields.get(4)?)),
                fs_type: (*fields.get(sep + 1)?).to_owned(),
                source: unescape(fields.get(sep + 2)?),
            })
        })
        .collect()
}

pub fn mounts() -> Result<Vec<MountInfo>> {
    let text = fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(parse_mountinfo(&text))
}

/// Mount points at or under any of `dirs`, deepest first (children before parents), each
/// once even when stacked.
pub fn mounts_under(mounts: &[MountInfo], dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mounts
        .iter()
        .map(|m| m.mount_point.clone())
        .filter(|p| dirs.iter().any(|d| p.starts_with(d)))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// Lazily unmounts `path` (`MNT_DETACH`: busy mounts still leave the namespace).
pub fn umount(path: &Path) -> Result<()> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid NUL-terminated path; umount2 reads it only.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        // EINVAL: not a mount point (any more); ENOENT: gone. Both mean done.
        if !matches!(err.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) {
            return Err(err).with_context(|| format!("umount2({})", path.display()));
        }
    }
    Ok(())
}

/// Unmounts everything under `dirs`, deepest first, repeating for stacked mounts.
pub fn unmount_all_under(dirs: &[PathBuf]) -> Result<()> {
    for _ in 0..8 {
        let targets = mounts_under(&mounts()?, dirs);
        if targets.is_empty() {
            return Ok(());
        }
        for t in targets {
            eprintln!("umount {}", t.display());
            umount(&t)?;
        }
    }
    bail!("mounts remain under {dirs:?} after repeated unmounting")
}

/// Removes `dir` recursively, refusing while anything is mounted under it (removing files
/// through a live mount would delete the mounted filesystem's contents).
pub fn remove_dir(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let left = mounts_under(&mounts()?, &[dir.to_path_buf()]);
    if !left.is_empty() {
        bail!("not removing {}: still mounted: {left:?}", dir.display());
    }
    fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

// ---------------------------------------------------------------------------------------
// network namespaces

/// Names of `/run/netns/cni-*` entries (the namespaces containerd creates for pods).
pub fn cni_netns() -> BTreeSet<String> {
    fs::read_dir(RUN_NETNS)
        .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with("cni-")).collect())
        .unwrap_or_default()
}

pub fn new_cni_netns(baseline: &Baseline) -> Vec<String> {
    cni_netns().into_iter().filter(|n| !baseline.cni_netns.contains(n)).collect()
}

/// Removes the pod network namespaces created since the baseline (unmount, then unlink).
pub fn remove_new_netns(baseline: &Baseline) -> Result<()> {
    for name in new_cni_netns(baseline) {
        let path = Path::new(RUN_NETNS).join(&name);
        eprintln!("removing network namespace {}", path.display());
        umount(&path)?;
        fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    if !baseline.run_netns_existed {
        let dir = Path::new(RUN_NETNS);
        let is_mount = mounts()?.iter().any(|m| m.mount_point == dir);
        // Only an empty, unmounted directory: anything else belongs to someone else now.
        if dir.exists() && !is_mount && fs::read_dir(dir)?.next().is_none() {
            fs::remove_dir(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// bridge

pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

pub fn remove_bridge(baseline: &Baseline) -> Result<()> {
    if baseline.bridge_existed || !link_exists(BRIDGE) {
        return Ok(());
    }
    eprintln!("ip link del {BRIDGE}");
    let status =
        Command::new("ip").args(["link", "del", BRIDGE]).status().context("running ip (apt package iproute2)")?;
    if !status.success() {
        bail!("ip link del {BRIDGE} failed");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// iptables

/// Whether a chain name is one the CNI plugins we configure create.
pub fn is_cni_chain(name: &str) -> bool {
    name.starts_with("CNI-")
}

/// The `CNI-*` chains of a table. Errors when the command or table is unavailable.
pub fn cni_chains(cmd: &str, table: &str) -> Result<BTreeSet<String>> {
    Ok(parse_chains(&iptables_save(cmd, table)?).into_iter().filter(|c| is_cni_chain(c)).collect())
}

fn iptables_save(cmd: &str, table: &str) -> Result<String> {
    let out = Command::new(cmd).args(["-w", "-t", table, "-S"]).output().with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!("{cmd} -t {table} -S: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// User-defined chains in `iptables -S` output (`-N NAME` lines).
pub fn parse_chains(rules: &str) -> Vec<String> {
    rules.lines().filter_map(|l| l.strip_prefix("-N ")).map(|c| c.trim().to_owned()).collect()
}

/// `(chain, rule number)` of every rule whose target (`-j`/`-g`) is in `targets`, in
/// `iptables -S` output. Rule numbers are 1-based per chain, in listing order.
pub fn rules_jumping_to(rules: &str, targets: &BTreeSet<String>) -> Vec<(String, usize)> {
    let mut counters: BTreeMap<String, usize> = BTreeMap::new();
    let mut found = Vec::new();
    for line in rules.lines() {
        let Some(rest) = line.strip_prefix("-A ") else {
            continue;
        };
        let tokens: Vec<&str> = rest.split_whitespace().collect();
        let Some(chain) = tokens.first() else {
            continue;
        };
        let n = counters.entry((*chain).to_owned()).or_default();
        *n += 1;
        let jumps = tokens.windows(2).any(|w| (w[0] == "-j" || w[0] == "-g") && targets.contains(w[1]));
        if jumps {
            found.push(((*chain).to_owned(), *n));
        }
    }
    found
}

fn iptables(cmd: &str, table: &str, args: &[&str]) -> Result<()> {
    let status =
        Command::new(cmd).args(["-w", "-t", table]).args(args).status().with_context(|| format!("running {cmd}"))?;
    if !status.success() {
        bail!("{cmd} -t {table} {} failed", args.join(" "));
    }
    Ok(())
}

/// `CNI-*` chains present now but not in the baseline, per `"cmd/table"`.
pub fn new_cni_chains(baseline: &Baseline) -> BTreeMap<(&'static str, &'static str), BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for (cmd, table) in IPTABLES_TABLES {
        let Ok(now) = cni_chains(cmd, table) else {
            continue;
        };
        let before = baseline.iptables_chains.get(&format!("{cmd}/{table}"));
        let new: BTreeSet<String> = now.into_iter().filter(|c| before.is_none_or(|b| !b.contains(c))).collect();
        if !new.is_empty() {
            out.insert((cmd, table), new);
        }
    }
    out
}

/// Removes the chains portmap (and bridge) created since the baseline: first the rules in
/// other chains that jump to them, then their own rules, then the chains.
pub fn remove_new_chains(baseline: &Baseline) -> Result<()> {
    for ((cmd, table), chains) in new_cni_chains(baseline) {
        let rules = iptables_save(cmd, table)?;
        let mut refs: Vec<(String, usize)> =
            rules_jumping_to(&rules, &chains).into_iter().filter(|(chain, _)| !chains.contains(chain)).collect();
        // Delete from the highest number down so the remaining numbers stay valid.
        refs.sort_by_key(|r| std::cmp::Reverse(r.1));
        for (chain, n) in refs {
            eprintln!("{cmd} -t {table} -D {chain} {n}");
            iptables(cmd, table, &["-D", &chain, &n.to_string()])?;
        }
        for chain in &chains {
            iptables(cmd, table, &["-F", chain])?;
        }
        for chain in &chains {
            eprintln!("{cmd} -t {table} -X {chain}");
            iptables(cmd, table, &["-X", chain])?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// cgroups

/// Mount points of every cgroup hierarchy (v1 and v2) under `/sys/fs/cgroup`.
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let mut h: Vec<PathBuf> = mounts()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.fs_type == "cgroup" || m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with("/sys/fs/cgroup"))
        .collect();
    h.sort();
    h.dedup();
    h
}

/// The `kubepods` cgroup of every hierarchy where it exists.
pub fn kubepods_cgroups() -> Vec<PathBuf> {
    cgroup_hierarchies().into_iter().map(|h| h.join("kubepods")).filter(|p| p.is_dir()).collect()
}

pub fn new_kubepods(baseline: &Baseline) -> Vec<PathBuf> {
    kubepods_cgroups().into_iter().filter(|p| !baseline.kubepods.contains(p)).collect()
}

/// `root` and every cgroup directory below it, deepest first.
pub fn cgroup_tree(root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        if let Ok(entries) = fs::read_dir(&dirs[i]) {
            for e in entries.flatten() {
                // Cgroup directories are real directories; control files are not.
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(e.path());
                }
            }
        }
        i += 1;
    }
    dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    dirs
}

/// Removes the `kubepods` trees created since the baseline, depth-first. A cgroup that
/// still has processes fails with EBUSY and is reported.
pub fn remove_new_kubepods(baseline: &Baseline) -> Result<()> {
    let mut failed = Vec::new();
    for root in new_kubepods(baseline) {
        eprintln!("removing cgroup tree {}", root.display());
        for dir in cgroup_tree(&root) {
            if let Err(e) = fs::remove_dir(&dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                failed.push(format!("{}: {e}", dir.display()));
            }
        }
    }
    if !failed.is_empty() {
        bail!("could not remove cgroups: {}", failed.join("; "));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// CNI cache, ip_forward

/// Cached CNI results of our network: `/var/lib/cni/results/<network>-<id>-<ifname>`.
pub fn our_cni_results(network: &str) -> Vec<PathBuf> {
    let prefix = format!("{network}-");
    fs::read_dir(Path::new(VAR_LIB_CNI).join("results"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

pub fn remove_cni_cache(baseline: &Baseline, network: &str) -> Result<()> {
    if baseline.var_lib_cni_existed {
        for f in our_cni_results(network) {
            fs::remove_file(&f).with_context(|| format!("removing {}", f.display()))?;
        }
        Ok(())
    } else {
        remove_dir(Path::new(VAR_LIB_CNI))
    }
}

pub fn restore_ip_forward(baseline: &Baseline) -> Result<()> {
    if let Some(before) = &baseline.ip_forward {
        let now = fs::read_to_string(IP_FORWARD).unwrap_or_default();
        if now.trim() != before {
            eprintln!("restoring net.ipv4.ip_forward = {before}");
            fs::write(IP_FORWARD, before).context("writing ip_forward")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:26 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory
31 22 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw
40 22 0:50 / /var/lib/swiftlet-testbed/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs rw,relatime - overlay overlay rw,lowerdir=/a,upperdir=/b
41 22 0:51 / /run/swiftlet-testbed/containerd/io.containerd.grpc.v1.cri/sandboxes/abc/shm rw - tmpfs shm rw
42 22 0:4 net:[4026532] /run/netns/cni-1234 rw shared:5 - nsfs nsfs rw
43 22 0:52 / /var/lib/swiftlet-testbed/with\\040space rw - tmpfs tmpfs\\040x rw
44 40 0:53 / /var/lib/swiftlet-testbed/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs/proc rw - proc proc rw
";

    #[test]
    fn parses_mountinfo_including_escapes_and_optional_fields() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 8);
        assert_eq!(m[1].mount_point, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(m[1].fs_type, "cgroup");
        assert_eq!(m[5].fs_type, "nsfs");
        assert_eq!(m[6].mount_point, Path::new("/var/lib/swiftlet-testbed/with space"));
        assert_eq!(m[6].source, "tmpfs x");
        assert_eq!(m[3].fs_type, "overlay");
    }

    #[test]
    fn mounts_under_are_deepest_first_and_scoped() {
        let m = parse_mountinfo(MOUNTINFO);
        let found =
            mounts_under(&m, &[PathBuf::from("/var/lib/swiftlet-testbed"), PathBuf::from("/run/swiftlet-testbed")]);
        assert_eq!(found.len(), 4);
        assert!(found[0].ends_with("rootfs/proc"));
        assert!(found.iter().all(|p| !p.starts_with("/run/netns")));
        let rootfs = found.iter().position(|p| p.ends_with("rootfs")).unwrap();
        let proc_ = found.iter().position(|p| p.ends_with("proc")).unwrap();
        assert!(proc_ < rootfs);
        // A sibling with a common string prefix is not "under".
        assert!(mounts_under(&m, &[PathBuf::from("/var/lib/swiftlet")]).is_empty());
    }

    #[test]
    fn finds_rules_jumping_to_our_chains_by_number() {
        let rules = r#"-P PREROUTING ACCEPT
-P OUTPUT ACCEPT
-N CNI-HOSTPORT-DNAT
-N CNI-DN-abc
-N OTHER
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A PREROUTING -j OTHER
-A OUTPUT -j OTHER
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"swiftlet-testbed\" id: \"x\"" -m multiport --dports 8080 -j CNI-DN-abc
"#;
        let ours: BTreeSet<String> = ["CNI-HOSTPORT-DNAT", "CNI-DN-abc"].into_iter().map(String::from).collect();
        assert_eq!(parse_chains(rules), ["CNI-HOSTPORT-DNAT", "CNI-DN-abc", "OTHER"]);
        assert_eq!(
            rules_jumping_to(rules, &ours),
            [("PREROUTING".to_owned(), 1), ("OUTPUT".to_owned(), 2), ("CNI-HOSTPORT-DNAT".to_owned(), 1)]
        );
    }

    #[test]
    fn baseline_round_trips_through_json() {
        let mut b = Baseline::strict();
        b.bridge_existed = true;
        b.iptables_chains.insert("iptables/nat".into(), ["CNI-HOSTPORT-DNAT".to_owned()].into());
        b.kubepods.insert("/sys/fs/cgroup/memory/kubepods".into());
        b.ip_forward = Some("0".into());
        let json = serde_json::to_string(&b).unwrap();
        assert_eq!(serde_json::from_str::<Baseline>(&json).unwrap(), b);
    }

    #[test]
    fn cgroup_tree_lists_children_before_parents() {
        let dir = std::env::temp_dir().join(format!("xtask-cgtree-{}", std::process::id()));
        fs::create_dir_all(dir.join("kubepods/besteffort/podx/ctr")).unwrap();
        fs::write(dir.join("kubepods/cgroup.procs"), "").unwrap();
        let tree = cgroup_tree(&dir.join("kubepods"));
        assert_eq!(tree.len(), 4);
        assert!(tree[0].ends_with("ctr"));
        assert_eq!(tree[3], dir.join("kubepods"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
