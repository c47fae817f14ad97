//! logind and systemd over the system bus (upstream `nodeshutdown/systemd`): the
//! `InhibitDelayMaxUSec` property, the `delay` inhibitor lock for `shutdown` (a file
//! descriptor: closing it releases the lock), the `PrepareForShutdown` signal, the
//! logind drop-in that raises `InhibitDelayMaxSec`, and the reload through systemd
//! (`KillUnit` with `SIGHUP`).

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use tokio::sync::mpsc;

use super::{Error, Result};

/// Where the system bus is when `DBUS_SYSTEM_BUS_ADDRESS` is not set.
pub const DEFAULT_SYSTEM_BUS: &str = "unix:path=/run/dbus/system_bus_socket";
/// logind's drop-in directory.
pub const LOGIND_CONF_DIR: &str = "/etc/systemd/logind.conf.d";
/// The drop-in the agent writes.
pub const KUBELET_LOGIND_CONF: &str = "99-kubelet.conf";

/// `org.freedesktop.login1.Manager`, as far as the shutdown manager uses it.
#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
trait Logind {
    /// Takes an inhibitor lock; the returned descriptor holds it.
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<zbus::zvariant::OwnedFd>;

    /// The longest a `delay` lock may delay, in microseconds.
    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;

    /// `true` when a shutdown begins, `false` when it was cancelled.
    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;
}

/// `org.freedesktop.systemd1.Manager`: only `KillUnit`.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Systemd {
    fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::Result<()>;
}

/// A held inhibitor lock: dropping or [`release`](Self::release)-ing it closes the
/// descriptor, which lets the shutdown proceed.
#[derive(Debug, Default)]
pub struct InhibitLock(Option<OwnedFd>);

impl InhibitLock {
    /// A lock held by `fd`.
    #[must_use]
    pub fn new(fd: OwnedFd) -> Self {
        Self(Some(fd))
    }

    /// Closes the descriptor (no-op when already released).
    pub fn release(&mut self) {
        self.0.take();
    }

    /// Whether the descriptor is still open.
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.0.is_some()
    }
}

/// What the manager asks of logind and systemd (upstream `dbusInhibiter`); the real one
/// is [`DbusInhibiter`], tests use a fake.
#[async_trait]
pub trait Inhibiter: Send + Sync {
    /// logind's `InhibitDelayMaxUSec`.
    async fn current_inhibit_delay(&self) -> Result<Duration>;
    /// `Inhibit("shutdown", "kubelet", ..., "delay")`.
    async fn inhibit_shutdown(&self) -> Result<InhibitLock>;
    /// `SIGHUP` to `systemd-logind.service` through systemd.
    async fn reload_logind_conf(&self) -> Result<()>;
    /// `PrepareForShutdown` values; the channel closes when the bus goes away.
    async fn monitor_shutdown(&self) -> Result<mpsc::Receiver<bool>>;
}

/// The system bus connection.
#[derive(Debug)]
pub struct DbusInhibiter {
    connection: zbus::Connection,
    logind: LogindProxy<'static>,
}

impl DbusInhibiter {
    /// Connects to `DBUS_SYSTEM_BUS_ADDRESS`, else [`DEFAULT_SYSTEM_BUS`].
    pub async fn connect() -> Result<Self> {
        let address = std::env::var("DBUS_SYSTEM_BUS_ADDRESS").unwrap_or_else(|_| DEFAULT_SYSTEM_BUS.to_owned());
        Self::connect_to(&address).await
    }

    /// Connects to the bus at `address` (a D-Bus address, e.g. `unix:path=...`).
    pub async fn connect_to(address: &str) -> Result<Self> {
        let err = |source| Error::Connect { address: address.to_owned(), source };
        let connection = zbus::connection::Builder::address(address).map_err(err)?.build().await.map_err(err)?;
        // Properties are read fresh each time: the value changes on a logind reload.
        let logind = LogindProxy::builder(&connection)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(err)?;
        Ok(Self { connection, logind })
    }
}

#[async_trait]
impl Inhibiter for DbusInhibiter {
    async fn current_inhibit_delay(&self) -> Result<Duration> {
        let usec = self.logind.inhibit_delay_max_usec().await.map_err(Error::InhibitDelay)?;
        Ok(Duration::from_micros(usec))
    }

    async fn inhibit_shutdown(&self) -> Result<InhibitLock> {
        let fd = self
            .logind
            .inhibit("shutdown", "kubelet", "Kubelet needs time to handle node shutdown", "delay")
            .await
            .map_err(Error::Inhibit)?;
        Ok(InhibitLock::new(fd.into()))
    }

    async fn reload_logind_conf(&self) -> Result<()> {
        let systemd = SystemdProxy::new(&self.connection).await.map_err(Error::Reload)?;
        systemd.kill_unit("systemd-logind.service", "all", libc::SIGHUP).await.map_err(Error::Reload)
    }

    async fn monitor_shutdown(&self) -> Result<mpsc::Receiver<bool>> {
        let mut signals = self.logind.receive_prepare_for_shutdown().await.map_err(Error::Monitor)?;
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            while let Some(signal) = signals.next().await {
                match signal.args() {
                    Ok(args) => {
                        if tx.send(args.start).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "failed obtaining shutdown event, PrepareForShutdown was not a bool");
                    }
                }
            }
        });
        Ok(rx)
    }
}

/// The drop-in text that sets logind's `InhibitDelayMaxSec` to `delay` (whole seconds).
#[must_use]
pub fn logind_drop_in(delay: Duration) -> String {
    format!("# Kubelet logind override\n[Login]\nInhibitDelayMaxSec={}\n", delay.as_secs_f64().round())
}

/// Writes [`logind_drop_in`] as `dir/99-kubelet.conf`, creating `dir` (upstream
/// `OverrideInhibitDelay`).
pub fn override_inhibit_delay(dir: &Path, delay: Duration) -> std::result::Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("failed creating {} directory: {e}", dir.display()))?;
    let path = dir.join(KUBELET_LOGIND_CONF);
    std::fs::write(&path, logind_drop_in(delay))
        .map_err(|e| format!("failed writing logind shutdown inhibit override file {}: {e}", path.display()))
}
