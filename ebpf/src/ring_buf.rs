//! The event stream: a tokio task that waits on the ring buffer's epoll readiness,
//! drains and decodes records, and sends them down a bounded channel.
//!
//! Backpressure is deliberate: when the consumer falls behind, the task waits on the
//! channel, the ring buffer fills, and the kernel counts drops (see
//! [`crate::Sensors::drops`]) instead of this task buffering without bound. The
//! agent's relisting PLEG repairs whatever was dropped.

use std::{
    io,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use aya::maps::{MapData, RingBuf};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
    time::MissedTickBehavior,
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info_span, warn};

use crate::events::{self, SensorEvent};

/// Why the event stream could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The stream was already taken; there is one reader per ring buffer.
    #[error("the sensor event stream was already taken")]
    AlreadyTaken,

    /// Called outside a tokio runtime.
    #[error("the sensor event stream needs a tokio runtime (with IO enabled)")]
    NoRuntime,

    /// Registering the ring buffer's fd with the tokio reactor failed.
    #[error("cannot register the ring buffer with the tokio reactor")]
    Register {
        /// The epoll registration error.
        #[source]
        io_error: io::Error,
    },
}

/// The reader task's state machine, driven by [`run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing to read: wait for a wakeup (lifecycle records force one), the flush
    /// tick (no-wakeup pressure records), cancellation, or the receiver going away.
    Waiting,
    /// Records may be pending: read and forward until the ring buffer is empty.
    Draining,
    /// Cancelled or the receiver was dropped: the task ends and closes the ring fd.
    Stopped,
}

/// Counters the reader shares with [`crate::Sensors`].
#[derive(Debug, Default)]
pub(crate) struct ReaderStats {
    /// Records that failed to decode and were skipped.
    pub(crate) decode_errors: AtomicU64,
}

/// Registers the ring buffer in `slot` with the current runtime and spawns the reader.
/// On error the ring buffer stays in `slot`, so the caller can try again.
pub(crate) fn spawn(
    slot: &mut Option<RingBuf<MapData>>,
    capacity: usize,
    flush_interval: Duration,
    cancel: CancellationToken,
    reader_stats: Arc<ReaderStats>,
) -> Result<mpsc::Receiver<SensorEvent>, StreamError> {
    let handle = tokio::runtime::Handle::try_current().map_err(|_| StreamError::NoRuntime)?;
    let ring = slot.take().ok_or(StreamError::AlreadyTaken)?;
    // Registration needs the runtime's reactor: enter it explicitly.
    let registered = {
        let _entered = handle.enter();
        // SAFETY: the ring buffer owns its map fd (an `OwnedFd` in `MapData`) and
        // returns that same fd from `as_raw_fd` for as long as it lives; the `AsyncFd`
        // owns the ring buffer, so the fd stays open and unchanged while registered.
        unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
    };
    let fd = match registered {
        Ok(fd) => fd,
        Err(error) => {
            let (ring, io_error) = error.into_parts();
            *slot = Some(ring);
            return Err(StreamError::Register { io_error });
        }
    };
    let (tx, rx) = mpsc::channel(capacity.max(1));
    handle.spawn(run(fd, tx, flush_interval, cancel, reader_stats).instrument(info_span!("sensor_events")));
    Ok(rx)
}

async fn run(
    mut fd: AsyncFd<RingBuf<MapData>>,
    tx: mpsc::Sender<SensorEvent>,
    flush_interval: Duration,
    cancel: CancellationToken,
    reader_stats: Arc<ReaderStats>,
) {
    let mut flush = tokio::time::interval(flush_interval.max(Duration::from_millis(1)));
    flush.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Records written before the reader existed sent their wakeups to nobody.
    let mut state = State::Draining;
    loop {
        state = match state {
            State::Waiting => tokio::select! {
                biased;
                () = cancel.cancelled() => State::Stopped,
                () = tx.closed() => State::Stopped,
                ready = fd.readable() => match ready {
                    Ok(mut guard) => {
                        // Clear before draining: a record committed after the drain
                        // re-arms readiness instead of being lost.
                        guard.clear_ready();
                        State::Draining
                    }
                    Err(error) => {
                        warn!(%error, "ring buffer poll failed; sensor events stop");
                        State::Stopped
                    }
                },
                _ = flush.tick() => State::Draining,
            },
            State::Draining => drain(fd.get_mut(), &tx, &cancel, &reader_stats).await,
            State::Stopped => break,
        };
    }
    debug!("sensor event reader stopped");
}

/// Forwards every pending record; `Stopped` if the consumer or the token ended it.
async fn drain(
    ring: &mut RingBuf<MapData>,
    tx: &mpsc::Sender<SensorEvent>,
    cancel: &CancellationToken,
    stats: &ReaderStats,
) -> State {
    loop {
        // Decode inside the borrow: the record is released (consumer position
        // advanced) before awaiting the channel.
        let decoded = match ring.next() {
            Some(record) => events::decode(&record),
            None => return State::Waiting,
        };
        match decoded {
            Ok(event) => {
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => return State::Stopped,
                    sent = tx.send(event) => if sent.is_err() { return State::Stopped },
                }
            }
            Err(error) => {
                if stats.decode_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                    warn!(%error, "skipping undecodable sensor record (further ones are only counted)");
                }
            }
        }
    }
}
