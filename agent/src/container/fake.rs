//! [`FakeRuntime`]: an in-memory CRI for unit tests of the modules above the runtime.
//! Containers run until told otherwise ([`FakeRuntime::exit_container`]); every call is
//! recorded so tests can assert what the kubelet asked for.
//!
//! `ExecSync` answers, in order of precedence: the next response queued for the container
//! ([`FakeRuntime::push_exec_response`]), the handler ([`FakeRuntime::set_exec_handler`]),
//! or exit code 0 with no output for a running container (`NotFound` for an unknown one,
//! an error for a stopped one, as containerd answers).
//!
//! Images: the node's images ([`FakeRuntime::with_images`], [`FakeRuntime::add_image`])
//! are found by id, repo tag (`busybox` and `busybox:latest` are the same reference, as
//! containerd resolves them) or repo digest. `PullImage` runs the pull hook first
//! ([`FakeRuntime::set_pull_hook`]: it may wait, or fail the pull), then copies the image
//! from the fake registry ([`FakeRuntime::add_registry_image`]) to the node, or fails with
//! `Unavailable` when the registry has no such image. `RemoveImage` fails for the images
//! told to ([`FakeRuntime::fail_remove_image`]); `ImageFsInfo` answers what
//! [`FakeRuntime::set_image_fs_info`] set, or one filesystem holding the images.
//!
//! `RunPodSandbox`, `CreateContainer` and `StartContainer` first run the start hook
//! ([`FakeRuntime::set_start_hook`]), which may wait to keep the call in flight.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use futures::future::BoxFuture;

use super::backoff::{Clock, SystemClock};
use super::{Result, RuntimeService, api};

/// Answers `ExecSync` calls: (container id, command, timeout) → response.
pub type ExecHandler = dyn Fn(&str, &[String], Duration) -> Result<api::ExecSyncResponse> + Send + Sync;

/// Runs at the start of every `PullImage`: (image, credentials) → `Ok` to go on with the
/// pull, `Err` to fail it. It may wait (a sleep, a `Notify`) to keep the pull in flight.
pub type PullHook = dyn Fn(&str, Option<&api::AuthConfig>) -> BoxFuture<'static, Result<()>> + Send + Sync;

/// Runs at the start of `RunPodSandbox`, `CreateContainer` and `StartContainer`, with the
/// recorded call name (`run_podsandbox`, `create_container`, `start_container`). It may
/// wait (a sleep, a `Notify`) to keep the call in flight.
pub type StartHook = dyn Fn(&'static str) -> BoxFuture<'static, ()> + Send + Sync;

/// One recorded `PullImage` call.
#[derive(Clone, PartialEq)]
pub struct PullCall {
    pub image: String,
    pub auth: Option<api::AuthConfig>,
}

impl std::fmt::Debug for PullCall {
    // Never print credentials, not even in tests.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullCall")
            .field("image", &self.image)
            .field("auth", &self.auth.as_ref().map(|a| &a.server_address))
            .finish()
    }
}

/// The node's images, the fake registry, and what was asked of them.
#[derive(Default)]
struct Images {
    local: Vec<api::Image>,
    registry: Vec<api::Image>,
    pull_hook: Option<Arc<PullHook>>,
    pulls: Vec<PullCall>,
    failing_removals: Vec<String>,
    removed: Vec<String>,
    fs_info: Option<api::ImageFsInfoResponse>,
    /// `ImageFsInfo` answers `Unimplemented` (a runtime without it).
    fs_info_unimplemented: bool,
}

impl std::fmt::Debug for Images {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Images")
            .field("local", &self.local.iter().map(|i| &i.id).collect::<Vec<_>>())
            .field("registry", &self.registry.iter().map(|i| &i.id).collect::<Vec<_>>())
            .field("pull_hook", &self.pull_hook.is_some())
            .field("pulls", &self.pulls)
            .field("removed", &self.removed)
            .finish_non_exhaustive()
    }
}

/// `name` with the default tag when it has neither tag nor digest, so that `busybox` and
/// `busybox:latest` compare equal.
fn with_default_tag(name: &str) -> String {
    let last = name.rsplit('/').next().unwrap_or(name);
    if name.contains('@') || last.contains(':') { name.to_string() } else { format!("{name}:latest") }
}

fn image_matches(image: &api::Image, name: &str) -> bool {
    image.id == name
        || image.repo_digests.iter().any(|d| d == name)
        || image.repo_tags.iter().any(|t| with_default_tag(t) == with_default_tag(name))
}

