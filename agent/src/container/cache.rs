//! [`RuntimeCache`]: what the node knows of the runtime's pods, in one place (upstream
//! `pkg/kubelet/container` `Cache` and `RuntimeCache`).
//!
//! Writers are the PLEGs and the runtime manager; readers are the pod workers, the sync
//! loop's housekeeping and the stats provider. None of them knows which PLEG runs.
//!
//! - **The listing**: every pod's sandboxes and containers as of the last relist (the
//!   relisting PLEG writes it, alone or as the evented PLEG's safety net); housekeeping
//!   reads it to find what runs without being wanted, the evented PLEG to name the
//!   containers of kernel events.
//! - **Kernel exits** ([`KernelExits`]): exits the evented PLEG saw before the runtime
//!   recorded them. [`RuntimeCache::pod_status`] lays them over the runtime's answer, so
//!   every reader of a pod's status sees them.
//! - **Starts in flight** ([`StartsInFlight`]): the runtime manager marks each sandbox
//!   and container start call under way, the evented PLEG waits on them.
//! - **Pod statuses**: the last status of each pod read through
//!   [`RuntimeCache::pod_status`], with when it was read; [`RuntimeCache::get_newer_than`]
//!   hands one out only if it was read after a given time (upstream `GetNewerThan`, without
//!   its wait: a reader that finds nothing newer reads the runtime itself).
//!   [`RuntimeCache::invalidate`] marks a pod's status stale from the time a change
//!   happened: the sync loop does for every PLEG event before the pod worker hears of it,
//!   so a status read before a change is never taken for one read after it. An exit the
//!   kernel saw and [`KernelExits`] holds ([`RuntimeCache::exit_recorded`]) makes it stale
//!   for a sync's actions as well — a restart is decided on the runtime's answer, and a
//!   runtime that is away (containerd restarting) must not have a failed start count
//!   towards the crash-loop back-off — but laid over the kept status the record *is* the
//!   change: [`RuntimeCache::kept_with_new_exit`] hands the kept status out with it,
//!   whatever its age, for the pod worker to write the exit into the pod's status before
//!   it asks the runtime.
//! - **Changes**: a counter bumped by every PLEG event and every start or stop the
//!   runtime manager makes; the stats provider collects anew when it moved.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::time::Instant;

use super::exits::KernelExits;
use super::pod_status::{RuntimePod, RuntimePodStatus};
use super::starts::StartsInFlight;
use super::{Result, RuntimeService};

/// The runtime's pods as the node last saw them; see the module docs.
#[derive(Debug, Default)]
pub struct RuntimeCache {
    listing: RwLock<Listing>,
    statuses: Mutex<HashMap<String, Entry>>,
    exits: KernelExits,
    starts: Arc<StartsInFlight>,
    changes: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct Listing {
    pods: BTreeMap<String, RuntimePod>,
    at: Option<Instant>,
}

/// One pod's status entry.
#[derive(Debug)]
struct Entry {
    /// The last status read, as the runtime gave it (kernel exits are laid over it when
    /// it is handed out).
    status: Option<RuntimePodStatus>,
    /// When it was read (the read began).
    read_at: Instant,
    /// When an event last said the pod changed.
    invalidated_at: Option<Instant>,
    /// When the kernel last saw a container (or sandbox) of the pod exit, for an exit
    /// [`KernelExits`] holds ([`RuntimeCache::exit_recorded`]).
    exited_at: Option<Instant>,
}

impl RuntimeCache {
    /// The runtime's pods as of the last listing.
    #[must_use]
    pub fn runtime_pods(&self) -> BTreeMap<String, RuntimePod> {
        self.listing.read().unwrap().pods.clone()
    }

    /// Calls `f` with the last listing, without copying it.
    pub fn with_listing<T>(&self, f: impl FnOnce(&BTreeMap<String, RuntimePod>) -> T) -> T {
        f(&self.listing.read().unwrap().pods)
    }

    /// Replaces the listing with `pods`, listed at `at`.
    pub fn set_listing(&self, pods: BTreeMap<String, RuntimePod>, at: Instant) {
        *self.listing.write().unwrap() = Listing { pods, at: Some(at) };
    }

    /// When the last listing was made; `None` before the first.
    #[must_use]
    pub fn listed_at(&self) -> Option<Instant> {
        self.listing.read().unwrap().at
    }

    /// Whether at least one listing has been made.
    #[must_use]
    pub fn has_listed(&self) -> bool {
        self.listed_at().is_some()
    }

    /// The name of container `id` of pod `pod_uid` as of the last listing.
    #[must_use]
    pub fn container_name(&self, pod_uid: &str, id: &str) -> Option<String> {
        self.listing.read().unwrap().pods.get(pod_uid)?.containers.get(id).map(|(name, _)| name.clone())
    }

