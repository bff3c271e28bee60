//! One tunnel's state, which every stage shares: its TUN, identity, peer table with
//! AllowedIPs, receiver-index table, sockets, handshake gate and lanes, timer queue,
//! view of the host's network and counters. Nothing here runs anything: the threads
//! are the runtime's (`runtime`), and which thread runs what is the execution model's
//! (`sched`). One process may hold many interfaces.
//!
//! Lock order (outermost first): `table` → a peer's state → a peer's sticky source →
//! `indices` → `timers`. Nothing holds a lock across crypto, and only the UAPI takes
//! `table` for writing.

use crate::budget::Budgets;
use crate::codel::{Codel, CodelParams};
use crate::fq_codel::{QueueDiscipline, QueuePolicy};
use crate::idmap::IdMap;
use crate::netwatch::NetWatch;
use crate::peer::Peer;
use crate::ports::TunPort;
use crate::sockets::Sockets;
use crate::stats::Stats;
use crate::timer_queue::TimerQueue;
use crate::underload::{ReplyRate, MAX_QUEUED_HANDSHAKES, UNDER_LOAD_AFTER, UNDER_LOAD_THRESHOLD};
use arc_swap::{ArcSwap, ArcSwapOption};
use crossbeam_channel::{Receiver, Sender};
use rand_core::{OsRng, RngCore};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant, SystemTime};
use wirelane_io::poll::Waker;
use wirelane_io::udp::LocalAddr;
use wirelane_proto::cookie::Gate;
use wirelane_proto::messages::Kind;
use wirelane_proto::{AllowedIps, IndexTable, LocalIdentity};

/// Sources the handshake rate limiter tracks at most, as the kernel's (8 times its
/// table of 8,192 on a machine with more than 1 GiB): with the table full, new sources
/// are refused while under load, so the bound is what an attacker holding many IPv6
/// /64s must keep refreshed to lock new peers out. About 3 MiB when full, and only
/// while the sources keep sending.
pub const RATE_LIMITER_CAPACITY: usize = 65_536;

/// A handshake message waiting for the handshake stage.
pub struct HandshakeJob {
    pub kind: Kind,
    pub bytes: Vec<u8>,
    pub src: SocketAddr,
    /// Where it arrived: the peer's sticky source once the message authenticates.
    pub local: Option<LocalAddr>,
    /// When it was queued (`Interface::now`, ns), for the lanes' sojourn.
    pub queued_ns: u64,
}

/// Peers by key and by id, plus the routing table over ids.
#[derive(Default)]
pub struct PeerTable {
    pub by_key: HashMap<[u8; 32], Arc<Peer>>,
    pub by_id: IdMap<Arc<Peer>>,
    pub allowed: AllowedIps<u32>,
    pub next_id: u32,
}

impl PeerTable {
    /// A peer id no live peer holds. Ids count up and wrap after 2^32 peers made; one
    /// still held by a peer from before the wrap is skipped, or the new peer would take
    /// the old one's place in `by_id` and the two would share its routes. There are
    /// fewer live peers than ids, so the search ends.
    pub fn take_id(&mut self) -> u32 {
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            if !self.by_id.contains_key(&id) {
                return id;
            }
        }
    }

    pub fn route(&self, dst: std::net::IpAddr) -> Option<&Arc<Peer>> {
        self.allowed.lookup(dst).and_then(|id| self.by_id.get(&id))
    }
}

/// Peers one interface holds at most, whatever the memory: the kernel's bound.
pub const MAX_PEERS_PER_INTERFACE: usize = 1 << 20;
/// AllowedIPs prefixes one interface holds at most, whatever the memory: 64 per peer
/// at the peer bound.
pub const MAX_ALLOWED_IPS_PER_INTERFACE: usize = 1 << 26;

