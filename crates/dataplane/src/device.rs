//! The interface-wide state every stage shares: identity, peer table with AllowedIPs,
//! receiver-index table, sockets, TUN, timer queue, work queues and counters.
//!
//! Lock order (outermost first): `table` → a peer's state → `indices` → `timers`.
//! Nothing holds a lock across crypto, and only the UAPI takes `table` for writing.

use crate::exec::Work;
use crate::netwatch::NetWatch;
use crate::packet::Packet;
use crate::peer::Peer;
use crate::stages;
use crate::stats::Stats;
use crossbeam_channel::{Receiver, Sender};
use rand_core::{OsRng, RngCore};
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant, SystemTime};
use wirelane_io::poll::Waker;
use wirelane_io::tun::Tun;
use wirelane_io::udp::{LocalAddr, ProofRule, Steering, UdpSocket};
use wirelane_proto::cookie::Gate;
use wirelane_proto::crypto::KeystreamRng;
use wirelane_proto::messages::Kind;
use wirelane_proto::{AllowedIps, Ctx, IndexTable, LocalIdentity, Output, PeerState};

/// Bound of the handshake queue (the kernel's MAX_QUEUED_INCOMING_HANDSHAKES).
pub const MAX_QUEUED_HANDSHAKES: usize = 4096;
/// Queue depth from which the interface counts as under load: an eighth of the bound.
pub const UNDER_LOAD_THRESHOLD: usize = MAX_QUEUED_HANDSHAKES / 8;
/// Receive buffer of each handshake socket (see `Sockets::bind`). The kernel charges a
/// small datagram about 1 KiB and doubles the size asked for, so this holds about two
/// thousand messages: milliseconds of a flood for a release build.
pub const HANDSHAKE_SOCKET_BUFFER: usize = 1 << 20;
/// How long under-load mode lasts after the queue drops below the threshold.
pub const UNDER_LOAD_AFTER: Duration = Duration::from_secs(1);
/// Sources the handshake rate limiter tracks at most.
pub const RATE_LIMITER_CAPACITY: usize = 16_384;

/// A handshake message waiting for the handshake stage.
pub struct HandshakeJob {
    pub kind: Kind,
    pub bytes: Vec<u8>,
    pub src: SocketAddr,
    /// Where it arrived: the peer's sticky source once the message authenticates.
    pub local: Option<LocalAddr>,
}

/// Peers by key and by id, plus the routing table over ids.
#[derive(Default)]
pub struct PeerTable {
    pub by_key: HashMap<[u8; 32], Arc<Peer>>,
    pub by_id: HashMap<u32, Arc<Peer>>,
    pub allowed: AllowedIps<u32>,
    pub next_id: u32,
}

impl PeerTable {
    pub fn route(&self, dst: std::net::IpAddr) -> Option<&Arc<Peer>> {
        self.allowed.lookup(dst).and_then(|id| self.by_id.get(&id))
    }
}

/// The bound UDP sockets and their settings.
#[derive(Default, Clone)]
pub struct Sockets {
    pub v4: Option<Arc<UdpSocket>>,
    pub v6: Option<Arc<UdpSocket>>,
    /// Handshake sockets, on the same port as `v4` and `v6`: the kernel steers every
    /// datagram but transport data and proven handshake messages to them
    /// (`UdpSocket::bind_steered`), so a handshake flood fills and overflows their
    /// buffers and never the data sockets'. None where the kernel refused; the data
    /// socket then receives everything. Replies leave by the data sockets, whose
    /// source port is the same.
    pub hs4: Option<Arc<UdpSocket>>,
    pub hs6: Option<Arc<UdpSocket>>,
    /// Proof sockets, beside the handshake sockets: initiations and responses whose
    /// mac2 is not zero, i.e. whose sender holds a cookie of ours. The resend that
    /// answers a cookie reply, and every initiation of a peer that holds a cookie, thus
    /// skip the queue a flood of cookie-less initiations builds on the handshake
    /// socket; a flood that fakes mac2 only fills this socket instead.
    pub proof4: Option<Arc<UdpSocket>>,
    pub proof6: Option<Arc<UdpSocket>>,
    pub port: u16,
    pub fwmark: u32,
}

