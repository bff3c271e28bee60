//! FQ-CoDel (RFC 8290) for one peer's transmit direction: the queue in front of the
//! nonce stage, where packets still have no counter and so may be reordered between
//! flows, dropped or marked without breaking the protocol's per-peer order.
//!
//! - Packets are hashed by their inner 5-tuple into [`FLOWS`] buckets. Deficit round
//!   robin over the buckets, with a quantum of [`QUANTUM`] bytes, serves a sparse
//!   flow (a request, a DNS query, a game tick) before the bulk flows: a bucket that
//!   becomes non-empty joins the *new* list, which is served first.
//! - Each bucket runs CoDel (RFC 8289) on its packets' sojourn time: once the sojourn
//!   stays above [`CodelParams::target`] for an [`CodelParams::interval`], it drops (or,
//!   for ECN-capable packets, marks CE) at the head, at intervals shrinking with the
//!   inverse square root of the drop count, until the sojourn falls below target.
//! - Time is a caller-given nanosecond clock, so the tests run on a simulated one.
//!
//! Invariant: a bucket is on exactly one of the two lists while `listed`, and the lists
//! hold no other buckets. The structure is not synchronised: the peer keeps it behind a
//! mutex, and whoever holds that mutex also assigns nonces to what it dequeues, so the
//! order of one flow's packets is the order of their counters.

use crate::budget::QueueBudget;
use crate::codel::{Codel, CodelParams};
use crate::queue::RoomWaiters;
use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How a peer's transmit direction queues packets before the nonce stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum QueueDiscipline {
    /// FQ-CoDel in front of a short ordered queue (the default).
    #[default]
    FqCodel,
    /// One FIFO of up to `queue::MAX_QUEUED_PACKETS`, the reader waiting when it is
    /// full: the kernel WireGuard's queue, kept for comparison.
    Fifo,
}

impl QueueDiscipline {
    pub const ALL: [QueueDiscipline; 2] = [QueueDiscipline::FqCodel, QueueDiscipline::Fifo];

    pub fn name(self) -> &'static str {
        match self {
            QueueDiscipline::FqCodel => "fq-codel",
            QueueDiscipline::Fifo => "fifo",
        }
    }
}

impl std::fmt::Display for QueueDiscipline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for QueueDiscipline {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        QueueDiscipline::ALL
            .into_iter()
            .find(|q| q.name() == s)
            .ok_or_else(|| format!("unknown queue discipline '{s}' (available: fq-codel, fifo)"))
    }
}

/// How an interface manages its queues: the transmit discipline, and CoDel's
/// parameters for the transmit flow queues and the receive side's controller (which
/// runs with fq-codel only; see `stages::rx_aqm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueuePolicy {
    pub discipline: QueueDiscipline,
    pub codel: CodelParams,
}

/// Flow buckets per peer. One peer of a gateway is usually one host or a small site:
/// 64 buckets keep two of its flows apart with probability 63/64. Only the buckets in
/// use have state (see [`FlowQueues`]), so a peer pays for the flows it carries.
pub const FLOWS: usize = 64;
// Buckets and list entries are stored as u8.
const _: () = assert!(FLOWS < u8::MAX as usize);
/// The DRR quantum, in bytes: 64 KiB, a run of about 45 full-size packets of one flow,
/// not RFC 8290's one packet. Runs of one flow are what the receiver's TUN coalesces
/// into one large write (GRO); interleaving 4 bulk flows packet by packet halved their
/// goodput in the lab (`tcp 4x`: 1.98 against 4.40 Gbit/s) as every packet became a
/// write of its own. A sparse flow does not wait for an old flow's run to end: its
/// bucket joins the new list, which the next dequeue serves first. It does wait behind
/// a bulk flow that is new itself (one that found every queue empty, as after a pause),
/// for what is left of that flow's first quantum: up to 64 KiB, about 46 packets.
pub const QUANTUM: i32 = 64 * 1024;