/// An image as the fake stores it: id `sha256:<name>`, tagged `name`, 1024 bytes.
#[must_use]
pub fn fake_image(name: &str) -> api::Image {
    api::Image { id: format!("sha256:{name}"), repo_tags: vec![name.to_string()], size: 1024, ..Default::default() }
}

/// One recorded `ExecSync` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecCall {
    pub container_id: String,
    pub cmd: Vec<String>,
    pub timeout: Duration,
}

/// An exec response for a test: exit code, stdout and stderr.
#[must_use]
pub fn exec_response(exit_code: i32, stdout: &str, stderr: &str) -> api::ExecSyncResponse {
    api::ExecSyncResponse { stdout: stdout.as_bytes().to_vec(), stderr: stderr.as_bytes().to_vec(), exit_code }
}

/// The error a CRI runtime answers when a command outlives its `ExecSync` timeout.
#[must_use]
pub fn exec_deadline_exceeded() -> super::Error {
    super::Error::Rpc {
        operation: "exec_sync",
        status: tonic::Status::deadline_exceeded("failed to exec in container: timeout exceeded"),
    }
}

#[derive(Default)]
struct ExecScript {
    queued: HashMap<String, VecDeque<Result<api::ExecSyncResponse>>>,
    handler: Option<Arc<ExecHandler>>,
    calls: Vec<ExecCall>,
}

impl std::fmt::Debug for ExecScript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecScript")
            .field("queued", &self.queued.keys().collect::<Vec<_>>())
            .field("handler", &self.handler.is_some())
            .field("calls", &self.calls)
            .finish()
    }
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    clock: i64,
    sandboxes: HashMap<String, (api::PodSandboxConfig, i32, i64)>,
    /// The runtime handler each sandbox was run with.
    sandbox_handlers: HashMap<String, String>,
    containers: HashMap<String, api::ContainerStatus>,
    container_sandbox: HashMap<String, String>,
    /// The config each container was created with.
    container_configs: HashMap<String, api::ContainerConfig>,
    /// The image sub paths each container was created with (when it had any).
    image_sub_paths: HashMap<String, super::ImageSubPaths>,
    images: Images,
    calls: Vec<String>,
    /// Names of the containers `StopContainer` stopped, in order.
    stopped: Vec<String>,
    exec: ExecScript,
    /// `ReopenContainerLog` fails with this message.
    reopen_failure: Option<String>,
    /// The runtime is away (a containerd restart): listings fail with `Unavailable`.
    unavailable: bool,
    /// Base of the URLs `Exec`, `Attach` and `PortForward` answer.
    streaming_url: Option<String>,
    /// The streaming requests made so far.
    streaming: Vec<StreamingCall>,
    start_hook: StartHookSlot,
    /// Run at the start of every `ListPodSandbox` ([`FakeRuntime::set_list_hook`]).
    list_hook: StartHookSlot,
    /// Containers whose process is gone but whose exit the runtime has not recorded yet:
    /// the exit code, and how many more `ContainerStatus` calls still show them running.
    lagging_exits: HashMap<String, (i32, u32)>,
}

#[derive(Default)]
struct StartHookSlot(Option<Arc<StartHook>>);

impl std::fmt::Debug for StartHookSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StartHookSlot").field(&self.0.is_some()).finish()
    }
}

/// One recorded `Exec`, `Attach` or `PortForward` call.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamingCall {
    Exec(api::ExecRequest),
    Attach(api::AttachRequest),
    PortForward { sandbox_id: String, ports: Vec<i32> },
}

/// In-memory runtime.
#[derive(Debug)]
pub struct FakeRuntime {
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self { state: Mutex::default(), clock: Arc::new(SystemClock) }
    }
}

/// The fake's streaming URL for `kind` and `id`, or `NotFound` when `exists` is false.
fn streaming_url(s: &State, kind: &str, id: &str, exists: bool) -> Result<String> {
    if !exists {
        return Err(not_found(id));
    }
    let base = s.streaming_url.as_deref().unwrap_or("http://127.0.0.1:10010");
    Ok(format!("{base}/{kind}/{id}"))
}

fn unavailable(operation: &'static str) -> super::Error {
    super::Error::Rpc { operation, status: tonic::Status::unavailable("connection refused") }
}

