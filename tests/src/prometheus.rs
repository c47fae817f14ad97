//! A Prometheus of a test's own, scraping an agent's four metrics endpoints every second.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Result;

/// The agent's endpoints Prometheus scrapes, as (job, path).
const JOBS: [(&str, &str); 4] = [
    ("kubelet", "/metrics"),
    ("resource", "/metrics/resource"),
    ("probes", "/metrics/probes"),
    ("cadvisor", "/metrics/cadvisor"),
];

/// A running `prometheus`, stopped by [`Prometheus::stop`].
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    /// Its web (and query API) port on 127.0.0.1.
    pub web: u16,
    log: PathBuf,
}

impl Prometheus {
    /// Starts `prometheus` in `dir` (created; its `prometheus.yml`, `data/` and
    /// `prometheus.log`) on a free loopback port, with the configuration `head` (its
    /// `global:` and whatever else comes before `scrape_configs:`) followed by one HTTPS job
    /// per endpoint of the agent on `host:https_port` (certificates not checked), and
    /// `flags`.
    pub fn start(dir: &Path, head: &str, host: &str, https_port: u16, flags: &[&str]) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut config = format!("{head}scrape_configs:\n");
        for (job, path) in JOBS {
            writeln!(
                config,
                "- job_name: {job}\n  scheme: https\n  metrics_path: {path}\n  tls_config:\n    insecure_skip_verify: true\n  static_configs:\n  - targets: ['{host}:{https_port}']",
            )?;
        }
        std::fs::write(dir.join("prometheus.yml"), &config)?;
        let web = crate::free_port()?;
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{web}"))
            .args(flags)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        Ok(Self { child, web, log })
    }

    /// Stops this Prometheus (by pid) and passes `result` on, a failure with the tail of
    /// Prometheus's log.
    pub fn stop<T>(mut self, result: Result<T>) -> Result<T> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        result.map_err(|e| {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            anyhow::anyhow!("{e}\nprometheus log:\n{}", crate::tail(&log, 20))
        })
    }
}
