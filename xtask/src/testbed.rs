//! The containerd test bed: `up`, `down`, `status`, `check-clean` and `smoke`.
//!
//! Where things live:
//! - `/var/lib/swiftlet-testbed` (root): containerd's root (images, snapshots), its config
//!   `containerd.toml`, its log `containerd.log`, the CNI conflist (`cni/net.d`), host-local
//!   IPAM state (`cni/ipam`), pod logs of the smoke pod.
//!   The test registries (`registry`, see the `registry` module) and containerd's
//!   `hosts.toml` files for them (`certs.d`) are there too.
//! - `/run/swiftlet-testbed` (state): the socket `containerd.sock`, containerd's state,
//!   runc's root (`runc`), pod network namespaces
//!   (`containerd/io.containerd.grpc.v1.cri/netns/cni-*`), and `testbed.json`, the record
//!   `down` works from; `registry.json`, the registries' record.
//! - Outside them, unavoidably: the `swiftlet0` bridge, portmap's iptables chains, pod
//!   cgroups under `kubepods`, `/var/lib/cni/results`, shim sockets in `/run/containerd/s`.
//! - `<target>/xtask/images`: the image tarball cache (kept across `down`, like any build
//!   output), and `<target>/xtask/containerd-last.log`, the log of the last test bed.
//!
//! `up` records a [`Baseline`] of the host before it creates anything, and keeps that first
//! record across repeated `up`s (a second `up` would otherwise see the test bed's own
//! bridge as pre-existing). `down` removes only what is not in it. Without `testbed.json`,
//! `down` removes only what is unambiguously the test bed's (its processes, mounts under its
//! dirs, the dirs) and `check-clean` takes the strict view that nothing pre-existed.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::{
    Ctx, apt,
    cleanup::{self, Baseline},
    cluster,
    containerd::{self, CNI_NETWORK},
    cri::{self, CriClient},
    images::{self, BuiltImage},
    registry,
    upstream::Upstream,
};

/// The test bed's directories and every path derived from them.
#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
    pub state: PathBuf,
}

/// A command line written as one string, as its arguments (tests of telling our processes
/// from others by theirs).
#[cfg(test)]
pub fn argv(line: &str) -> Vec<String> {
    line.split(' ').map(str::to_owned).collect()
}

/// The swiftlet root dir that `cargo xtask demo` gives the agent.
pub const DEMO_ROOT: &str = "/var/lib/swiftlet-demo";

impl Layout {
    pub fn new(root: impl Into<PathBuf>, state: impl Into<PathBuf>) -> Self {
        Self { root: root.into(), state: state.into() }
    }

    /// A layout under `/x`, for tests of what points inside one.
    #[cfg(test)]
    pub fn under_x() -> Self {
        Self::new("/x/root", "/x/state")
    }

    pub fn standard() -> Self {
        Self::new("/var/lib/swiftlet-testbed", "/run/swiftlet-testbed")
    }

