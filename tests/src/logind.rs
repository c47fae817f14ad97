//! A private system bus with a logind (and systemd) stand-in, for the graceful node
//! shutdown tests: a real `dbus-daemon` (Debian `dbus-daemon`) on a socket in a temp
//! directory, started with its own configuration (anyone may own any name), and a zbus
//! server on it owning `org.freedesktop.login1` and `org.freedesktop.systemd1`:
//! - `org.freedesktop.login1.Manager.Inhibit` returns the write end of a pipe and
//!   watches the read end: when every copy of the descriptor is closed (the lock's
//!   holder released it or died), the inhibitor is marked released;
//! - the `InhibitDelayMaxUSec` property;
//! - `PrepareForShutdown` on demand ([`Logind::prepare_for_shutdown`]);
//! - `org.freedesktop.systemd1.Manager.KillUnit("systemd-logind.service", _, SIGHUP)`
//!   re-reads `InhibitDelayMaxSec` from the `*.conf` drop-ins in [`Logind::conf_dir`],
//!   as logind does on a reload.
//!
//! Point the agent at it with `DBUS_SYSTEM_BUS_ADDRESS` = [`Logind::address`] and
//! `SWIFTLET_LOGIND_CONF_DIR` = [`Logind::conf_dir`]. Dropping it kills the daemon (by
//! its pid) and removes the directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

/// One inhibitor lock logind handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inhibitor {
    pub what: String,
    pub who: String,
    pub why: String,
    pub mode: String,
    pub taken: Instant,
    /// When its descriptor was closed everywhere.
    pub released: Option<Instant>,
}

#[derive(Debug)]
struct State {
    delay_usec: u64,
    inhibitors: Vec<Inhibitor>,
    reloads: u32,
    conf_dir: PathBuf,
    watchers: Vec<tokio::task::JoinHandle<()>>,
}

type Shared = Arc<Mutex<State>>;

struct LogindManager {
    state: Shared,
}

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl LogindManager {
    fn inhibit(
        &self,
        what: String,
        who: String,
        why: String,
        mode: String,
    ) -> zbus::fdo::Result<zbus::zvariant::OwnedFd> {
        let failed = |e: std::io::Error| zbus::fdo::Error::Failed(e.to_string());
        let (reader, writer) = std::io::pipe().map_err(failed)?;
        let mut reader =
            tokio::net::unix::pipe::Receiver::from_owned_fd(std::os::fd::OwnedFd::from(reader)).map_err(failed)?;
        let mut state = self.state.lock().unwrap();
        let index = state.inhibitors.len();
        state.inhibitors.push(Inhibitor { what, who, why, mode, taken: Instant::now(), released: None });
        let shared = self.state.clone();
        state.watchers.push(tokio::spawn(async move {
            use tokio::io::AsyncReadExt as _;
            let mut buf = [0_u8; 16];
            // EOF once no process holds the write end any more.
            while matches!(reader.read(&mut buf).await, Ok(n) if n > 0) {}
            shared.lock().unwrap().inhibitors[index].released = Some(Instant::now());
        }));
        Ok(std::os::fd::OwnedFd::from(writer).into())
    }

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> u64 {
        self.state.lock().unwrap().delay_usec
    }
}

struct SystemdManager {
    state: Shared,
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl SystemdManager {
    fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::fdo::Result<()> {
        if name != "systemd-logind.service" || signal != libc::SIGHUP {
            return Err(zbus::fdo::Error::Failed(format!(
                "stand-in: KillUnit({name}, {whom}, {signal}) not supported"
            )));
        }
        let mut state = self.state.lock().unwrap();
        state.reloads += 1;
        if let Some(secs) = inhibit_delay_max_sec(&state.conf_dir) {
            state.delay_usec = secs * 1_000_000;
        }
        Ok(())
    }
}

/// The last `InhibitDelayMaxSec=` of the `*.conf` files in `dir`, in name order.
fn inhibit_delay_max_sec(dir: &Path) -> Option<u64> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "conf"))
        .collect();
    files.sort();
    let values: Vec<u64> = files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| text.lines().map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|l| l.trim().strip_prefix("InhibitDelayMaxSec=").and_then(|v| v.trim().parse().ok()))
        .collect();
    values.last().copied()
}

fn bus_config(socket: &Path) -> String {
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"#,
        socket.display()
    )
}

/// The private bus and the stand-in serving on it.
#[derive(Debug)]
pub struct Logind {
    daemon: Option<Child>,
    address: String,
    connection: zbus::Connection,
    state: Shared,
    dir: tempfile::TempDir,
}

