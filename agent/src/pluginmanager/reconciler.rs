//! The actual state of the world (which plugins are registered, through which socket) and
//! the loop that brings it to the desired state (upstream `reconciler`): each pass
//! deregisters the plugins whose socket went away or was replaced, and starts registering
//! the sockets that have no plugin yet. The loop alone owns both states; the operations
//! run as tasks and report back to it, at most one per socket at a time.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::Handlers;
use super::desired::{Change, DesiredState};
use super::metrics::{ACTUAL_STATE, DESIRED_STATE, PluginManagerMetrics, TotalPluginsLabels};
use super::operation::{self, RegisterError, Registered, Timeouts};

/// The wait after a socket's first failed registration; it doubles with each further
/// failure up to [`MAX_BACKOFF`] (upstream's operation backoff: 500 ms to 2 min 2 s).
const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(122);

/// Where one socket is in its life. A socket with no entry has nothing under way and no
/// plugin registered.
#[derive(Debug)]
enum SocketState {
    /// A registration of this generation of the socket is under way; `failures` counts
    /// the attempts on it that failed before.
    Registering { generation: u64, failures: u32 },
    /// The handler accepted the plugin and the plugin was told so.
    Registered { generation: u64, plugin: Registered },
    /// The last attempt on this generation failed; the next one starts at the first pass
    /// from `retry_at` on, unless the socket goes away or is replaced first (a new
    /// generation starts afresh).
    BackingOff { generation: u64, failures: u32, retry_at: Instant },
    /// The handler is being told that the plugin is gone. Nothing else starts on this
    /// socket before that returns: a replacement plugin registers only after its
    /// predecessor was deregistered.
    Deregistering,
}

/// What an operation task returns.
#[derive(Debug)]
enum Outcome {
    Registration(Result<Registered, RegisterError>),
    Deregistration,
}

/// The actual state and the operations under way.
#[derive(Debug)]
pub(super) struct Reconciler {
    handlers: Arc<Handlers>,
    timeouts: Timeouts,
    sockets: BTreeMap<PathBuf, SocketState>,
    tasks: JoinSet<Outcome>,
    /// The socket each task works on.
    task_sockets: HashMap<tokio::task::Id, PathBuf>,
}

impl Reconciler {
    pub(super) fn new(handlers: Handlers, timeouts: Timeouts) -> Self {
        Self {
            handlers: Arc::new(handlers),
            timeouts,
            sockets: BTreeMap::new(),
            tasks: JoinSet::new(),
            task_sockets: HashMap::new(),
        }
    }

    /// Walks the directory, then reconciles after every change inotify reports, every
    /// finished operation, and every `period` (when the directory is walked again, in
    /// case inotify missed something), until `cancel`.
    pub(super) async fn run(
        mut self,
        mut desired: DesiredState,
        mut changes: mpsc::UnboundedReceiver<Change>,
        period: Duration,
        metrics: PluginManagerMetrics,
        cancel: CancellationToken,
    ) {
        desired.rescan();
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut published = HashSet::new();
        loop {
            self.reconcile(&desired, Instant::now());
            metrics.publish(&mut published, self.series(&desired));
            tokio::select! {
                () = cancel.cancelled() => break,
                Some(done) = self.tasks.join_next_with_id() => {
                    let (id, outcome) = match done {
                        Ok((id, outcome)) => (id, Ok(outcome)),
                        Err(e) => (e.id(), Err(e)),
                    };
                    if let Some(socket) = self.task_sockets.remove(&id) {
                        self.finished(socket, outcome, Instant::now());
                    }
                }
                Some(change) = changes.recv() => {
                    desired.apply(change);
                    while let Ok(change) = changes.try_recv() {
                        desired.apply(change);
                    }
                }
                _ = tick.tick() => desired.rescan(),
            }
        }
        // Operations under way are dropped: a plugin left unregistered by that is found
        // again by the next start's walk, and a handler's own shutdown follows the agent's.
        self.tasks.shutdown().await;
    }

