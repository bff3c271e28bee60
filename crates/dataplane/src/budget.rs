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
//!
//! Both directions' budgets are sized by time, not by a count (a dynamic queue
//! limit): what left the queues for good in the last timer tick gives the drain rate,
//! and the limit is `BUDGET_TARGET` of work at that rate, between a floor and a
//! ceiling. Why: under an overload the queues stand at the limit, so the limit is the
//! delay every packet waits. A fixed 8,192 packets was 26 ms of decryption on two
//! cores and a fraction of a millisecond on sixty-four; on transmit, a fixed 4,096 held
//! a gateway's packets 9 ms on average from TUN read to send (p99 up to 33 ms) when it
//! sent to a thousand peers on two cores, where 5 ms of work held them 3 ms. The
//! target is 1 ms, not CoDel's 5 ms, because what the queues hold is also the
//! pipeline's working set: each packet is a 2 KiB buffer that the reader writes and a
//! worker reads again later. 5 ms of decryption held about 3,000 packets (6 MiB) at a
//! thousand peers on two cores, past what stays in cache, and the copy, the AEAD and
//! the TUN write each paid for it: the gateway delivered 0.8× and spent 1.2× the CPU
//! per byte that it did with 1 ms (BENCHMARKS.md, "The receive budget"). The floor
//! still covers a reader's full read (shared by the tunnels of one pool, each keeps at
//! least one receive batch: [`BUDGET_MIN_SHARE_PACKETS`]), and 1 ms is five of a
//! waiting reader's looks (`POLL`), so a waiting reader looks again long before the
//! workers run dry. The
//! limit grows at once with the rate and shrinks by an eighth a tick at most, so a
//! burst after a quiet moment finds the room a busy moment had. Only the last queue's
//! exit counts as drained (`QueueBudget::drain`): a transmit packet moves from its
//! flow queue to its peer's ordered queue under the same budget, and counting both
//! moves would double the rate. Race: `resize` runs on the timer thread alone;
//! readers only read the limit, so a reader may judge one packet batch against the
//! old one.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use std::sync::Arc;
use std::time::{Duration, Instant};

/// Packets either direction's queues hold at most together (16 MiB of buffers),
/// whatever their drain rate: on transmit every peer's ordered queue and, under
/// `fq-codel`, its flow queues in front.
pub const BUDGET_MAX_PACKETS: usize = 8192;

/// The work either direction's queues hold at their drain rate: the standing delay a
/// queue may keep, and small enough that the packets it holds stay in cache (see the
/// module's comment).
pub const BUDGET_TARGET: Duration = Duration::from_millis(1);

/// The floor of either direction's budget, so that a limit sized in a quiet moment
/// holds a reader back no longer than the workers take to drain one read: on receive
/// more than one full read of a reader (16 coalesced buffers of up to 45 datagrams,
/// 720 packets); on transmit, four peers' full ordered queues
/// (`stages::fq::RING_PACKETS`), enough to give every worker a batch. It must stay at
/// least one receive batch (`packet::RX_BATCH_MAX`), which a reader admits whole or
/// not at all. When a peer's whole read was one batch, a floor of 512 delivered next
/// to nothing from one peer: its reads never fitted.
pub const BUDGET_MIN_PACKETS: usize = 1024;
// The packet module is left out of the loom build, which checks only the atomics.
#[cfg(not(loom))]
const _: () = assert!(BUDGET_MIN_PACKETS >= crate::packet::RX_BATCH_MAX);

/// The least share of [`BUDGET_MIN_PACKETS`] an interface keeps when several share one
/// worker pool ([`QueueBudget::share_floor`]): one receive batch, which a reader admits
/// whole, and four transmit reads.
///
/// Why the floor is shared: it is there so that the workers never run dry behind a
/// waiting reader, and the workers are the process's, not an interface's. Each of 16
/// tunnels keeping the whole floor let 16 times as many packets wait in flight as one
/// tunnel with the same 16 flows: a transmitted packet then spent 8.4 ms from its TUN
/// read to its send against 3.3 ms, each tunnel's items waiting out a round of the
/// pool's deficit round robin over the others' (BENCHMARKS.md, "Many tunnels").
pub const BUDGET_MIN_SHARE_PACKETS: usize = 256;
#[cfg(not(loom))]
const _: () = assert!(BUDGET_MIN_SHARE_PACKETS >= crate::packet::RX_BATCH_MAX);

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