/// Which of a family's sockets a UDP reader serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketRole {
    Data,
    Handshake,
    Proof,
}

impl SocketRole {
    pub const ALL: [SocketRole; 3] = [SocketRole::Data, SocketRole::Handshake, SocketRole::Proof];

    pub fn name(self) -> &'static str {
        match self {
            SocketRole::Data => "data",
            SocketRole::Handshake => "handshake",
            SocketRole::Proof => "proof",
        }
    }
}

/// WireGuard's shapes for the kernel's steering: transport data to the data socket,
/// initiations and responses with a non-zero mac2 (their last 16 bytes) to the proof
/// socket.
fn steering() -> Steering {
    use wirelane_proto::crypto::MAC_LEN;
    use wirelane_proto::messages::{
        INITIATION_LEN, RESPONSE_LEN, TYPE_INITIATION, TYPE_RESPONSE, TYPE_TRANSPORT,
    };
    let rule = |first_byte, len: usize| ProofRule {
        first_byte,
        len: len as u32,
        field: (len - MAC_LEN) as u32,
    };
    Steering {
        data_first_byte: TYPE_TRANSPORT,
        proof: vec![
            rule(TYPE_INITIATION, INITIATION_LEN),
            rule(TYPE_RESPONSE, RESPONSE_LEN),
        ],
    }
}

impl Sockets {
    pub fn for_destination(&self, dst: &SocketAddr) -> Option<&Arc<UdpSocket>> {
        match dst {
            SocketAddr::V4(_) => self.v4.as_ref(),
            SocketAddr::V6(a) if a.ip().to_ipv4_mapped().is_some() => self.v4.as_ref(),
            SocketAddr::V6(_) => self.v6.as_ref(),
        }
    }

    /// The socket one UDP reader serves.
    pub fn for_reader(&self, v6: bool, role: SocketRole) -> Option<&Arc<UdpSocket>> {
        match (v6, role) {
            (false, SocketRole::Data) => self.v4.as_ref(),
            (true, SocketRole::Data) => self.v6.as_ref(),
            (false, SocketRole::Handshake) => self.hs4.as_ref(),
            (true, SocketRole::Handshake) => self.hs6.as_ref(),
            (false, SocketRole::Proof) => self.proof4.as_ref(),
            (true, SocketRole::Proof) => self.proof6.as_ref(),
        }
    }

    /// Binds both families on `port` (0: any). IPv6 may be unavailable; IPv4 may not.
    pub fn bind(port: u16, fwmark: u32) -> std::io::Result<Sockets> {
        let steering = steering();
        let (v4, steered4) = UdpSocket::bind_steered(false, port, &steering)?;
        let port = v4.local_port()?;
        let (v6, steered6) = match UdpSocket::bind_steered(true, port, &steering) {
            Ok((s, steered)) => (Some(s), steered.ok()),
            Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => (None, None),
            Err(e) => return Err(e),
        };
        if let Err(e) = &steered4 {
            tracing::info!(error = %e, "no steered handshake sockets: floods share the data socket");
        }
        let (hs4, proof4) = steered4.ok().unzip();
        let (hs6, proof6) = steered6.unzip();
        // A handshake socket's backlog is all flood when it fills: kept shallow, it
        // holds a legitimate initiation behind milliseconds of it, not a second, and
        // drains soon after a flood ends. So is a proof socket's under a forged flood.
        for s in [&hs4, &hs6, &proof4, &proof6].into_iter().flatten() {
            s.set_receive_buffer(HANDSHAKE_SOCKET_BUFFER)?;
        }
        let s = Sockets {
            v4: Some(Arc::new(v4)),
            v6: v6.map(Arc::new),
            hs4: hs4.map(Arc::new),
            hs6: hs6.map(Arc::new),
            proof4: proof4.map(Arc::new),
            proof6: proof6.map(Arc::new),
            port,
            fwmark,
        };
        s.apply_fwmark(fwmark)?;
        Ok(s)
    }