pub struct Interface {
    /// Unique among the runtime's interfaces, for as long as the process runs.
    pub id: u32,
    pub tun: Box<dyn TunPort>,
    /// How transmit packets queue before their nonce.
    pub queue: QueueDiscipline,
    /// What every peer's queues of one direction hold together, at most.
    pub budgets: Budgets,
    /// Peers the table may hold (`set_max_peers`); an update that would exceed it is
    /// refused whole.
    max_peers: AtomicUsize,
    /// AllowedIPs prefixes the table may hold (`set_max_allowed_ips`), likewise.
    max_allowed_ips: AtomicUsize,
    /// Held through each configuration update, so that the peer count an update is
    /// checked against cannot change before it is applied.
    pub(crate) apply_lock: Mutex<()>,
    /// CoDel's parameters, for both directions.
    pub codel: CodelParams,
    /// The receive side's controller, with fq-codel: one per interface, since its
    /// queue, the socket buffer and the pipeline behind it, is shared by every peer
    /// (its drops then land on peers in proportion to their traffic).
    pub rx_codel: Mutex<Codel>,
    origin: Instant,
    /// The wall clock less `now()`, ns, as of the last `refresh_wall_offset` (at
    /// creation, then every timer tick).
    wall_offset_ns: AtomicU64,
    /// Read by every protocol step, so twice per packet sent; written only by a
    /// configuration change. An `ArcSwap`, not a lock: see [`Interface::sockets`].
    identity: ArcSwapOption<LocalIdentity>,
    table: RwLock<PeerTable>,
    indices: Mutex<IdMap<Arc<Peer>>>,
    sockets: ArcSwap<Sockets>,
    gate: Mutex<Option<Gate>>,
    handshake_tx: Sender<HandshakeJob>,
    handshake_rx: Receiver<HandshakeJob>,
    /// Admitted handshake messages that carry a mac2, and cookie replies, served
    /// first. Under load only these are admitted (within the per-source limit), but the
    /// plain lane may still hold up to a queue's worth admitted on mac1 alone just
    /// before the mode began: a legitimate peer's cookie-bearing retry must not wait
    /// behind those Diffie-Hellman steps.
    cookie_lane_tx: Sender<HandshakeJob>,
    cookie_lane_rx: Receiver<HandshakeJob>,
    last_under_load_ns: AtomicU64,
    /// The gate's cookie replies per [`UNDER_LOAD_AFTER`], which keep a flood under load.
    pub(crate) cookie_reply_rate: ReplyRate,
    timers: TimerQueue,
    /// The device's place, MTU and addresses, and the sockets' routing generation.
    pub netwatch: NetWatch,
    /// Limits the ICMP errors written back for packets no peer routes.
    pub(crate) icmp_limit: crate::icmp::RateLimit,
    /// Kernel drops at sockets this interface no longer uses, per `SocketRole::ALL`.
    retired_kernel_drops: Mutex<[u64; 3]>,
    /// Recent verdicts of the routing-loop filter (`stages::route`).
    pub(crate) outer_verdicts: crate::stages::route::OuterVerdicts,
    pub stats: Stats,
    stopping: AtomicBool,
    /// Readable once the interface stops: whoever serves it (the daemon's supervisor)
    /// polls it to learn that it stopped on its own.
    pub waker: Waker,
    /// Why the interface stopped on its own (the TUN went away), if it did.
    pub fatal: Mutex<Option<String>>,
}

/// Index-table view handed to the protocol for one peer.
pub(crate) struct PeerIndices<'a> {
    map: &'a Mutex<IdMap<Arc<Peer>>>,
    peer: &'a Arc<Peer>,
}

impl IndexTable for PeerIndices<'_> {
    /// A removed peer's step gets an index that is never entered: `forget_peer` has
    /// taken out those it held, and nothing would take out a new one. Race: removal
    /// marks the peer before it locks the peer's state to read its indices, and this
    /// runs under that lock, so either it sees the mark or `forget_peer` sees the index.
    fn allocate(&mut self) -> u32 {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let i = OsRng.next_u32();
            if self.peer.is_removed() {
                return i;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = map.entry(i) {
                e.insert(self.peer.clone());
                return i;
            }
        }
    }
    fn release(&mut self, index: u32) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&index);
    }
}