    /// One pass: deregister what is gone or replaced, register what is new or due again.
    fn reconcile(&mut self, desired: &DesiredState, now: Instant) {
        let wanted = |socket: &PathBuf| desired.get(socket).map(|d| d.generation);
        let mut stale = Vec::new();
        self.sockets.retain(|socket, state| match state {
            SocketState::Registered { generation, .. } => {
                if wanted(socket) != Some(*generation) {
                    stale.push(socket.clone());
                }
                true
            }
            // Gone or replaced before it ever registered: nothing to undo.
            SocketState::BackingOff { generation, .. } => wanted(socket) == Some(*generation),
            SocketState::Registering { .. } | SocketState::Deregistering => true,
        });
        for socket in stale {
            let Some(SocketState::Registered { plugin, .. }) =
                self.sockets.insert(socket.clone(), SocketState::Deregistering)
            else {
                unreachable!("only registered sockets are stale");
            };
            tracing::info!(socket = %socket.display(), plugin_type = %plugin.plugin_type, name = %plugin.name, "deregistering plugin");
            self.spawn(socket, async move {
                operation::deregister(&plugin).await;
                Outcome::Deregistration
            });
        }

        for (socket, plugin) in desired.iter() {
            let failures = match self.sockets.get(socket) {
                None => 0,
                Some(SocketState::BackingOff { failures, retry_at, .. }) if *retry_at <= now => *failures,
                Some(_) => continue,
            };
            self.sockets.insert(socket.clone(), SocketState::Registering { generation: plugin.generation, failures });
            tracing::debug!(socket = %socket.display(), failures, "registering plugin");
            let (handlers, timeouts, path) = (Arc::clone(&self.handlers), self.timeouts, socket.clone());
            self.spawn(socket.clone(), async move {
                Outcome::Registration(operation::register(&path, &handlers, timeouts).await)
            });
        }
    }

    fn spawn(&mut self, socket: PathBuf, op: impl Future<Output = Outcome> + Send + 'static) {
        let span = tracing::info_span!("plugin_socket", socket = %socket.display());
        let id = self.tasks.spawn(op.instrument(span)).id();
        self.task_sockets.insert(id, socket);
    }

    /// Records how the operation on `socket` ended.
    fn finished(&mut self, socket: PathBuf, outcome: Result<Outcome, JoinError>, now: Instant) {
        match (self.sockets.remove(&socket), outcome) {
            (Some(SocketState::Registering { generation, failures }), outcome) => {
                let error = match outcome {
                    Ok(Outcome::Registration(Ok(plugin))) => {
                        tracing::info!(
                            socket = %socket.display(), plugin_type = %plugin.plugin_type, name = %plugin.name,
                            endpoint = %plugin.endpoint.display(), "plugin registered"
                        );
                        self.sockets.insert(socket, SocketState::Registered { generation, plugin });
                        return;
                    }
                    Ok(Outcome::Registration(Err(e))) => chain(&e),
                    Ok(Outcome::Deregistration) => unreachable!("a registration task registers"),
                    Err(e) => format!("the registration task failed: {e}"),
                };
                let failures = failures.saturating_add(1);
                let wait = backoff(failures);
                tracing::warn!(socket = %socket.display(), %error, retry_in = ?wait, "plugin not registered");
                self.sockets.insert(socket, SocketState::BackingOff { generation, failures, retry_at: now + wait });
            }
            (Some(SocketState::Deregistering), outcome) => match outcome {
                Ok(_) => tracing::info!(socket = %socket.display(), "plugin deregistered"),
                Err(e) => tracing::error!(socket = %socket.display(), error = %e, "plugin deregistration task failed"),
            },
            (state, _) => {
                tracing::error!(socket = %socket.display(), ?state, "operation ended on a socket with none under way");
                if let Some(state) = state {
                    self.sockets.insert(socket, state);
                }
            }
        }
    }

    /// The `plugin_manager_total_plugins` series of the two states.
    fn series(&self, desired: &DesiredState) -> HashSet<TotalPluginsLabels> {
        let label = |socket: &PathBuf, state| TotalPluginsLabels { socket_path: socket.display().to_string(), state };
        let registered = self
            .sockets
            .iter()
            .filter(|(_, s)| matches!(s, SocketState::Registered { .. }))
            .map(|(socket, _)| label(socket, ACTUAL_STATE));
        desired.iter().map(|(socket, _)| label(socket, DESIRED_STATE)).chain(registered).collect()
    }
}

/// The wait before the next attempt after `failures` failed ones in a row.
fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    INITIAL_BACKOFF.saturating_mul(1 << doublings).min(MAX_BACKOFF)
}

/// An error and its sources, colon-separated, for one log field.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(e) = source {
        s.push_str(": ");
        s.push_str(&e.to_string());
        source = e.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_half_a_second_up_to_two_minutes() {
        let waits: Vec<_> = (1..=10).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(waits, [500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 122_000, 122_000]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn chain_joins_sources() {
        let e = RegisterError::GetInfo(tonic::Status::unavailable("connection refused"));
        assert!(chain(&e).starts_with("GetInfo failed: "), "{}", chain(&e));
        assert!(chain(&e).contains("connection refused"), "{}", chain(&e));
    }
}
