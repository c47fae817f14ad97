//! `cargo xtask conformance`: the Kubernetes e2e suite's node conformance tests against a
//! swiftlet node and against an upstream kubelet node, side by side.
//!
//! The suite is upstream's own, built from the Go modules (`upstream/go.mod`) by
//! `Upstream::build_e2e`: `e2e.test` (package `k8s.io/kubernetes/test/e2e` v1.37.2), the
//! `ginkgo` runner and agnhost. Its images are built here and served by the test bed's
//! plain registry ([`images`]). For each agent in turn the agent joins the test bed's
//! real control plane as the cluster's one node (schedulable: no bench taint), the suite
//! runs against the cluster as its admin, and the agent and its node are removed.
//!
//! Selected by default: `[NodeConformance]` and sig-node's `[Conformance]` specs (427 of
//! the suite's 3,206 in v1.37.2), less [`SKIPPED`], each with the reason one machine cannot
//! run it. `--focus` and `--skip` narrow that. Outputs in `target/conformance/`:
//! `<agent>/report.json` (ginkgo), `<agent>/junit.xml`, `<agent>/e2e.log`, the agent's
//! log, and `report.md`, the side-by-side table (also printed). The run fails when a spec
//! passes on the upstream kubelet and not on swiftlet.

mod busybox;
mod images;
mod report;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};

use crate::{
    Ctx,
    bench::{
        self,
        agent::{self, BenchAgent, PlegMode},
        apiserver::ApiServer,
        cluster::Cluster,
    },
    cri::CriClient,
    registry, testbed,
    testbed::Layout,
    upstream::Upstream,
};

/// The specs run by default: the node conformance tests and sig-node's conformance tests.
pub const DEFAULT_FOCUS: &str = r"\[NodeConformance\]|\[sig-node\].*\[Conformance\]";

/// The specs never run here, each with the reason (a ginkgo skip regex each).
pub const SKIPPED: &[(&str, &str)] = &[(
    r"\[Disruptive\]",
    "restarts or breaks the node's agent or runtime mid-run; the harness's one node and its test bed's \
     containerd are shared with the run itself",
)];

