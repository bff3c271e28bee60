//! Per-peer ordered queue, as the kernel keeps one per peer and direction.
//!
//! A batch enters its peer's ordered queue and the shared crypt queue at the same time.
//! Crypt workers finish batches in any order; the peer's serial stage drains from the
//! head and stops at the first batch that is not done, so packets leave in the order
//! they entered no matter which worker finished first.
//!
//! Race and invariant: `scheduled` is true while a serial-stage work item for this queue
//! is pending or running. A worker that completes a batch calls [`OrderedQueue::schedule`];
//! if that finds `scheduled` already set it does nothing, so the running drain must
//! re-check the head after clearing the flag (see [`OrderedQueue::drain`]). All the
//! flag and `done` accesses are `SeqCst`, which rules out both sides missing each other.

use crate::packet::Batch;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Most packets one peer may have queued per direction (the kernel's
/// MAX_QUEUED_PACKETS); beyond it new batches are dropped, never older ones.
pub const MAX_QUEUED_PACKETS: usize = 1024;

#[derive(Default)]
pub struct OrderedQueue {
    batches: Mutex<VecDeque<Arc<Batch>>>,
    /// Signalled whenever batches leave, for producers waiting for room.
    room: Condvar,
    packets: AtomicUsize,
    scheduled: AtomicBool,
}

impl OrderedQueue {
    /// Appends a batch; false (and the batch is not queued) when the queue is full.
    pub fn push(&self, batch: Arc<Batch>, npackets: usize) -> bool {
        let mut q = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        if self.packets.load(Ordering::Relaxed) + npackets > MAX_QUEUED_PACKETS {
            return false;
        }
        self.packets.fetch_add(npackets, Ordering::Relaxed);
        q.push_back(batch);
        true
    }

    /// Waits (at most `timeout`) until `npackets` more fit. Only I/O reader threads call
    /// this, never workers: a worker waiting here could block the very drain it waits
    /// for. Waiting instead of dropping is the backpressure that keeps TCP from seeing
    /// losses that are only a full queue.
    pub fn wait_for_room(&self, npackets: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        while self.packets.load(Ordering::Relaxed) + npackets > MAX_QUEUED_PACKETS {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q = self
                .room
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Claims the right to run the serial stage. True means the caller must queue one
    /// serial-stage work item for this queue.
    pub fn schedule(&self) -> bool {
        !self.scheduled.swap(true, Ordering::SeqCst)
    }

    fn pop_done(&self) -> Option<Arc<Batch>> {
        let mut q = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        if q.front().is_some_and(|b| b.is_done()) {
            let b = q.pop_front()?;
            self.packets.fetch_sub(b.len(), Ordering::Relaxed);
            self.room.notify_all();
            Some(b)
        } else {
            None
        }
    }

    fn head_done(&self) -> bool {
        let q = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        q.front().is_some_and(|b| b.is_done())
    }

    /// Runs `f` on every finished batch at the head, in order. Called only from the
    /// serial-stage work item that `schedule` returned true for. Returns the number of
    /// batches handled (the lab's "packets per serial-stage invocation" signature).
    pub fn drain(&self, mut f: impl FnMut(Arc<Batch>)) -> usize {
        let mut handled = 0;
        loop {
            while let Some(b) = self.pop_done() {
                f(b);
                handled += 1;
            }
            self.scheduled.store(false, Ordering::SeqCst);
            // A batch may have completed after our last look but before the store; its
            // worker saw `scheduled` set and left the work to us.
            if !(self.head_done() && self.schedule()) {
                return handled;
            }
        }
    }

    /// Drops everything queued (peer removal). In-flight crypt work still completes but
    /// finds its batch gone from here.
    pub fn clear(&self) {
        let mut q = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        q.clear();
        self.packets.store(0, Ordering::Relaxed);
        self.room.notify_all();
    }

    pub fn queued_packets(&self) -> usize {
        self.packets.load(Ordering::Relaxed)
    }
}