    pub fn socket(&self) -> PathBuf {
        self.state.join("containerd.sock")
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    pub fn containerd_config(&self) -> PathBuf {
        self.root.join("containerd.toml")
    }

    pub fn containerd_root(&self) -> PathBuf {
        self.root.join("containerd")
    }

    pub fn containerd_state(&self) -> PathBuf {
        self.state.join("containerd")
    }

    pub fn runc_root(&self) -> PathBuf {
        self.state.join("runc")
    }

    pub fn cni_conf_dir(&self) -> PathBuf {
        self.root.join("cni/net.d")
    }

    pub fn cni_ipam_dir(&self) -> PathBuf {
        self.root.join("cni/ipam")
    }

    pub fn pod_logs_dir(&self) -> PathBuf {
        self.root.join("pod-logs")
    }

    pub fn log_file(&self) -> PathBuf {
        self.root.join("containerd.log")
    }

    pub fn opt_dir(&self) -> PathBuf {
        self.root.join("opt")
    }

    pub fn state_file(&self) -> PathBuf {
        self.state.join("testbed.json")
    }

    /// The test registries' files (see `registry`).
    pub fn registry_dir(&self) -> PathBuf {
        self.root.join("registry")
    }

    /// containerd's registry `config_path`: one `<host:port>/hosts.toml` per registry.
    pub fn registry_hosts_dir(&self) -> PathBuf {
        self.root.join("certs.d")
    }

    /// `registry.json`, the test registries' record (endpoints, credentials, CA).
    pub fn registry_state_file(&self) -> PathBuf {
        self.state.join("registry.json")
    }

    pub fn dirs(&self) -> Vec<PathBuf> {
        vec![self.root.clone(), self.state.clone()]
    }
}

/// `testbed.json`: what `up` made and what `down` needs to undo it.
#[expect(clippy::struct_field_names, reason = "`state_dir` is the test bed's state directory, named as in the docs")]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// What tests pass as `--container-runtime-endpoint` / `SWIFTLET_CRI_ENDPOINT`.
    pub cri_endpoint: String,
    pub socket: PathBuf,
    /// `None` between recording the baseline and starting containerd.
    pub containerd_pid: Option<i32>,
    pub containerd_config: PathBuf,
    pub containerd_log: PathBuf,
    pub root_dir: PathBuf,
    pub state_dir: PathBuf,
    /// containerd's own description of itself, from CRI `Version`.
    #[serde(default)]
    pub runtime: String,
    /// Image name -> CRI image id.
    #[serde(default)]
    pub images: BTreeMap<String, String>,
    /// Directories other xtask commands created for use with this test bed (the demo's
    /// agent root dir); `down` unmounts and removes them too.
    #[serde(default)]
    pub extra_dirs: Vec<PathBuf>,
    pub baseline: Baseline,
}

impl State {
    pub fn new(layout: &Layout, baseline: Baseline) -> Self {
        Self {
            cri_endpoint: layout.endpoint(),
            socket: layout.socket(),
            containerd_pid: None,
            containerd_config: layout.containerd_config(),
            containerd_log: layout.log_file(),
            root_dir: layout.root.clone(),
            state_dir: layout.state.clone(),
            runtime: String::new(),
            images: BTreeMap::new(),
            extra_dirs: Vec::new(),
            baseline,
        }
    }

    pub fn load(layout: &Layout) -> Result<Option<Self>> {
        images::read_json(&layout.state_file())
    }

    pub fn save(&self, layout: &Layout) -> Result<()> {
        fs::create_dir_all(&layout.state).with_context(|| format!("creating {}", layout.state.display()))?;
        images::write_atomic(&layout.state_file(), &serde_json::to_vec_pretty(self)?)
    }
}

pub fn require_root() -> Result<()> {
    // SAFETY: geteuid cannot fail and has no side effects.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the test bed needs root (containerd, mounts, iptables, cgroups)");
    }
    Ok(())
}

/// Whether the recorded containerd is ours, alive and answering CRI.
async fn healthy(layout: &Layout, state: &State) -> bool {
    let Some(pid) = state.containerd_pid else {
        return false;
    };
    let ours = containerd::cmdline(pid).is_some_and(|a| containerd::is_our_containerd(&a, &layout.containerd_config()));
    if !ours || !containerd::is_alive(pid) {
        return false;
    }
    let probe = async {
        let mut c = CriClient::connect(&layout.socket()).await?;
        c.version().await
    };
    matches!(tokio::time::timeout(Duration::from_secs(10), probe).await, Ok(Ok(_)))
}

