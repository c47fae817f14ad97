//! A bench "cluster": one agent joined as a node to the test bed's real control plane
//! (kube-apiserver, kube-controller-manager, kube-scheduler at [`crate::upstream::VERSION`],
//! see [`ApiServer`]) by TLS bootstrap, a namespace of its own for the bench's pods, a
//! client for the bench's requests as the cluster admin and the bench's own pod watch
//! ([`PodWatch`]). [`Cluster::end`] undoes all of it in any state: the API pods are deleted
//! (the agent stops them), the agent is torn down (pods left are removed through CRI), the
//! node and the namespace are deleted. The control plane stays up: it is the test bed's.

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

use crate::{
    bench::{
        agent::{self, BenchAgent, NAMESPACE},
        apiserver::{self, ApiClient, ApiServer},
        procfs,
        watch::{self, PodWatch, WatchTarget},
    },
    cri::CriClient,
    testbed::Layout,
};

/// An agent joined to the test bed's control plane.
#[derive(Debug)]
pub struct Cluster {
    pub api: ApiServer,
    pub agent: BenchAgent,
    /// The namespace of this agent's pods (`swiftlet-bench-<pid>-<label>`), deleted at the end.
    pub namespace: String,
    pub client: Option<ApiClient>,
    pub watch: Option<PodWatch>,
}

impl Cluster {
    /// Sets `agent` up to join `api` as node `swiftlet-bench-<label>` (with the bench
    /// nodes' taint); neither the agent nor anything in the API exists yet.
    pub fn prepare(api: &ApiServer, agent: BenchAgent) -> Result<Self> {
        Self::prepare_registering(api, agent, &apiserver::register_with_taint())
    }

    /// As [`Self::prepare`], for a node the scheduler may place any pod on (no bench
    /// taint): the cluster's only node of `cargo xtask conformance`.
    pub fn prepare_schedulable(api: &ApiServer, agent: BenchAgent) -> Result<Self> {
        Self::prepare_registering(api, agent, "")
    }

    fn prepare_registering(api: &ApiServer, agent: BenchAgent, registration: &str) -> Result<Self> {
        let node = apiserver::node_name(&agent.label);
        let namespace = format!("{NAMESPACE}-{}-{}", std::process::id(), apiserver::dns_label(&agent.label));
        let agent = agent.joining(&node, &api.bootstrap_kubeconfig, registration);
        agent.setup()?;
        Ok(Self { api: api.clone(), agent, namespace, client: None, watch: None })
    }

    /// Removes what earlier benches left in the cluster, creates the namespace, starts
    /// the agent, waits until its node is Ready and starts the bench's watch on the
    /// namespace's pods.
    pub async fn start(&mut self) -> Result<()> {
        let mut client = self.api.client();
        client.remove_stale().await?;
        client.create_namespace(&self.namespace).await?;
        self.client = Some(client);
        self.agent.spawn().await?;
        let node = self.agent.node_name().to_owned();
        if let Err(e) = self.client()?.wait_node_ready(&node, Duration::from_mins(1)).await {
            bail!("{e:#}; agent log tail:\n{}", self.agent.log_tail(30));
        }
        eprintln!("bench: node {node} joined the {} control plane and is Ready", self.api.version);
        let namespace = self.namespace.clone();
        let (_, rv) = self.client()?.list_pods(&namespace).await?;
        let target =
            WatchTarget { host: self.api.host.clone(), tls: self.api.tls.clone(), namespace: self.namespace.clone() };
        self.watch = Some(PodWatch::start(target, &rv)?);
        Ok(())
    }

    /// An API pod of this cluster's namespace bound to its node (see [`apiserver::pod`]).
    pub fn pod(&self, name: &str, script: &str, memory_volume: bool) -> Value {
        apiserver::pod(name, &self.namespace, self.agent.node_name(), script, memory_volume)
    }

    pub fn client(&mut self) -> Result<&mut ApiClient> {
        self.client.as_mut().context("the cluster is not started")
    }

    pub fn watch(&self) -> Result<&PodWatch> {
        self.watch.as_ref().context("the cluster is not started")
    }

    /// Creates `pods` one after the other as fast as the server answers; returns the
    /// `CLOCK_MONOTONIC` time just before each request.
    pub async fn create_pods(&mut self, pods: &[Value]) -> Result<Vec<u64>> {
        let namespace = self.namespace.clone();
        let client = self.client()?;
        let mut sent = Vec::with_capacity(pods.len());
        for pod in pods {
            sent.push(procfs::monotonic_ns());
            client.create_pod(&namespace, pod).await?;
        }
        Ok(sent)
    }