fn not_found(what: &str) -> super::Error {
    super::Error::Rpc { operation: "fake", status: tonic::Status::not_found(format!("{what} not found")) }
}

/// What containerd 1.6 answers a kill of a container whose exit it is still recording.
fn exit_in_flight(operation: &'static str, id: &str) -> super::Error {
    let message = format!("failed to kill container {id:?}: ttrpc: closed: unknown");
    super::Error::Rpc { operation, status: tonic::Status::unknown(message) }
}

impl FakeRuntime {
    /// A runtime that has these images.
    #[must_use]
    pub fn with_images(images: &[&str]) -> Self {
        let rt = Self::default();
        rt.state.lock().unwrap().images.local = images.iter().map(|i| fake_image(i)).collect();
        rt
    }

    /// Puts `image` on the node (replacing an image with the same id).
    pub fn add_image(&self, image: api::Image) {
        let mut s = self.state.lock().unwrap();
        s.images.local.retain(|i| i.id != image.id);
        s.images.local.push(image);
    }

    /// The images on the node.
    #[must_use]
    pub fn images(&self) -> Vec<api::Image> {
        self.state.lock().unwrap().images.local.clone()
    }

    /// Makes `image` pullable: a pull of one of its tags or digests copies it to the node.
    pub fn add_registry_image(&self, image: api::Image) {
        self.state.lock().unwrap().images.registry.push(image);
    }

    /// Runs `hook` at the start of every `PullImage` (see [`PullHook`]).
    pub fn set_pull_hook(
        &self,
        hook: impl Fn(&str, Option<&api::AuthConfig>) -> BoxFuture<'static, Result<()>> + Send + Sync + 'static,
    ) {
        self.state.lock().unwrap().images.pull_hook = Some(Arc::new(hook));
    }