/// `testbed up`: see the module docs. Prints the CRI endpoint as the last line of stdout.
pub async fn up(ctx: &Ctx, layout: &Layout) -> Result<State> {
    require_root()?;
    apt::ensure(apt::PACKAGES)?;
    let built = images::build_all(&ctx.workspace, &images::cache_dir(ctx))?;

    let mut state = if let Some(state) = State::load(layout)? {
        state
    } else {
        // Before creating anything: this is what down must leave alone.
        let state = State::new(layout, Baseline::record());
        state.save(layout)?;
        state
    };

    if healthy(layout, &state).await {
        eprintln!(
            "test bed already up: containerd pid {} ({})",
            state.containerd_pid.unwrap_or_default(),
            state.runtime
        );
        if fs::read_to_string(layout.containerd_config()).ok() != Some(containerd::config_toml(layout)) {
            eprintln!(
                "warning: containerd runs with an older config than this xtask writes (e.g. without the \
                 registry config_path the test registries need); `testbed down` then `up` applies it"
            );
        }
    } else {
        // Never two containerds on one state: stop any leftover of ours first.
        for pid in containerd::find_processes(|a| containerd::is_our_containerd(a, &layout.containerd_config())) {
            eprintln!("stopping unhealthy test bed containerd pid {pid}");
            containerd::terminate(pid, Duration::from_secs(15))?;
        }
        containerd::write_config(layout)?;
        let pid = containerd::spawn(layout)?;
        state.containerd_pid = Some(pid);
        state.save(layout)?;
        eprintln!(
            "started containerd pid {pid}, config {}, log {}",
            layout.containerd_config().display(),
            layout.log_file().display()
        );
        state.runtime = containerd::wait_ready(layout, pid, Duration::from_mins(1)).await?;
        eprintln!("containerd answers CRI: {}", state.runtime);
    }

    let mut client = CriClient::connect(&layout.socket()).await?;
    for image in &built {
        ensure_image(&mut client, layout, image).await?;
        state.images.insert(image.name.clone(), image.image_id.clone());
    }
    state.save(layout)?;
    let copies = images::build_registry_copies(&ctx.workspace, &images::cache_dir(ctx))?;
    let registries = registry::up(layout, registry::Ports::default(), &copies)?;
    eprintln!(
        "test registries up: http://{} and https://{} ({})",
        registries.plain.endpoint,
        registries.tls.endpoint,
        layout.registry_state_file().display()
    );
    eprintln!("test bed up; state in {}", layout.state_file().display());
    println!("{}", state.cri_endpoint);
    Ok(state)
}

