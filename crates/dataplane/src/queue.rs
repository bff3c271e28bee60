//! Per-peer ordered queue, as the kernel keeps one per peer and direction.
//!
//! A batch enters its peer's ordered queue and the crypt stage at the same time. Crypt
//! workers finish batches in any order; the peer's serial stage drains from the head
//! and stops at the first batch that is not done, so packets leave in the order they
//! entered no matter which worker finished first.
//!
//! Race and invariant (the hand-off every execution model relies on): `scheduled` is
//! true while a serial-stage work item for this queue is pending or running. A crypt
//! worker marks its batch done and then calls [`OrderedQueue::schedule`], which claims
//! the stage if nobody has; the running drain decides to stop, and clears `scheduled`,
//! only under the same lock in which it sees the head not done. So either the
//! completer finds `scheduled` clear and queues the stage, or the drain, taking the
//! lock after it, sees the batch done and goes on: the wake-up cannot be lost (the
//! lost wake-up of CVE-2026-52945, where a poll that found the head undone completed
//! and no later completion polled again). Both sides meet in a mutex rather than in a
//! pair of sequentially consistent atomics, so the argument needs no memory-model
//! subtlety, and loom checks it exactly. `tests` run the protocol under real threads
//! and Miri; `loom_tests` model-check it for each model's hand-off
//! (`RUSTFLAGS="--cfg loom"`).

#[cfg(loom)]
use loom::sync::atomic::{AtomicUsize, Ordering};
#[cfg(loom)]
use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::budget::QueueBudget;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most packets one peer may have queued per direction (the kernel's
/// MAX_QUEUED_PACKETS); beyond it new batches are dropped, never older ones.
pub const MAX_QUEUED_PACKETS: usize = 1024;

/// What one invocation of a serial stage did: the execution-order signatures of
/// design.md §4 are counted from these.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    pub batches: usize,
    pub packets: usize,
    /// The budget ran out with more ready: still scheduled, to be run again.
    pub more: bool,
    /// It stopped at a head batch whose crypt stage had not finished.
    pub head_pending: bool,
}

/// What an ordered queue holds: the pipeline's batches, or a stand-in in the tests
/// (which run under Miri, where the real batches' crypto keys cannot be built).
pub trait Ordered {
    /// Whether the crypt stage has finished with it (`SeqCst`, see `packet::Batch`).
    fn is_done(&self) -> bool;
    /// Packets it counts against [`MAX_QUEUED_PACKETS`].
    fn packets(&self) -> usize;
    /// Bytes it counts in [`OrderedQueue::queued_bytes`]; the same for as long as it
    /// is queued.
    fn bytes(&self) -> usize;
}

/// The queue proper and its `scheduled` flag, under one lock.
struct State<T> {
    batches: VecDeque<Arc<T>>,
    scheduled: bool,
}

pub struct OrderedQueue<T: Ordered> {
    state: Mutex<State<T>>,
    /// Producers waiting in `wait_for_room`, woken when batches leave.
    room: RoomWaiters,
    packets: AtomicUsize,
    /// What the queued batches count in bytes; changed with `packets`, under the lock.
    bytes: AtomicUsize,
    /// The bound this queue shares with the interface's other queues of its direction.
    budget: Option<Arc<QueueBudget>>,
}

/// Producers waiting for room in a bounded queue, and the condition variable they wait
/// on with the queue's lock. The count is changed and read only with that lock held,
/// so a consumer that sees 0 cannot miss a waiter: the waiter counts itself before the
/// condvar wait releases the lock. It saves a `futex` wake syscall on every dequeue
/// when nobody waits, which is nearly always.
pub struct RoomWaiters {
    room: Condvar,
    waiting: AtomicUsize,
}

impl Default for RoomWaiters {
    fn default() -> Self {
        RoomWaiters {
            room: Condvar::new(),
            waiting: AtomicUsize::new(0),
        }
    }
}