    /// The exits the kernel saw before the runtime recorded them.
    #[must_use]
    pub fn exits(&self) -> &KernelExits {
        &self.exits
    }

    /// The start calls under way.
    #[must_use]
    pub fn starts(&self) -> &Arc<StartsInFlight> {
        &self.starts
    }

    /// Records that a sandbox or container started, stopped or changed state.
    pub fn containers_changed(&self) {
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// The change counter, shared (the stats provider reads it).
    #[must_use]
    pub fn changes(&self) -> Arc<AtomicU64> {
        self.changes.clone()
    }

    /// Reads pod `uid`'s status from the runtime, keeps it, and returns it with the
    /// kernel's exits laid over it.
    ///
    /// # Errors
    /// The runtime's, when it cannot be read (what was kept stays).
    pub async fn pod_status(&self, rt: &dyn RuntimeService, uid: &str) -> Result<RuntimePodStatus> {
        let read_at = Instant::now();
        let status = RuntimePodStatus::fetch(rt, uid).await?;
        {
            let mut statuses = self.statuses.lock().unwrap();
            let e = statuses.entry(uid.to_owned()).or_insert(Entry {
                status: None,
                read_at,
                invalidated_at: None,
                exited_at: None,
            });
            // A slower read that began earlier does not replace a newer one.
            if e.status.is_none() || e.read_at <= read_at {
                e.status = Some(status.clone());
                e.read_at = read_at;
            }
        }
        let mut status = status;
        self.exits.apply(&mut status);
        Ok(status)
    }

    /// Pod `uid`'s kept status if it was read at or after `t` (upstream's "not before")
    /// and after every change reported in the pod since, recorded exits included, with
    /// the kernel's exits laid over it (upstream `GetNewerThan`, which waits where this
    /// returns `None`).
    #[must_use]
    pub fn get_newer_than(&self, uid: &str, t: Instant) -> Option<RuntimePodStatus> {
        let statuses = self.statuses.lock().unwrap();
        let e = statuses.get(uid)?;
        let fresh = e.read_at >= t
            && e.invalidated_at.is_none_or(|i| e.read_at > i)
            && e.exited_at.is_none_or(|x| e.read_at > x);
        let mut status = e.status.clone().filter(|_| fresh)?;
        drop(statuses);
        self.exits.apply(&mut status);
        Some(status)
    }

    /// Marks pod `uid`'s kept status stale if it was read before `at`, when something
    /// changed in the pod (a PLEG event: the kernel's time of it, or when it was listed).
    pub fn invalidate(&self, uid: &str, at: Instant) {
        if let Some(e) = self.statuses.lock().unwrap().get_mut(uid) {
            e.invalidated_at = Some(e.invalidated_at.map_or(at, |i| i.max(at)));
        }
    }

    /// A container or sandbox of pod `uid` exited at `at` (the kernel's time) and the
    /// evented PLEG recorded the exit in [`Self::exits`], which every status handed out
    /// carries: like [`Self::invalidate`] for [`Self::get_newer_than`], but the kept
    /// status stays at hand for [`Self::kept_with_new_exit`].
    pub fn exit_recorded(&self, uid: &str, at: Instant) {
        if let Some(e) = self.statuses.lock().unwrap().get_mut(uid) {
            e.exited_at = Some(e.exited_at.map_or(at, |x| x.max(at)));
        }
    }

    /// Pod `uid`'s kept status with the kernel's exits laid over it, whatever its age, if
    /// an exit ([`Self::exit_recorded`]) came after it was read and no other change did:
    /// the exit the pod worker is woken for, which it can write into the pod's status
    /// before the runtime answers (a runtime busy recording the exit, on a dense node,
    /// answers in tens of milliseconds, at worst in more than 100).
    #[must_use]
    pub fn kept_with_new_exit(&self, uid: &str) -> Option<RuntimePodStatus> {
        let statuses = self.statuses.lock().unwrap();
        let e = statuses.get(uid)?;
        let current = e.invalidated_at.is_none_or(|i| e.read_at > i);
        let new_exit = e.exited_at.is_some_and(|x| x >= e.read_at);
        let mut status = e.status.clone().filter(|_| current && new_exit)?;
        drop(statuses);
        self.exits.apply(&mut status);
        Some(status)
    }

    /// Forgets pod `uid`'s status (the pod is gone from the node).
    pub fn forget(&self, uid: &str) {
        self.statuses.lock().unwrap().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::container::fake::FakeRuntime;

    fn pod(uid: &str, container: (&str, &str)) -> RuntimePod {
        RuntimePod {
            uid: uid.into(),
            containers: BTreeMap::from([(
                container.0.to_owned(),
                (container.1.to_owned(), crate::container::ContainerState::Running),
            )]),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_listing_is_replaced_whole_and_names_containers() {
        let cache = RuntimeCache::default();
        assert!(!cache.has_listed());
        let t0 = Instant::now();
        cache.set_listing(BTreeMap::from([("u".into(), pod("u", ("c1", "web")))]), t0);
        assert!(cache.has_listed());
        assert_eq!(cache.runtime_pods().keys().collect::<Vec<_>>(), ["u"]);
        assert_eq!(cache.container_name("u", "c1").as_deref(), Some("web"));
        assert_eq!(cache.container_name("u", "c2"), None);
        cache.set_listing(BTreeMap::new(), t0 + Duration::from_secs(1));
        assert!(cache.runtime_pods().is_empty(), "replaced whole");
        assert_eq!(cache.container_name("u", "c1"), None);
        assert_eq!(cache.listed_at(), Some(t0 + Duration::from_secs(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_is_newer_only_if_read_after_the_time_and_the_last_event() {
        let cache = RuntimeCache::default();
        let rt = FakeRuntime::default();
        let before = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(cache.get_newer_than("u", before).is_none(), "nothing read yet");
        cache.pod_status(&rt, "u").await.unwrap();
        assert!(cache.get_newer_than("u", before).is_some());
        assert!(cache.get_newer_than("u", Instant::now()).is_some(), "read at the time asked");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(cache.get_newer_than("u", Instant::now()).is_none(), "read before the time asked");
        cache.invalidate("u", before);
        assert!(cache.get_newer_than("u", before).is_some(), "the change came before the read");
        cache.invalidate("u", Instant::now());
        assert!(cache.get_newer_than("u", before).is_none(), "the change came after the read");
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.pod_status(&rt, "u").await.unwrap();
        assert!(cache.get_newer_than("u", before).is_some(), "read again after the event");
        cache.forget("u");
        assert!(cache.get_newer_than("u", before).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorded_kernel_exit_makes_the_status_stale_but_hands_it_out_for_the_early_write() {
        let cache = RuntimeCache::default();
        let rt = FakeRuntime::default();
        let before = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.pod_status(&rt, "u").await.unwrap();
        assert!(cache.kept_with_new_exit("u").is_none(), "no exit since the read");
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.exit_recorded("u", Instant::now());
        assert!(cache.get_newer_than("u", before).is_none(), "a sync acts on the runtime's answer");
        assert!(cache.kept_with_new_exit("u").is_some(), "an exit since the read");
        tokio::time::advance(Duration::from_mins(1)).await;
        assert!(cache.kept_with_new_exit("u").is_some(), "whatever the kept status' age");
        cache.invalidate("u", Instant::now());
        assert!(cache.kept_with_new_exit("u").is_none(), "another change since the read");
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.pod_status(&rt, "u").await.unwrap();
        assert!(cache.kept_with_new_exit("u").is_none(), "read again after the exit");
        assert!(cache.get_newer_than("u", before).is_some());
        assert!(cache.kept_with_new_exit("other").is_none(), "nothing kept");
    }

    #[tokio::test(start_paused = true)]
    async fn kept_statuses_carry_the_kernels_exits() {
        use crate::container::api;
        use crate::container::labels::{self, ContainerKind};
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "img"}]}
        }))
        .unwrap();
        let container = &p.spec.as_ref().unwrap().containers[0];
        let rt = FakeRuntime::with_images(&["img"]);
        let sandbox = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: "p".into(),
                uid: "u".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            labels: labels::sandbox_labels(&p),
            ..Default::default()
        };
        let sandbox_id = rt.run_pod_sandbox(sandbox.clone(), String::new()).await.unwrap();
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: "c".into(), attempt: 0 }),
            image: Some(api::ImageSpec { image: "img".into(), ..Default::default() }),
            labels: labels::container_labels(&p, container, ContainerKind::Regular),
            ..Default::default()
        };
        let id = rt.create_container(&sandbox_id, config, sandbox).await.unwrap();
        rt.start_container(&id).await.unwrap();
        let cache = RuntimeCache::default();
        let before = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        let running = cache.pod_status(&rt, "u").await.unwrap();
        assert_eq!(running.find_container("c").unwrap().state, crate::container::ContainerState::Running);
        cache.exits().record("u", &id, 137, std::time::SystemTime::now());
        let kept = cache.get_newer_than("u", before).unwrap();
        let c = kept.find_container("c").unwrap();
        assert_eq!((c.state, c.exit_code), (crate::container::ContainerState::Exited, 137));
    }
}