/// The subset CI runs (`--ci`): each entry is a substring of one spec's text. Chosen to
/// cover probes, lifecycle hooks (sidecars' too), the configMap, secret, downwardAPI,
/// projected and emptyDir volumes, environment variables and `/etc/hosts`, security
/// contexts, init containers and the container runtime's behaviour, from the specs that
/// pass on the upstream kubelet here and take seconds, not minutes (no `[Slow]`), and one
/// spec on each of the images built here besides agnhost and busybox (nonroot,
/// nonewprivs, glibc-dns-testing).
pub const CI_SPECS: &[&str] = &[
    "Probing container should be restarted with a exec \"cat /tmp/health\" liveness probe",
    "Probing container should be restarted startup probe fails",
    "Probing container with readiness probe should not be ready before initial delay and never restart",
    "[sig-node] Container Lifecycle Hook when create a pod with lifecycle hook should execute poststart exec hook properly",
    "[sig-node] Container Lifecycle Hook when create a pod with lifecycle hook should execute prestop http hook properly",
    "Restartable Init Container Lifecycle Hook when create a pod with lifecycle hook should execute poststart http hook properly",
    "[sig-storage] ConfigMap should be consumable from pods in volume with mappings and Item mode set",
    "[sig-storage] ConfigMap updates should be reflected in volume",
    "[sig-storage] Secrets should be consumable from pods in volume with defaultMode set",
    "[sig-storage] Downward API volume should update labels on modification",
    "[sig-storage] Projected combined should project all components that make up the projection API",
    "[sig-storage] EmptyDir volumes should support (non-root,0666,tmpfs)",
    "[sig-storage] EmptyDir volumes when FSGroup is specified [LinuxOnly] new files should be created with FSGroup ownership when container is non-root",
    "[sig-node] Variable Expansion should allow composing env vars into new env vars",
    "[sig-node] Downward API should provide pod name, namespace and IP address as env vars",
    // `envFrom` with a prefix, and names that are not shell names (`data-1`): busybox's
    // `sh` must pass them on to `env`.
    "[sig-node] ConfigMap should be consumable via the environment",
    "[sig-node] Secrets should be consumable from pods in env vars",
    "[sig-node] KubeletManagedEtcHosts should test kubelet managed /etc/hosts file",
    "[sig-node] Security Context When creating a container with runAsUser should run the container with uid 65534",
    "[sig-node] Security Context When creating a container with runAsNonRoot should run with an explicit non-root user ID",
    "[sig-node] Security Context When creating a pod with readOnlyRootFilesystem should run the container with writable rootfs when readOnlyRootFilesystem=false",
    "[sig-node] InitContainer should invoke init containers on a RestartAlways pod",
    "[sig-node] InitContainer should not start app containers if init containers fail on a RestartAlways pod",
    "[sig-node] Container Runtime blackbox test on terminated container should report termination message if TerminationMessagePath is set [NodeConformance]",
    "[sig-node] Container Runtime blackbox test when starting a container that exits should run with the expected status",
    "[sig-node] Downward API should provide host IP and pod IP as an env var if pod uses host network",
    "RestartAllContainers should restart all containers on regular container exit",
    "[sig-node] Security Context When creating a container with runAsNonRoot should run with an image specified user ID",
    "[sig-node] Security Context when creating containers with AllowPrivilegeEscalation should not allow privilege escalation when false",
    "[sig-node] Override hostname of Pod a pod with only hostnameOverride field will have hostnameOverride as hostname",
    "[sig-node] Container Runtime blackbox test on terminated container should report termination message from log output if TerminationMessagePolicy FallbackToLogsOnError is set",
    "burstable pods - pod-level resources pod-level resize with requests and limits add",
];

#[derive(Debug, Clone, clap::Args)]
pub struct ConformanceArgs {
    /// Run only the specs matching this regex (within the default selection).
    #[arg(long)]
    pub focus: Option<String>,
    /// Also skip the specs matching this regex.
    #[arg(long)]
    pub skip: Option<String>,
    /// The agents to run the suite on, in this order (default: swiftlet, then upstream).
    #[arg(long = "agent", value_enum)]
    pub agents: Vec<AgentKind>,
    /// Parallel ginkgo processes (default 1; 2 with `--ci`).
    #[arg(long)]
    pub procs: Option<u32>,
    /// The fixed subset CI runs ([`CI_SPECS`]), on swiftlet unless `--agent` says
    /// otherwise: every one of them must pass.
    #[arg(long, conflicts_with_all = ["focus", "list"])]
    pub ci: bool,
    /// Print the selected specs and stop (no cluster, no agent).
    #[arg(long)]
    pub list: bool,
    /// The swiftlet binary (default: a debug build of the workspace's).
    #[arg(long)]
    pub swiftlet_bin: Option<PathBuf>,
    /// Leave the test bed up at the end even if it was down before.
    #[arg(long)]
    pub keep_testbed: bool,
}

/// An agent the suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentKind {
    Swiftlet,
    Upstream,
}

impl AgentKind {
    fn name(self) -> &'static str {
        match self {
            Self::Swiftlet => "swiftlet",
            Self::Upstream => "kubelet",
        }
    }
}

pub async fn run(ctx: &Ctx, layout: &Layout, args: &ConformanceArgs) -> Result<()> {
    let upstream = Upstream::new(ctx);
    upstream.build()?;
    upstream.build_e2e()?;
    let focus = selection_focus(&upstream, args)?;
    if args.list {
        return list(&upstream, args, &focus);
    }
    testbed::require_root()?;
    let _lock = bench::testbed_lock(layout)?;
    let bed_was_up = bench::bed_was_up(layout);
    let started = Instant::now();
    let outcome = conformance(ctx, layout, &upstream, args, &focus).await;
    eprintln!("conformance: took {:.1} min", started.elapsed().as_secs_f64() / 60.0);
    bench::finish(ctx, layout, bed_was_up || args.keep_testbed, outcome, Ok(()), Ok(())).await
}

