//! A map of bounded size that forgets its least recently used entry when full: the
//! correlator's caches (upstream uses groupcache's `lru.Cache` for the same job). Reading
//! an entry and writing one both count as a use.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// At most `capacity` entries; `put` beyond that drops the least recently used one.
#[derive(Debug)]
pub(super) struct Lru<K, V> {
    capacity: usize,
    /// Stamp of the latest use; stamps only grow, so the smallest is the oldest use.
    clock: u64,
    entries: HashMap<K, (V, u64)>,
    /// Every entry's key by the stamp of its latest use.
    order: BTreeMap<u64, K>,
}

impl<K: Clone + Eq + Hash, V> Lru<K, V> {
    /// A cache of `capacity` entries (at least one).
    pub(super) fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), clock: 0, entries: HashMap::new(), order: BTreeMap::new() }
    }

    /// The value of `key`, now the most recently used.
    pub(super) fn get(&mut self, key: &K) -> Option<&V> {
        let stamp = self.tick();
        let (_, used) = self.entries.get_mut(key)?;
        let previous = std::mem::replace(used, stamp);
        if let Some(k) = self.order.remove(&previous) {
            self.order.insert(stamp, k);
        }
        self.entries.get(key).map(|(v, _)| v)
    }

    /// Sets `key` to `value`, the most recently used entry; drops the least recently used
    /// entry if the cache is over capacity.
    pub(super) fn put(&mut self, key: K, value: V) {
        let stamp = self.tick();
        if let Some((_, previous)) = self.entries.insert(key.clone(), (value, stamp)) {
            self.order.remove(&previous);
        }
        self.order.insert(stamp, key);
        while self.entries.len() > self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else { break };
            self.entries.remove(&oldest);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_the_least_recently_used() {
        let mut lru = Lru::new(2);
        lru.put("a", 1);
        lru.put("b", 2);
        // Reading `a` makes `b` the oldest use.
        assert_eq!(lru.get(&"a"), Some(&1));
        lru.put("c", 3);
        assert_eq!(lru.len(), 2);
        assert_eq!(lru.get(&"b"), None);
        assert_eq!(lru.get(&"a"), Some(&1));
        // Writing an existing key is a use too, and does not grow the cache.
        lru.put("c", 4);
        lru.put("d", 5);
        assert_eq!(lru.get(&"a"), None);
        assert_eq!(lru.get(&"c"), Some(&4));
        assert_eq!(lru.get(&"d"), Some(&5));
        assert_eq!((lru.entries.len(), lru.order.len()), (2, 2));
    }
}