impl Interface {
    /// A new interface around `tun` and `sockets`. Opens its rtnetlink view at once
    /// (see `NetWatch::new` for why before privileges are dropped). It carries no
    /// traffic until a runtime serves it (`Runtime::serve`).
    pub fn new(
        tun: Box<dyn TunPort>,
        sockets: Sockets,
        policy: QueuePolicy,
    ) -> std::io::Result<Arc<Interface>> {
        static NEXT_ID: AtomicU32 = AtomicU32::new(0);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (handshake_tx, handshake_rx) = crossbeam_channel::bounded(MAX_QUEUED_HANDSHAKES);
        let (cookie_lane_tx, cookie_lane_rx) =
            crossbeam_channel::bounded(MAX_QUEUED_HANDSHAKES / 4);
        let netwatch = NetWatch::new(tun.as_tun());
        // 512 buffers (1 MiB), half of one peer's queue bound (MAX_QUEUED_PACKETS), so
        // a first burst finds buffers ready.
        crate::pool::prefill(8);
        let iface = Arc::new(Interface {
            id,
            tun,
            queue: policy.discipline,
            codel: policy.codel,
            rx_codel: Mutex::new(Codel::default()),
            origin: Instant::now(),
            wall_offset_ns: AtomicU64::new(0),
            identity: ArcSwapOption::empty(),
            table: RwLock::new(PeerTable::default()),
            indices: Mutex::new(IdMap::default()),
            sockets: ArcSwap::from_pointee(sockets),
            budgets: Budgets::default(),
            max_peers: AtomicUsize::new(MAX_PEERS_PER_INTERFACE),
            max_allowed_ips: AtomicUsize::new(MAX_ALLOWED_IPS_PER_INTERFACE),
            apply_lock: Mutex::new(()),
            gate: Mutex::new(None),
            handshake_tx,
            handshake_rx,
            cookie_lane_tx,
            cookie_lane_rx,
            last_under_load_ns: AtomicU64::new(0),
            cookie_reply_rate: Default::default(),
            timers: TimerQueue::default(),
            netwatch,
            icmp_limit: Default::default(),
            retired_kernel_drops: Default::default(),
            outer_verdicts: Default::default(),
            stats: Stats::default(),
            stopping: AtomicBool::new(false),
            waker: Waker::new()?,
            fatal: Mutex::new(None),
        });
        iface.refresh_wall_offset();
        Ok(iface)
    }

    // --- clock ---

    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// The wall clock (since the Unix epoch) as the monotonic clock plus an offset, as
    /// the kernel itself keeps it: one clock read where the protocol step needs both
    /// (`stages::protocol`), for every packet sent. The offset follows a step of the
    /// wall clock within a timer tick (`refresh_wall_offset`); what reads it (TAI64N
    /// timestamps, the last handshake's time, sojourns against the kernel's receive
    /// stamps) tolerates that.
    pub fn wall(&self) -> Duration {
        self.wall_at(self.now())
    }

    /// [`Interface::wall`] at a `now()` already read.
    pub fn wall_at(&self, now: Duration) -> Duration {
        now + Duration::from_nanos(self.wall_offset_ns.load(Ordering::Relaxed))
    }

    /// Re-reads the wall clock's offset from the monotonic one.
    pub fn refresh_wall_offset(&self) {
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let offset = wall.saturating_sub(self.now());
        self.wall_offset_ns
            .store(offset.as_nanos() as u64, Ordering::Relaxed);
    }

    // --- shared state accessors ---

    pub fn identity(&self) -> Option<Arc<LocalIdentity>> {
        self.identity.load_full()
    }

    /// The identity for a moment (a protocol step), without touching its reference
    /// count: that count's cache line is every thread's, the guard's slot this thread's.
    pub(crate) fn identity_now(&self) -> arc_swap::Guard<Option<Arc<LocalIdentity>>> {
        self.identity.load()
    }

    pub(crate) fn set_identity(&self, id: Option<Arc<LocalIdentity>>) {
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = id
            .as_ref()
            .map(|i| Gate::new(&i.public, RATE_LIMITER_CAPACITY));
        self.identity.store(id);
    }

    pub fn table(&self) -> RwLockReadGuard<'_, PeerTable> {
        self.table.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets how many peers the table may hold, at most [`MAX_PEERS_PER_INTERFACE`].
    /// Peers already configured stay; only updates that would add more are refused.
    pub fn set_max_peers(&self, n: usize) {
        self.max_peers
            .store(n.min(MAX_PEERS_PER_INTERFACE), Ordering::Relaxed);
    }

    pub fn max_peers(&self) -> usize {
        self.max_peers.load(Ordering::Relaxed)
    }

    /// Sets how many AllowedIPs prefixes the table may hold, at most
    /// [`MAX_ALLOWED_IPS_PER_INTERFACE`], as [`Self::set_max_peers`] does for peers.
    pub fn set_max_allowed_ips(&self, n: usize) {
        self.max_allowed_ips
            .store(n.min(MAX_ALLOWED_IPS_PER_INTERFACE), Ordering::Relaxed);
    }

    pub fn max_allowed_ips(&self) -> usize {
        self.max_allowed_ips.load(Ordering::Relaxed)
    }

    pub(crate) fn table_mut(&self) -> RwLockWriteGuard<'_, PeerTable> {
        self.table.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The sockets, for a moment: hold the guard no longer than a send or a receive.
    ///
    /// Why an `ArcSwap` rather than a read-write lock: every flush reads them, so with
    /// a thousand peers every packet sent did, and a read lock is a write to the lock's
    /// cache line, which every reader and worker shares. A guard writes a slot of the
    /// calling thread's own. Race: a sender that loaded the sockets just before a
    /// replacement sends once more on the old ones, as it would have under the lock
    /// taken just before the writer's.
    pub fn sockets(&self) -> arc_swap::Guard<Arc<Sockets>> {
        self.sockets.load()
    }

