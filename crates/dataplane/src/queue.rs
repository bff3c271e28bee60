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

/// What an ordered queue holds: the pipeline's batches, or a stand-in in the tests
/// (which run under Miri, where the real batches' crypto keys cannot be built).
pub trait Ordered {
    /// Whether the crypt stage has finished with it (`SeqCst`, see [`Batch`]).
    fn is_done(&self) -> bool;
    /// Packets it counts against [`MAX_QUEUED_PACKETS`].
    fn packets(&self) -> usize;
}

impl Ordered for Batch {
    fn is_done(&self) -> bool {
        Batch::is_done(self)
    }
    fn packets(&self) -> usize {
        self.len()
    }
}

pub struct OrderedQueue<T: Ordered = Batch> {
    batches: Mutex<VecDeque<Arc<T>>>,
    /// Signalled when batches leave while a producer waits for room.
    room: Condvar,
    /// Producers blocked in `wait_for_room`. Changed and read only with `batches`
    /// locked, so a drain that sees 0 cannot miss a waiter: the waiter counts itself
    /// before the condvar wait releases the lock. It saves a `futex` wake syscall on
    /// every drain when nobody waits, which is nearly always.
    waiting: AtomicUsize,
    packets: AtomicUsize,
    scheduled: AtomicBool,
}

impl<T: Ordered> Default for OrderedQueue<T> {
    fn default() -> Self {
        OrderedQueue {
            batches: Mutex::default(),
            room: Condvar::new(),
            waiting: AtomicUsize::new(0),
            packets: AtomicUsize::new(0),
            scheduled: AtomicBool::new(false),
        }
    }
}

impl<T: Ordered> OrderedQueue<T> {
    /// Appends a batch; false (and the batch is not queued) when the queue is full.
    pub fn push(&self, batch: Arc<T>, npackets: usize) -> bool {
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
            self.waiting.fetch_add(1, Ordering::Relaxed);
            q = self
                .room
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        true
    }

    /// Claims the right to run the serial stage. True means the caller must queue one
    /// serial-stage work item for this queue.
    pub fn schedule(&self) -> bool {
        !self.scheduled.swap(true, Ordering::SeqCst)
    }

    fn pop_done(&self) -> Option<Arc<T>> {
        let mut q = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        if q.front().is_some_and(|b| b.is_done()) {
            let b = q.pop_front()?;
            self.packets.fetch_sub(b.packets(), Ordering::Relaxed);
            self.wake_waiters();
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
    pub fn drain(&self, mut f: impl FnMut(Arc<T>)) -> usize {
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
        self.wake_waiters();
    }

    /// Wakes producers waiting for room. Call with `batches` locked.
    fn wake_waiters(&self) {
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.room.notify_all();
        }
    }

    pub fn queued_packets(&self) -> usize {
        self.packets.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    //! The scheduling protocol under concurrency. Also run under Miri
    //! (`scripts/sanitize.sh`), which checks every access for data races and explores
    //! thread interleavings across seeds.

    use super::*;
    use std::sync::atomic::AtomicU64;

    struct Item {
        seq: usize,
        n: usize,
        done: AtomicBool,
    }

    impl Ordered for Item {
        fn is_done(&self) -> bool {
            self.done.load(Ordering::SeqCst)
        }
        fn packets(&self) -> usize {
            self.n
        }
    }

    /// Under Miri threads are emulated and slow, so fewer items.
    const ITEMS: usize = if cfg!(miri) { 24 } else { 1000 };
    const WORKERS: usize = 3;

    /// A producer pushes items in order into the ordered queue and a shared "crypt"
    /// queue; workers complete them in whatever order they grab them (front or back),
    /// then claim and run the serial drain as the workqueue model does. Every item must
    /// come out exactly once, in order, with nothing stranded by a lost wake-up.
    #[test]
    fn completes_out_of_order_delivers_in_order() {
        let q = Arc::new(OrderedQueue::<Item>::default());
        let crypt = Arc::new(Mutex::new(VecDeque::new()));
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let produced = Arc::new(AtomicBool::new(false));
        let producer = {
            let (q, crypt, produced) = (q.clone(), crypt.clone(), produced.clone());
            std::thread::spawn(move || {
                for seq in 0..ITEMS {
                    let item = Arc::new(Item {
                        seq,
                        n: 1,
                        done: AtomicBool::new(false),
                    });
                    assert!(q.push(item.clone(), 1));
                    crypt.lock().unwrap().push_back(item);
                }
                produced.store(true, Ordering::SeqCst);
            })
        };
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (q, crypt, delivered, produced) = (
                    q.clone(),
                    crypt.clone(),
                    delivered.clone(),
                    produced.clone(),
                );
                std::thread::spawn(move || {
                    let rng = AtomicU64::new(0x9e37_79b9 + w as u64);
                    loop {
                        let flip = rng.fetch_add(0x6a09_e667, Ordering::Relaxed) & 0x100 != 0;
                        let item = {
                            let mut c = crypt.lock().unwrap();
                            if flip {
                                c.pop_back()
                            } else {
                                c.pop_front()
                            }
                        };
                        let Some(item) = item else {
                            if produced.load(Ordering::SeqCst) && crypt.lock().unwrap().is_empty() {
                                return;
                            }
                            std::thread::yield_now();
                            continue;
                        };
                        item.done.store(true, Ordering::SeqCst);
                        if q.schedule() {
                            q.drain(|b| delivered.lock().unwrap().push(b.seq));
                        }
                    }
                })
            })
            .collect();
        producer.join().unwrap();
        for w in workers {
            w.join().unwrap();
        }
        let delivered = delivered.lock().unwrap();
        assert_eq!(*delivered, (0..ITEMS).collect::<Vec<_>>());
        assert_eq!(q.queued_packets(), 0);
        assert!(
            q.schedule(),
            "the serial stage was left marked as scheduled"
        );
    }

    #[test]
    fn full_queue_refuses_new_batches_and_frees_room_on_drain() {
        let q = OrderedQueue::<Item>::default();
        let item = |seq, n| {
            Arc::new(Item {
                seq,
                n,
                done: AtomicBool::new(true),
            })
        };
        assert!(q.push(item(0, MAX_QUEUED_PACKETS - 1), MAX_QUEUED_PACKETS - 1));
        assert!(!q.push(item(1, 2), 2), "over the bound");
        assert!(q.push(item(2, 1), 1));
        assert!(!q.wait_for_room(1, Duration::from_millis(1)));
        assert!(q.schedule());
        let mut seen = Vec::new();
        q.drain(|b| seen.push(b.seq));
        assert_eq!(seen, [0, 2]);
        assert!(q.wait_for_room(MAX_QUEUED_PACKETS, Duration::ZERO));
    }
    /// The drain wakes a producer that waits for room, although it skips the condvar
    /// when nobody waits: the waiter must return well before its long timeout.
    #[test]
    fn drain_wakes_a_producer_waiting_for_room() {
        let q = Arc::new(OrderedQueue::<Item>::default());
        let full = Arc::new(Item {
            seq: 0,
            n: MAX_QUEUED_PACKETS,
            done: AtomicBool::new(true),
        });
        assert!(q.push(full, MAX_QUEUED_PACKETS));
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                (q.wait_for_room(1, Duration::from_secs(10)), start.elapsed())
            })
        };
        // Let the producer block first; if it has not yet, it finds room on its own.
        std::thread::sleep(Duration::from_millis(20));
        assert!(q.schedule());
        q.drain(|_| {});
        let (room, waited) = waiter.join().unwrap();
        assert!(room);
        assert!(waited < Duration::from_secs(5), "woken by the timeout only");
    }
}