impl RoomWaiters {
    /// Waits, with `guard` (the queue's lock) released meanwhile, while `full` holds
    /// and at most `timeout`. Returns the guard and whether there is room.
    pub fn wait_while<'a, G>(
        &self,
        mut guard: MutexGuard<'a, G>,
        timeout: Duration,
        mut full: impl FnMut(&G) -> bool,
    ) -> (MutexGuard<'a, G>, bool) {
        // Read only when it must wait: the clock costs more than the check.
        let mut deadline = None;
        while full(&guard) {
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + timeout);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return (guard, false);
            }
            self.waiting.fetch_add(1, Ordering::Relaxed);
            guard = self
                .room
                .wait_timeout(guard, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        (guard, true)
    }

    /// Wakes every waiter, if there is one. Call with the queue's lock held.
    pub fn wake(&self) {
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.room.notify_all();
        }
    }
}

impl<T: Ordered> Default for OrderedQueue<T> {
    fn default() -> Self {
        OrderedQueue {
            state: Mutex::new(State {
                batches: VecDeque::new(),
                scheduled: false,
            }),
            room: RoomWaiters::default(),
            packets: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            budget: None,
        }
    }
}

/// A queue that goes away with packets still in it (its peer dropped while a batch it
/// took after the peer's removal was still queued) gives their room back.
impl<T: Ordered> Drop for OrderedQueue<T> {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.sub(self.packets.load(Ordering::Relaxed));
        }
    }
}

impl<T: Ordered> OrderedQueue<T> {
    /// A queue that also counts against `budget`, shared with other queues.
    pub fn with_budget(budget: Arc<QueueBudget>) -> Self {
        let mut q = Self::default();
        q.budget = Some(budget);
        q
    }

    /// Appends a batch; false (and the batch is not queued) when the queue, or the
    /// budget it shares, is full.
    pub fn push(&self, batch: Arc<T>, npackets: usize) -> bool {
        if self.budget.as_ref().is_some_and(|b| !b.fits(npackets)) {
            return false;
        }
        self.push_past_budget(batch, npackets)
    }

    /// Appends a batch even if the shared budget is full (it still counts there);
    /// false when the queue itself is. For packets the budget already counted in a
    /// queue before this one, and for the few it must never refuse.
    pub fn push_past_budget(&self, batch: Arc<T>, npackets: usize) -> bool {
        let mut st = self.lock();
        if self.packets.load(Ordering::Relaxed) + npackets > MAX_QUEUED_PACKETS {
            return false;
        }
        self.packets.fetch_add(npackets, Ordering::Relaxed);
        self.bytes.fetch_add(batch.bytes(), Ordering::Relaxed);
        if let Some(b) = &self.budget {
            b.add(npackets);
        }
        st.batches.push_back(batch);
        true
    }