    /// Runs `hook` at the start of every sandbox or container start (see [`StartHook`]).
    pub fn set_start_hook(&self, hook: impl Fn(&'static str) -> BoxFuture<'static, ()> + Send + Sync + 'static) {
        self.state.lock().unwrap().start_hook = StartHookSlot(Some(Arc::new(hook)));
    }

    /// Runs `hook` at the start of every `ListPodSandbox` (the first call of a pod
    /// status read): it may wait, to keep the runtime from answering.
    pub fn set_list_hook(&self, hook: impl Fn(&'static str) -> BoxFuture<'static, ()> + Send + Sync + 'static) {
        self.state.lock().unwrap().list_hook = StartHookSlot(Some(Arc::new(hook)));
    }

    /// Runs the start hook, if any, without holding the lock.
    async fn start_hook(&self, call: &'static str) {
        let hook = self.state.lock().unwrap().start_hook.0.clone();
        if let Some(hook) = hook {
            hook(call).await;
        }
    }

    /// The `PullImage` calls made so far, in order.
    #[must_use]
    pub fn pull_calls(&self) -> Vec<PullCall> {
        self.state.lock().unwrap().images.pulls.clone()
    }

    /// Makes `RemoveImage` of the image with this id fail.
    pub fn fail_remove_image(&self, id: &str) {
        self.state.lock().unwrap().images.failing_removals.push(id.to_string());
    }

    /// What `RemoveImage` removed so far, in order (as asked for: id or reference).
    #[must_use]
    pub fn removed_images(&self) -> Vec<String> {
        self.state.lock().unwrap().images.removed.clone()
    }

    /// Answers `ImageFsInfo` with `info` from now on.
    pub fn set_image_fs_info(&self, info: api::ImageFsInfoResponse) {
        self.state.lock().unwrap().images.fs_info = Some(info);
    }

    /// Makes `ImageFsInfo` answer `Unimplemented`, as a runtime without it.
    pub fn unimplement_image_fs_info(&self) {
        self.state.lock().unwrap().images.fs_info_unimplemented = true;
    }

    /// Uses `clock` for container start and finish times (paused-time tests).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    fn now_nanos(&self) -> i64 {
        self.clock.now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
    }

    /// How many containers were created so far.
    #[must_use]
    pub fn created_containers(&self) -> usize {
        self.state.lock().unwrap().calls.iter().filter(|c| *c == "create_container").count()
    }

    /// The names of the calls made so far, in order.
    #[must_use]
    pub fn calls(&self) -> Vec<String> {
        self.state.lock().unwrap().calls.clone()
    }

    /// The names of the containers stopped so far, in order.
    #[must_use]
    pub fn stopped_containers(&self) -> Vec<String> {
        self.state.lock().unwrap().stopped.clone()
    }

    /// Makes `ListPodSandbox` and `ListContainers` fail with `Unavailable`, as a stopped
    /// containerd's socket does (or answer again with `false`).
    pub fn set_unavailable(&self, away: bool) {
        self.state.lock().unwrap().unavailable = away;
    }

    /// Makes `ReopenContainerLog` fail with `message` (or succeed again with `None`).
    pub fn fail_reopen_log(&self, message: Option<&str>) {
        self.state.lock().unwrap().reopen_failure = message.map(str::to_owned);
    }

    /// Answers `Exec`, `Attach` and `PortForward` with URLs under `base` (e.g. the address
    /// of a test's streaming server): `<base>/exec/<container id>`, `<base>/attach/<id>`,
    /// `<base>/portforward/<sandbox id>`. Default: `http://127.0.0.1:10010`.
    pub fn set_streaming_url(&self, base: &str) {
        self.state.lock().unwrap().streaming_url = Some(base.trim_end_matches('/').to_owned());
    }

    /// The `Exec`, `Attach` and `PortForward` calls made so far, in order.
    #[must_use]
    pub fn streaming_calls(&self) -> Vec<StreamingCall> {
        self.state.lock().unwrap().streaming.clone()
    }

    /// Makes a running container exit with `code`.
    pub fn exit_container(&self, id: &str, code: i32) {
        let mut s = self.state.lock().unwrap();
        if let Some(c) = s.containers.get_mut(id) {
            c.state = api::ContainerState::ContainerExited as i32;
            c.exit_code = code;
            c.finished_at = self.now_nanos();
            c.reason = if code == 0 { "Completed" } else { "Error" }.into();
        }
    }

    /// Makes a running container's process exit with `code` the way containerd lags
    /// behind the kernel: the runtime still shows it running for the next `polls`
    /// `ContainerStatus` calls, and meanwhile stopping it, or its sandbox, fails as
    /// containerd 1.6 does while it deletes the task (`ttrpc: closed`), and so does
    /// removing it (it is running).
    pub fn exit_container_lagging(&self, id: &str, code: i32, polls: u32) {
        self.state.lock().unwrap().lagging_exits.insert(id.to_owned(), (code, polls));
    }

    /// The config container `id` was created with.
    #[must_use]
    pub fn container_config(&self, id: &str) -> Option<api::ContainerConfig> {
        self.state.lock().unwrap().container_configs.get(id).cloned()
    }

    /// The `Mount.image_sub_path`s container `id` was created with (empty: none).
    #[must_use]
    pub fn image_sub_paths(&self, id: &str) -> super::ImageSubPaths {
        self.state.lock().unwrap().image_sub_paths.get(id).cloned().unwrap_or_default()
    }

    /// The runtime handler of each sandbox run so far, oldest first.
    #[must_use]
    pub fn sandbox_handlers(&self) -> Vec<String> {
        let s = self.state.lock().unwrap();
        let mut ids: Vec<&String> = s.sandbox_handlers.keys().collect();
        ids.sort();
        ids.into_iter().map(|id| s.sandbox_handlers[id].clone()).collect()
    }

    /// Ids of containers with this name, oldest first.
    #[must_use]
    pub fn containers_named(&self, name: &str) -> Vec<String> {
        let s = self.state.lock().unwrap();
        let mut v: Vec<_> = s
            .containers
            .values()
            .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
            .map(|c| (c.created_at, c.id.clone()))
            .collect();
        v.sort();
        v.into_iter().map(|(_, id)| id).collect()
    }

    /// Queues the answer to the next `ExecSync` in container `id` (answers are used in the
    /// order they were queued, before the handler).
    pub fn push_exec_response(&self, id: &str, response: Result<api::ExecSyncResponse>) {
        self.state.lock().unwrap().exec.queued.entry(id.to_string()).or_default().push_back(response);
    }

    /// Answers every `ExecSync` without a queued response with `handler`.
    pub fn set_exec_handler(
        &self,
        handler: impl Fn(&str, &[String], Duration) -> Result<api::ExecSyncResponse> + Send + Sync + 'static,
    ) {
        self.state.lock().unwrap().exec.handler = Some(Arc::new(handler));
    }

    /// The `ExecSync` calls made so far, in order.
    #[must_use]
    pub fn exec_calls(&self) -> Vec<ExecCall> {
        self.state.lock().unwrap().exec.calls.clone()
    }

    fn record(&self, call: &str) -> std::sync::MutexGuard<'_, State> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(call.to_string());
        s
    }
}