/// `--ginkgo.skip`: [`SKIPPED`] and `--skip`.
fn skip_regex(args: &ConformanceArgs) -> String {
    SKIPPED.iter().map(|(re, _)| *re).chain(args.skip.as_deref()).collect::<Vec<_>>().join("|")
}

/// `--ginkgo.focus` for the run: the CI subset, the default selection, or with `--focus`
/// the default selection's specs whose text the `--focus` regex matches. Ginkgo ORs its
/// focus regexes and RE2 has no lookahead, so the narrowing is done here: a dry run
/// lists the selection, and the focus names the chosen specs literally.
fn selection_focus(upstream: &Upstream, args: &ConformanceArgs) -> Result<String> {
    if args.ci {
        return Ok(literal_alternatives(CI_SPECS.iter().copied()));
    }
    let Some(focus) = &args.focus else { return Ok(DEFAULT_FOCUS.to_owned()) };
    let user = regex::Regex::new(focus).with_context(|| format!("--focus {focus:?} is not a regex"))?;
    let selected = dry_run(upstream, DEFAULT_FOCUS, &skip_regex(args))?;
    let picked = narrow(&selected, &user);
    ensure!(!picked.is_empty(), "--focus {focus:?} matches none of the {} selected specs", selected.len());
    Ok(literal_alternatives(picked.into_iter()))
}

/// The specs of `selected` whose text `focus` matches.
fn narrow<'a>(selected: &'a [String], focus: &regex::Regex) -> Vec<&'a str> {
    selected.iter().filter(|name| focus.is_match(name)).map(String::as_str).collect()
}

/// A regex matching any of `texts` read literally.
fn literal_alternatives<'a>(texts: impl Iterator<Item = &'a str>) -> String {
    texts.map(regex::escape).collect::<Vec<_>>().join("|")
}

