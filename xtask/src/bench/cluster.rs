//! A bench "cluster": the test API server ([`ApiServer`]), one agent joined to it
//! ([`BenchAgent`] with `--kubeconfig`), a client for the bench's requests and the bench's
//! own pod watch ([`PodWatch`]). [`Cluster::end`] undoes all of it in any state: the API
//! pods are deleted (the agent stops them), the agent is torn down (pods left are removed
//! through CRI), the server stops.

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench::{
        agent::{self, BenchAgent, NODE_NAME},
        apiserver::{ApiClient, ApiServer, TOKEN},
        procfs,
        watch::{self, PodWatch, WatchTarget},
    },
    cri::CriClient,
    testbed::Layout,
};

/// The test API server and an agent joined to it.
#[derive(Debug)]
pub struct Cluster {
    pub api: ApiServer,
    pub agent: BenchAgent,
    pub client: Option<ApiClient>,
    pub watch: Option<PodWatch>,
}

impl Cluster {
    /// Starts the API server in the agent's directory's parent (`<tmp>/swiftlet-bench-<pid>-<label>-api`);
    /// the agent is set up to join it but not started.
    pub async fn prepare(apiserver_bin: &Path, agent: BenchAgent) -> Result<Self> {
        let dir = agent.dir.with_file_name(format!(
            "{}-api",
            agent.dir.file_name().and_then(|n| n.to_str()).unwrap_or("swiftlet-bench-api")
        ));
        let api = ApiServer::start(apiserver_bin, &dir).await?;
        let agent = agent.with_kubeconfig(&api.kubeconfig);
        agent.setup()?;
        Ok(Self { api, agent, client: None, watch: None })
    }

    /// Starts the agent, waits until its node is registered, creates the bench namespace
    /// and starts the bench's watch on it.
    pub async fn start(&mut self) -> Result<()> {
        self.agent.spawn().await?;
        let mut client = self.api.client().await?;
        client
            .wait_node(NODE_NAME, Duration::from_mins(1))
            .await
            .map_err(|e| anyhow::anyhow!("{e:#}; agent log tail:\n{}", self.agent.log_tail(30)))?;
        client.ensure_namespace().await?;
        let (_, rv) = client.list_pods().await?;
        let target =
            WatchTarget { addr: self.api.addr(), token: TOKEN.to_owned(), namespace: agent::NAMESPACE.to_owned() };
        self.watch = Some(PodWatch::start(target, &rv)?);
        self.client = Some(client);
        Ok(())
    }

    pub fn client(&mut self) -> Result<&mut ApiClient> {
        self.client.as_mut().context("the cluster is not started")
    }

    pub fn watch(&self) -> Result<&PodWatch> {
        self.watch.as_ref().context("the cluster is not started")
    }

    /// Creates `pods` one after the other as fast as the server answers; returns the
    /// `CLOCK_MONOTONIC` time just before each request.
    pub async fn create_pods(&mut self, pods: &[serde_json::Value]) -> Result<Vec<u64>> {
        let client = self.client()?;
        let mut sent = Vec::with_capacity(pods.len());
        for pod in pods {
            sent.push(procfs::monotonic_ns());
            client.create_pod(pod).await?;
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
        for name in names {
            self.client()?.delete_pod(name).await?;
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

    /// Undoes everything (see the module docs), keeping the agent's log at `keep_log`.
    /// Every step runs even when an earlier one failed.
    pub async fn end(&mut self, layout: &Layout, keep_log: &Path) -> Result<()> {
        let mut failures = Vec::new();
        self.watch = None;
        if self.agent.ensure_alive().is_ok() {
            let deleted = async {
                let mut client = match self.client.take() {
                    Some(c) => c,
                    None => self.api.client().await?,
                };
                let n = client.delete_all_pods().await?;
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
        self.api.stop();
        let api_dir = self.api.kubeconfig.parent().map(Path::to_path_buf);
        if let Some(dir) = api_dir
            && let Some(parent) = keep_log.parent()
        {
            let _ =
                std::fs::copy(dir.join("apiserver.log"), parent.join(format!("{}-apiserver.log", self.agent.label)));
            if let Err(e) = crate::cleanup::remove_dir(&dir) {
                failures.push(format!("removing {}: {e:#}", dir.display()));
            }
        }
        if failures.is_empty() { Ok(()) } else { bail!("cleanup incomplete: {}", failures.join("; ")) }
    }
}