#[async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(&self) -> Result<api::VersionResponse> {
        let _s = self.record("version");
        Ok(api::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "0".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self, verbose: bool) -> Result<api::StatusResponse> {
        let _s = self.record("status");
        let info = if verbose {
            HashMap::from([("config".to_string(), r#"{"sandboxImage":"registry.k8s.io/pause:3.9"}"#.to_string())])
        } else {
            HashMap::new()
        };
        Ok(api::StatusResponse { info, ..Default::default() })
    }

    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig, handler: String) -> Result<String> {
        self.start_hook("run_podsandbox").await;
        let mut s = self.record("run_podsandbox");
        s.next_id += 1;
        s.clock += 1;
        let id = format!("{:064x}", s.next_id);
        let created = s.clock;
        s.sandboxes.insert(id.clone(), (config, api::PodSandboxState::SandboxReady as i32, created));
        s.sandbox_handlers.insert(id.clone(), handler);
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut s = self.record("stop_podsandbox");
        if let Some(c) = s.lagging_exits.keys().find(|c| s.container_sandbox.get(*c).is_some_and(|sb| sb == id)) {
            return Err(exit_in_flight("stop_podsandbox", c));
        }
        let Some(sb) = s.sandboxes.get_mut(id) else { return Err(not_found(id)) };
        sb.1 = api::PodSandboxState::SandboxNotready as i32;
        let ids: Vec<String> = s.container_sandbox.iter().filter(|(_, sb)| *sb == id).map(|(c, _)| c.clone()).collect();
        for c in ids {
            if let Some(st) = s.containers.get_mut(&c)
                && st.state == api::ContainerState::ContainerRunning as i32
            {
                st.state = api::ContainerState::ContainerExited as i32;
                st.exit_code = 137;
            }
        }
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut s = self.record("remove_podsandbox");
        s.sandboxes.remove(id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus> {
        let s = self.record("podsandbox_status");
        let (cfg, state, created) = s.sandboxes.get(id).ok_or_else(|| not_found(id))?;
        Ok(api::PodSandboxStatus {
            id: id.into(),
            metadata: cfg.metadata.clone(),
            state: *state,
            created_at: *created,
            // Like containerd: a sandbox on the node's network has no IP of its own.
            network: Some(api::PodSandboxNetworkStatus {
                ip: if host_network(cfg) { String::new() } else { "10.0.0.2".into() },
                additional_ips: vec![],
            }),
            // Like containerd: the namespace options the sandbox was created with.
            linux: Some(api::LinuxPodSandboxStatus {
                namespaces: Some(api::Namespace {
                    options: cfg.linux.as_ref().and_then(|l| l.security_context.as_ref()?.namespace_options.clone()),
                }),
            }),
            labels: cfg.labels.clone(),
            annotations: cfg.annotations.clone(),
            ..Default::default()
        })
    }

    async fn list_pod_sandbox(&self, filter: Option<api::PodSandboxFilter>) -> Result<Vec<api::PodSandbox>> {
        let hook = self.state.lock().unwrap().list_hook.0.clone();
        if let Some(hook) = hook {
            hook("list_podsandbox").await;
        }
        let s = self.record("list_podsandbox");
        if s.unavailable {
            return Err(unavailable("list_podsandbox"));
        }
        let state = filter.as_ref().and_then(|f| f.state.as_ref()).map(|s| s.state);
        let sel = filter.map(|f| f.label_selector).unwrap_or_default();
        Ok(s.sandboxes
            .iter()
            .filter(|(_, (cfg, _, _))| sel.iter().all(|(k, v)| cfg.labels.get(k) == Some(v)))
            .filter(|(_, (_, st, _))| state.is_none_or(|want| *st == want))
            .map(|(id, (cfg, state, created))| api::PodSandbox {
                id: id.clone(),
                metadata: cfg.metadata.clone(),
                state: *state,
                created_at: *created,
                labels: cfg.labels.clone(),
                annotations: cfg.annotations.clone(),
                runtime_handler: String::new(),
            })
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String> {
        self.start_hook("create_container").await;
        let mut s = self.record("create_container");
        if !s.sandboxes.contains_key(sandbox_id) {
            return Err(not_found(sandbox_id));
        }
        // As containerd: a target pid namespace must be a running container of the sandbox.
        let namespaces = config.linux.as_ref().and_then(|l| l.security_context.as_ref()?.namespace_options.as_ref());
        if let Some(ns) = namespaces.filter(|ns| ns.pid == api::NamespaceMode::Target as i32) {
            let target = s
                .containers
                .get(&ns.target_id)
                .filter(|_| s.container_sandbox.get(&ns.target_id).map(String::as_str) == Some(sandbox_id));
            let running = target.is_some_and(|c| c.state == api::ContainerState::ContainerRunning as i32);
            if !running {
                return Err(super::Error::Rpc {
                    operation: "fake",
                    status: tonic::Status::unknown(format!(
                        "invalid target container: container {:?} is not running",
                        ns.target_id
                    )),
                });
            }
        }
        s.next_id += 1;
        s.clock += 1;
        let id = format!("{:064x}", s.next_id);
        let st = api::ContainerStatus {
            id: id.clone(),
            metadata: config.metadata.clone(),
            state: api::ContainerState::ContainerCreated as i32,
            created_at: s.clock,
            image: config.image.clone(),
            image_ref: config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            mounts: config.mounts.clone(),
            // As containerd: the log path the status tells is under the sandbox's directory.
            log_path: if sandbox_config.log_directory.is_empty() || config.log_path.is_empty() {
                config.log_path.clone()
            } else {
                format!("{}/{}", sandbox_config.log_directory, config.log_path)
            },
            ..Default::default()
        };
        s.containers.insert(id.clone(), st);
        s.container_sandbox.insert(id.clone(), sandbox_id.into());
        s.container_configs.insert(id.clone(), config);
        Ok(id)
    }

    async fn create_container_with_image_sub_paths(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
        image_sub_paths: &super::ImageSubPaths,
    ) -> Result<String> {
        let id = self.create_container(sandbox_id, config, sandbox_config).await?;
        if !image_sub_paths.is_empty() {
            self.state.lock().unwrap().image_sub_paths.insert(id.clone(), image_sub_paths.clone());
        }
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        self.start_hook("start_container").await;
        let mut s = self.record("start_container");
        let c = s.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        c.state = api::ContainerState::ContainerRunning as i32;
        c.started_at = self.now_nanos();
        Ok(())
    }

    async fn stop_container(&self, id: &str, _timeout: i64) -> Result<()> {
        let mut s = self.record("stop_container");
        if s.lagging_exits.contains_key(id) {
            return Err(exit_in_flight("stop_container", id));
        }
        let c = s.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        if c.state != api::ContainerState::ContainerExited as i32 {
            c.state = api::ContainerState::ContainerExited as i32;
            c.exit_code = 137;
            c.finished_at = self.now_nanos();
        }
        let name = c.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        s.stopped.push(name);
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        let mut s = self.record("remove_container");
        if s.lagging_exits.contains_key(id) {
            let message =
                format!("failed to set removing state for container {id:?}: container is still running, to stop first");
            return Err(super::Error::Rpc { operation: "remove_container", status: tonic::Status::unknown(message) });
        }
        s.containers.remove(id);
        s.container_sandbox.remove(id);
        s.container_configs.remove(id);
        s.image_sub_paths.remove(id);
        Ok(())
    }

    async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>> {
        let s = self.record("list_containers");
        if s.unavailable {
            return Err(unavailable("list_containers"));
        }
        let state = filter.as_ref().and_then(|f| f.state.as_ref()).map(|s| s.state);
        let sel = filter.map(|f| f.label_selector).unwrap_or_default();
        Ok(s.containers
            .values()
            .filter(|c| sel.iter().all(|(k, v)| c.labels.get(k) == Some(v)))
            .filter(|c| state.is_none_or(|want| c.state == want))
            .map(|c| api::Container {
                id: c.id.clone(),
                pod_sandbox_id: s.container_sandbox.get(&c.id).cloned().unwrap_or_default(),
                metadata: c.metadata.clone(),
                image: c.image.clone(),
                image_ref: c.image_ref.clone(),
                state: c.state,
                created_at: c.created_at,
                labels: c.labels.clone(),
                annotations: c.annotations.clone(),
                image_id: String::new(),
            })
            .collect())
    }

    async fn reopen_container_log(&self, id: &str) -> Result<()> {
        let s = self.record("reopen_container_log");
        let c = s.containers.get(id).ok_or_else(|| not_found(id))?;
        if let Some(message) = &s.reopen_failure {
            return Err(super::Error::Rpc { operation: "fake", status: tonic::Status::unknown(message.clone()) });
        }
        if c.state != api::ContainerState::ContainerRunning as i32 {
            return Err(super::Error::Rpc {
                operation: "fake",
                status: tonic::Status::failed_precondition("container is not running"),
            });
        }
        // Like the runtime: new output goes to a new file at the (absolute) log path.
        let path = std::path::Path::new(&c.log_path);
        if path.is_absolute() {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| super::Error::Rpc { operation: "fake", status: tonic::Status::internal(e.to_string()) })?;
        }
        Ok(())
    }

    async fn update_container_resources(&self, id: &str, linux: api::LinuxContainerResources) -> Result<()> {
        let mut s = self.record("update_container_resources");
        let c = s.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        if c.state != api::ContainerState::ContainerRunning as i32 {
            return Err(super::Error::Rpc {
                operation: "fake",
                status: tonic::Status::failed_precondition("container is not running"),
            });
        }
        c.resources = Some(api::ContainerResources { linux: Some(linux), windows: None });
        Ok(())
    }

    async fn container_status(&self, id: &str) -> Result<api::ContainerStatus> {
        let mut s = self.record("container_status");
        match s.lagging_exits.get_mut(id) {
            Some((_, polls)) if *polls > 0 => *polls -= 1,
            Some(&mut (code, _)) => {
                s.lagging_exits.remove(id);
                drop(s);
                self.exit_container(id, code);
                s = self.state.lock().unwrap();
            }
            None => {}
        }
        s.containers.get(id).cloned().ok_or_else(|| not_found(id))
    }

    async fn image_status(&self, image: &str) -> Result<Option<api::Image>> {
        let s = self.record("image_status");
        Ok(s.images.local.iter().find(|i| image_matches(i, image)).cloned())
    }

    async fn list_images(&self) -> Result<Vec<api::Image>> {
        let s = self.record("list_images");
        Ok(s.images.local.clone())
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        let mut s = self.record("remove_image");
        let failing =
            s.images.local.iter().any(|i| image_matches(i, image) && s.images.failing_removals.contains(&i.id));
        if failing {
            return Err(super::Error::Rpc {
                operation: "remove_image",
                status: tonic::Status::unknown(format!("failed to remove image {image:?}: image is busy")),
            });
        }
        s.images.local.retain(|i| !image_matches(i, image));
        s.images.removed.push(image.to_string());
        Ok(())
    }

    async fn image_fs_info(&self) -> Result<api::ImageFsInfoResponse> {
        let s = self.record("image_fs_info");
        if s.images.fs_info_unimplemented {
            return Err(super::Error::Rpc {
                operation: "image_fs_info",
                status: tonic::Status::unimplemented("ImageFsInfo"),
            });
        }
        if let Some(info) = &s.images.fs_info {
            return Ok(info.clone());
        }
        let used: u64 = s.images.local.iter().map(|i| i.size).sum();
        Ok(api::ImageFsInfoResponse {
            image_filesystems: vec![api::FilesystemUsage {
                timestamp: self.now_nanos(),
                fs_id: Some(api::FilesystemIdentifier { mountpoint: "/var/lib/containerd".into() }),
                used_bytes: Some(api::UInt64Value { value: used }),
                inodes_used: Some(api::UInt64Value { value: s.images.local.len() as u64 }),
            }],
            container_filesystems: Vec::new(),
        })
    }

    async fn exec_sync(&self, id: &str, cmd: Vec<String>, timeout: Duration) -> Result<api::ExecSyncResponse> {
        let handler = {
            let mut s = self.record("exec_sync");
            s.exec.calls.push(ExecCall { container_id: id.to_string(), cmd: cmd.clone(), timeout });
            if let Some(response) = s.exec.queued.get_mut(id).and_then(VecDeque::pop_front) {
                return response;
            }
            if let Some(h) = &s.exec.handler {
                Arc::clone(h)
            } else {
                let c = s.containers.get(id).ok_or_else(|| not_found(id))?;
                if c.state != api::ContainerState::ContainerRunning as i32 {
                    return Err(super::Error::Rpc {
                        operation: "exec_sync",
                        status: tonic::Status::unknown(format!("container {id} is not running")),
                    });
                }
                return Ok(api::ExecSyncResponse::default());
            }
        };
        // Called without the lock: a handler may use the runtime itself.
        handler(id, &cmd, timeout)
    }

    async fn exec(&self, request: api::ExecRequest) -> Result<String> {
        let mut s = self.record("exec");
        let url = streaming_url(&s, "exec", &request.container_id, s.containers.contains_key(&request.container_id))?;
        s.streaming.push(StreamingCall::Exec(request));
        Ok(url)
    }

    async fn attach(&self, request: api::AttachRequest) -> Result<String> {
        let mut s = self.record("attach");
        let url = streaming_url(&s, "attach", &request.container_id, s.containers.contains_key(&request.container_id))?;
        s.streaming.push(StreamingCall::Attach(request));
        Ok(url)
    }

    async fn port_forward(&self, sandbox_id: &str, ports: Vec<i32>) -> Result<String> {
        let mut s = self.record("port_forward");
        let url = streaming_url(&s, "portforward", sandbox_id, s.sandboxes.contains_key(sandbox_id))?;
        s.streaming.push(StreamingCall::PortForward { sandbox_id: sandbox_id.to_owned(), ports });
        Ok(url)
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        _sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String> {
        let hook = {
            let mut s = self.record("pull_image");
            s.images.pulls.push(PullCall { image: image.to_string(), auth: auth.clone() });
            s.images.pull_hook.clone()
        };
        // Awaited without the lock: the hook may take (paused) time.
        if let Some(hook) = hook {
            hook(image, auth.as_ref()).await?;
        }
        let mut s = self.state.lock().unwrap();
        let Some(found) = s.images.registry.iter().find(|i| image_matches(i, image)).cloned() else {
            return Err(super::Error::Rpc {
                operation: "pull_image",
                status: tonic::Status::unavailable(format!("no registry for {image}")),
            });
        };
        s.images.local.retain(|i| i.id != found.id);
        let id = found.id.clone();
        s.images.local.push(found);
        Ok(id)
    }
}

/// Whether a sandbox config asks for the node's network namespace.
fn host_network(cfg: &api::PodSandboxConfig) -> bool {
    let options = cfg.linux.as_ref().and_then(|l| l.security_context.as_ref()?.namespace_options.as_ref());
    options.is_some_and(|o| o.network == api::NamespaceMode::Node as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn running_container(rt: &FakeRuntime) -> String {
        let sandbox = rt.run_pod_sandbox(api::PodSandboxConfig::default(), String::new()).await.unwrap();
        let id = rt
            .create_container(&sandbox, api::ContainerConfig::default(), api::PodSandboxConfig::default())
            .await
            .unwrap();
        rt.start_container(&id).await.unwrap();
        id
    }

    #[tokio::test]
    async fn exec_answers_queue_then_handler_then_default() {
        let rt = FakeRuntime::default();
        let id = running_container(&rt).await;
        let second = Duration::from_secs(1);
        // Default: a running container runs anything with exit code 0.
        assert_eq!(rt.exec_sync(&id, vec!["true".into()], second).await.unwrap(), api::ExecSyncResponse::default());
        rt.exit_container(&id, 0);
        assert!(rt.exec_sync(&id, vec!["true".into()], second).await.is_err(), "not running");
        assert!(rt.exec_sync("nope", vec!["true".into()], second).await.unwrap_err().is_not_found());

        rt.set_exec_handler(|id, cmd, _| Ok(exec_response(cmd.len() as i32, id, "")));
        rt.push_exec_response("nope", Err(exec_deadline_exceeded()));
        rt.push_exec_response("nope", Ok(exec_response(7, "", "")));
        assert!(rt.exec_sync("nope", vec![], second).await.is_err());
        assert_eq!(rt.exec_sync("nope", vec![], second).await.unwrap().exit_code, 7);
        assert_eq!(
            rt.exec_sync("nope", vec!["a".into(), "b".into()], second).await.unwrap(),
            exec_response(2, "nope", "")
        );

        let calls = rt.exec_calls();
        assert_eq!(calls.len(), 6);
        assert_eq!(
            calls[5],
            ExecCall { container_id: "nope".into(), cmd: vec!["a".into(), "b".into()], timeout: second }
        );
        assert_eq!(rt.calls().iter().filter(|c| *c == "exec_sync").count(), 6);
    }
}