/// The texts of the specs `focus` and `skip` select, from a dry run of the suite.
fn dry_run(upstream: &Upstream, focus: &str, skip: &str) -> Result<Vec<String>> {
    let dir = std::env::temp_dir().join(format!("swiftlet-conformance-list-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let json = dir.join("report.json");
    let status = Command::new(upstream.e2e_bin("e2e.test"))
        .arg("--ginkgo.dry-run")
        .arg(format!("--ginkgo.focus={focus}"))
        .arg(format!("--ginkgo.skip={skip}"))
        .arg(format!("--ginkgo.json-report={}", json.display()))
        .arg("--ginkgo.no-color")
        .stdout(Stdio::null())
        .status()
        .context("running e2e.test --ginkgo.dry-run")?;
    ensure!(status.success(), "e2e.test --ginkgo.dry-run failed ({status})");
    let specs = report::outcomes(&fs::read_to_string(&json)?)?;
    fs::remove_dir_all(&dir).ok();
    Ok(specs.into_keys().collect())
}

fn list(upstream: &Upstream, args: &ConformanceArgs, focus: &str) -> Result<()> {
    let specs = dry_run(upstream, focus, &skip_regex(args))?;
    for name in &specs {
        println!("{name}");
    }
    eprintln!("conformance: {} spec(s) selected", specs.len());
    for (re, why) in SKIPPED {
        eprintln!("conformance: skipped {re}: {why}");
    }
    Ok(())
}

async fn conformance(
    ctx: &Ctx,
    layout: &Layout,
    upstream: &Upstream,
    args: &ConformanceArgs,
    focus: &str,
) -> Result<()> {
    testbed::up(ctx, layout).await.context("bringing the test bed up")?;
    let api = ApiServer::up(ctx, layout)?;
    let cluster_state = crate::cluster::State::load(layout)?.context("the test bed's control plane has no record")?;
    let registry = registry::State::load(layout)?.context("the test bed's registries are not up")?;
    let out = ctx.target_dir.join("conformance");
    fs::create_dir_all(&out)?;

    eprintln!("==> conformance: the suite's images");
    let built = images::build(upstream, &ctx.workspace, &crate::images::cache_dir(ctx))?;
    for (path, image) in &built {
        registry::push_plain(&registry, image, path)?;
    }
    let repo_list = out.join("repo-list.yaml");
    fs::write(&repo_list, images::repo_list(&registry.plain.endpoint))?;
    let mut cri = CriClient::connect(&layout.socket()).await?;
    drop_stale_images(&mut cri, &registry.plain.endpoint, &built).await?;

    let agents = match (args.agents.is_empty(), args.ci) {
        (false, _) => args.agents.clone(),
        (true, true) => vec![AgentKind::Swiftlet],
        (true, false) => vec![AgentKind::Swiftlet, AgentKind::Upstream],
    };
    bench::preflight(&mut cri, layout).await?;
    let suite = Suite { upstream, args, focus, kubeconfig: &cluster_state.admin_kubeconfig, repo_list: &repo_list };
    let mut runs = Vec::new();
    for kind in agents {
        eprintln!();
        eprintln!("==> conformance: {}", kind.name());
        let binary = match kind {
            AgentKind::Swiftlet => crate::fidelity::swiftlet_binary(ctx, args.swiftlet_bin.as_deref())?,
            AgentKind::Upstream => upstream.bin("kubelet"),
        };
        let dir = out.join(kind.name());
        let outcomes = run_agent(layout, &api, kind, &binary, &suite, &dir, &mut cri)
            .await
            .with_context(|| format!("the {} run", kind.name()))?;
        let (p, f, s) = report::counts(&outcomes);
        eprintln!("conformance: {}: {p} passed, {f} failed, {s} skipped", kind.name());
        runs.push((kind.name(), outcomes));
    }
    let shown: Vec<(&str, &BTreeMap<String, report::Outcome>)> = runs.iter().map(|(n, o)| (*n, o)).collect();
    let mut text = format!(
        "# Node conformance, {}\n\n{}, skip `{}`\n\n",
        upstream_suite_name(),
        describe_selection(args),
        skip_regex(args)
    );
    for (re, why) in SKIPPED {
        let _ = writeln!(text, "- skipped `{re}`: {why}");
    }
    text.push('\n');
    text.push_str(&report::table(&shown));
    print!("{text}");
    fs::write(out.join("report.md"), &text)?;
    eprintln!("conformance: report in {}", out.join("report.md").display());
    if args.ci {
        for (agent, outcomes) in &runs {
            let missed = ci_specs_not_passed(outcomes);
            ensure!(
                missed.is_empty(),
                "{agent}: {} spec(s) of the CI subset did not pass: {}",
                missed.len(),
                missed.join("; ")
            );
        }
    }
    let swiftlet_run = runs.iter().find(|(n, _)| *n == "swiftlet");
    let kubelet_run = runs.iter().find(|(n, _)| *n == "kubelet");
    if let (Some((_, ours)), Some((_, theirs))) = (swiftlet_run, kubelet_run) {
        let worse = report::regressions(ours, theirs);
        ensure!(
            worse.is_empty(),
            "{} spec(s) pass on the upstream kubelet and not on swiftlet: {}",
            worse.len(),
            worse.join("; ")
        );
    }
    Ok(())
}

/// Removes from the runtime each suite image an earlier run pulled that is not the one
/// just built: the suite pulls `IfNotPresent`, so an image changed here (a tool added to
/// agnhost) would otherwise never reach the agents.
async fn drop_stale_images(
    cri: &mut CriClient,
    endpoint: &str,
    built: &[(String, crate::images::BuiltImage)],
) -> Result<()> {
    for (path, image) in built {
        let reference = format!("{endpoint}/{path}");
        if let Some(present) = cri.image_status(&reference).await?
            && present.id != image.image_id
        {
            eprintln!("conformance: removing {reference} ({}), older than the one built", present.id);
            cri.remove_image(&reference).await?;
        }
    }
    Ok(())
}

/// The CI subset's specs (each a substring of exactly one spec's text) that did not pass
/// in `outcomes`, a spec that did not run at all included.
fn ci_specs_not_passed(outcomes: &BTreeMap<String, report::Outcome>) -> Vec<&'static str> {
    CI_SPECS
        .iter()
        .filter(|spec| !outcomes.iter().any(|(name, o)| name.contains(**spec) && *o == report::Outcome::Passed))
        .copied()
        .collect()
}

fn upstream_suite_name() -> String {
    format!("k8s.io/kubernetes/test/e2e {}", crate::upstream::VERSION)
}

/// What was selected, in words, for the report.
fn describe_selection(args: &ConformanceArgs) -> String {
    if args.ci {
        return format!("the CI subset ({} specs)", CI_SPECS.len());
    }
    match &args.focus {
        Some(f) => format!("focus `{DEFAULT_FOCUS}` narrowed by `{f}`"),
        None => format!("focus `{DEFAULT_FOCUS}`"),
    }
}

/// How the suite is run: the same for each agent.
struct Suite<'a> {
    upstream: &'a Upstream,
    args: &'a ConformanceArgs,
    /// `--focus` (see [`selection_focus`]).
    focus: &'a str,
    kubeconfig: &'a Path,
    repo_list: &'a Path,
}