/// What the queue needs to know of a packet.
pub trait Queued {
    /// Bytes it occupies (the deficit is charged in bytes).
    fn bytes(&self) -> usize;
    /// Marks it Congestion Experienced if it is ECN-capable (ECT(0) or ECT(1)); false,
    /// and the packet unchanged, otherwise.
    fn mark_ce(&mut self) -> bool;
    /// Whether a DRR turn may end after it: false inside a run of segments that should
    /// leave together (one super-packet's), whose turn then goes on to the run's end.
    fn ends_run(&self) -> bool {
        true
    }
}

/// What a dequeue did besides returning a packet: the controller's drops and marks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Verdicts {
    pub dropped: u64,
    pub marked: u64,
    /// Sum and count of the sojourn times of the packets returned, ns.
    pub sojourn_ns: u64,
    pub sojourn_max_ns: u64,
    pub delivered: u64,
}

/// One bucket's state.
struct Flow<T> {
    bucket: u8,
    packets: VecDeque<(u64, T)>,
    bytes: usize,
    deficit: i32,
    /// The last packet it gave ended no run (`Queued::ends_run`): its turn goes on.
    mid_run: bool,
    listed: bool,
    codel: Codel,
}

impl<T> Flow<T> {
    fn new(bucket: usize) -> Self {
        Flow {
            bucket: bucket as u8,
            packets: VecDeque::new(),
            bytes: 0,
            deficit: 0,
            mid_run: false,
            listed: false,
            codel: Codel::default(),
        }
    }
}

/// The buckets in use and the DRR lists over them.
///
/// Invariants: `slot[b]` is 1 + the index in `flows` of bucket `b`'s state, 0 when it
/// has none; the lists hold indices into `flows`, each flow on at most one of them and
/// exactly while `listed`. Flows are only ever removed when nothing is queued, and the
/// lists are emptied then, so an index on a list always names the flow it was listed as.
struct Table<T> {
    slot: [u8; FLOWS],
    flows: Vec<Flow<T>>,
    new_flows: VecDeque<u8>,
    old_flows: VecDeque<u8>,
    packets: usize,
    /// The largest of the device's MTU (`note_mtu`) and the packets queued since the
    /// table was made: a bucket holding no more than one such packet is no standing
    /// queue (RFC 8289's maxpacket; the kernel's CoDel compares with the device's MTU).
    /// The packets count too, so a segment larger than the MTU (a jumbo frame seen
    /// before the MTU change arrived) is no standing queue alone either.
    max_packet: usize,
}

/// One peer's flow queues.
///
/// Memory: the table exists only while something is queued or a bucket's controller
/// remembers a recent dropping episode. When the last packet leaves, the buckets whose
/// controllers have nothing left to remember are released, and with them, when none
/// remains, the table. A gateway's memory then follows the peers that have packets in
/// flight, which the interface's transmit budget bounds, not the peers configured: at
/// 10,000 peers a table per peer, kept, was about 50 MiB.
pub struct FlowQueues<T> {
    table: Option<Box<Table<T>>>,
}

impl<T> Default for FlowQueues<T> {
    fn default() -> Self {
        FlowQueues { table: None }
    }
}

impl<T: Queued> FlowQueues<T> {
    /// Whether nothing is queued and no bucket's controller remembers anything: the
    /// state of a peer whose packets have all left, its table released.
    pub fn is_idle(&self) -> bool {
        self.table.is_none()
    }