    /// Changes the sockets' fwmark (already applied to them): copies of the same
    /// sockets with the new mark replace them.
    pub(crate) fn set_sockets_fwmark(&self, mark: u32) {
        self.sockets.rcu(|s| {
            Arc::new(Sockets {
                fwmark: mark,
                ..Sockets::clone(s)
            })
        });
    }

    pub(crate) fn replace_sockets(&self, s: Sockets) {
        // What the kernel dropped at the old sockets stays counted: the counters built
        // on it must never go down (Prometheus would read a reset). The swap and the
        // count move together under the lock `kernel_drops` reads under, so no reading
        // sees the new sockets without the old ones' drops.
        let mut retired = self
            .retired_kernel_drops
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let old = self.sockets.swap(Arc::new(s));
        for (i, role) in crate::sockets::SocketRole::ALL.into_iter().enumerate() {
            retired[i] += old.kernel_drops(role);
        }
        drop(retired);
        // After the swap: a woken reader must find the successors.
        if let Some(w) = &old.retired {
            w.wake();
        }
    }

    /// Datagrams the kernel dropped at this role's sockets, these and every earlier
    /// set's (a new listen port binds new ones): a counter that never goes down.
    pub fn kernel_drops(&self, role: crate::sockets::SocketRole) -> u64 {
        let i = crate::sockets::SocketRole::ALL
            .iter()
            .position(|r| *r == role)
            .unwrap_or(0);
        let retired = self
            .retired_kernel_drops
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        retired[i] + self.sockets().kernel_drops(role)
    }