/// Starts `dbus-daemon` with `config`, listening on `socket`; returns once it listens.
async fn spawn_daemon(config: &Path, socket: &Path) -> Result<Child> {
    let _ = std::fs::remove_file(socket);
    let mut daemon = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", config.display()))
        .args(["--nofork", "--nopidfile", "--nosyslog"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("starting dbus-daemon (Debian package dbus-daemon)")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    // Until a connection is accepted: the socket's file appears at its bind, a moment
    // before the daemon listens (a client then is refused, as a test once was).
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if let Some(status) = daemon.try_wait()? {
            bail!("dbus-daemon exited at start with {status}");
        }
        if Instant::now() > deadline {
            let _ = daemon.kill();
            let _ = daemon.wait();
            bail!("dbus-daemon did not listen on {} in 10s", socket.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(daemon)
}

/// The stand-in's connection: both objects served, both names owned.
async fn serve(address: &str, state: &Shared) -> zbus::Result<zbus::Connection> {
    zbus::connection::Builder::address(address)?
        .serve_at("/org/freedesktop/login1", LogindManager { state: state.clone() })?
        .serve_at("/org/freedesktop/systemd1", SystemdManager { state: state.clone() })?
        .name("org.freedesktop.login1")?
        .name("org.freedesktop.systemd1")?
        .build()
        .await
}

impl Logind {
    /// Starts `dbus-daemon` and the stand-in with `InhibitDelayMaxUSec` = `delay`.
    pub async fn start(delay: Duration) -> Result<Self> {
        // The agent's systemd cgroup driver talks to systemd over the same system bus.
        if crate::node::node_target()?.is_some() {
            bail!(
                "the logind stand-in's private system bus would be the systemd cgroup driver's bus too: the node \
                 shutdown tests run on the host's test bed (cgroupfs driver), not in the node container"
            );
        }
        let dir = tempfile::Builder::new().prefix("swiftlet-logind-").tempdir()?;
        let socket = dir.path().join("system_bus_socket");
        let config = dir.path().join("bus.conf");
        std::fs::write(&config, bus_config(&socket))?;
        let mut daemon = spawn_daemon(&config, &socket).await?;
        let address = format!("unix:path={}", socket.display());
        let state = Arc::new(Mutex::new(State {
            delay_usec: u64::try_from(delay.as_micros())?,
            inhibitors: Vec::new(),
            reloads: 0,
            conf_dir: dir.path().join("logind.conf.d"),
            watchers: Vec::new(),
        }));
        let connection = match serve(&address, &state).await {
            Ok(c) => c,
            Err(e) => {
                let _ = daemon.kill();
                let _ = daemon.wait();
                bail!("logind stand-in on {address}: {e}");
            }
        };
        Ok(Self { daemon: Some(daemon), address, connection, state, dir })
    }

    /// Kills the bus daemon and starts a new one on the same socket, with the stand-in
    /// (and its inhibitor records) back on it: a bus restart as clients see it.
    pub async fn restart_bus(&mut self) -> Result<()> {
        self.stop_bus();
        let socket = self.dir.path().join("system_bus_socket");
        self.daemon = Some(spawn_daemon(&self.dir.path().join("bus.conf"), &socket).await?);
        self.connection = serve(&self.address, &self.state).await?;
        Ok(())
    }

    /// The bus address (`DBUS_SYSTEM_BUS_ADDRESS`).
    #[must_use]
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The logind drop-in directory (`SWIFTLET_LOGIND_CONF_DIR`); created by whoever
    /// writes a drop-in.
    #[must_use]
    pub fn conf_dir(&self) -> PathBuf {
        self.state.lock().unwrap().conf_dir.clone()
    }

    /// The environment that points an agent at this bus.
    #[must_use]
    pub fn agent_env(&self) -> Vec<(String, String)> {
        vec![
            ("DBUS_SYSTEM_BUS_ADDRESS".into(), self.address.clone()),
            ("SWIFTLET_LOGIND_CONF_DIR".into(), self.conf_dir().display().to_string()),
        ]
    }

    /// `InhibitDelayMaxUSec` now.
    #[must_use]
    pub fn inhibit_delay(&self) -> Duration {
        Duration::from_micros(self.state.lock().unwrap().delay_usec)
    }

    /// How many times systemd was asked to reload logind.
    #[must_use]
    pub fn reloads(&self) -> u32 {
        self.state.lock().unwrap().reloads
    }

    /// Every inhibitor lock handed out, oldest first.
    #[must_use]
    pub fn inhibitors(&self) -> Vec<Inhibitor> {
        self.state.lock().unwrap().inhibitors.clone()
    }

    /// Waits until `pred` holds for the inhibitors.
    pub async fn wait_inhibitors(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&[Inhibitor]) -> bool,
    ) -> Result<Vec<Inhibitor>> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.inhibitors();
            if pred(&now) {
                return Ok(now);
            }
            if Instant::now() > deadline {
                bail!("logind stand-in: {what} not seen in {timeout:?}; inhibitors: {now:#?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the bus daemon (by pid), as when the system bus goes away.
    pub fn stop_bus(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }

    /// Emits `PrepareForShutdown(start)` as logind does when a shutdown begins (true) or
    /// is cancelled (false).
    pub async fn prepare_for_shutdown(&self, start: bool) -> Result<()> {
        self.connection
            .emit_signal(
                None::<&str>,
                "/org/freedesktop/login1",
                "org.freedesktop.login1.Manager",
                "PrepareForShutdown",
                &(start,),
            )
            .await?;
        Ok(())
    }
}

impl Drop for Logind {
    fn drop(&mut self) {
        for w in self.state.lock().unwrap().watchers.drain(..) {
            w.abort();
        }
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use swiftlet::nodeshutdown::{DbusInhibiter, Inhibiter as _, Manager, PodTerminator, PriorityPeriod, systemd};

    use super::*;

    /// The agent's D-Bus side against the stand-in: the delay, the drop-in and reload,
    /// the lock and its release, the signal.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_agents_dbus_side_works_against_the_stand_in() -> Result<()> {
        let logind = Logind::start(Duration::from_secs(5)).await?;
        let bus = DbusInhibiter::connect_to(logind.address()).await?;
        assert_eq!(bus.current_inhibit_delay().await?, Duration::from_secs(5));

        systemd::override_inhibit_delay(&logind.conf_dir(), Duration::from_secs(40)).map_err(anyhow::Error::msg)?;
        bus.reload_logind_conf().await?;
        assert_eq!(logind.reloads(), 1);
        assert_eq!(bus.current_inhibit_delay().await?, Duration::from_secs(40), "read fresh after the reload");

        let mut events = bus.monitor_shutdown().await?;
        let mut lock = bus.inhibit_shutdown().await?;
        let taken = logind.wait_inhibitors(Duration::from_secs(5), "a lock", |i| i.len() == 1).await?;
        assert_eq!(
            (taken[0].what.as_str(), taken[0].who.as_str(), taken[0].mode.as_str()),
            ("shutdown", "kubelet", "delay")
        );
        assert_eq!(taken[0].why, "Kubelet needs time to handle node shutdown");
        assert_eq!(taken[0].released, None, "held while the descriptor is open");

        logind.prepare_for_shutdown(true).await?;
        let got = tokio::time::timeout(Duration::from_secs(5), events.recv()).await?;
        assert_eq!(got, Some(true));
        logind.prepare_for_shutdown(false).await?;
        assert_eq!(tokio::time::timeout(Duration::from_secs(5), events.recv()).await?, Some(false));

        lock.release();
        logind
            .wait_inhibitors(Duration::from_secs(5), "the release", |i| i.first().is_some_and(|i| i.released.is_some()))
            .await?;

        // The bus going away ends the events (the manager then connects again).
        let mut logind = logind;
        logind.stop_bus();
        assert_eq!(tokio::time::timeout(Duration::from_secs(5), events.recv()).await?, None);
        Ok(())
    }

    /// No pods to kill.
    struct NoPods;

    #[async_trait::async_trait]
    impl PodTerminator for NoPods {
        async fn terminate(
            &self,
            _pod: &k8s_openapi::api::core::v1::Pod,
            _grace: i64,
        ) -> Result<(), swiftlet::nodeshutdown::BoxError> {
            Ok(())
        }
    }

    /// The whole manager against the stand-in: the lock at start, a new one after the
    /// bus restarted (reconnecting every second), the release after a shutdown.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_manager_takes_the_lock_again_after_a_bus_restart() -> Result<()> {
        let mut logind = Logind::start(Duration::from_secs(30)).await?;
        let root = tempfile::tempdir()?;
        let manager = Manager::new(
            vec![PriorityPeriod { priority: 0, grace_seconds: 2 }],
            root.path(),
            Arc::new(Vec::new),
            Arc::new(NoPods),
        )
        .with_bus_address(logind.address())
        .with_logind_conf_dir(logind.conf_dir());
        let status = manager.status();
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(manager.run(stop.clone()));
        logind.wait_inhibitors(Duration::from_secs(10), "the first lock", |i| i.len() == 1).await?;

        logind.restart_bus().await?;
        let locks = logind
            .wait_inhibitors(Duration::from_secs(10), "a lock on the new bus", |i| {
                i.len() == 2 && i[1].released.is_none()
            })
            .await?;
        assert!(locks[0].released.is_some(), "the lock of the lost connection is closed");

        logind.prepare_for_shutdown(true).await?;
        logind
            .wait_inhibitors(Duration::from_secs(10), "the release", |i| i.len() == 2 && i[1].released.is_some())
            .await?;
        assert_eq!(status.check(), Err("node is shutting down".to_owned()));
        let state = std::fs::read_to_string(root.path().join("graceful_node_shutdown_state"))?;
        assert!(state.starts_with(r#"{"startTime":""#) && !state.contains("0001-01-01"), "{state}");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await??;
        Ok(())
    }
}