    /// Packets queued over all buckets.
    pub fn len(&self) -> usize {
        self.table.as_ref().map_or(0, |t| t.packets)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Buckets with state: queued packets or a controller's memory.
    pub fn buckets_held(&self) -> usize {
        self.table.as_ref().map_or(0, |t| t.flows.len())
    }

    /// Drops everything queued (peer removal).
    pub fn clear(&mut self) {
        self.table = None;
    }

    /// Queues `item` of the flow hashing to `hash`, stamped `now`.
    pub fn enqueue(&mut self, hash: u32, item: T, now: u64) {
        let t = self.table.get_or_insert_with(|| {
            Box::new(Table {
                slot: [0; FLOWS],
                flows: Vec::new(),
                new_flows: VecDeque::new(),
                old_flows: VecDeque::new(),
                packets: 0,
                max_packet: 0,
            })
        });
        t.max_packet = t.max_packet.max(item.bytes());
        let b = hash as usize % FLOWS;
        let i = match t.slot[b] {
            0 => {
                t.flows.push(Flow::new(b));
                t.slot[b] = t.flows.len() as u8;
                t.flows.len() - 1
            }
            s => s as usize - 1,
        };
        let f = &mut t.flows[i];
        f.bytes += item.bytes();
        f.packets.push_back((now, item));
        t.packets += 1;
        if !f.listed {
            f.listed = true;
            f.deficit = QUANTUM;
            t.new_flows.push_back(i as u8);
        }
    }

    /// Tells the queues the device's MTU, the least that counts as one full packet.
    pub fn note_mtu(&mut self, mtu: usize) {
        if let Some(t) = self.table.as_mut() {
            t.max_packet = t.max_packet.max(mtu);
        }
    }

    /// Drops the oldest packet of the bucket holding the most bytes (RFC 8290 §4.1's
    /// overflow rule), so a flood of one flow cannot push out the others. Returns
    /// whether anything was queued to drop.
    pub fn drop_from_fattest(&mut self) -> bool {
        let Some(t) = self.table.as_mut() else {
            return false;
        };
        let Some(f) = t.flows.iter_mut().max_by_key(|f| f.bytes) else {
            return false;
        };
        match f.packets.pop_front() {
            Some((_, p)) => {
                f.bytes -= p.bytes();
                t.packets -= 1;
                true
            }
            None => false,
        }
    }

    /// The next packet by DRR over the buckets, after CoDel's drops and marks (with
    /// `params`) at the heads it visits; None when every bucket is empty.
    pub fn dequeue(&mut self, params: &CodelParams, now: u64, v: &mut Verdicts) -> Option<T> {
        let t = self.table.as_mut()?;
        let got = t.dequeue(params, now, v);
        if t.packets == 0 {
            self.release_idle(params, now);
        }
        got
    }

    /// With nothing queued: ends every bucket's DRR turn and keeps only the buckets
    /// whose controllers still remember something, without their packet buffers.
    ///
    /// Ending the turns early changes nothing RFC 8290 cares for: its rule that an
    /// emptied bucket passes through the old list once keeps a flow that empties and
    /// refills from jumping ahead of backlogged ones, and with every bucket empty there
    /// is none to jump ahead of.
    fn release_idle(&mut self, params: &CodelParams, now: u64) {
        let Some(t) = self.table.as_mut() else {
            return;
        };
        t.new_flows.clear();
        t.old_flows.clear();
        t.flows.retain_mut(|f| {
            f.codel.on_empty();
            !f.codel.forgettable(params, now)
        });
        if t.flows.is_empty() {
            self.table = None;
            return;
        }
        t.slot = [0; FLOWS];
        for (i, f) in t.flows.iter_mut().enumerate() {
            f.listed = false;
            f.mid_run = false;
            f.packets = VecDeque::new();
            t.slot[f.bucket as usize] = i as u8 + 1;
        }
    }
}

impl<T: Queued> Table<T> {
    fn dequeue(&mut self, params: &CodelParams, now: u64, v: &mut Verdicts) -> Option<T> {
        loop {
            let (from_new, i) = match self.new_flows.front() {
                Some(&i) => (true, i as usize),
                None => (false, *self.old_flows.front()? as usize),
            };
            // A turn ends at a run's end, never inside one: a super-packet's segments
            // interleaved with another flow's reach the receiver as two runs, two TUN
            // writes where one would do (with 4 bulk flows, 22,000-29,000 writes per
            // GB at the receiver against 17,000-18,000 behind the FIFO). The overdraft
            // is at most one super-packet, 64 KiB, and the next turn repays it.
            if self.flows[i].deficit <= 0 && !self.flows[i].mid_run {
                self.flows[i].deficit += QUANTUM;
                self.pop_list(from_new);
                self.old_flows.push_back(i as u8);
                continue;
            }
            match self.codel_dequeue(params, i, now, v) {
                Some(p) => {
                    self.flows[i].deficit -= p.bytes() as i32;
                    self.flows[i].mid_run = !p.ends_run();
                    return Some(p);
                }
                None => {
                    self.flows[i].mid_run = false;
                    // Empty. A new bucket goes to the old list once (RFC 8290 §4.2) so
                    // that a flow emptying and refilling at once cannot stay "new".
                    self.pop_list(from_new);
                    if from_new && !self.old_flows.is_empty() {
                        self.old_flows.push_back(i as u8);
                    } else {
                        self.flows[i].listed = false;
                    }
                }
            }
        }
    }