impl Suite<'_> {
    /// `ginkgo [flags] e2e.test -- [suite flags]`, writing its reports into `dir`.
    fn command(&self, dir: &Path) -> Command {
        let mut cmd = Command::new(self.upstream.e2e_bin("ginkgo"));
        let procs = self.args.procs.unwrap_or(if self.args.ci { 2 } else { 1 });
        cmd.arg(format!("--procs={}", procs.max(1)))
            .arg(format!("--focus={}", self.focus))
            .arg(format!("--skip={}", skip_regex(self.args)))
            .arg(format!("--output-dir={}", dir.display()))
            .args(["--json-report=report.json", "--junit-report=junit.xml", "--no-color", "--timeout=24h"])
            .arg(self.upstream.e2e_bin("e2e.test"))
            .arg("--")
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(["--provider=skeleton", "--node-schedulable-timeout=2m", "--dump-logs-on-failure=false"])
            .arg(format!("--report-dir={}", dir.display()))
            .env("KUBE_TEST_REPO_LIST", self.repo_list);
        cmd
    }
}

/// One agent: joined as the cluster's only node, the suite run against it, the agent
/// and its node removed; each spec's outcome.
async fn run_agent(
    layout: &Layout,
    api: &ApiServer,
    kind: AgentKind,
    binary: &Path,
    suite: &Suite<'_>,
    dir: &Path,
    cri: &mut CriClient,
) -> Result<BTreeMap<String, report::Outcome>> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    fs::create_dir_all(dir)?;
    let label = format!("conformance-{}", kind.name());
    let mut agent =
        BenchAgent::named(&label, PlegMode::Evented, binary, &layout.endpoint(), 110)?.serving_the_api_server();
    if kind == AgentKind::Upstream {
        agent = agent.other_agent();
    }
    let mut cluster = Cluster::prepare_schedulable(api, agent)?;
    let ran = async {
        cluster.start().await?;
        let log = fs::File::create(dir.join("e2e.log"))?;
        let mut cmd = suite.command(dir);
        cmd.stdout(log.try_clone()?).stderr(log);
        eprintln!(
            "conformance: running the suite against node {} (log {})",
            cluster.agent.node_name(),
            dir.join("e2e.log").display()
        );
        let status = tokio::task::spawn_blocking(move || cmd.status()).await?.context("running ginkgo")?;
        // ginkgo exits non-zero when a spec fails: the report says which.
        eprintln!("conformance: the suite ended ({status})");
        cluster.agent.ensure_alive()?;
        drain(&mut cluster, cri).await
    }
    .await;
    let ended = cluster.end(layout, &dir.join(format!("{}-agent.log", kind.name()))).await;
    let cleared = clear_sandboxes(cri).await;
    ran?;
    ended.context("cleaning up")?;
    cleared.context("removing the run's sandboxes")?;
    let json = dir.join("report.json");
    report::outcomes(&fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?)
}

