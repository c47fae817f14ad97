//! Storage: every object in memory under one global, monotonically increasing
//! resourceVersion (etcd's revision), and per resource a bounded history of events that
//! watches resume from (the real server's watch cache). A resume from a resourceVersion
//! older than the history is answered with 410 Expired "too old resource version", as the
//! watch cache does (`watch_cache.go` `getAllEventsSinceLocked`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::meta;
use super::status::StatusError;

/// (namespace or "" for cluster-scoped objects, name).
pub(crate) type Key = (String, String);

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed change, as the watch cache keeps it: the new state (for a deletion, the
/// last state with the deletion's resourceVersion) and the previous state.
#[derive(Debug)]
pub(crate) struct StoredEvent {
    pub rv: u64,
    pub storage: &'static str,
    pub kind: EventType,
    pub object: Arc<Value>,
    pub prev: Option<Arc<Value>>,
}

#[derive(Debug, Default)]
struct History {
    events: VecDeque<Arc<StoredEvent>>,
    /// The oldest resourceVersion a watch may resume from.
    floor: u64,
}

/// One page of a paginated list still to be served (`continue` tokens).
#[derive(Debug)]
pub(crate) struct Page {
    pub rv: u64,
    pub items: Vec<Value>,
}

/// The data behind the lock.
#[derive(Debug)]
pub(crate) struct Data {
    rv: u64,
    objects: HashMap<&'static str, BTreeMap<Key, Arc<Value>>>,
    history: HashMap<&'static str, History>,
    history_cap: usize,
    pages: HashMap<String, Page>,
    page_order: VecDeque<String>,
    tx: broadcast::Sender<Arc<StoredEvent>>,
}

/// The store: data behind one lock, and the channel every committed event goes out on.
#[derive(Debug)]
pub(crate) struct Store {
    data: Mutex<Data>,
}

/// How many unconsumed events a watch may fall behind before it is closed (the real
/// server closes unresponsive watchers too; the client then resumes).
const WATCH_CHANNEL: usize = 16 * 1024;
/// How many pages of paginated lists are kept for `continue`.
const MAX_PAGES: usize = 256;

impl Store {
    pub(crate) fn new(history_cap: usize) -> Self {
        let (tx, _) = broadcast::channel(WATCH_CHANNEL);
        Self {
            data: Mutex::new(Data {
                rv: 0,
                objects: HashMap::new(),
                history: HashMap::new(),
                history_cap: history_cap.max(1),
                pages: HashMap::new(),
                page_order: VecDeque::new(),
                tx,
            }),
        }
    }

    /// Locks the data. Never held across an await.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Data> {
        self.data.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Data {
    /// The current (latest committed) resourceVersion.
    pub(crate) fn rv(&self) -> u64 {
        self.rv
    }

    pub(crate) fn get(&self, storage: &str, key: &Key) -> Option<Arc<Value>> {
        self.objects.get(storage).and_then(|m| m.get(key)).cloned()
    }

    /// Objects of a storage, in key order (etcd's), optionally in one namespace.
    pub(crate) fn iter<'a>(&'a self, storage: &str, ns: Option<&'a str>) -> impl Iterator<Item = &'a Arc<Value>> + 'a {
        self.objects
            .get(storage)
            .into_iter()
            .flat_map(|m| m.iter())
            .filter(move |((n, _), _)| ns.is_none_or(|ns| n == ns))
            .map(|(_, v)| v)
    }

    pub(crate) fn count_in_namespace(&self, storage: &str, ns: &str) -> usize {
        self.iter(storage, Some(ns)).count()
    }

    /// Writes an object (create or update): bumps the resourceVersion, stamps it on the
    /// object, records and sends the event.
    pub(crate) fn put(&mut self, storage: &'static str, mut obj: Value) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        meta::meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let key = (meta::namespace(&obj).to_string(), meta::name(&obj).to_string());
        let obj = Arc::new(obj);
        let prev = self.objects.entry(storage).or_default().insert(key, obj.clone());
        let kind = if prev.is_some() { EventType::Modified } else { EventType::Added };
        self.record(StoredEvent { rv, storage, kind, object: obj.clone(), prev });
        obj
    }

    /// Removes an object; returns its last state with the deletion's resourceVersion.
    pub(crate) fn remove(&mut self, storage: &'static str, key: &Key) -> Option<Arc<Value>> {
        let prev = self.objects.get_mut(storage)?.remove(key)?;
        self.rv += 1;
        let rv = self.rv;
        let mut last = (*prev).clone();
        meta::meta_mut(&mut last).insert("resourceVersion".into(), json!(rv.to_string()));
        let last = Arc::new(last);
        self.record(StoredEvent { rv, storage, kind: EventType::Deleted, object: last.clone(), prev: Some(prev) });
        Some(last)
    }

    fn record(&mut self, ev: StoredEvent) {
        let ev = Arc::new(ev);
        let cap = self.history_cap;
        let h = self.history.entry(ev.storage).or_default();
        if h.events.len() == cap
            && let Some(old) = h.events.pop_front()
        {
            h.floor = old.rv;
        }
        h.events.push_back(ev.clone());
        // Sent under the lock, so a reader that holds the lock knows every event up to
        // `rv` is already in its channel.
        let _ = self.tx.send(ev);
    }

    /// Every event of `storage` after `rv`, or 410 if the history no longer reaches back.
    pub(crate) fn events_since(&self, storage: &str, rv: u64) -> Result<Vec<Arc<StoredEvent>>, StatusError> {
        let (floor, events) = self.history.get(storage).map_or((self.default_floor(), None), |h| (h.floor, Some(h)));
        if rv < floor {
            return Err(StatusError::expired(format!("too old resource version: {rv} ({floor})")));
        }
        Ok(events.into_iter().flat_map(|h| h.events.iter()).filter(|e| e.rv > rv).cloned().collect())
    }

    /// The floor of a storage that has seen no event since the history was reset.
    fn default_floor(&self) -> u64 {
        self.history.values().map(|h| h.floor).max().unwrap_or(0)
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<StoredEvent>> {
        self.tx.subscribe()
    }

    /// Forgets every event (as a restarted server's fresh watch cache, or a compaction):
    /// watches may only resume from the current resourceVersion on.
    pub(crate) fn reset_history(&mut self) {
        let rv = self.rv;
        for h in self.history.values_mut() {
            h.events.clear();
            h.floor = rv;
        }
        // Storages without events yet also start at the current revision.
        self.history.entry("").or_default().floor = rv;
        self.pages.clear();
        self.page_order.clear();
    }

    pub(crate) fn save_page(&mut self, token: String, page: Page) {
        if self.page_order.len() == MAX_PAGES
            && let Some(old) = self.page_order.pop_front()
        {
            self.pages.remove(&old);
        }
        self.page_order.push_back(token.clone());
        self.pages.insert(token, page);
    }

    pub(crate) fn take_page(&mut self, token: &str) -> Option<Page> {
        self.page_order.retain(|t| t != token);
        self.pages.remove(token)
    }
}