    /// Datagrams the kernel dropped on this role's sockets since they were bound.
    pub fn kernel_drops(&self, role: SocketRole) -> u64 {
        [false, true]
            .into_iter()
            .filter_map(|v6| self.for_reader(v6, role))
            .map(|s| u64::from(s.drops().unwrap_or(0)))
            .sum()
    }

    pub fn apply_fwmark(&self, mark: u32) -> std::io::Result<()> {
        let all = [
            &self.v4,
            &self.v6,
            &self.hs4,
            &self.hs6,
            &self.proof4,
            &self.proof6,
        ];
        for s in all.into_iter().flatten() {
            s.set_mark(mark)?;
        }
        Ok(())
    }
}

pub struct Device {
    pub tun: Tun,
    origin: Instant,
    identity: RwLock<Option<Arc<LocalIdentity>>>,
    table: RwLock<PeerTable>,
    indices: Mutex<HashMap<u32, Arc<Peer>>>,
    sockets: RwLock<Sockets>,
    /// Bumped whenever the sockets are replaced, so readers pick up new ones.
    pub sockets_generation: AtomicU64,
    gate: Mutex<Option<Gate>>,
    work_tx: Sender<Work>,
    pub(crate) work_rx: Receiver<Work>,
    handshake_tx: Sender<HandshakeJob>,
    pub(crate) handshake_rx: Receiver<HandshakeJob>,
    /// Admitted handshake messages that carry a mac2, and cookie replies, served
    /// first. Under load only these are admitted (within the per-source limit), but the
    /// plain lane may still hold up to a queue's worth admitted on mac1 alone just
    /// before the mode began: a legitimate peer's cookie-bearing retry must not wait
    /// behind those Diffie-Hellman steps.
    cookie_lane_tx: Sender<HandshakeJob>,
    pub(crate) cookie_lane_rx: Receiver<HandshakeJob>,
    last_under_load_ns: AtomicU64,
    /// The gate's cookie replies per [`UNDER_LOAD_AFTER`], which keep a flood under load.
    pub(crate) cookie_reply_rate: crate::stages::gate::ReplyRate,
    timers: Mutex<BinaryHeap<Reverse<(u64, u32)>>>,
    /// The device's place, MTU and addresses, and the sockets' routing generation.
    pub netwatch: NetWatch,
    /// Limits the ICMP errors written back for packets no peer routes.
    pub(crate) icmp_limit: crate::icmp::RateLimit,
    pub stats: Stats,
    stopping: AtomicBool,
    /// Dropped by [`Device::stop`]: every thread that blocks on a channel also selects
    /// on `stop_rx`, whose disconnection wakes it at once.
    stop_tx: Mutex<Option<Sender<()>>>,
    pub(crate) stop_rx: Receiver<()>,
    pub waker: Waker,
    /// Why the device stopped on its own (the TUN went away), if it did.
    pub fatal: Mutex<Option<String>>,
}

thread_local! {
    /// Randomness for protocol steps: ephemeral keys, session indices and the rekey
    /// jitter that every data send draws. Seeded once per thread from the OS; drawing
    /// from the OS instead cost a `getrandom` syscall per request on an idle tunnel.
    /// The generator erases its key as it goes (see [`KeystreamRng`]).
    static STEP_RNG: RefCell<KeystreamRng> = RefCell::new(KeystreamRng::from_rng(&mut OsRng));
}

/// Index-table view handed to the protocol for one peer.
struct PeerIndices<'a> {
    map: &'a Mutex<HashMap<u32, Arc<Peer>>>,
    peer: &'a Arc<Peer>,
}