    pub(crate) fn gate(&self) -> MutexGuard<'_, Option<Gate>> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn peer_by_index(&self, index: u32) -> Option<Arc<Peer>> {
        self.indices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&index)
            .cloned()
    }

    pub fn index_count(&self) -> usize {
        self.indices.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn mtu(&self) -> usize {
        self.netwatch.mtu()
    }

    /// Queues a copy of a handshake message the gate admitted, or a cookie reply
    /// received; drops it when its lane is full. True if it was queued: the caller then
    /// tells the scheduler.
    pub(crate) fn queue_handshake(
        &self,
        kind: Kind,
        bytes: &[u8],
        src: SocketAddr,
        local: Option<LocalAddr>,
    ) -> bool {
        if self.handshake_queue_len() >= UNDER_LOAD_THRESHOLD {
            self.renew_under_load();
        }
        let mac2_len = wirelane_proto::crypto::MAC_LEN;
        let carries_cookie = match kind {
            Kind::CookieReply => true,
            _ => bytes[bytes.len() - mac2_len..].iter().any(|&b| b != 0),
        };
        let lane = if carries_cookie {
            &self.cookie_lane_tx
        } else {
            &self.handshake_tx
        };
        let queued = !lane.is_full()
            && lane
                .try_send(HandshakeJob {
                    kind,
                    bytes: bytes.to_vec(),
                    src,
                    local,
                    queued_ns: self.now().as_nanos() as u64,
                })
                .is_ok();
        if !queued {
            self.stats
                .handshake_queue_full
                .fetch_add(1, Ordering::Relaxed);
        }
        queued
    }

    /// The next queued handshake message, and how long it waited: the cookie lane
    /// first, always (see `cookie_lane_tx`).
    pub(crate) fn take_handshake(&self) -> Option<(HandshakeJob, Duration)> {
        let job = self
            .cookie_lane_rx
            .try_recv()
            .or_else(|_| self.handshake_rx.try_recv())
            .ok()?;
        let waited = (self.now().as_nanos() as u64).saturating_sub(job.queued_ns);
        let s = &self.stats;
        s.handshake_dequeued.fetch_add(1, Ordering::Relaxed);
        s.handshake_sojourn_ns.fetch_add(waited, Ordering::Relaxed);
        s.handshake_sojourn_max_ns
            .fetch_max(waited, Ordering::Relaxed);
        Some((job, Duration::from_nanos(waited)))
    }

    /// The index table the protocol allocates `peer`'s receiver indices in.
    pub(crate) fn index_table<'a>(&'a self, peer: &'a Arc<Peer>) -> PeerIndices<'a> {
        PeerIndices {
            map: &self.indices,
            peer,
        }
    }

    /// Keeps under-load mode on for another [`UNDER_LOAD_AFTER`].
    pub(crate) fn renew_under_load(&self) {
        self.last_under_load_ns
            .store(self.now().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Handshake messages waiting for the handshake stage.
    pub fn handshake_queue_len(&self) -> usize {
        self.handshake_tx.len() + self.cookie_lane_tx.len()
    }

    /// Sources the handshake rate limiter tracks now (bounded by its capacity).
    pub fn ratelimiter_sources(&self) -> usize {
        self.gate().as_ref().map_or(0, |g| g.limiter.tracked())
    }

    /// Under load while the handshake queue is deep, and for a second after.
    pub fn under_load(&self) -> bool {
        if self.handshake_queue_len() >= UNDER_LOAD_THRESHOLD {
            return true;
        }
        let last = self.last_under_load_ns.load(Ordering::Relaxed);
        last != 0 && self.now().as_nanos() as u64 - last < UNDER_LOAD_AFTER.as_nanos() as u64
    }

    /// Makes sure the timer queue holds an entry for `peer` no later than `deadline`.
    pub(crate) fn rearm(&self, peer: &Arc<Peer>, deadline: Option<Duration>) {
        if let Some(d) = deadline {
            self.timers
                .arm(&peer.timer_at, peer.id, d.as_nanos() as u64);
        }
    }

    /// Pops the timer entries due now: (deadline, peer id) (see `timer_queue::take`).
    pub(crate) fn due_timers(&self) -> Vec<(u64, u32)> {
        self.timers.pop_due(self.now().as_nanos() as u64)
    }

    pub fn timer_queue_len(&self) -> usize {
        self.timers.len()
    }

    /// The local address to send to `endpoint` from: the peer's sticky source while it
    /// is usable (checked once per `NetWatch` generation), else None (the route's
    /// choice).
    pub fn source_for(&self, peer: &Peer, endpoint: SocketAddr) -> Option<LocalAddr> {
        let sticky = peer.sticky_source(endpoint)?;
        let generation = self.netwatch.generation();
        if sticky.checked == generation {
            return Some(sticky.local);
        }
        let (port, fwmark) = {
            let s = self.sockets();
            (s.port, s.fwmark)
        };
        let usable = self
            .netwatch
            .source_usable(&endpoint, &sticky.local, port, fwmark);
        peer.checked_source(sticky, usable, generation);
        usable.then_some(sticky.local)
    }

    // --- lifecycle ---

    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Marks the interface stopping and fires its waker. The runtime's threads go on
    /// serving other interfaces; `Runtime::unserve` takes this one out of them.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Stops the interface because something it depends on failed.
    pub fn fail(&self, why: String) {
        let mut f = self.fatal.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(why);
        }
        drop(f);
        self.stop();
    }

    /// Removes a peer from every index (the table lock is held by the caller).
    pub(crate) fn forget_peer(&self, table: &mut PeerTable, peer: &Arc<Peer>) {
        table.by_key.remove(&peer.public_key);
        table.by_id.remove(&peer.id);
        table.allowed.remove_value(peer.id);
        let dropped = peer.mark_removed() as u64;
        self.stats
            .removed_dropped
            .fetch_add(dropped, Ordering::Relaxed);
        self.timers.disarm(&peer.timer_at, peer.id);
        let held = peer.state().indices();
        let mut map = self.indices.lock().unwrap_or_else(|p| p.into_inner());
        for i in held {
            map.remove(&i);
        }
    }
}

/// An interface on an in-memory TUN, with real sockets on an ephemeral port and the
/// default queues: what the unit tests that drive one stage need.
#[cfg(test)]
impl Interface {
    pub(crate) fn for_tests() -> Arc<Interface> {
        let tun = crate::memory::MemoryTun::new("wl-test", |_| {}, None).unwrap();
        let sockets = Sockets::bind(0, 0).unwrap();
        Interface::new(Box::new(tun), sockets, QueuePolicy::default()).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_ids_wrap_around_the_ones_still_held() {
        let budgets = crate::budget::Budgets::default();
        let mut t = PeerTable {
            next_id: u32::MAX,
            ..PeerTable::default()
        };
        t.by_id
            .insert(0, Arc::new(Peer::new(0, [1; 32], [0; 32], &budgets)));
        assert_eq!(t.take_id(), u32::MAX);
        // 0 is still a live peer's: the next id after the wrap is 1.
        assert_eq!(t.take_id(), 1);
        assert_eq!(t.take_id(), 2);
    }
}