/// Imports `image` unless CRI already has exactly this build of it.
async fn ensure_image(client: &mut CriClient, layout: &Layout, image: &BuiltImage) -> Result<()> {
    if let Some(found) = client.image_status(&image.name).await?
        && found.id == image.image_id
    {
        eprintln!("image {}: present ({})", image.name, found.id);
        return Ok(());
    }
    images::import(&layout.socket(), image)?;
    // CRI learns about ctr imports asynchronously, from containerd's events: until then
    // it reports nothing, or the id of an earlier build under the same name.
    let mut seen = None;
    for _ in 0..50 {
        if let Some(found) = client.image_status(&image.name).await? {
            if found.id == image.image_id {
                eprintln!("image {}: imported ({})", image.name, found.id);
                return Ok(());
            }
            seen = Some(found.id);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    match seen {
        Some(id) => bail!("image {}: CRI reports id {id} but the import was {}", image.name, image.image_id),
        None => bail!("image {}: imported with ctr but CRI ImageStatus does not find it", image.name),
    }
}

/// Stops and removes every pod sandbox through CRI (which also removes their containers,
/// network namespaces and IPs).
async fn drain(layout: &Layout) -> Result<usize> {
    let mut client = CriClient::connect(&layout.socket()).await?;
    client.version().await?;
    let sandboxes = client.list_pod_sandboxes().await?;
    let mut errors = Vec::new();
    for sb in &sandboxes {
        let name = sb.metadata.as_ref().map_or_else(String::new, |m| format!(" ({}/{})", m.namespace, m.name));
        eprintln!("removing pod sandbox {}{name}", sb.id);
        if let Err(e) = client.stop_pod_sandbox(&sb.id).await {
            errors.push(format!("{e:#}"));
        }
        if let Err(e) = client.remove_pod_sandbox(&sb.id).await {
            errors.push(format!("{e:#}"));
        }
    }
    if !errors.is_empty() {
        bail!("draining pods: {}", errors.join("; "));
    }
    Ok(sandboxes.len())
}

/// Deletes containers runc still knows in our runc root (left when containerd died before
/// it could stop them): `runc delete --force` kills them and removes their cgroups.
fn delete_runc_leftovers(layout: &Layout) -> Result<()> {
    let Ok(namespaces) = fs::read_dir(layout.runc_root()) else {
        return Ok(());
    };
    for ns in namespaces.flatten() {
        let root = ns.path();
        let out =
            Command::new("runc").arg("--root").arg(&root).args(["list", "-q"]).output().context("running runc list")?;
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            eprintln!("runc delete --force {id}");
            let status = Command::new("runc")
                .arg("--root")
                .arg(&root)
                .args(["delete", "--force", id])
                .status()
                .context("running runc delete")?;
            if !status.success() {
                bail!("runc --root {} delete --force {id} failed", root.display());
            }
        }
    }
    Ok(())
}

/// Kills the shims of our containerd (matched by their `-address`), and removes the
/// sockets they leave in `/run/containerd/s`.
fn kill_shims(layout: &Layout) -> Result<()> {
    let socket = layout.socket();
    let address = socket.display().to_string();
    for pid in containerd::find_processes(|a| containerd::is_our_shim(a, &socket)) {
        let args = containerd::cmdline(pid).unwrap_or_default();
        eprintln!("killing shim pid {pid}: {}", args.join(" "));
        containerd::signal(pid, libc::SIGKILL);
        for _ in 0..100 {
            if !containerd::is_alive(pid) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let (Some(ns), Some(id)) = (containerd::shim_arg(&args, "-namespace"), containerd::shim_arg(&args, "-id")) {
            let sock = containerd::shim_socket_path(&address, ns, id);
            if sock.exists() {
                fs::remove_file(&sock).with_context(|| format!("removing {}", sock.display()))?;
            }
        }
    }
    Ok(())
}

/// Runs every cleanup step even when earlier ones fail, collecting the failures.
struct Steps(Vec<String>);

impl Steps {
    fn run(&mut self, what: &str, result: Result<()>) {
        if let Err(e) = result {
            eprintln!("down: {what} failed: {e:#}");
            self.0.push(format!("{what}: {e:#}"));
        }
    }
}

/// `testbed down`: see the module docs.
pub async fn down(ctx: &Ctx, layout: &Layout) -> Result<()> {
    require_root()?;
    let state = State::load(layout).unwrap_or_else(|e| {
        eprintln!("down: ignoring unreadable state: {e:#}");
        None
    });
    if state.is_none() {
        eprintln!("down: no {}; removing only what is unambiguously the test bed's", layout.state_file().display());
    }
    let mut steps = Steps(Vec::new());

    if layout.socket().exists() {
        match tokio::time::timeout(Duration::from_mins(5), drain(layout)).await {
            Ok(Ok(n)) => eprintln!("down: drained {n} pod sandbox(es)"),
            Ok(Err(e)) => eprintln!("down: could not drain pods through CRI: {e:#}"),
            Err(_) => eprintln!("down: draining pods timed out"),
        }
    }

    // The control plane first: its controllers must not act on a half-removed node.
    steps.run("stopping the control plane", cluster::down(layout, &Upstream::new(ctx).bin_dir));
    steps.run("stopping the bench's node containers", crate::nodectr::down_bench(layout));
    steps.run("stopping the node container", crate::nodectr::down(layout));

    let config = layout.containerd_config();
    let mut pids = containerd::find_processes(|a| containerd::is_our_containerd(a, &config));
    if let Some(pid) = state.as_ref().and_then(|s| s.containerd_pid)
        && !pids.contains(&pid)
        && containerd::cmdline(pid).is_some_and(|a| containerd::is_our_containerd(&a, &config))
    {
        pids.push(pid);
    }
    for pid in pids {
        eprintln!("down: stopping containerd pid {pid}");
        steps.run("stopping containerd", containerd::terminate(pid, Duration::from_secs(20)));
    }
    steps.run("deleting runc leftovers", delete_runc_leftovers(layout));
    steps.run("stopping registries", registry::stop(ctx, layout));
    steps.run("killing shims", kill_shims(layout));

    let mut dirs = layout.dirs();
    dirs.extend(state.iter().flat_map(|s| s.extra_dirs.clone()));
    steps.run("unmounting", cleanup::unmount_all_under(&dirs));

    if let Some(state) = &state {
        let b = &state.baseline;
        steps.run("removing network namespaces", cleanup::remove_new_netns(b));
        steps.run("removing iptables chains", cleanup::remove_new_chains(b));
        steps.run("removing bridge", cleanup::remove_bridge(b));
        steps.run("removing kubepods cgroups", cleanup::remove_new_kubepods(b));
        steps.run("removing CNI cache", cleanup::remove_cni_cache(b, CNI_NETWORK));
        steps.run("restoring ip_forward", cleanup::restore_ip_forward(b));
        if !b.run_containerd_existed {
            steps.run("removing /run/containerd", cleanup::remove_dir(Path::new(cleanup::RUN_CONTAINERD)));
        }
    }

    // Keep the last containerd log for post-mortems: the test bed dirs go away next.
    if layout.log_file().exists() {
        let keep = ctx.target_dir.join("xtask/containerd-last.log");
        if fs::create_dir_all(keep.parent().unwrap_or(Path::new("/"))).is_ok()
            && fs::copy(layout.log_file(), &keep).is_ok()
        {
            eprintln!("down: containerd log kept at {}", keep.display());
        }
    }
    for dir in &dirs {
        steps.run(&format!("removing {}", dir.display()), cleanup::remove_dir(dir));
    }

    let leftovers = check_clean(layout, &Upstream::new(ctx).bin_dir, state.as_ref());
    if !steps.0.is_empty() || !leftovers.is_empty() {
        for l in &leftovers {
            eprintln!("left behind: {l}");
        }
        // The failures themselves, not only their count: CI's summary shows this line alone.
        let mut what = steps.0.clone();
        what.extend(leftovers.iter().map(|l| format!("left behind: {l}")));
        bail!(
            "test bed down incomplete: {} step(s) failed, {} leftover(s): {}",
            steps.0.len(),
            leftovers.len(),
            what.join("; ")
        );
    }
    eprintln!("test bed down; host clean");
    Ok(())
}

/// Everything the test bed left on the host. Empty means clean. With no `state`, nothing
/// is assumed to have existed before (see the module docs).
pub fn check_clean(layout: &Layout, bin_dir: &Path, state: Option<&State>) -> Vec<String> {
    let mut left = Vec::new();
    let config = layout.containerd_config();
    for pid in containerd::find_processes(|a| containerd::is_our_containerd(a, &config)) {
        left.push(format!("containerd process {pid}"));
    }
    let socket = layout.socket();
    for pid in containerd::find_processes(|a| containerd::is_our_shim(a, &socket)) {
        left.push(format!("shim process {pid} serving {}", socket.display()));
    }
    left.extend(registry::leftovers(layout));
    left.extend(cluster::leftovers(layout, bin_dir));
    left.extend(crate::nodectr::leftovers(layout));
    left.extend(crate::nodectr::bench_leftovers(layout));

    let mut dirs = layout.dirs();
    match state {
        Some(s) => dirs.extend(s.extra_dirs.iter().cloned()),
        None => dirs.push(PathBuf::from(DEMO_ROOT)),
    }
    match cleanup::mounts() {
        Ok(m) => {
            for p in cleanup::mounts_under(&m, &dirs) {
                left.push(format!("mount {}", p.display()));
            }
            // The end-to-end tests' own: agents' volumes, loop filesystems.
            for p in m.iter().map(|m| &m.mount_point).filter(|p| is_e2e_temp(p)) {
                left.push(format!("end-to-end test mount {}", p.display()));
            }
        }
        Err(e) => left.push(format!("cannot read mounts: {e:#}")),
    }
    // The end-to-end tests' private containerds (tests/src/scratch.rs) and their shims.
    for pid in containerd::find_processes(|a| {
        a.first().is_some_and(|p| p.contains("containerd"))
            && a.windows(2).any(|w| (w[0] == "--config" || w[0] == "-address") && is_e2e_temp(Path::new(&w[1])))
    }) {
        left.push(format!("end-to-end test containerd or shim process {pid}"));
    }
    for d in dirs.iter().filter(|d| d.exists()) {
        left.push(format!("directory {}", d.display()));
    }

    let strict = Baseline::strict();
    let baseline = state.map_or(&strict, |s| &s.baseline);
    if !baseline.bridge_existed && cleanup::link_exists(containerd::BRIDGE) {
        left.push(format!("bridge {}", containerd::BRIDGE));
    }
    for ((cmd, table), chains) in cleanup::new_cni_chains(baseline) {
        for c in chains {
            left.push(format!("{cmd} -t {table} chain {c}"));
        }
    }
    for cg in cleanup::new_kubepods(baseline) {
        left.push(format!("cgroup {}", cg.display()));
    }
    for f in cleanup::our_cni_results(CNI_NETWORK) {
        left.push(format!("CNI result cache {}", f.display()));
    }
    // These three are shared, well-known places: judged only against a recorded baseline.
    if let Some(s) = state {
        for n in cleanup::new_cni_netns(&s.baseline) {
            left.push(format!("network namespace {}/{n}", cleanup::RUN_NETNS));
        }
        if !s.baseline.var_lib_cni_existed && Path::new(cleanup::VAR_LIB_CNI).exists() {
            left.push(format!("directory {}", cleanup::VAR_LIB_CNI));
        }
        if !s.baseline.run_containerd_existed && Path::new(cleanup::RUN_CONTAINERD).exists() {
            left.push(format!("directory {}", cleanup::RUN_CONTAINERD));
        }
    }
    left
}

/// Whether `path` is in a temporary directory of the end-to-end tests
/// (`<tmp>/swiftlet-e2e-*`).
fn is_e2e_temp(path: &Path) -> bool {
    path.strip_prefix(std::env::temp_dir())
        .ok()
        .and_then(|rest| rest.components().next())
        .is_some_and(|first| first.as_os_str().to_string_lossy().starts_with("swiftlet-e2e-"))
}

/// `testbed check-clean` on its own.
pub fn check_clean_cmd(ctx: &Ctx, layout: &Layout) -> Result<()> {
    let state = State::load(layout)?;
    let left = check_clean(layout, &Upstream::new(ctx).bin_dir, state.as_ref());
    if left.is_empty() {
        println!("clean: nothing of the test bed is left on this host");
        return Ok(());
    }
    for l in &left {
        println!("left behind: {l}");
    }
    bail!("{} thing(s) left behind by the test bed", left.len())
}

/// `testbed status`. Errors (exit 1) when the test bed is down.
pub async fn status(layout: &Layout) -> Result<()> {
    let Some(state) = State::load(layout)? else {
        println!("test bed: down (no {})", layout.state_file().display());
        bail!("test bed is down");
    };
    let pid = state.containerd_pid.unwrap_or_default();
    let alive = pid > 0 && containerd::is_alive(pid);
    println!("endpoint:   {}", state.cri_endpoint);
    println!("containerd: pid {pid} {}", if alive { "running" } else { "NOT running" });
    println!("log:        {}", state.containerd_log.display());
    if !alive {
        bail!("test bed is down (containerd not running)");
    }
    let probe = async {
        let mut c = CriClient::connect(&layout.socket()).await?;
        let v = c.version().await?;
        let sandboxes = c.list_pod_sandboxes().await?;
        let containers = c.list_containers().await?;
        anyhow::Ok((v, sandboxes, containers))
    };
    match tokio::time::timeout(Duration::from_secs(30), probe).await {
        Ok(Ok((v, sandboxes, containers))) => {
            println!("runtime:    {} {} (CRI {})", v.runtime_name, v.runtime_version, v.runtime_api_version);
            let ready = sandboxes.iter().filter(|s| s.state == 0).count();
            let running = containers.iter().filter(|c| c.state == cri::CONTAINER_RUNNING).count();
            println!("sandboxes:  {} ({ready} ready)", sandboxes.len());
            println!("containers: {} ({running} running)", containers.len());
            println!("test bed: up");
            Ok(())
        }
        Ok(Err(e)) => bail!("test bed is down: CRI does not answer: {e:#}"),
        Err(_) => bail!("test bed is down: CRI timed out"),
    }
}

/// `testbed smoke`: one CNI pod with a hostPort and a busybox httpd, checked from the host
/// through the pod IP and through the hostPort. Proves images, sandbox, CNI, portmap and
/// cgroups all work. Removes the pod afterwards unless `keep` (to exercise `down`).
pub async fn smoke(layout: &Layout, keep: bool) -> Result<()> {
    const HOST_PORT: i32 = 31_999;
    const MARKER: &str = "swiftlet-smoke-ok";
    let mut c = CriClient::connect(&layout.socket()).await?;
    let uid = format!("smoke-{}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis());
    let log_dir = layout.pod_logs_dir().join(&uid);
    fs::create_dir_all(&log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "smoke".into(),
            uid: uid.clone(),
            namespace: "xtask".into(),
            attempt: 0,
        }),
        hostname: "smoke".into(),
        log_directory: log_dir.display().to_string(),
        port_mappings: vec![cri::PortMapping {
            protocol: 0,
            container_port: 8080,
            host_port: HOST_PORT,
            host_ip: String::new(),
        }],
        labels: [("swiftlet.io/xtask".to_owned(), "smoke".to_owned())].into(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("/kubepods/besteffort/pod{uid}"),
            security_context: None,
        }),
    };
    // runc creates the cgroup parents but never removes them (that is the kubelet's job):
    // note which are new, to remove them with the pod and leave the agents under test a
    // `kubepods` tree as it was.
    let cgroup_levels = ["kubepods", "kubepods/besteffort"]
        .into_iter()
        .map(str::to_owned)
        .chain([format!("kubepods/besteffort/pod{uid}")]);
    let mut new_cgroups: Vec<PathBuf> = cleanup::cgroup_hierarchies()
        .iter()
        .flat_map(|h| cgroup_levels.clone().map(move |l| h.join(l)))
        .filter(|p| !p.exists())
        .collect();
    new_cgroups.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    let sandbox = c.run_pod_sandbox(sandbox_config.clone()).await?;
    eprintln!("smoke: sandbox {sandbox}");
    let container = c
        .create_container(
            &sandbox,
            cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata { name: "httpd".into(), attempt: 0 }),
                image: Some(cri::ImageSpec { image: images::BUSYBOX_IMAGE.into() }),
                command: vec!["sh".into(), "-c".into()],
                args: vec![format!(
                    "mkdir -p /www && echo {MARKER} > /www/index.html && exec httpd -f -p 8080 -h /www"
                )],
                mounts: Vec::new(),
                log_path: "httpd.log".into(),
            },
            sandbox_config,
        )
        .await?;
    c.start_container(&container).await?;
    let status = c.container_status(&container).await?;
    if status.state != cri::CONTAINER_RUNNING {
        bail!("smoke: container not running: {status:?}");
    }
    let ip = c.pod_sandbox_status(&sandbox).await?.network.map(|n| n.ip).unwrap_or_default();
    eprintln!("smoke: container {container} running, pod IP {ip}");
    if ip.is_empty() {
        bail!("smoke: sandbox has no IP: CNI did not run");
    }
    http_get_expect(&format!("{ip}:8080"), MARKER).await?;
    eprintln!("smoke: pod IP answers");
    http_get_expect(&format!("127.0.0.1:{HOST_PORT}"), MARKER).await?;
    eprintln!("smoke: hostPort {HOST_PORT} answers");
    if keep {
        eprintln!("smoke: leaving the pod running (--keep)");
    } else {
        c.stop_pod_sandbox(&sandbox).await?;
        c.remove_pod_sandbox(&sandbox).await?;
        for cg in &new_cgroups {
            fs::remove_dir(cg).with_context(|| format!("removing cgroup {}", cg.display()))?;
        }
        eprintln!("smoke: pod and its cgroups removed");
    }
    println!("smoke: ok");
    Ok(())
}

