//! systemd's D-Bus API for `cgroupDriver: systemd`: the `QoS` and pod cgroups are
//! transient slice units that systemd creates, limits and removes (upstream's kubelet goes
//! through runc's libcontainer systemd manager, which does the same calls).
//!
//! - **Create**: `StartTransientUnit(<slice>, "replace", props)` with `Wants=<parent>`,
//!   `DefaultDependencies=no`, the accounting switches and the limits, then the job's
//!   `JobRemoved` signal is awaited (the cgroup exists once the job is done). A unit that
//!   exists already (`UnitExists`) is kept, as libcontainer does.
//! - **Update**: `SetUnitProperties(<slice>, runtime=true, props)`, so that a
//!   `daemon-reload` does not put old limits back; the manager then writes the same values
//!   into the cgroup files (libcontainer's systemd manager also does both, and the
//!   controllers systemd does not handle on v1, cpuset and hugetlb, exist only that way).
//! - **Remove**: `StopUnit(<slice>, "replace")` after the kubelet has killed what was left
//!   in the pod; a unit that does not exist (`NoSuchUnit`) is already gone.
//!
//! The bus: `DBUS_SYSTEM_BUS_ADDRESS`, else the system bus socket, else systemd's private
//! socket `/run/systemd/private` (for root, as go-systemd falls back to). The calls are
//! synchronous (the [`super::PodContainerManager`] contract): a dedicated thread owns the
//! connection and its own runtime, and callers wait for its answer with a deadline.

use std::path::Path;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use tokio::sync::mpsc;
use zbus::zvariant::{OwnedObjectPath, Value};

use super::resources::{self, PodResourceConfig};

/// systemd's system bus socket.
pub const SYSTEM_BUS_SOCKET: &str = "/run/dbus/system_bus_socket";
/// systemd's private socket (root only, no bus daemon).
pub const PRIVATE_SOCKET: &str = "/run/systemd/private";
/// How long a call and its job may take (libcontainer waits 30 s for a unit to start).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A unit property for `StartTransientUnit` / `SetUnitProperties`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Property {
    /// `t`.
    U64(&'static str, u64),
    /// `b`.
    Bool(&'static str, bool),
    /// `s`.
    Str(&'static str, String),
    /// `as`.
    Strs(&'static str, Vec<String>),
}

impl Property {
    /// The property's name.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            Self::U64(n, _) | Self::Bool(n, _) | Self::Str(n, _) | Self::Strs(n, _) => n,
        }
    }

    fn value(&self) -> Value<'static> {
        match self {
            Self::U64(_, v) => Value::from(*v),
            Self::Bool(_, v) => Value::from(*v),
            Self::Str(_, v) => Value::from(v.clone()),
            Self::Strs(_, v) => Value::from(v.clone()),
        }
    }
}

/// Errors of systemd calls; each names the unit and the call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No bus could be reached.
    #[error("cannot connect to systemd over D-Bus at {address}: {source}")]
    Connect {
        /// The D-Bus address tried.
        address: String,
        /// Why.
        #[source]
        source: Box<zbus::Error>,
    },
    /// A call failed.
    #[error("systemd {call} of {unit} failed: {source}")]
    Call {
        /// The D-Bus method.
        call: &'static str,
        /// The unit.
        unit: String,
        /// The D-Bus error.
        #[source]
        source: Box<zbus::Error>,
    },
    /// The job of a call ended other than `done`.
    #[error("systemd job for {unit} ended with result {result:?}")]
    Job {
        /// The unit.
        unit: String,
        /// systemd's job result (`failed`, `timeout`, `dependency`, ...).
        result: String,
    },
    /// No answer in time.
    #[error("systemd {call} of {unit} gave no answer within {timeout:?}")]
    Timeout {
        /// The D-Bus method.
        call: &'static str,
        /// The unit.
        unit: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// The connection's thread is gone.
    #[error("the systemd D-Bus connection is closed")]
    Closed,
}