impl IndexTable for PeerIndices<'_> {
    fn allocate(&mut self) -> u32 {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let i = OsRng.next_u32();
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

impl Device {
    pub fn new(tun: Tun, sockets: Sockets) -> std::io::Result<Arc<Device>> {
        let (work_tx, work_rx) = crossbeam_channel::unbounded();
        let (handshake_tx, handshake_rx) = crossbeam_channel::bounded(MAX_QUEUED_HANDSHAKES);
        let (cookie_lane_tx, cookie_lane_rx) =
            crossbeam_channel::bounded(MAX_QUEUED_HANDSHAKES / 4);
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(0);
        let netwatch = NetWatch::new(&tun);
        // 512 buffers (1 MiB), half of one peer's queue bound (MAX_QUEUED_PACKETS), so
        // a first burst finds buffers ready.
        crate::pool::prefill(8);
        Ok(Arc::new(Device {
            tun,
            origin: Instant::now(),
            identity: RwLock::new(None),
            table: RwLock::new(PeerTable::default()),
            indices: Mutex::new(HashMap::new()),
            sockets: RwLock::new(sockets),
            sockets_generation: AtomicU64::new(0),
            gate: Mutex::new(None),
            work_tx,
            work_rx,
            handshake_tx,
            handshake_rx,
            cookie_lane_tx,
            cookie_lane_rx,
            last_under_load_ns: AtomicU64::new(0),
            cookie_reply_rate: Default::default(),
            timers: Mutex::new(BinaryHeap::new()),
            netwatch,
            icmp_limit: Default::default(),
            stats: Stats::default(),
            stopping: AtomicBool::new(false),
            stop_tx: Mutex::new(Some(stop_tx)),
            stop_rx,
            waker: Waker::new()?,
            fatal: Mutex::new(None),
        }))
    }

    // --- clock ---

    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    pub fn wall(&self) -> Duration {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
    }

    // --- shared state accessors ---

    pub fn identity(&self) -> Option<Arc<LocalIdentity>> {
        self.identity
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn set_identity(&self, id: Option<Arc<LocalIdentity>>) {
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = id
            .as_ref()
            .map(|i| Gate::new(&i.public, RATE_LIMITER_CAPACITY));
        *self.identity.write().unwrap_or_else(|p| p.into_inner()) = id;
    }

    pub fn table(&self) -> RwLockReadGuard<'_, PeerTable> {
        self.table.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn table_mut(&self) -> RwLockWriteGuard<'_, PeerTable> {
        self.table.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn sockets(&self) -> RwLockReadGuard<'_, Sockets> {
        self.sockets.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn sockets_mut(&self) -> RwLockWriteGuard<'_, Sockets> {
        self.sockets.write().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn replace_sockets(&self, s: Sockets) {
        *self.sockets_mut() = s;
        self.sockets_generation.fetch_add(1, Ordering::SeqCst);
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

    // --- work submission ---

    pub(crate) fn submit(&self, w: Work) {
        // An I/O reader may run the item itself (the workqueue model's idle shortcut).
        if let Some(w) = crate::exec::workqueue::run_here(self, w) {
            // The receiver lives as long as the device, so sending cannot fail.
            let _ = self.work_tx.send(w);
        }
    }

    /// Queues a copy of a handshake message the gate admitted, or a cookie reply
    /// received; drops it when its lane is full.
    pub(crate) fn queue_handshake(
        &self,
        kind: Kind,
        bytes: &[u8],
        src: SocketAddr,
        local: Option<LocalAddr>,
    ) {
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
                })
                .is_ok();
        if !queued {
            self.stats
                .handshake_queue_full
                .fetch_add(1, Ordering::Relaxed);
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

    // --- protocol steps ---

    /// Runs `f` with this thread's protocol-step generator (see `STEP_RNG`).
    pub(crate) fn with_step_rng<R>(f: impl FnOnce(&mut KeystreamRng) -> R) -> R {
        STEP_RNG.with_borrow_mut(f)
    }

    /// Runs one protocol step on `peer` with a fully built context, then re-arms its
    /// timer and carries out whatever the step asked for.
    pub fn with_peer<R>(
        &self,
        peer: &Arc<Peer>,
        f: impl FnOnce(&mut PeerState, &mut Ctx, &mut Vec<Output>) -> R,
    ) -> R {
        let identity = self.identity();
        let mut out = Vec::new();
        let (r, deadline) = {
            let mut state = peer.state();
            let mut indices = PeerIndices {
                map: &self.indices,
                peer,
            };
            let r = Self::with_step_rng(|rng| {
                let mut ctx = Ctx {
                    now: self.now(),
                    wall: self.wall(),
                    rng,
                    local: identity.as_deref(),
                    indices: &mut indices,
                };
                f(&mut state, &mut ctx, &mut out)
            });
            (r, state.next_deadline())
        };
        self.rearm(peer, deadline);
        self.carry_out(peer, out);
        r
    }

    /// Makes sure the timer queue holds an entry for `peer` no later than `deadline`.
    pub(crate) fn rearm(&self, peer: &Arc<Peer>, deadline: Option<Duration>) {
        let Some(d) = deadline else { return };
        let ns = d.as_nanos() as u64;
        if ns < peer.timer_at.load(Ordering::Relaxed) {
            peer.timer_at.store(ns, Ordering::Relaxed);
            self.timers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Reverse((ns, peer.id)));
        }
    }

    /// Pops the ids of peers whose timer entry is due.
    pub(crate) fn due_timers(&self) -> Vec<u32> {
        let now = self.now().as_nanos() as u64;
        let mut heap = self.timers.lock().unwrap_or_else(|p| p.into_inner());
        let mut due = Vec::new();
        while let Some(Reverse((at, id))) = heap.peek().copied() {
            if at > now {
                break;
            }
            heap.pop();
            due.push(id);
        }
        due
    }

    pub fn timer_queue_len(&self) -> usize {
        self.timers.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Carries out protocol outputs for `peer`.
    pub fn carry_out(&self, peer: &Arc<Peer>, outs: Vec<Output>) {
        for o in outs {
            match o {
                Output::Handshake(bytes) => self.send_to_peer(peer, &bytes),
                Output::SendStaged { keepalive_if_empty } => {
                    let mut staged = peer.take_staged();
                    if staged.is_empty() && keepalive_if_empty {
                        staged.push(Packet::with_capacity(0));
                    }
                    if !staged.is_empty() {
                        stages::nonce::assign_and_enqueue(self, peer, staged);
                    }
                }
                Output::Keepalive => {
                    stages::nonce::assign_and_enqueue(self, peer, vec![Packet::with_capacity(0)])
                }
                Output::DropStaged => {
                    let n = peer.take_staged().len();
                    self.stats.tx_dropped.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
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
        let fwmark = self.sockets().fwmark;
        let usable = self
            .netwatch
            .source_usable(&endpoint, &sticky.local, fwmark);
        peer.checked_source(sticky, usable, generation);
        usable.then_some(sticky.local)
    }

    /// Sends one datagram to the peer's current endpoint, if it has one.
    pub fn send_to_peer(&self, peer: &Peer, bytes: &[u8]) {
        let Some(ep) = peer.state().endpoint() else {
            self.stats.tx_no_endpoint.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let src = self.source_for(peer, ep);
        let sockets = self.sockets();
        if let Some(s) = sockets.for_destination(&ep) {
            if s.send_from(bytes, &ep, src).is_ok() {
                peer.tx_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
        }
    }

    // --- lifecycle ---

    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Wakes every thread of the device: pollers through the waker, channel waiters
    /// through the stop channel's disconnection.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.waker.wake();
        self.stop_tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    /// Stops the device because something it depends on failed.
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
        peer.mark_removed();
        let held = peer.state().indices();
        let mut map = self.indices.lock().unwrap_or_else(|p| p.into_inner());
        for i in held {
            map.remove(&i);
        }
    }
}