    /// Waits until the watch has shown each pod `names[i]` Running after `created[i]`;
    /// returns those times. Fails after `timeout`, naming the pods still waiting.
    pub async fn wait_running(&mut self, names: &[String], created: &[u64], timeout: Duration) -> Result<Vec<u64>> {
        let started = Instant::now();
        let mut last_note = Instant::now();
        loop {
            self.agent.ensure_alive()?;
            let seen: Vec<Option<u64>> = self.watch()?.with_events(|events| {
                names.iter().zip(created).map(|(n, c)| watch::running_at(events, n, *c)).collect()
            })?;
            let running = seen.iter().filter(|s| s.is_some()).count();
            if running == names.len() {
                return Ok(seen.into_iter().flatten().collect());
            }
            if started.elapsed() > timeout {
                let waiting: Vec<&str> =
                    names.iter().zip(&seen).filter(|(_, s)| s.is_none()).map(|(n, _)| n.as_str()).take(10).collect();
                bail!(
                    "{running}/{} pods Running after {timeout:?} (waiting: {}); agent log tail:\n{}",
                    names.len(),
                    waiting.join(", "),
                    self.agent.log_tail(30)
                );
            }
            if last_note.elapsed() > Duration::from_secs(10) {
                eprintln!(
                    "bench: {running}/{} pods Running after {:.0} s",
                    names.len(),
                    started.elapsed().as_secs_f64()
                );
                last_note = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Deletes `names` from the API (at once) and waits until the agent no longer lists
    /// them and the runtime has no ready sandbox of the bench namespace: the next
    /// measurement starts on a quiet node. Stopped sandboxes may stay (an upstream kubelet
    /// removes them in its garbage collection, minutes later).
    pub async fn delete_and_wait(&mut self, cri: &mut CriClient, names: &[String], timeout: Duration) -> Result<()> {
        let namespace = self.namespace.clone();
        for name in names {
            self.client()?.delete_pod(&namespace, name).await?;
        }
        let full: BTreeSet<String> = names.iter().cloned().collect();
        let deadline = Instant::now() + timeout;
        loop {
            self.agent.ensure_alive()?;
            let listed = self.agent.pods().await?.into_iter().filter(|p| full.contains(&p.name)).count();
            let ready = agent::ready_bench_sandboxes(cri).await?.len();
            if listed == 0 && ready == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{listed} deleted pod(s) still in /pods and {ready} ready sandbox(es) {timeout:?} after deleting \
                     them; agent log tail:\n{}",
                    self.agent.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Deletes the namespace's pods and waits (at most 2 minutes) until the agent has
    /// deleted their objects too, which it does once their volumes are unmounted (as
    /// upstream's status manager): before a driver running as a pod on the node, which the
    /// unmounts need, is removed. Fails at once if the agent is not running.
    pub async fn delete_pods_and_wait(&mut self) -> Result<()> {
        self.agent.ensure_alive()?;
        let mut client = self.client.take().unwrap_or_else(|| self.api.client());
        let namespace = self.namespace.clone();
        let outcome = async {
            client.delete_all_pods(&namespace).await?;
            let deadline = Instant::now() + Duration::from_mins(2);
            loop {
                let (left, _) = client.list_pods(&namespace).await?;
                if left.is_empty() {
                    return anyhow::Ok(());
                }
                ensure!(Instant::now() < deadline, "pods of {namespace} still there after 2 minutes: {left:?}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        .await;
        self.client = Some(client);
        outcome
    }

    /// Undoes everything (see the module docs), keeping the agent's log at `keep_log`.
    /// Every step runs even when an earlier one failed.
    pub async fn end(&mut self, layout: &Layout, keep_log: &Path) -> Result<()> {
        let mut failures = Vec::new();
        self.watch = None;
        let mut client = self.client.take().unwrap_or_else(|| self.api.client());
        if self.agent.ensure_alive().is_ok() {
            let deleted = async {
                let n = client.delete_all_pods(&self.namespace).await?;
                if n > 0 {
                    eprintln!("bench: deleted {n} pod(s) from the API server; waiting for the agent to stop them");
                    let mut cri = CriClient::connect(&layout.socket()).await?;
                    let deadline = Instant::now() + Duration::from_mins(2);
                    while !agent::ready_bench_sandboxes(&mut cri).await?.is_empty() && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                anyhow::Ok(())
            };
            if let Err(e) = deleted.await {
                failures.push(format!("deleting the API pods: {e:#}"));
            }
        }
        if let Err(e) = self.agent.teardown(layout, keep_log).await {
            failures.push(format!("{e:#}"));
        }
        // The node would stay NotReady in the cluster; the namespace's deletion removes
        // any pod left in it.
        let node = self.agent.node_name().to_owned();
        if let Err(e) = client.delete_node(&node).await {
            failures.push(format!("deleting node {node}: {e:#}"));
        }
        if let Err(e) = client.delete_namespace(&self.namespace).await {
            failures.push(format!("deleting namespace {}: {e:#}", self.namespace));
        }
        if failures.is_empty() { Ok(()) } else { bail!("cleanup incomplete: {}", failures.join("; ")) }
    }
}