/// Deletes every pod left on the node and waits until the API and the runtime have none
/// running: the suite deletes its namespaces without waiting for them, and an agent
/// stopped under running containers would leave their cgroups behind.
async fn drain(cluster: &mut Cluster, cri: &mut CriClient) -> Result<()> {
    let node = cluster.agent.node_name().to_owned();
    let path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}");
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let (code, list) = cluster.client()?.request("GET", &path, None).await?;
        ensure!(code == 200, "listing the pods of node {node}: {code}: {list}");
        let pods: Vec<(String, String, bool)> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let meta = &p["metadata"];
                let name = |k: &str| meta[k].as_str().unwrap_or_default().to_owned();
                (name("namespace"), name("name"), meta.get("deletionTimestamp").is_some())
            })
            .collect();
        if pods.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{} pod(s) still on node {node} after {} s: {}",
            pods.len(),
            DRAIN_TIMEOUT.as_secs(),
            pods.iter().map(|(ns, n, _)| format!("{ns}/{n}")).collect::<Vec<_>>().join(", ")
        );
        for (namespace, name, _) in pods.iter().filter(|(_, _, deleting)| !deleting) {
            let (code, body) = cluster
                .client()?
                .request("DELETE", &format!("/api/v1/namespaces/{namespace}/pods/{name}"), None)
                .await?;
            ensure!(code == 200 || code == 404, "deleting pod {namespace}/{name}: {code}: {body}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    while cri.list_pod_sandboxes().await?.iter().any(|s| s.state == agent::SANDBOX_READY) {
        ensure!(Instant::now() < deadline, "the runtime still has ready sandboxes after {} s", DRAIN_TIMEOUT.as_secs());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// How long [`drain`] waits for the node's pods to go.
const DRAIN_TIMEOUT: Duration = Duration::from_mins(3);

/// Stops and removes every sandbox left in the runtime (the run checked at its start that
/// none was anyone else's), so that the next agent starts on an empty runtime.
async fn clear_sandboxes(cri: &mut CriClient) -> Result<()> {
    for sandbox in cri.list_pod_sandboxes().await? {
        cri.stop_pod_sandbox(&sandbox.id).await?;
        cri.remove_pod_sandbox(&sandbox.id).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(focus: Option<&str>, skip: Option<&str>) -> ConformanceArgs {
        ConformanceArgs {
            focus: focus.map(str::to_owned),
            skip: skip.map(str::to_owned),
            agents: Vec::new(),
            procs: None,
            ci: false,
            list: false,
            swiftlet_bin: None,
            keep_testbed: false,
        }
    }

    /// `--focus` picks specs of the default selection, whose texts carry the selection's
    /// own tags too; the focus names them literally. `--skip` adds to the skips that are
    /// always there.
    #[test]
    fn focus_narrows_and_skip_adds() {
        let selected = vec![
            "[sig-node] Probing container should be restarted [NodeConformance] [Conformance]".to_owned(),
            "[sig-node] Pods should get a host IP (a+b) [NodeConformance]".to_owned(),
        ];
        let user = regex::Regex::new(r"Probing container should be restarted \[NodeConformance\]").unwrap();
        let picked = narrow(&selected, &user);
        assert_eq!(picked, [selected[0].as_str()]);
        let focus = regex::Regex::new(&literal_alternatives(selected.iter().map(String::as_str))).unwrap();
        assert!(selected.iter().all(|s| focus.is_match(s)), "names with brackets and parentheses read literally");
        assert!(!focus.is_match("[sig-node] Pods should get a host IP aab [NodeConformance]"));
        let skip = regex::Regex::new(&skip_regex(&args(None, Some(r"\[Slow\]")))).unwrap();
        assert!(skip.is_match("[sig-node] restarts [Disruptive]"));
        assert!(skip.is_match("[sig-node] Probing [Slow]"));
        assert!(!skip.is_match("[sig-node] Pods [NodeConformance]"));
    }

    /// `--ci` focuses on exactly the subset's specs, read literally (their brackets and
    /// quotes are not regex syntax), and fails unless each of them passed.
    #[test]
    fn the_ci_subset_is_focused_literally_and_must_all_pass() {
        let ci = ConformanceArgs { ci: true, ..args(None, None) };
        let focus = regex::Regex::new(&literal_alternatives(CI_SPECS.iter().copied())).unwrap();
        for spec in CI_SPECS {
            assert!(focus.is_match(&format!("{spec} [Conformance] [NodeConformance]")), "{spec}");
        }
        assert!(
            !focus.is_match("[sig-node] Probing container should be restarted with a /healthz http liveness probe")
        );
        let mut outcomes: BTreeMap<String, report::Outcome> =
            CI_SPECS.iter().map(|s| (format!("{s} [NodeConformance]"), report::Outcome::Passed)).collect();
        assert!(ci_specs_not_passed(&outcomes).is_empty());
        let first = format!("{} [NodeConformance]", CI_SPECS[0]);
        outcomes.insert(first.clone(), report::Outcome::Failed("timedout".into()));
        assert_eq!(ci_specs_not_passed(&outcomes), [CI_SPECS[0]]);
        outcomes.remove(&first);
        assert_eq!(ci_specs_not_passed(&outcomes), [CI_SPECS[0]], "a spec that did not run did not pass");
        let suite_args = |procs| ConformanceArgs { procs, ..ci.clone() };
        let upstream = Upstream { module_dir: "/m".into(), bin_dir: "/b".into() };
        for (procs, want) in [(None, "--procs=2"), (Some(3), "--procs=3")] {
            let a = suite_args(procs);
            let suite = Suite {
                upstream: &upstream,
                args: &a,
                focus: "x",
                kubeconfig: Path::new("/k"),
                repo_list: Path::new("/r"),
            };
            let cmd = suite.command(Path::new("/out"));
            assert!(cmd.get_args().any(|x| x == want), "{procs:?}");
        }
    }

    #[test]
    fn the_suite_runs_through_ginkgo_with_the_remapped_registries() {
        let upstream = Upstream { module_dir: "/m".into(), bin_dir: "/b".into() };
        let a = args(None, None);
        let suite = Suite {
            upstream: &upstream,
            args: &a,
            focus: "x",
            kubeconfig: Path::new("/k/admin"),
            repo_list: Path::new("/r.yaml"),
        };
        let cmd = suite.command(Path::new("/out"));
        assert_eq!(cmd.get_program(), "/b/e2e/ginkgo");
        let argv: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        let dashdash = argv.iter().position(|a| a == "--").unwrap();
        assert_eq!(argv[dashdash - 1], "/b/e2e/e2e.test");
        assert!(argv[..dashdash].contains(&"--json-report=report.json".to_owned()));
        assert!(argv[..dashdash].contains(&"--output-dir=/out".to_owned()));
        assert!(argv[dashdash..].contains(&"--kubeconfig=/k/admin".to_owned()));
        assert!(argv[dashdash..].contains(&"--provider=skeleton".to_owned()));
        let env: Vec<_> = cmd.get_envs().collect();
        assert_eq!(env, vec![(std::ffi::OsStr::new("KUBE_TEST_REPO_LIST"), Some(std::ffi::OsStr::new("/r.yaml")))]);
    }
}
