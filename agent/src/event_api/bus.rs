//! The in-process event bus: a bounded broadcast channel between the agent's publishers
//! (PLEG, OOM watcher, eviction) and the event API's subscribers (one per `Watch` call).
//!
//! Publishing never blocks and never fails: the channel is a ring of `capacity` events
//! and a subscriber that falls a full ring behind loses the oldest events instead of
//! slowing the publisher. Such a subscriber is told how many it lost
//! ([`RecvError::Lagged`]) and the loss is added to [`EventBus::dropped_total`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::broadcast;

use super::NodeEvent;

/// Events buffered for the slowest subscriber before it starts losing them.
pub const DEFAULT_CAPACITY: usize = 4096;

/// The publishing side of the node events. Cheap to clone; every clone publishes to the
/// same subscribers.
#[derive(Clone, Debug)]
pub struct EventBus {
    // Arc so that a fan-out to N subscribers clones a pointer, not N sets of strings;
    // subscribers whose filter rejects an event never copy it at all.
    tx: broadcast::Sender<Arc<NodeEvent>>,
    dropped: Arc<AtomicU64>,
}

impl Default for EventBus {
    /// A bus with [`DEFAULT_CAPACITY`].
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl EventBus {
    /// A bus that buffers up to `capacity` events per subscriber (at least 1).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        // broadcast::channel panics on 0; a zero from config means "as small as possible".
        let (tx, _) = broadcast::channel(capacity.max(1));
        Self { tx, dropped: Arc::new(AtomicU64::new(0)) }
    }

    /// Publishes `ev` to every current subscriber. Never blocks; with no subscriber the
    /// event is simply discarded.
    pub fn publish(&self, ev: NodeEvent) {
        // send only fails when nobody subscribes, which is the normal idle state.
        let _ = self.tx.send(Arc::new(ev));
    }

    /// A new subscriber that sees every event published from now on.
    #[must_use]
    pub fn subscribe(&self) -> Subscription {
        Subscription { rx: self.tx.subscribe(), dropped: Arc::clone(&self.dropped) }
    }

    /// Events lost by lagging subscribers since the bus was created, summed over all of
    /// them (an event lost by two subscribers counts twice). For a counter metric.
    #[must_use]
    pub fn dropped_total(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Subscribers currently attached (open `Watch` streams, among others).
    #[must_use]
    pub fn subscriber_count(&self) -> usize {
        self.tx.receiver_count()
    }
}

/// Why [`Subscription::recv`] returned no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The subscriber fell more than the bus capacity behind; this many events were lost.
    /// The next `recv` continues with the oldest event still buffered.
    #[error("subscriber too slow, {dropped} events dropped")]
    Lagged { dropped: u64 },
    /// Every [`EventBus`] clone was dropped and the buffer is drained.
    #[error("event bus closed")]
    Closed,
}

/// One subscriber's view of the bus.
#[derive(Debug)]
pub struct Subscription {
    rx: broadcast::Receiver<Arc<NodeEvent>>,
    dropped: Arc<AtomicU64>,
}

impl Subscription {
    /// The next event, in publish order.
    pub async fn recv(&mut self) -> Result<Arc<NodeEvent>, RecvError> {
        match self.rx.recv().await {
            Ok(ev) => Ok(ev),
            Err(broadcast::error::RecvError::Lagged(dropped)) => {
                self.dropped.fetch_add(dropped, Ordering::Relaxed);
                Err(RecvError::Lagged { dropped })
            }
            Err(broadcast::error::RecvError::Closed) => Err(RecvError::Closed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_api::NodeEventKind;

    fn ev(name: &str) -> NodeEvent {
        NodeEvent { pod_name: name.into(), ..NodeEvent::new(NodeEventKind::ContainerStarted) }
    }

    #[test]
    fn publish_without_subscribers_is_fine() {
        let bus = EventBus::default();
        bus.publish(ev("a"));
        assert_eq!(bus.dropped_total(), 0);
        assert_eq!(bus.subscriber_count(), 0);
    }

    #[tokio::test]
    async fn subscribers_see_events_in_order() {
        let bus = EventBus::new(8);
        let mut a = bus.subscribe();
        let mut b = bus.subscribe();
        bus.publish(ev("1"));
        bus.publish(ev("2"));
        for sub in [&mut a, &mut b] {
            assert_eq!(sub.recv().await.unwrap().pod_name, "1");
            assert_eq!(sub.recv().await.unwrap().pod_name, "2");
        }
    }

    #[tokio::test]
    async fn lagging_subscriber_is_told_and_counted() {
        let bus = EventBus::new(2);
        let mut slow = bus.subscribe();
        for i in 0..5 {
            bus.publish(ev(&i.to_string()));
        }
        assert_eq!(slow.recv().await.unwrap_err(), RecvError::Lagged { dropped: 3 });
        assert_eq!(bus.dropped_total(), 3);
        // It carries on from the oldest event still buffered.
        assert_eq!(slow.recv().await.unwrap().pod_name, "3");
    }

    #[tokio::test]
    async fn closed_when_every_sender_is_gone() {
        let bus = EventBus::new(0);
        let mut sub = bus.subscribe();
        drop(bus);
        assert_eq!(sub.recv().await.unwrap_err(), RecvError::Closed);
    }
}