    /// Takes `n` packets of `bytes` off the counts and gives their room back (with the
    /// lock held). `drained`: they left done with, and this queue is the last under its
    /// budget, so its drain rate counts them; otherwise they were dropped.
    fn count_out(&self, n: usize, bytes: usize, drained: bool) {
        self.packets.fetch_sub(n, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        match &self.budget {
            Some(b) if drained => b.drain(n),
            Some(b) => b.sub(n),
            None => {}
        }
    }

    /// Whether `npackets` more fit now, in this queue and in its budget.
    pub fn has_room(&self, npackets: usize) -> bool {
        self.packets.load(Ordering::Relaxed) + npackets <= MAX_QUEUED_PACKETS
            && self.budget.as_ref().is_none_or(|b| b.fits(npackets))
    }

    /// Waits (at most `timeout`) until `npackets` more fit. Only I/O reader threads call
    /// this, never workers: a worker waiting here could block the very drain it waits
    /// for. Waiting instead of dropping is the backpressure that keeps TCP from seeing
    /// losses that are only a full queue.
    pub fn wait_for_room(&self, npackets: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let full =
            |_: &State<T>| self.packets.load(Ordering::Relaxed) + npackets > MAX_QUEUED_PACKETS;
        if !self.room.wait_while(self.lock(), timeout, full).1 {
            return false;
        }
        match &self.budget {
            Some(b) => b.wait_for_room(npackets, deadline),
            None => true,
        }
    }

    /// For a stall's report: batches queued, whether a serial stage is scheduled, and
    /// whether the head batch is done.
    pub fn describe(&self) -> (usize, bool, Option<bool>) {
        let st = self.lock();
        (
            st.batches.len(),
            st.scheduled,
            st.batches.front().map(|b| b.is_done()),
        )
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims the right to run the serial stage. True means the caller must have one
    /// serial-stage work item for this queue run. A crypt worker calls it after
    /// marking its batch done.
    pub fn schedule(&self) -> bool {
        let mut st = self.lock();
        !std::mem::replace(&mut st.scheduled, true)
    }

    /// Runs `f` on the finished batches at the head, in order, until `budget` packets
    /// are handled (`usize::MAX`: all that are ready), each outside the lock. Called
    /// only from the serial-stage work item that `schedule` returned true for.
    ///
    /// When the budget runs out with the next batch already finished, the stage stays
    /// scheduled ([`Drained::more`]): the caller must run it again, as NAPI re-polls a
    /// poller that used its whole budget. Otherwise it is unscheduled, in the same
    /// lock that saw the head empty or not done (see the module comment).
    pub fn drain(&self, budget: usize, f: impl FnMut(Arc<T>)) -> Drained {
        self.drain_then(budget, false, f)
    }

    /// [`drain`](Self::drain), but a drain that finds nothing more to do keeps the
    /// claim: the stage stays scheduled, so completions leave it to the caller, who
    /// must end it with [`release`](Self::release). For a stage that hands on what it
    /// drained to be finished later (sends gathered across peers, `tx_flush`): no other
    /// drain of this queue can overtake what it holds.
    pub fn drain_held(&self, budget: usize, f: impl FnMut(Arc<T>)) -> Drained {
        self.drain_then(budget, true, f)
    }

    /// Ends a claim that [`drain_held`](Self::drain_held) kept: unscheduled, unless a
    /// batch finished at the head meanwhile. True then: still scheduled, and the
    /// caller must have the stage run again. The decision is taken under the same lock
    /// as a drain's, so no completion's wake-up is lost.
    pub fn release(&self) -> bool {
        let mut st = self.lock();
        let ready = st.batches.front().is_some_and(|head| head.is_done());
        if !ready {
            st.scheduled = false;
        }
        ready
    }

    fn drain_then(&self, budget: usize, hold: bool, mut f: impl FnMut(Arc<T>)) -> Drained {
        let mut d = Drained::default();
        loop {
            let b = {
                let mut st = self.lock();
                match st.batches.front() {
                    Some(head) if head.is_done() => {
                        if d.packets >= budget {
                            d.more = true;
                            return d;
                        }
                        let b = st.batches.pop_front().expect("the head exists");
                        self.count_out(b.packets(), b.bytes(), true);
                        self.wake_waiters();
                        b
                    }
                    head => {
                        d.head_pending = head.is_some();
                        st.scheduled = hold;
                        return d;
                    }
                }
            };
            d.packets += b.packets();
            d.batches += 1;
            let claim = GiveUpOnUnwind(self);
            f(b);
            std::mem::forget(claim);
        }
    }

    /// Gives up the claim of a drain whose `f` panicked (see [`GiveUpOnUnwind`]).
    fn give_up_claim(&self) {
        self.lock().scheduled = false;
    }

    /// Drops everything queued (peer removal) and returns how many packets that was.
    /// In-flight crypt work still completes but finds its batch gone from here. The
    /// room comes back without counting as drained: a removal's drop is no drain rate
    /// (a budget sized by it would grow for packets that never left).
    pub fn clear(&self) -> usize {
        let mut st = self.lock();
        let dropped: usize = st.batches.drain(..).map(|b| b.packets()).sum();
        let bytes = self.bytes.load(Ordering::Relaxed);
        self.count_out(self.packets.load(Ordering::Relaxed), bytes, false);
        self.wake_waiters();
        drop(st);
        dropped
    }

    /// Wakes producers waiting for room. Call with `state` locked.
    fn wake_waiters(&self) {
        self.room.wake();
    }

    pub fn queued_packets(&self) -> usize {
        self.packets.load(Ordering::Relaxed)
    }

    pub fn queued_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// Held by a drain around each batch it hands out: if the stage panics with it, the
/// drain's claim (`scheduled`) is given up as the panic unwinds, so that the next
/// completion, or whoever caught the panic (`stages::run_serial`), can schedule the
/// stage again; kept, the claim would hold the peer's queue still for good. Dropped
/// only by unwinding: a drain that returns forgets it. A stage that keeps its claim
/// past the drain (`drain_held`) holds one of its own until it releases it.
pub(crate) struct GiveUpOnUnwind<'a, T: Ordered>(pub(crate) &'a OrderedQueue<T>);

impl<T: Ordered> Drop for GiveUpOnUnwind<'_, T> {
    fn drop(&mut self) {
        self.0.give_up_claim();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! The scheduling protocol under concurrency. Also run under Miri
    //! (`scripts/sanitize.sh`), which checks every access for data races and explores
    //! thread interleavings across seeds.

    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64};

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
        fn bytes(&self) -> usize {
            100 * self.n
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
                            q.drain(usize::MAX, |b| delivered.lock().unwrap().push(b.seq));
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
        assert_eq!(q.queued_bytes(), 0);
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
        q.drain(usize::MAX, |b| seen.push(b.seq));
        assert_eq!(seen, [0, 2]);
        assert!(q.wait_for_room(MAX_QUEUED_PACKETS, Duration::ZERO));
    }
    /// A removal's clear says what it dropped and gives the room back without counting
    /// it as drained: a budget sized by its drain rate does not grow for packets that
    /// never left (it grew to the whole cleared queue per interval before), while a
    /// drain's packets do count.
    #[test]
    fn a_clear_is_no_drain() {
        let budget = Arc::new(QueueBudget::sized_by_drain(
            64,
            8192,
            Duration::from_millis(1),
        ));
        let q = OrderedQueue::<Item>::with_budget(budget.clone());
        let t0 = std::time::Instant::now();
        // Idle intervals bring the limit down to its floor.
        for k in 0..100 {
            budget.resize(t0 + Duration::from_millis(k));
        }
        assert_eq!(budget.limit(), 64);
        let item = Arc::new(Item {
            seq: 0,
            n: 60,
            done: AtomicBool::new(false),
        });
        assert!(q.push(item, 60));
        assert_eq!(q.clear(), 60);
        assert_eq!(budget.used(), 0);
        budget.resize(t0 + Duration::from_micros(99_100));
        assert_eq!(budget.limit(), 64);
        // The same packets drained do count: the limit follows their rate (60 in
        // 100 µs, 600 in a 1 ms target).
        let done = Arc::new(Item {
            seq: 1,
            n: 60,
            done: AtomicBool::new(true),
        });
        assert!(q.push(done, 60));
        assert!(q.schedule());
        q.drain(usize::MAX, |_| {});
        assert_eq!(budget.used(), 0);
        budget.resize(t0 + Duration::from_micros(99_200));
        assert_eq!(budget.limit(), 600);
    }

    /// Queues sharing a budget refuse what would take the sum past it, whatever room
    /// each has of its own; a drain or a clear gives the room back to all of them.
    #[test]
    fn queues_sharing_a_budget_hold_no_more_than_it_together() {
        let budget = Arc::new(QueueBudget::new(10));
        let (a, b) = (
            OrderedQueue::<Item>::with_budget(budget.clone()),
            OrderedQueue::<Item>::with_budget(budget.clone()),
        );
        let item = |seq, n| {
            Arc::new(Item {
                seq,
                n,
                done: AtomicBool::new(true),
            })
        };
        assert!(a.push(item(0, 6), 6));
        assert!(!b.push(item(1, 6), 6), "6 + 6 is past the shared 10");
        assert!(!b.wait_for_room(6, Duration::from_millis(1)));
        assert!(b.push(item(2, 4), 4));
        assert_eq!(budget.used(), 10);
        assert!(a.schedule());
        a.drain(usize::MAX, |_| {});
        assert_eq!(budget.used(), 4);
        assert!(b.wait_for_room(6, Duration::ZERO));
        b.clear();
        assert_eq!(budget.used(), 0);
        assert!(b.push(item(3, 5), 5));
        drop(b);
        assert_eq!(budget.used(), 0, "a dropped queue gives its room back");
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
        q.drain(usize::MAX, |_| {});
        let (room, waited) = waiter.join().unwrap();
        assert!(room);
        assert!(waited < Duration::from_secs(5), "woken by the timeout only");
    }

    /// A held drain keeps the claim; its release gives it up only with nothing
    /// finished at the head, and otherwise leaves the stage for the caller to run.
    #[test]
    fn a_held_drain_keeps_the_claim_until_released() {
        let q = OrderedQueue::<Item>::default();
        let push = |seq| {
            let it = Arc::new(Item {
                seq,
                n: 1,
                done: AtomicBool::new(false),
            });
            assert!(q.push(it.clone(), 1));
            it
        };
        push(0).done.store(true, Ordering::SeqCst);
        assert!(q.schedule());
        let d = q.drain_held(usize::MAX, |_| {});
        assert_eq!((d.packets, d.more), (1, false));
        push(1).done.store(true, Ordering::SeqCst);
        assert!(
            !q.schedule(),
            "held: the completion leaves the stage to the holder"
        );
        assert!(
            q.release(),
            "a finished head: the holder runs the stage again"
        );
        assert_eq!(q.drain_held(usize::MAX, |_| {}).packets, 1);
        let _pending = push(2);
        assert!(!q.release(), "nothing finished at the head: released");
        assert!(q.schedule(), "unscheduled by the release");
    }

    /// A budget stops the drain with the stage still scheduled while more is ready,
    /// and unschedules it once the head is not ready; the signatures say which.
    #[test]
    fn a_budget_keeps_the_stage_scheduled_while_more_is_ready() {
        let q = OrderedQueue::<Item>::default();
        let item = |seq, done| {
            Arc::new(Item {
                seq,
                n: 10,
                done: AtomicBool::new(done),
            })
        };
        let pending = item(3, false);
        for it in [item(0, true), item(1, true), item(2, true), pending.clone()] {
            assert!(q.push(it, 10));
        }
        assert!(q.schedule());
        let mut seen = Vec::new();
        let d = q.drain(15, |b| seen.push(b.seq));
        assert_eq!(
            (d.batches, d.packets, d.more, d.head_pending),
            (2, 20, true, false)
        );
        assert!(!q.schedule(), "still scheduled: the caller runs it again");
        let d = q.drain(15, |b| seen.push(b.seq));
        assert_eq!(
            (d.batches, d.packets, d.more, d.head_pending),
            (1, 10, false, true)
        );
        assert_eq!(seen, [0, 1, 2]);
        assert!(q.schedule(), "unscheduled at the pending head");
        let d = q.drain(15, |b| seen.push(b.seq));
        assert_eq!((d.batches, d.more, d.head_pending), (0, false, true));
        pending.done.store(true, Ordering::SeqCst);
        assert!(q.schedule());
        q.drain(15, |b| seen.push(b.seq));
        assert_eq!(seen, [0, 1, 2, 3]);
    }
}

/// Model checks of the hand-off from a completed crypt item to the serial stage, one
/// per execution model, over every interleaving loom can find of a producer, two crypt
/// completions and the serial stage (`RUSTFLAGS="--cfg loom" cargo test -p
/// wirelane-dataplane --release --lib queue::loom_tests`). Each ends with nothing
/// stranded: every item delivered once, in order, and the stage unscheduled.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;