/// The slice units the systemd cgroup driver needs; [`DbusSystemd`] on a node, a fake in
/// the fixture tests.
pub trait SystemdUnits: Send + Sync + std::fmt::Debug {
    /// Starts the transient slice `name` under the slice `parent` with `props`, waiting
    /// for its job. `Ok(false)` when the unit existed already (then nothing was changed).
    ///
    /// # Errors
    /// The call or its job failed.
    fn start_slice(&self, name: &str, parent: &str, props: &[Property]) -> Result<bool, Error>;

    /// Sets `props` on the unit `name` at runtime.
    ///
    /// # Errors
    /// The call failed.
    fn set_properties(&self, name: &str, props: &[Property]) -> Result<(), Error>;

    /// Stops the unit `name` and waits for its job; a unit that does not exist is stopped.
    ///
    /// # Errors
    /// The call or its job failed.
    fn stop_unit(&self, name: &str) -> Result<(), Error>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
trait Systemd1Manager {
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Value<'_>)],
        aux: &[(&str, &[(&str, Value<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;

    fn set_unit_properties(&self, name: &str, runtime: bool, properties: &[(&str, Value<'_>)]) -> zbus::Result<()>;

    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    fn subscribe(&self) -> zbus::Result<()>;

    #[zbus(signal)]
    fn job_removed(&self, id: u32, job: zbus::zvariant::ObjectPath<'_>, unit: &str, result: &str) -> zbus::Result<()>;
}

enum Op {
    Start { name: String, props: Vec<Property> },
    Set { name: String, props: Vec<Property> },
    Stop { name: String },
}

struct Request {
    op: Op,
    reply: std_mpsc::SyncSender<Result<bool, Error>>,
}

/// systemd over D-Bus, from a thread of its own.
#[derive(Debug)]
pub struct DbusSystemd {
    address: String,
    requests: mpsc::UnboundedSender<Request>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").finish_non_exhaustive()
    }
}

/// The D-Bus address to reach systemd at: `DBUS_SYSTEM_BUS_ADDRESS`, the system bus if
/// its socket exists, else the private socket; `true` for the latter (a peer-to-peer
/// connection, no bus daemon in between).
#[must_use]
pub fn default_address(system_bus_env: Option<String>, system_bus_exists: bool) -> (String, bool) {
    if let Some(address) = system_bus_env.filter(|a| !a.is_empty()) {
        return (address, false);
    }
    if system_bus_exists {
        return (format!("unix:path={SYSTEM_BUS_SOCKET}"), false);
    }
    (format!("unix:path={PRIVATE_SOCKET}"), true)
}

impl DbusSystemd {
    /// Connects as [`default_address`] says, and subscribes to job signals.
    ///
    /// # Errors
    /// [`Error::Connect`] naming the address.
    pub fn connect() -> Result<Self, Error> {
        let (address, p2p) =
            default_address(std::env::var("DBUS_SYSTEM_BUS_ADDRESS").ok(), Path::new(SYSTEM_BUS_SOCKET).exists());
        Self::connect_to(&address, p2p)
    }

    /// Connects to `address` (`p2p` for systemd's private socket).
    ///
    /// # Errors
    /// [`Error::Connect`] naming the address.
    pub fn connect_to(address: &str, p2p: bool) -> Result<Self, Error> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Request>();
        let (ready_tx, ready_rx) = std_mpsc::sync_channel::<Result<(), Error>>(1);
        let owned = address.to_owned();
        std::thread::Builder::new()
            .name("systemd-dbus".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let source = zbus::Error::InputOutput(std::sync::Arc::new(e));
                        let _ = ready_tx.send(Err(Error::Connect { address: owned, source: Box::new(source) }));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let proxy = match connect_proxy(&owned, p2p).await {
                        Ok(p) => {
                            let _ = ready_tx.send(Ok(()));
                            p
                        }
                        Err(source) => {
                            let _ = ready_tx.send(Err(Error::Connect { address: owned, source: Box::new(source) }));
                            return;
                        }
                    };
                    while let Some(req) = rx.recv().await {
                        let answer = serve(&proxy, req.op).await;
                        let _ = req.reply.send(answer);
                    }
                });
            })
            .map_err(|e| Error::Connect {
                address: address.to_owned(),
                source: Box::new(zbus::Error::InputOutput(std::sync::Arc::new(e))),
            })?;
        match ready_rx.recv_timeout(CALL_TIMEOUT) {
            Ok(Ok(())) => Ok(Self { address: address.to_owned(), requests: tx }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Timeout { call: "connect", unit: address.to_owned(), timeout: CALL_TIMEOUT }),
        }
    }

    /// The address connected to.
    #[must_use]
    pub fn address(&self) -> &str {
        &self.address
    }

    fn call(&self, call: &'static str, unit: &str, op: Op) -> Result<bool, Error> {
        let (reply, answer) = std_mpsc::sync_channel(1);
        self.requests.send(Request { op, reply }).map_err(|_| Error::Closed)?;
        // The thread's own deadline is CALL_TIMEOUT per step; this one only guards against
        // a thread that stopped answering.
        answer.recv_timeout(CALL_TIMEOUT * 2).unwrap_or_else(|e| match e {
            std_mpsc::RecvTimeoutError::Timeout => {
                Err(Error::Timeout { call, unit: unit.to_owned(), timeout: CALL_TIMEOUT * 2 })
            }
            std_mpsc::RecvTimeoutError::Disconnected => Err(Error::Closed),
        })
    }
}

async fn connect_proxy(address: &str, p2p: bool) -> zbus::Result<Systemd1ManagerProxy<'static>> {
    let mut builder = zbus::connection::Builder::address(address)?;
    if p2p {
        builder = builder.p2p();
    }
    let connection = builder.build().await?;
    let proxy =
        Systemd1ManagerProxy::builder(&connection).cache_properties(zbus::proxy::CacheProperties::No).build().await?;
    proxy.subscribe().await?;
    Ok(proxy)
}

fn is_method_error(e: &zbus::Error, name: &str) -> bool {
    matches!(e, zbus::Error::MethodError(n, _, _) if n.as_str() == name)
}

async fn serve(proxy: &Systemd1ManagerProxy<'static>, op: Op) -> Result<bool, Error> {
    use futures::StreamExt as _;
    let values = |props: &[Property]| -> Vec<(&'static str, Value<'static>)> {
        props.iter().map(|p| (p.name(), p.value())).collect()
    };
    match op {
        Op::Set { name, props } => {
            let values = values(&props);
            tokio::time::timeout(CALL_TIMEOUT, proxy.set_unit_properties(&name, true, &values))
                .await
                .map_err(|_| Error::Timeout { call: "SetUnitProperties", unit: name.clone(), timeout: CALL_TIMEOUT })?
                .map_err(|source| Error::Call { call: "SetUnitProperties", unit: name, source: Box::new(source) })?;
            Ok(true)
        }
        op => {
            let (call, name) = match &op {
                Op::Start { name, .. } => ("StartTransientUnit", name.clone()),
                Op::Stop { name } => ("StopUnit", name.clone()),
                Op::Set { .. } => unreachable!("handled above"),
            };
            // Listen before calling: the job may end before the call returns.
            let mut removed = proxy.receive_job_removed().await.map_err(|source| Error::Call {
                call,
                unit: name.clone(),
                source: Box::new(source),
            })?;
            let job = match &op {
                Op::Start { props, .. } => {
                    let values = values(props);
                    proxy.start_transient_unit(&name, "replace", &values, &[]).await
                }
                _ => proxy.stop_unit(&name, "replace").await,
            };
            let job = match job {
                Ok(job) => job,
                Err(e) if is_method_error(&e, "org.freedesktop.systemd1.UnitExists") => return Ok(false),
                Err(e) if is_method_error(&e, "org.freedesktop.systemd1.NoSuchUnit") => return Ok(false),
                Err(source) => return Err(Error::Call { call, unit: name, source: Box::new(source) }),
            };
            let wait = async {
                while let Some(signal) = removed.next().await {
                    let Ok(args) = signal.args() else { continue };
                    if args.job.as_str() == job.as_str() {
                        return Some(args.result.to_owned());
                    }
                }
                None
            };
            match tokio::time::timeout(CALL_TIMEOUT, wait).await {
                Ok(Some(result)) if result == "done" => Ok(true),
                Ok(Some(result)) => Err(Error::Job { unit: name, result }),
                Ok(None) => Err(Error::Closed),
                Err(_) => Err(Error::Timeout { call, unit: name, timeout: CALL_TIMEOUT }),
            }
        }
    }
}

impl SystemdUnits for DbusSystemd {
    fn start_slice(&self, name: &str, parent: &str, props: &[Property]) -> Result<bool, Error> {
        let mut all = slice_properties(name, parent);
        all.extend_from_slice(props);
        self.call("StartTransientUnit", name, Op::Start { name: name.to_owned(), props: all })
    }

    fn set_properties(&self, name: &str, props: &[Property]) -> Result<(), Error> {
        if props.is_empty() {
            return Ok(());
        }
        self.call("SetUnitProperties", name, Op::Set { name: name.to_owned(), props: props.to_vec() }).map(|_| ())
    }

    fn stop_unit(&self, name: &str) -> Result<(), Error> {
        self.call("StopUnit", name, Op::Stop { name: name.to_owned() }).map(|_| ())
    }
}

/// What every slice the driver starts carries (libcontainer's `Apply` for a slice):
/// a description, `Wants=` and `After=`-free ordering on its parent, no default
/// dependencies, and the accounting that makes systemd create its cgroup in each
/// controller.
#[must_use]
pub fn slice_properties(name: &str, parent: &str) -> Vec<Property> {
    let mut props = vec![Property::Str("Description", format!("swiftlet cgroup {name}"))];
    if parent != "-.slice" {
        props.push(Property::Strs("Wants", vec![parent.to_owned()]));
    }
    props.extend([
        Property::Bool("DefaultDependencies", false),
        Property::Bool("MemoryAccounting", true),
        Property::Bool("CPUAccounting", true),
        Property::Bool("IOAccounting", true),
        Property::Bool("TasksAccounting", true),
    ]);
    props
}

/// The limits of `cfg` as unit properties (libcontainer's `genV1ResourcesProperties` /
/// `genV2ResourcesProperties`): cpu weight, quota per second and its period, memory and
/// task limits; unset values are left out, unbounded ones are systemd's infinity.
#[must_use]
pub fn resource_properties(cfg: &PodResourceConfig, unified: bool) -> Vec<Property> {
    const INFINITY: u64 = u64::MAX;
    let mut props = Vec::new();
    if let Some(shares) = cfg.cpu_shares.filter(|s| *s != 0) {
        if unified {
            props.push(Property::U64("CPUWeight", resources::cpu_shares_to_cpu_weight(shares)));
        } else {
            props.push(Property::U64("CPUShares", shares));
        }
    }
    let quota = cfg.cpu_quota.unwrap_or(0);
    let period = cfg.cpu_period.unwrap_or(0);
    if quota != 0 || period != 0 {
        let period_us = Some(period).filter(|p| *p != 0);
        if let Some(p) = period_us {
            props.push(Property::U64("CPUQuotaPeriodUSec", p));
        }
        props.push(Property::U64("CPUQuotaPerSecUSec", quota_per_sec(quota, period_us.unwrap_or(100_000))));
    }
    if let Some(limit) = cfg.memory_limit.filter(|m| *m != 0) {
        let value = u64::try_from(limit).unwrap_or(INFINITY);
        props.push(Property::U64(if unified { "MemoryMax" } else { "MemoryLimit" }, value));
    }
    if let Some(limit) = cfg.pids_limit.filter(|p| *p > 0 || *p == -1) {
        props.push(Property::U64("TasksMax", u64::try_from(limit).unwrap_or(INFINITY)));
    }
    props
}

/// systemd's `CPUQuotaPerSecUSec` for a CFS quota and period in µs: the share of a second,
/// rounded up to 10 ms as systemd stores it (libcontainer's `addCpuQuota`); infinity for
/// no quota.
#[must_use]
pub fn quota_per_sec(quota: i64, period_us: u64) -> u64 {
    let Ok(quota) = u64::try_from(quota) else { return u64::MAX };
    if quota == 0 || period_us == 0 {
        return u64::MAX;
    }
    let per_sec = quota.saturating_mul(1_000_000) / period_us;
    per_sec.div_ceil(10_000) * 10_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_become_v1_and_v2_properties() {
        let cfg = PodResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(128 << 20),
            pids_limit: Some(1024),
            ..PodResourceConfig::default()
        };
        assert_eq!(
            resource_properties(&cfg, false),
            [
                Property::U64("CPUShares", 512),
                Property::U64("CPUQuotaPeriodUSec", 100_000),
                Property::U64("CPUQuotaPerSecUSec", 500_000),
                Property::U64("MemoryLimit", 128 << 20),
                Property::U64("TasksMax", 1024),
            ]
        );
        let v2 = resource_properties(&cfg, true);
        assert_eq!(v2[0], Property::U64("CPUWeight", resources::cpu_shares_to_cpu_weight(512)));
        assert_eq!(v2[3], Property::U64("MemoryMax", 128 << 20));
    }

    #[test]
    fn unbounded_and_unset_limits() {
        let cfg = PodResourceConfig {
            cpu_quota: Some(-1),
            cpu_period: Some(100_000),
            memory_limit: Some(-1),
            pids_limit: Some(-1),
            ..PodResourceConfig::default()
        };
        let props = resource_properties(&cfg, false);
        assert!(props.contains(&Property::U64("CPUQuotaPerSecUSec", u64::MAX)), "{props:?}");
        assert!(props.contains(&Property::U64("MemoryLimit", u64::MAX)), "{props:?}");
        assert!(props.contains(&Property::U64("TasksMax", u64::MAX)), "{props:?}");
        assert!(resource_properties(&PodResourceConfig::default(), true).is_empty());
    }

    /// libcontainer's rounding: 1 ms of a 100 ms period is 1 % of a second, 10 ms.
    #[test]
    fn quota_per_second_rounds_up_to_ten_milliseconds() {
        assert_eq!(quota_per_sec(1_000, 100_000), 10_000);
        assert_eq!(quota_per_sec(1_500, 100_000), 20_000);
        assert_eq!(quota_per_sec(200_000, 100_000), 2_000_000);
        assert_eq!(quota_per_sec(0, 100_000), u64::MAX);
    }

    #[test]
    fn slices_want_their_parent_and_turn_accounting_on() {
        let props = slice_properties("kubepods-burstable.slice", "kubepods.slice");
        assert!(props.contains(&Property::Strs("Wants", vec!["kubepods.slice".into()])));
        assert!(props.contains(&Property::Bool("DefaultDependencies", false)));
        assert!(!slice_properties("kubepods.slice", "-.slice").iter().any(|p| p.name() == "Wants"));
    }

    #[test]
    fn an_unreachable_bus_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let address = format!("unix:path={}", dir.path().join("private").display());
        let err = DbusSystemd::connect_to(&address, true).unwrap_err().to_string();
        assert!(err.starts_with(&format!("cannot connect to systemd over D-Bus at {address}: ")), "{err}");
    }

    #[test]
    fn the_bus_is_the_environment_then_the_system_bus_then_the_private_socket() {
        assert_eq!(default_address(Some("unix:path=/x".into()), true), ("unix:path=/x".into(), false));
        assert_eq!(default_address(None, true), (format!("unix:path={SYSTEM_BUS_SOCKET}"), false));
        assert_eq!(default_address(Some(String::new()), false), (format!("unix:path={PRIVATE_SOCKET}"), true));
    }
}