    fn pop_list(&mut self, from_new: bool) {
        if from_new {
            self.new_flows.pop_front();
        } else {
            self.old_flows.pop_front();
        }
    }

    /// RFC 8289's dequeue for bucket `i`: pops heads until one is neither dropped
    /// nor marked by the bucket's controller, or a marked one, and returns it.
    fn codel_dequeue(
        &mut self,
        params: &CodelParams,
        i: usize,
        now: u64,
        v: &mut Verdicts,
    ) -> Option<T> {
        loop {
            let f = &mut self.flows[i];
            let Some((at, mut p)) = f.packets.pop_front() else {
                f.codel.on_empty();
                return None;
            };
            f.bytes -= p.bytes();
            self.packets -= 1;
            let sojourn = now.saturating_sub(at);
            if !f
                .codel
                .judge(params, now, sojourn, f.bytes > self.max_packet)
            {
                return Some(deliver(p, sojourn, v));
            }
            if params.ecn && p.mark_ce() {
                v.marked += 1;
                return Some(deliver(p, sojourn, v));
            }
            v.dropped += 1;
        }
    }
}

/// Most packets one peer's flow queues hold. Above it the TUN reader waits for room (as
/// it waits on the FIFO), and after the wait drops from the fattest flow. CoDel keeps a
/// responsive flow's queue far below it: at 5 Gbit/s, 5 ms of sojourn is about 2,200
/// packets, so the bound leaves CoDel room to act before backpressure does.
pub const FQ_LIMIT: usize = 4096;

/// A peer's flow queues as the pipeline shares them: the queues under a mutex, a
/// reader waiting for room (`RoomWaiters`), the pump hand-off flag, and the
/// interface's transmit budget they count against.
///
/// Invariant (the budget): what the queues hold is counted in the budget from the
/// moment their lock is released ([`FqGuard`] settles the difference, whatever changed
/// it: enqueues, CoDel's drops, overflow, `clear`), and given back when they go.
///
/// Race and invariant (the pump, see `stages::fq`): whoever wants the queues pumped sets
/// `pump_again` and then tries the lock; whoever holds the lock clears the flag before
/// each pass and looks at it again after unlocking. So a pump request made while another
/// thread holds the lock is seen by that thread, and no request is lost; and nobody
/// waits for the lock to pump, so a serial stage run inline under a pumping reader
/// cannot deadlock on it.
pub struct SharedFlowQueues<T: Queued> {
    queues: Mutex<FlowQueues<T>>,
    room: RoomWaiters,
    pub pump_again: AtomicBool,
    budget: Arc<QueueBudget>,
}

/// The locked queues. On release it settles the budget to what they hold.
pub struct FqGuard<'a, T: Queued> {
    queues: MutexGuard<'a, FlowQueues<T>>,
    budget: &'a QueueBudget,
    /// What the budget counts for these queues.
    counted: usize,
}

