//! [`Agent::spawn`] starts the tasks [`super::build`] made; [`Running::wait`] waits for
//! shutdown and gives them their grace period.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::{Agent, Error, Fatal, SHUTDOWN_GRACE, Task};

impl Agent {
    /// Starts every task under the agent's tracker, in the order the agent has always
    /// started them (the sync loop and the server last).
    pub fn spawn(self) -> Running {
        let a = self;
        let tracker = a.tracker;
        let spawn = |task: Task| {
            tracker.spawn(task);
        };
        a.client_certificate.into_iter().chain(a.serving_certificate).chain(a.events).for_each(spawn);
        spawn(a.runtime_state);
        a.stats.into_iter().chain(a.static_pods).for_each(spawn);
        if let Some(api) = a.api {
            [api.connections, api.pods, api.mirror_pods, api.node_status].into_iter().for_each(spawn);
        }
        a.status_writer.into_iter().for_each(spawn);
        spawn(a.pleg);
        a.event_api.into_iter().chain(a.image_gc).for_each(spawn);
        spawn(a.container_gc);
        if let Some(eviction) = a.eviction {
            spawn(eviction.manager);
            match eviction.kernel_signals {
                Some((signals, settings)) => {
                    crate::pressure::spawn_watchers(&tracker, &signals, &settings, &a.shutdown);
                }
                None => {
                    tracing::info!("--eviction-kernel-signals=false: memory pressure is seen by the 10 s pass only");
                }
            }
        }
        a.container_logs.into_iter().chain(a.node_shutdown).for_each(spawn);
        spawn(a.plugin_manager);
        spawn(a.cpu_manager);
        spawn(a.sync_loop);
        let (server, server_shutdown) = (a.server, a.shutdown.clone());
        let server =
            tracker.spawn(async move { server.run(server_shutdown).await }.instrument(tracing::info_span!("server")));
        Running { tracker, shutdown: a.shutdown, fatal: a.fatal, server }
    }
}

/// The agent with every task started.
#[derive(Debug)]
pub struct Running {
    tracker: TaskTracker,
    shutdown: CancellationToken,
    fatal: Fatal,
    server: tokio::task::JoinHandle<crate::server::Result<()>>,
}

impl Running {
    /// Waits for `shutdown` (or the server's end), then gives every task
    /// [`SHUTDOWN_GRACE`] to finish; returns the error a task stopped the agent with, or
    /// the server's.
    pub async fn wait(self) -> Result<(), Error> {
        let Self { tracker, shutdown, fatal, server } = self;
        let server_result = tokio::select! {
            () = shutdown.cancelled() => None,
            r = server => Some(r),
        };
        shutdown.cancel();
        tracker.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait()).await.is_err() {
            tracing::warn!("some tasks did not stop within {SHUTDOWN_GRACE:?}");
        }
        if let Some(e) = fatal.take() {
            return Err(e);
        }
        if let Some(Ok(Err(e))) = server_result {
            return Err(e.into());
        }
        tracing::info!("swiftlet stopped");
        Ok(())
    }
}
