//! A device plugin for tests (`v1beta1`, as real plugins speak it): it serves
//! `DevicePlugin` on its own socket in the agent's device plugin directory, registers on
//! `kubelet.sock`, and registers again (on a fresh socket) whenever `kubelet.sock` is
//! created anew, i.e. after an agent restart.
//!
//! Its devices are `dev-0`..`dev-<N-1>`. `Allocate` exposes device `dev-<i>` as the host
//! node [`TestDevicePluginOptions::host_path`] at `/dev/fake<i>`, sets `FAKE_DEVICES`
//! (the ids, comma-separated) plus the configured variables, and adds the configured
//! mount. `GetPreferredAllocation` prefers the highest-numbered devices, so a test can
//! tell that the agent asked. Devices can be marked unhealthy; every call is recorded.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::{Stream, StreamExt as _};
use swiftlet::cm::devicemanager::proto::device_plugin_server::{DevicePlugin, DevicePluginServer};
use swiftlet::cm::devicemanager::proto::registration_client::RegistrationClient;
use swiftlet::cm::devicemanager::proto::{self, Empty};
use swiftlet::cm::devicemanager::{HEALTHY, KUBELET_SOCKET, UNHEALTHY, VERSION, connect_plugin};
use tokio::sync::watch;
use tokio_stream::wrappers::{UnixListenerStream, WatchStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// What the plugin advertises and hands out.
#[derive(Clone, Debug)]
pub struct TestDevicePluginOptions {
    /// The extended resource, e.g. `swiftlet.test/fake`.
    pub resource_name: String,
    /// How many devices.
    pub count: usize,
    /// The host device node behind every device (default `/dev/null`).
    pub host_path: String,
    /// Extra environment variables in every allocation.
    pub envs: BTreeMap<String, String>,
    /// A mount in every allocation: (host path, container path), read-only.
    pub mount: Option<(PathBuf, String)>,
    /// Ask for `PreStartContainer` calls.
    pub pre_start_required: bool,
    /// Offer `GetPreferredAllocation`.
    pub preferred_allocation: bool,
    /// The NUMA node reported for every device (none: no topology).
    pub numa_node: Option<i64>,
    /// The plugin's socket file name in the device plugin directory.
    pub endpoint: String,
}

impl Default for TestDevicePluginOptions {
    fn default() -> Self {
        Self {
            resource_name: "swiftlet.test/fake".into(),
            count: 2,
            host_path: "/dev/null".into(),
            envs: BTreeMap::new(),
            mount: None,
            pre_start_required: false,
            preferred_allocation: true,
            numa_node: None,
            endpoint: "swiftlet-test-plugin.sock".into(),
        }
    }
}

/// What the plugin was asked.
#[derive(Debug, Default)]
struct Calls {
    allocate: Vec<Vec<String>>,
    preferred: Vec<proto::ContainerPreferredAllocationRequest>,
    pre_start: Vec<Vec<String>>,
    registrations: usize,
}

#[derive(Debug)]
struct Shared {
    opts: TestDevicePluginOptions,
    devices: watch::Sender<Vec<proto::Device>>,
    calls: Mutex<Calls>,
}

#[derive(Clone, Debug)]
struct Service {
    shared: Arc<Shared>,
    /// Ends this server instance's streams.
    stop: CancellationToken,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<proto::ListAndWatchResponse, Status>> + Send>>;

fn index(id: &str) -> String {
    id.trim_start_matches("dev-").to_owned()
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<proto::DevicePluginOptions>, Status> {
        Ok(Response::new(proto::DevicePluginOptions {
            pre_start_required: self.shared.opts.pre_start_required,
            get_preferred_allocation_available: self.shared.opts.preferred_allocation,
        }))
    }

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<DeviceStream>, Status> {
        let stream = WatchStream::new(self.shared.devices.subscribe())
            .map(|devices| Ok(proto::ListAndWatchResponse { devices }))
            .take_until(self.stop.clone().cancelled_owned());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<proto::PreferredAllocationRequest>,
    ) -> Result<Response<proto::PreferredAllocationResponse>, Status> {
        let mut out = Vec::new();
        for r in request.into_inner().container_requests {
            self.shared.calls.lock().unwrap().preferred.push(r.clone());
            let mut ids = r.must_include_device_i_ds.clone();
            let mut rest: Vec<String> = r.available_device_i_ds.iter().filter(|d| !ids.contains(d)).cloned().collect();
            rest.sort_by_key(|d| std::cmp::Reverse(index(d).parse::<u32>().unwrap_or(0)));
            ids.extend(rest);
            ids.truncate(usize::try_from(r.allocation_size).unwrap_or(0));
            out.push(proto::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(proto::PreferredAllocationResponse { container_responses: out }))
    }

    async fn allocate(
        &self,
        request: Request<proto::AllocateRequest>,
    ) -> Result<Response<proto::AllocateResponse>, Status> {
        let opts = &self.shared.opts;
        let mut out = Vec::new();
        for r in request.into_inner().container_requests {
            self.shared.calls.lock().unwrap().allocate.push(r.devices_ids.clone());
            let mut envs: std::collections::HashMap<String, String> =
                opts.envs.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            envs.insert("FAKE_DEVICES".into(), r.devices_ids.join(","));
            out.push(proto::ContainerAllocateResponse {
                envs,
                mounts: opts
                    .mount
                    .iter()
                    .map(|(host, container)| proto::Mount {
                        container_path: container.clone(),
                        host_path: host.display().to_string(),
                        read_only: true,
                    })
                    .collect(),
                devices: r
                    .devices_ids
                    .iter()
                    .map(|d| proto::DeviceSpec {
                        container_path: format!("/dev/fake{}", index(d)),
                        host_path: opts.host_path.clone(),
                        permissions: "rw".into(),
                    })
                    .collect(),
                annotations: [("swiftlet.test/devices".to_string(), r.devices_ids.join(","))].into(),
                cdi_devices: Vec::new(),
            });
        }
        Ok(Response::new(proto::AllocateResponse { container_responses: out }))
    }

    async fn pre_start_container(
        &self,
        request: Request<proto::PreStartContainerRequest>,
    ) -> Result<Response<proto::PreStartContainerResponse>, Status> {
        self.shared.calls.lock().unwrap().pre_start.push(request.into_inner().devices_ids);
        Ok(Response::new(proto::PreStartContainerResponse {}))
    }
}

/// A running test device plugin. Stop it with [`Self::stop`] (dropping it stops it too).
#[derive(Debug)]
pub struct TestDevicePlugin {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    socket: PathBuf,
    /// The short name the sockets are reached by, when the directory's is too long.
    _alias: Option<ShortAlias>,
}

/// A unix socket's path holds at most 107 bytes (`sun_path`), and the device plugin
/// directory of an agent in the node container is deeper than that from the host: a
/// symlink to the directory in `/tmp` gives the sockets a short path (the kernel follows
/// it; the socket files are made in the directory itself). Removed when dropped.
#[derive(Debug)]
struct ShortAlias(PathBuf);

impl ShortAlias {
    /// Longest socket path used as it is.
    const MAX: usize = 100;

    /// `dir` itself when its sockets' paths fit, else an alias for it.
    fn of(dir: &Path) -> Result<(PathBuf, Option<Self>)> {
        if dir.as_os_str().len() + 40 <= Self::MAX {
            return Ok((dir.to_path_buf(), None));
        }
        let alias = std::env::temp_dir().join(format!("swl-dp-{:016x}", rand::random::<u64>()));
        std::os::unix::fs::symlink(dir, &alias).with_context(|| format!("linking {}", alias.display()))?;
        Ok((alias.clone(), Some(Self(alias))))
    }
}

impl Drop for ShortAlias {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl TestDevicePlugin {
    /// Serves and registers with the agent whose device plugin directory is `dir`
    /// (waiting up to 30 s for `kubelet.sock`); keeps registering again after agent
    /// restarts until stopped.
    ///
    /// # Errors
    /// When the first registration does not succeed.
    pub async fn start(dir: &Path, opts: TestDevicePluginOptions) -> Result<Self> {
        let devices = (0..opts.count)
            .map(|i| proto::Device {
                id: format!("dev-{i}"),
                health: HEALTHY.into(),
                topology: opts.numa_node.map(|n| proto::TopologyInfo { nodes: vec![proto::NumaNode { id: n }] }),
            })
            .collect();
        let shared = Arc::new(Shared { opts, devices: watch::Sender::new(devices), calls: Mutex::default() });
        let shutdown = CancellationToken::new();
        let (reach, alias) = ShortAlias::of(dir)?;
        let kubelet = reach.join(KUBELET_SOCKET);
        let socket = reach.join(&shared.opts.endpoint);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !kubelet.exists() {
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "{} did not appear", kubelet.display());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (instance, inode) = serve_and_register(&shared, &kubelet, &socket).await?;
        let task = tokio::spawn(supervise(shared.clone(), kubelet, socket.clone(), shutdown.clone(), instance, inode));
        Ok(Self { shared, shutdown, task: Some(task), socket, _alias: alias })
    }

    /// Marks device `dev-<i>` healthy or not (sent to the agent at once).
    pub fn set_healthy(&self, i: usize, healthy: bool) {
        self.shared.devices.send_modify(|d| d[i].health = if healthy { HEALTHY } else { UNHEALTHY }.into());
    }

    /// The device ids of every `Allocate` call, in order.
    #[must_use]
    pub fn allocations(&self) -> Vec<Vec<String>> {
        self.shared.calls.lock().unwrap().allocate.clone()
    }

    /// The `GetPreferredAllocation` requests, in order.
    #[must_use]
    pub fn preferred_requests(&self) -> Vec<proto::ContainerPreferredAllocationRequest> {
        self.shared.calls.lock().unwrap().preferred.clone()
    }

    /// The device ids of every `PreStartContainer` call, in order.
    #[must_use]
    pub fn pre_starts(&self) -> Vec<Vec<String>> {
        self.shared.calls.lock().unwrap().pre_start.clone()
    }

    /// How many times the plugin registered.
    #[must_use]
    pub fn registrations(&self) -> usize {
        self.shared.calls.lock().unwrap().registrations
    }

    /// Stops serving (the agent sees `ListAndWatch` end) and removes the socket.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for TestDevicePlugin {
    fn drop(&mut self) {
        self.shutdown.cancel();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Tells one `kubelet.sock` from the next: the inode alone is not enough, a new file may
/// get the number of the one just removed.
type FileId = (u64, i64, i64);

fn identity(m: &std::fs::Metadata) -> FileId {
    (m.ino(), m.ctime(), m.ctime_nsec())
}

/// Binds the plugin socket, serves on it, and registers; returns the instance's stop
/// token and the inode of the `kubelet.sock` it registered with.
async fn serve_and_register(
    shared: &Arc<Shared>,
    kubelet: &Path,
    socket: &Path,
) -> Result<(CancellationToken, FileId)> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))?;
    let stop = CancellationToken::new();
    let svc = DevicePluginServer::new(Service { shared: shared.clone(), stop: stop.clone() });
    let until = stop.clone();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .serve_with_incoming_shutdown(svc, UnixListenerStream::new(listener), until.cancelled_owned())
            .await;
    });
    match register(shared, kubelet, socket).await {
        Ok(inode) => Ok((stop, inode)),
        Err(e) => {
            stop.cancel();
            Err(e)
        }
    }
}

async fn register(shared: &Arc<Shared>, kubelet: &Path, socket: &Path) -> Result<FileId> {
    let inode = identity(&std::fs::metadata(kubelet)?);
    let channel = connect_plugin(kubelet).await.with_context(|| format!("connecting to {}", kubelet.display()))?;
    let endpoint = socket.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
    RegistrationClient::new(channel)
        .register(proto::RegisterRequest {
            version: VERSION.into(),
            endpoint,
            resource_name: shared.opts.resource_name.clone(),
            options: Some(proto::DevicePluginOptions {
                pre_start_required: shared.opts.pre_start_required,
                get_preferred_allocation_available: shared.opts.preferred_allocation,
            }),
        })
        .await
        .map_err(|s| anyhow::anyhow!("registration refused: {}", s.message()))?;
    shared.calls.lock().unwrap().registrations += 1;
    Ok(inode)
}

/// Registers again whenever `kubelet.sock` is a new file (as real plugins watch for it).
async fn supervise(
    shared: Arc<Shared>,
    kubelet: PathBuf,
    socket: PathBuf,
    shutdown: CancellationToken,
    mut instance: CancellationToken,
    mut inode: FileId,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        let Ok(now) = std::fs::metadata(&kubelet).map(|m| identity(&m)) else { continue };
        if now == inode {
            continue;
        }
        instance.cancel();
        match serve_and_register(&shared, &kubelet, &socket).await {
            Ok((i, n)) => {
                instance = i;
                inode = n;
            }
            // The agent may not be serving yet; try again on the next tick.
            Err(e) => eprintln!("test device plugin: registering again failed: {e:#}"),
        }
    }
    instance.cancel();
}