/// `GET /` over plain TCP, retrying while the server starts; fails unless the reply
/// contains `marker`.
async fn http_get_expect(addr: &str, marker: &str) -> Result<()> {
    let mut last = String::new();
    for _ in 0..50 {
        let attempt = async {
            let mut s = tokio::net::TcpStream::connect(addr).await?;
            s.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
            let mut reply = String::new();
            s.read_to_string(&mut reply).await?;
            anyhow::Ok(reply)
        };
        match tokio::time::timeout(Duration::from_secs(2), attempt).await {
            Ok(Ok(reply)) if reply.contains(marker) => return Ok(()),
            Ok(Ok(reply)) => last = format!("unexpected reply: {reply:?}"),
            Ok(Err(e)) => last = format!("{e:#}"),
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("smoke: http://{addr}/ did not answer: {last}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_file_round_trips() {
        let dir = std::env::temp_dir().join(format!("xtask-state-{}", std::process::id()));
        let layout = Layout::new(dir.join("root"), dir.join("state"));
        assert!(State::load(&layout).unwrap().is_none());

        let mut baseline = Baseline::strict();
        baseline.bridge_existed = true;
        baseline.cni_netns.insert("cni-1".into());
        let mut state = State::new(&layout, baseline);
        state.containerd_pid = Some(42);
        state.images.insert("localhost/pause:3.10".into(), "sha256:ab".into());
        state.save(&layout).unwrap();

        let loaded = State::load(&layout).unwrap().unwrap();
        assert_eq!(loaded, state);
        let json: serde_json::Value = serde_json::from_slice(&fs::read(layout.state_file()).unwrap()).unwrap();
        assert_eq!(json["cri_endpoint"], format!("unix://{}/state/containerd.sock", dir.display()));
        assert_eq!(json["containerd_pid"], 42);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn e2e_temp_dirs_are_recognised() {
        let tmp = std::env::temp_dir();
        assert!(is_e2e_temp(&tmp.join("swiftlet-e2e-loop-x1/mnt")));
        assert!(is_e2e_temp(&tmp.join("swiftlet-e2e-ctrd-x/containerd.sock")));
        assert!(!is_e2e_temp(&tmp.join("other/swiftlet-e2e-x")));
        assert!(!is_e2e_temp(Path::new("/var/lib/swiftlet-e2e-x")));
    }

    #[test]
    fn standard_layout_matches_the_documented_endpoint() {
        assert_eq!(Layout::standard().endpoint(), "unix:///run/swiftlet-testbed/containerd.sock");
    }
}