    struct Item {
        seq: usize,
        done: AtomicBool,
    }

    impl Ordered for Item {
        fn is_done(&self) -> bool {
            self.done.load(Ordering::SeqCst)
        }
        fn packets(&self) -> usize {
            1
        }
        fn bytes(&self) -> usize {
            100
        }
    }

    const ITEMS: usize = 2;

    /// Every interleaving with at most three preemptions (loom's usual bound: bugs of
    /// this kind need one or two), which keeps each check to seconds.
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(f);
    }

    /// Queues the items in order and returns them for the crypt threads.
    fn produce(q: &OrderedQueue<Item>) -> Vec<Arc<Item>> {
        (0..ITEMS)
            .map(|seq| {
                let it = Arc::new(Item {
                    seq,
                    done: AtomicBool::new(false),
                });
                assert!(q.push(it.clone(), 1));
                it
            })
            .collect()
    }

    fn check(q: &OrderedQueue<Item>, delivered: &Mutex<Vec<usize>>) {
        assert_eq!(*delivered.lock().unwrap(), (0..ITEMS).collect::<Vec<_>>());
        assert_eq!(q.queued_packets(), 0);
        assert!(q.schedule(), "the serial stage was left scheduled");
    }

    /// One serial run as the workqueue runs it: a plain drain, or (`held`) a drain
    /// that hands on what it took only just before it releases the claim, as the
    /// transmit plug (`tx_flush`) does, and drains again while the release finds more.
    fn serial_run(q: &OrderedQueue<Item>, d: &Mutex<Vec<usize>>, held: bool) {
        if !held {
            q.drain(usize::MAX, |b| d.lock().unwrap().push(b.seq));
            return;
        }
        loop {
            let mut taken = Vec::new();
            q.drain_held(usize::MAX, |b| taken.push(b.seq));
            d.lock().unwrap().extend(taken);
            if !q.release() {
                return;
            }
        }
    }

    /// workqueue: the thread that wins `schedule` queues the serial item on the shared
    /// FIFO, which any worker (here: whichever runs next, or the end of the run) drains.
    fn workqueue_hand_off_with(held: bool) {
        model(move || {
            let q = Arc::new(OrderedQueue::<Item>::default());
            let fifo = Arc::new(Mutex::new(0usize)); // serial items queued
            let delivered = Arc::new(Mutex::new(Vec::new()));
            let items = produce(&q);
            let run_fifo =
                move |q: &OrderedQueue<Item>, fifo: &Mutex<usize>, d: &Mutex<Vec<usize>>| {
                    while std::mem::take(&mut *fifo.lock().unwrap()) > 0 {
                        serial_run(q, d, held);
                    }
                };
            let threads: Vec<_> = items
                .into_iter()
                .map(|it| {
                    let (q, fifo, d) = (q.clone(), fifo.clone(), delivered.clone());
                    loom::thread::spawn(move || {
                        it.done.store(true, Ordering::SeqCst);
                        if q.schedule() {
                            *fifo.lock().unwrap() += 1;
                        }
                        run_fifo(&q, &fifo, &d);
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            run_fifo(&q, &fifo, &delivered);
            check(&q, &delivered);
        });
    }

    #[test]
    fn workqueue_hand_off() {
        workqueue_hand_off_with(false);
    }

    #[test]
    fn held_drain_hand_off() {
        workqueue_hand_off_with(true);
    }

    /// threaded: the winner wakes the peer's own thread, which drains whenever woken.
    #[test]
    fn threaded_hand_off() {
        model(|| {
            let q = Arc::new(OrderedQueue::<Item>::default());
            let wakeups = Arc::new((Mutex::new((0usize, false)), Condvar::new()));
            let delivered = Arc::new(Mutex::new(Vec::new()));
            let items = produce(&q);
            let serial = {
                let (q, w, d) = (q.clone(), wakeups.clone(), delivered.clone());
                loom::thread::spawn(move || loop {
                    let mut g = w.0.lock().unwrap();
                    while g.0 == 0 && !g.1 {
                        g = w.1.wait(g).unwrap();
                    }
                    if g.0 == 0 {
                        return;
                    }
                    g.0 -= 1;
                    drop(g);
                    q.drain(usize::MAX, |b| d.lock().unwrap().push(b.seq));
                })
            };
            let threads: Vec<_> = items
                .into_iter()
                .map(|it| {
                    let (q, w) = (q.clone(), wakeups.clone());
                    loom::thread::spawn(move || {
                        it.done.store(true, Ordering::SeqCst);
                        if q.schedule() {
                            w.0.lock().unwrap().0 += 1;
                            w.1.notify_one();
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            wakeups.0.lock().unwrap().1 = true;
            wakeups.1.notify_one();
            serial.join().unwrap();
            check(&q, &delivered);
        });
    }

    /// softirq: the winner raises the poll on its own core's poller, which polls with a
    /// budget (one packet here) and polls again while the drain says there is more.
    #[test]
    fn softirq_hand_off_with_a_budget() {
        model(|| {
            let q = Arc::new(OrderedQueue::<Item>::default());
            let delivered = Arc::new(Mutex::new(Vec::new()));
            let items = produce(&q);
            let threads: Vec<_> = items
                .into_iter()
                .map(|it| {
                    let (q, d) = (q.clone(), delivered.clone());
                    // Each crypt thread is its own core; its poller runs after it on
                    // that core, so it is modelled in the same thread.
                    loom::thread::spawn(move || {
                        it.done.store(true, Ordering::SeqCst);
                        if q.schedule() {
                            while q.drain(1, |b| d.lock().unwrap().push(b.seq)).more {}
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            check(&q, &delivered);
        });
    }
}