impl Budgets {
    /// Re-sizes both directions' budgets at `now`, with their floors shared among the
    /// `sharers` interfaces that draw on the same worker pool (the timer thread's, every
    /// tick).
    pub fn resize(&self, now: Instant, sharers: usize) {
        for b in [&self.rx, &self.tx] {
            b.share_floor(sharers);
            b.resize(now);
        }
    }
}

impl Default for Budgets {
    fn default() -> Budgets {
        Budgets {
            rx: Arc::new(QueueBudget::by_drain()),
            tx: Arc::new(QueueBudget::by_drain()),
            staged: Arc::new(QueueBudget::new(STAGED_BUDGET_PACKETS)),
        }
    }
}

#[derive(Debug)]
pub struct QueueBudget {
    limit: AtomicUsize,
    used: AtomicUsize,
    /// Sizing by drain rate, for a budget that has it.
    sizing: Option<Sizing>,
}

/// A budget's sizing by drain rate (see the module's comment).
#[derive(Debug)]
struct Sizing {
    min: usize,
    max: usize,
    target: Duration,
    /// Packets that ever left the last queue holding the budget (`drain`).
    drained: AtomicU64,
    /// When `resize` last looked, and `drained` then.
    last: std::sync::Mutex<Option<(Instant, u64)>>,
    /// The floor `resize` keeps now: `min`, or this interface's share of it
    /// (`share_floor`).
    floor: AtomicUsize,
}

impl QueueBudget {
    /// A fixed bound of `limit` packets.
    pub fn new(limit: usize) -> QueueBudget {
        QueueBudget {
            limit: AtomicUsize::new(limit),
            used: AtomicUsize::new(0),
            sizing: None,
        }
    }

    /// An interface's budget for one direction: [`BUDGET_TARGET`] of work at its drain
    /// rate, between [`BUDGET_MIN_PACKETS`] and [`BUDGET_MAX_PACKETS`].
    pub fn by_drain() -> QueueBudget {
        QueueBudget::sized_by_drain(BUDGET_MIN_PACKETS, BUDGET_MAX_PACKETS, BUDGET_TARGET)
    }

    /// A bound of `target` worth of work at the rate its queues drain, between `min`
    /// and `max` packets, starting at `max`; [`QueueBudget::resize`] keeps it so.
    pub fn sized_by_drain(min: usize, max: usize, target: Duration) -> QueueBudget {
        QueueBudget {
            limit: AtomicUsize::new(max),
            used: AtomicUsize::new(0),
            sizing: Some(Sizing {
                min: min.min(max),
                max,
                target,
                drained: AtomicU64::new(0),
                last: std::sync::Mutex::new(None),
                floor: AtomicUsize::new(min.min(max)),
            }),
        }
    }