impl<T: Queued> Deref for FqGuard<'_, T> {
    type Target = FlowQueues<T>;
    fn deref(&self) -> &FlowQueues<T> {
        &self.queues
    }
}

impl<T: Queued> DerefMut for FqGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut FlowQueues<T> {
        &mut self.queues
    }
}

impl<T: Queued> FqGuard<'_, T> {
    /// Packets the budget still takes, as of the lock (changes since are not counted).
    pub fn budget_room(&self) -> usize {
        self.budget.room()
    }

    /// Brings the budget up to date with what the queues hold now.
    pub fn settle(&mut self) {
        let held = self.queues.len();
        if held > self.counted {
            self.budget.add(held - self.counted);
        } else {
            self.budget.sub(self.counted - held);
        }
        self.counted = held;
    }
}

impl<T: Queued> Drop for FqGuard<'_, T> {
    fn drop(&mut self) {
        self.settle();
    }
}

impl<T: Queued> Drop for SharedFlowQueues<T> {
    fn drop(&mut self) {
        let q = self.queues.get_mut().unwrap_or_else(|p| p.into_inner());
        self.budget.sub(q.len());
    }
}

impl<T: Queued> SharedFlowQueues<T> {
    /// Empty queues that count against `budget`.
    pub fn with_budget(budget: Arc<QueueBudget>) -> Self {
        SharedFlowQueues {
            queues: Mutex::new(FlowQueues::default()),
            room: RoomWaiters::default(),
            pump_again: AtomicBool::new(false),
            budget,
        }
    }

    fn guard<'a>(&'a self, queues: MutexGuard<'a, FlowQueues<T>>) -> FqGuard<'a, T> {
        let counted = queues.len();
        FqGuard {
            queues,
            budget: &self.budget,
            counted,
        }
    }

    pub fn lock(&self) -> FqGuard<'_, T> {
        self.guard(self.queues.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The queues if nobody holds them (a poisoned lock is taken: the queues stay
    /// consistent between calls, which never panic midway).
    pub fn try_lock(&self) -> Option<FqGuard<'_, T>> {
        match self.queues.try_lock() {
            Ok(g) => Some(self.guard(g)),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(self.guard(p.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Whether `n` more packets fit the interface's transmit budget now.
    pub fn budget_fits(&self, n: usize) -> bool {
        self.budget.fits(n)
    }

    /// Locks the queues once `n` more packets fit under [`FQ_LIMIT`] and in the budget,
    /// or `timeout` passed (the caller then makes room by dropping). The budget is
    /// waited for first, without the lock, since the pumps of other peers free it.
    pub fn lock_with_room(&self, n: usize, timeout: Duration) -> FqGuard<'_, T> {
        // The clock is read only when the budget is full: with room at once, as
        // nearly always, the deadline is never needed.
        let mut left = timeout;
        if !self.budget.fits(n) {
            let deadline = std::time::Instant::now() + timeout;
            self.budget.wait_for_room(n, deadline);
            left = deadline.saturating_duration_since(std::time::Instant::now());
        }
        let full = |q: &FlowQueues<T>| q.len() + n > FQ_LIMIT;
        let locked = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let queues = self.room.wait_while(locked, left, full).0;
        self.guard(queues)
    }

    /// Wakes a reader waiting for room. Call with the queues locked, after dequeuing.
    pub fn wake_waiters(&self) {
        self.room.wake();
    }
}

fn deliver<T>(p: T, sojourn: u64, v: &mut Verdicts) -> T {
    v.delivered += 1;
    v.sojourn_ns += sojourn;
    v.sojourn_max_ns = v.sojourn_max_ns.max(sojourn);
    p
}

#[cfg(test)]
#[path = "fq_codel_tests.rs"]
mod tests;
