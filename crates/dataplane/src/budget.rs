//! An interface-wide bound on the packets its peers' queues of one direction hold
//! together, beside each queue's own bound (`queue::MAX_QUEUED_PACKETS`).
//!
//! Why: the per-queue bound alone lets memory grow with the number of peers. A gateway
//! overloaded by a thousand peers would fill a thousand queues, a thousand packets
//! each, 2 KiB per packet; with the shared bound the excess waits in the kernel's
//! socket buffer (receive) or the TUN device's queue (transmit) instead and is dropped
//! there, where an overload belongs. Transmit needs it as much as receive: when the
//! workers fall behind a TUN reader that spreads packets over many peers, every peer's
//! queue fills.
//!
//! Invariant: `used` is the sum of the packets queued in every queue holding this
//! budget. It changes only under the lock of the queue whose count changes, together
//! with that count (`OrderedQueue`; `fq_codel::FqGuard` when the flow queues' lock is
//! released; `Peer::stage` and `take_staged`), and a queue that goes gives its share
//! back, so each queue's share is exactly what it holds. A check and the add that
//! follows are not one step: producers of different queues racing past the check may
//! exceed the limit by a packet or a batch each, which bounds the excess.
//! Waiting for room polls instead of waiting on a condition variable: only an I/O
//! reader ever waits, and only while the whole interface is overloaded, so a short
//! sleep costs nothing that matters, while a wake-up on every dequeue of every peer
//! would.

#[cfg(loom)]
use loom::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicUsize, Ordering};

use std::sync::Arc;
use std::time::{Duration, Instant};

/// Packets an interface's receive queues hold at most together: tens of milliseconds
/// of decryption on any core count this runs on, 16 MiB of buffers.
pub const RX_BUDGET_PACKETS: usize = 8192;

/// Packets an interface's transmit queues hold at most together (8 MiB of buffers):
/// every peer's ordered queue and, under `fq-codel`, its flow queues in front.
pub const TX_BUDGET_PACKETS: usize = 4096;

/// Packets an interface's peers hold staged together while their handshakes run
/// (8 MiB of buffers), beside each peer's own bound (`peer::MAX_STAGED_PACKETS`).
/// Nothing waits for it: past it, staging drops, since a peer without a session must
/// not hold back the peers that have one. Without it, a gateway still sending to
/// 10,000 peers whose sessions had expired held 128 packets for each: 2.8 GB.
pub const STAGED_BUDGET_PACKETS: usize = 4096;

/// How often a reader waiting for room looks again.
pub const POLL: Duration = Duration::from_micros(200);

/// An interface's shared bounds: one per direction, and one for staged packets.
#[derive(Debug)]
pub struct Budgets {
    pub rx: Arc<QueueBudget>,
    pub tx: Arc<QueueBudget>,
    pub staged: Arc<QueueBudget>,
}

impl Default for Budgets {
    fn default() -> Budgets {
        Budgets {
            rx: Arc::new(QueueBudget::new(RX_BUDGET_PACKETS)),
            tx: Arc::new(QueueBudget::new(TX_BUDGET_PACKETS)),
            staged: Arc::new(QueueBudget::new(STAGED_BUDGET_PACKETS)),
        }
    }
}

#[derive(Debug)]
pub struct QueueBudget {
    limit: usize,
    used: AtomicUsize,
}

impl QueueBudget {
    pub fn new(limit: usize) -> QueueBudget {
        QueueBudget {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    /// Whether `n` more packets fit.
    pub fn fits(&self, n: usize) -> bool {
        self.used.load(Ordering::Relaxed) + n <= self.limit
    }

    pub(crate) fn add(&self, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn sub(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }

    /// How many more packets fit.
    pub fn room(&self) -> usize {
        self.limit.saturating_sub(self.used.load(Ordering::Relaxed))
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Waits until `n` more fit or `deadline` passes; whether they fit.
    pub fn wait_for_room(&self, n: usize, deadline: Instant) -> bool {
        loop {
            if self.fits(n) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            std::thread::sleep(left.min(POLL));
        }
    }
}