    /// Re-sizes a budget sized by drain rate from what drained since the last call
    /// (the timer thread's, every tick); a fixed budget stays as it is.
    pub fn resize(&self, now: Instant) {
        let Some(s) = &self.sizing else { return };
        let drained = s.drained.load(Ordering::Relaxed);
        let mut last = s.last.lock().unwrap_or_else(|p| p.into_inner());
        let Some((then, before)) = last.replace((now, drained)) else {
            return;
        };
        let secs = now.saturating_duration_since(then).as_secs_f64();
        if secs <= 0.0 {
            return;
        }
        let rate = drained.saturating_sub(before) as f64 / secs;
        let wanted = (rate * s.target.as_secs_f64()) as usize;
        let old = self.limit.load(Ordering::Relaxed);
        let floor = s.floor.load(Ordering::Relaxed);
        let limit = wanted.max(old - old / 8).clamp(floor, s.max);
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Shares the floor among `sharers` interfaces that draw on one worker pool: each
    /// keeps `min / sharers`, never less than [`BUDGET_MIN_SHARE_PACKETS`] (nor more
    /// than `min`), so that the floors together hold one floor's packets in flight up
    /// to four tunnels, and one receive batch more for each tunnel past that. Takes
    /// effect at the next `resize`; a fixed budget has no floor.
    pub fn share_floor(&self, sharers: usize) {
        if let Some(s) = &self.sizing {
            let floor = (s.min / sharers.max(1))
                .max(BUDGET_MIN_SHARE_PACKETS)
                .min(s.min);
            s.floor.store(floor, Ordering::Relaxed);
        }
    }

    /// The bound now, packets.
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Whether `n` more packets fit.
    pub fn fits(&self, n: usize) -> bool {
        self.used.load(Ordering::Relaxed) + n <= self.limit()
    }

    /// Counts `n` more packets held (a queue's push; the model's reader).
    pub fn add(&self, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    /// Gives back the room of `n` packets that moved to another queue under this
    /// budget, or were dropped.
    pub(crate) fn sub(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }

    /// Gives back the room of `n` packets that left the last queue under this budget,
    /// done with: what the drain rate counts.
    pub fn drain(&self, n: usize) {
        self.sub(n);
        if let Some(s) = &self.sizing {
            s.drained.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// How many more packets fit.
    pub fn room(&self) -> usize {
        self.limit()
            .saturating_sub(self.used.load(Ordering::Relaxed))
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(10);

    /// Drains `per_tick` packets a tick for `ticks` ticks from `t`, resizing each tick.
    fn run(b: &QueueBudget, t: &mut Instant, per_tick: usize, ticks: usize) {
        for _ in 0..ticks {
            b.add(per_tick);
            b.drain(per_tick);
            *t += TICK;
            b.resize(*t);
        }
    }

    #[test]
    fn the_receive_budget_holds_its_target_of_work_at_the_drain_rate() {
        let b = QueueBudget::sized_by_drain(1024, 8192, Duration::from_millis(5));
        let mut t = Instant::now();
        b.resize(t);
        assert_eq!(b.limit(), 8192, "it starts at its ceiling");
        // 350,000 packets a second (two cores decrypting): 5 ms is 1,750 packets.
        run(&b, &mut t, 3_500, 40);
        assert_eq!(b.limit(), 1_750);
        // Ten times faster (many cores): the ceiling.
        run(&b, &mut t, 35_000, 1);
        assert_eq!(b.limit(), 8192, "it grows at once");
    }

    #[test]
    fn the_receive_budget_shrinks_slowly_to_its_floor_when_idle() {
        let b = QueueBudget::sized_by_drain(1024, 8192, Duration::from_millis(5));
        let mut t = Instant::now();
        b.resize(t);
        run(&b, &mut t, 0, 1);
        assert_eq!(b.limit(), 8192 - 8192 / 8, "an eighth a tick at most");
        run(&b, &mut t, 0, 100);
        assert_eq!(b.limit(), 1024);
        // A burst after the quiet moment: the limit follows the rate it drains at.
        run(&b, &mut t, 10_000, 1);
        assert_eq!(b.limit(), 5_000);
    }

    /// Sixteen interfaces on one pool each fall to a sixteenth of the floor, but not
    /// below one receive batch; alone again, an interface gets the whole floor back.
    #[test]
    fn interfaces_sharing_a_pool_share_the_floor() {
        let b = QueueBudget::by_drain();
        let mut t = Instant::now();
        b.share_floor(4);
        b.resize(t);
        run(&b, &mut t, 0, 100);
        assert_eq!(b.limit(), BUDGET_MIN_PACKETS / 4);
        b.share_floor(16);
        run(&b, &mut t, 0, 100);
        assert_eq!(b.limit(), BUDGET_MIN_SHARE_PACKETS);
        b.share_floor(1);
        run(&b, &mut t, 0, 1);
        assert_eq!(b.limit(), BUDGET_MIN_PACKETS);
        // What the drain rate asks for still holds above the shared floor.
        b.share_floor(16);
        run(&b, &mut t, 10_000, 1);
        assert_eq!(b.limit(), 1_000);
        // A fixed budget has no floor to share.
        let fixed = QueueBudget::new(10);
        fixed.share_floor(16);
        fixed.resize(t);
        assert_eq!(fixed.limit(), 10);
    }

    #[test]
    fn packets_moving_between_queues_under_one_budget_are_not_drained() {
        let b = QueueBudget::sized_by_drain(1024, 8192, Duration::from_millis(5));
        let mut t = Instant::now();
        b.resize(t);
        // 350,000 packets a second pass a flow queue, then the ordered queue behind.
        for _ in 0..40 {
            b.add(3_500);
            b.sub(3_500);
            b.add(3_500);
            b.drain(3_500);
            t += TICK;
            b.resize(t);
        }
        assert_eq!(b.limit(), 1_750, "the rate counts each packet once");
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn a_fixed_budget_stays_fixed_and_the_limit_bounds_what_fits() {
        let b = QueueBudget::new(10);
        let t = Instant::now();
        b.resize(t);
        b.sub(0);
        b.resize(t + TICK);
        assert_eq!(b.limit(), 10);
        b.add(8);
        assert!(b.fits(2) && !b.fits(3));
        assert_eq!(b.room(), 2);
    }
}
