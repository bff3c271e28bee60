//! The simulated WireGuard pipeline and each execution model's rules for it. Flow, one
//! direction (costs per direction, `params::StageCosts`):
//!
//! burst arrives → host queue of its RSS core (softirq: `host_packet_ns`)
//!   → reader: a reader thread's socket queue (wirelane), or the same softirq (kernel)
//!   → classify/route into per-peer entries, each queued in its peer's ordered queue
//!     and dealt to the crypt stage as one item (wirelane: on receive a run of one
//!     peer's consecutive packets, on transmit a peer's packets in the read; the
//!     kernel: one per packet) — `ingress`; a full queue makes a wirelane reader wait
//!     for room, on transmit the overflow waits in the peer's flow queues instead,
//!     and the kernel drops it
//!   → crypt (any worker) marks its entry done and schedules the peer's serial stage
//!   → serial stage drains done entries from the head of the peer's queue, in order,
//!     then pumps the flow queues into the room it made — `serial`.
//!
//! This file holds the state, and what each context does next (`next_step`) and what
//! a step's end changes (`complete`).
//!
//! Where the serial stage runs is the execution model (design.md §4):
//! - `workqueue`: an item on the shared FIFO (the kernel patch: on the completing
//!   core's own queue), at the workers' priority;
//! - `threaded`: the peer's own thread, placed by the scheduler;
//! - `softirq`: RX on the completing core's high-priority poller with a budget per
//!   poll, requeued at the tail while more is ready (the kernel: on that core's softirq,
//!   beside its NIC queue); TX on the worker queue of a core fixed per peer.
//!
//! Invariant (the one the daemon keeps): a peer's serial stage is scheduled at most
//! once at a time, and a stage that ends with a done head entry is scheduled again, so
//! no completion is ever left undelivered.

use super::engine::{Ctx, Event, Ns, Prio, Role, Sim, State};
use super::params::{Direction, Params, Pool, StageCosts};
use super::source::hash;
use super::Scenario;
use std::collections::VecDeque;
use wirelane_dataplane::exec::Model;
use wirelane_dataplane::ring_limit::RingLimit;

/// Packets that arrived together for one peer: what a crypt item carries.
pub(super) struct Entry {
    pub(super) packets: u32,
    pub(super) done: bool,
    pub(super) arrived: Ns,
}

pub(super) struct PeerState {
    pub(super) queue: VecDeque<Entry>,
    pub(super) head_seq: u64,
    pub(super) queued: usize,
    /// On transmit, the packets in the peer's flow queues: groups (packets, arrival)
    /// that found its ordered queue full or others already waiting.
    pub(super) backlog: VecDeque<(u32, Ns)>,
    /// On transmit, the daemon's byte limit on the ordered queue, where the platform
    /// has one (`Platform::tx_ring_limit`).
    pub(super) ring: Option<RingLimit>,
    pub(super) scheduled: bool,
    /// The kernel's `NAPIF_STATE_MISSED`: a completion found the stage already
    /// scheduled, so the poll that ends next schedules it once more, on its own core.
    pub(super) missed: bool,
    pub(super) host_queue: usize,
    pub(super) reader: usize,
    pub(super) thread: Option<usize>,
}

pub(super) enum Item {
    Crypt { peer: u32, seq: u64, packets: u32 },
    Serial { peer: u32 },
}

#[derive(Clone, Copy)]
pub(super) enum Pollable {
    Host(usize),
    Peer(u32),
}

/// A step's work, fixed when it starts and applied when it ends.
pub enum Work {
    HostPoll {
        queue: usize,
        packets: Vec<(u32, Ns)>,
    },
    Read {
        packets: Vec<(u32, Ns)>,
    },
    /// A reader goes on queueing the groups it held (already paid for).
    Resume,
    Crypt {
        peer: u32,
        seq: u64,
        packets: u32,
    },
    Serial(SerialStep),
    Background,
    /// Looking for work before sleeping.
    Spin,
}

/// Packets one step of an unbounded drain handles: it delivers as it goes, as the
/// daemon writes packet by packet, rather than all at the end of one long step.
pub(super) const DRAIN_CHUNK: usize = 64;

/// Linux's minimum retransmission timeout (TCP_RTO_MIN), 200 ms.
pub(super) const RTO_MIN_NS: Ns = 200_000_000;

/// Linux's `TCP_TIMEOUT_MIN`, 2 jiffies, at Debian's 250 Hz: the floor of the tail loss
/// probe's timer.
pub(super) const TCP_TIMEOUT_MIN_NS: Ns = 8_000_000;

/// Largest item the `workqueue` model's readers run themselves
/// (`exec::workqueue::SHORTCUT_MAX_PACKETS`).
pub(super) const SHORTCUT_MAX_PACKETS: usize = 4;

/// A step of a peer's serial stage.
pub struct SerialStep {
    pub(super) peer: u32,
    pub(super) entries: usize,
    pub(super) packets: u32,
    pub(super) budget: usize,
    /// The invocation's first step (later ones continue an unbounded drain).
    pub(super) first: bool,
}

/// Packets lost, by where.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Drops {
    /// At the switch port ahead of the link (`line_buffer_packets`).
    pub line: u64,
    pub host: u64,
    pub socket: u64,
    pub crypt_ring: u64,
    pub peer_queue: u64,
}

/// The serial stage's signatures and the other stages' counts, as the daemon keeps them.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Signature {
    pub invocations: u64,
    pub packets: u64,
    pub batches: u64,
    pub empty_polls: u64,
    pub head_pending: u64,
    pub budget_exhausted: u64,
    pub crypt_items: u64,
    pub reader_batches: u64,
    /// Transmit flushes a reader ran inside its plug, and the sends its plugs made.
    pub plugged: u64,
    pub plug_sends: u64,
}

impl Signature {
    /// Growth since `earlier`.
    pub fn since(&self, earlier: &Signature) -> Signature {
        Signature {
            invocations: self.invocations - earlier.invocations,
            packets: self.packets - earlier.packets,
            batches: self.batches - earlier.batches,
            empty_polls: self.empty_polls - earlier.empty_polls,
            head_pending: self.head_pending - earlier.head_pending,
            budget_exhausted: self.budget_exhausted - earlier.budget_exhausted,
            crypt_items: self.crypt_items - earlier.crypt_items,
            reader_batches: self.reader_batches - earlier.reader_batches,
            plugged: self.plugged - earlier.plugged,
            plug_sends: self.plug_sends - earlier.plug_sends,
        }
    }
}

pub struct Pipeline {
    pub(super) peers: Vec<PeerState>,
    pub(super) host: Vec<VecDeque<(u32, Ns)>>,
    pub(super) host_listed: Vec<bool>,
    pub(super) sockets: Vec<VecDeque<(u32, Ns)>>,
    pub(super) reader_waiting: Vec<bool>,
    /// Per reader: the groups of its last read still to be queued, the first waiting
    /// for room in its peer's queue (`QueueFull::Wait`).
    pub(super) held: Vec<VecDeque<(u32, u32, Ns)>>,
    /// Per reader: its current read's plug has a send to make already, so a further
    /// flush it runs adds its datagrams to that send (`stages::tx_flush::plugged`).
    pub(super) plug_open: Vec<bool>,
    pub(super) shared: VecDeque<Item>,
    pub(super) per_worker: Vec<VecDeque<Item>>,
    /// Whether workers are pinned one per core, each with a queue of its own for the
    /// work queued to that core (the `softirq` model; the kernel).
    pub(super) per_core: bool,
    /// Whether crypt items go to those queues round robin (wirelane's `softirq`
    /// model), rather than to the shared FIFO. The kernel deals only the wake-ups
    /// round robin: its workers all consume one device-wide ring
    /// (`wg_packet_decrypt_worker`), so a busy core holds no packet hostage.
    pub(super) crypt_per_core: bool,
    pub(super) rr: usize,
    pub(super) softirq_list: Vec<VecDeque<Pollable>>,
    pub(super) poller_list: Vec<VecDeque<u32>>,
    pub(super) thread_peers: Vec<VecDeque<u32>>,
    pub(super) inflight: super::inflight::Inflight,
    pub(super) crypt_ring: usize,
    /// When the link ahead of the host has sent everything queued on it.
    pub(super) link_free: Ns,
    pub(super) softirq_ctx: Vec<usize>,
    pub(super) poller_ctx: Vec<usize>,
    pub reader_ctx: Vec<usize>,
    pub worker_ctx: Vec<usize>,
    pub thread_ctx: Vec<usize>,
    pub background_ctx: Vec<usize>,
    pub(super) worker_on_core: Vec<usize>,
    pub(super) costs: StageCosts,
    pub(super) model: Model,
    pub(super) dir: Direction,
    pub(super) size: f64,
    pub drops: Drops,
    pub sig: Signature,
    pub offered: u64,
    pub delivered: u64,
    /// Time packets waited in the host queue before their poll began (measured interval).
    pub host_wait: crate::hist::Histogram,
}

impl Pipeline {
    pub fn new(params: &Params, sc: &Scenario) -> Pipeline {
        let p = &params.platform;
        let weights = p.cores as f64 + p.rss_skew;
        let rss = |peer: usize| {
            let u = (hash(peer as u64 ^ sc.seed) >> 11) as f64 / (1u64 << 53) as f64 * weights;
            if u < 1.0 + p.rss_skew {
                0
            } else {
                (1 + (u - 1.0 - p.rss_skew) as usize).min(p.cores - 1)
            }
        };
        let ring_limit = p.tx_ring_limit && sc.direction == Direction::Tx;
        let peers = (0..sc.peers)
            .map(|i| PeerState {
                queue: VecDeque::new(),
                head_seq: 0,
                queued: 0,
                backlog: VecDeque::new(),
                ring: ring_limit.then(RingLimit::default),
                scheduled: false,
                missed: false,
                host_queue: rss(i),
                reader: i % p.reader_threads.max(1),
                thread: None,
            })
            .collect();
        Pipeline {
            peers,
            host: vec![VecDeque::new(); p.cores],
            host_listed: vec![false; p.cores],
            sockets: vec![VecDeque::new(); p.reader_threads],
            reader_waiting: vec![false; p.reader_threads],
            held: vec![VecDeque::new(); p.reader_threads],
            plug_open: vec![false; p.reader_threads],
            shared: VecDeque::new(),
            per_worker: (0..sc.workers).map(|_| VecDeque::new()).collect(),
            per_core: sc.model == Model::Softirq || p.pool == Pool::PerCore,
            crypt_per_core: sc.model == Model::Softirq && p.pool == Pool::Shared,
            rr: 0,
            softirq_list: vec![VecDeque::new(); p.cores],
            poller_list: vec![VecDeque::new(); sc.workers],
            thread_peers: Vec::new(),
            inflight: super::inflight::Inflight::new(p),
            crypt_ring: 0,
            link_free: 0,
            softirq_ctx: Vec::new(),
            poller_ctx: Vec::new(),
            reader_ctx: Vec::new(),
            worker_ctx: Vec::new(),
            thread_ctx: Vec::new(),
            background_ctx: Vec::new(),
            worker_on_core: Vec::new(),
            costs: params.costs(sc.direction).clone(),
            model: sc.model,
            dir: sc.direction,
            size: sc.size as f64,
            drops: Drops::default(),
            sig: Signature::default(),
            offered: 0,
            delivered: 0,
            host_wait: crate::hist::Histogram::default(),
        }
    }

    pub fn spawn_contexts(&mut self, ctxs: &mut Vec<Ctx>, params: &Params, sc: &Scenario) {
        let p = &params.platform;
        let mut new = |role, prio, pinned| {
            ctxs.push(new_ctx(role, prio, pinned));
            ctxs.len() - 1
        };
        self.softirq_ctx = (0..p.cores)
            .map(|c| new(Role::Softirq(c), Prio::High, Some(c)))
            .collect();
        // Background work is the lab's generator and sink: threads the scheduler
        // places like any other, so one core's share moves away from a pinned worker
        // rather than taking half of that worker's core.
        self.background_ctx = (0..p.cores)
            .map(|c| new(Role::Background(c), Prio::Normal, None))
            .collect();
        self.reader_ctx = (0..p.reader_threads)
            .map(|r| new(Role::Reader(r), Prio::Normal, None))
            .collect();
        let per_core = self.per_core;
        self.worker_ctx = (0..sc.workers)
            .map(|w| {
                new(
                    Role::Worker(w),
                    Prio::Normal,
                    per_core.then_some(w % p.cores),
                )
            })
            .collect();
        if sc.model == Model::Softirq && p.reader_threads > 0 {
            self.poller_ctx = (0..sc.workers)
                .map(|i| new(Role::Poller(i), Prio::High, Some(i % p.cores)))
                .collect();
        }
        self.worker_on_core = (0..p.cores)
            .map(|c| {
                (0..sc.workers)
                    .find(|w| w % p.cores == c)
                    .unwrap_or(c % sc.workers)
            })
            .collect();
    }

    /// The next step of context `ctx`, with its cost; None: it sleeps.
    pub fn next_step(sim: &mut Sim, ctx: usize) -> Option<(Work, f64)> {
        let plat = &sim.params.platform;
        let (budget, readers) = (plat.poll_budget, plat.reader_threads);
        // The kernel's work items and kthreads poll with NAPI's budget; wirelane's
        // serial stage drains everything ready.
        let serial_budget = match plat.pool {
            Pool::PerCore => budget,
            Pool::Shared => usize::MAX,
        };
        let (now, measured) = (sim.now, sim.now >= sim.warmup);
        if let Some(peer) = sim.ctxs[ctx].continuation.take() {
            return Some(sim.pipe.serial_step(peer, usize::MAX, false));
        }
        let pipe = &mut sim.pipe;
        let c = &pipe.costs;
        match sim.ctxs[ctx].role {
            Role::Softirq(q) => loop {
                match pipe.softirq_list[q].pop_front()? {
                    Pollable::Host(h) => {
                        pipe.host_listed[h] = false;
                        let n = budget.min(pipe.host[h].len());
                        if n == 0 {
                            continue;
                        }
                        let packets: Vec<_> = pipe.host[h].drain(..n).collect();
                        if measured {
                            for &(_, t) in &packets {
                                pipe.host_wait.record(now - t);
                            }
                        }
                        let mut cost = n as f64 * c.host_packet_ns;
                        if readers == 0 {
                            cost += c.reader_batch_ns + n as f64 * c.reader_packet_ns;
                            pipe.sig.reader_batches += 1;
                        }
                        return Some((Work::HostPoll { queue: h, packets }, cost));
                    }
                    Pollable::Peer(p) => return Some(pipe.serial_step(p, budget, true)),
                }
            },
            Role::Poller(i) => {
                let p = pipe.poller_list[i].pop_front()?;
                Some(pipe.serial_step(p, budget, true))
            }
            Role::Reader(r) => {
                if let Some(&(peer, n, _)) = pipe.held[r].front() {
                    // Blocked in the middle of a read: only the drain of that peer's
                    // queue wakes it (`wake_held_readers`).
                    let room = pipe.peer_room(plat.peer_queue(pipe.dir), peer, n);
                    pipe.reader_waiting[r] = !room;
                    return room.then_some((Work::Resume, 0.0));
                }
                if pipe.inflight.full(now) {
                    // The daemon's reader sleeps and looks again (`budget::POLL`):
                    // no one wakes it when room frees.
                    pipe.reader_waiting[r] = true;
                    sim.ctxs[ctx].spun = true;
                    let at = now + wirelane_dataplane::budget::POLL.as_nanos() as Ns;
                    sim.push(at, Event::Timer(ctx));
                    return None;
                }
                pipe.reader_waiting[r] = false;
                let n = pipe.read_len(r, plat.read_limit(pipe.dir));
                if n == 0 {
                    return None;
                }
                let packets: Vec<_> = pipe.sockets[r].drain(..n).collect();
                pipe.sig.reader_batches += 1;
                pipe.plug_open[r] = false;
                let cost = c.reader_batch_ns + n as f64 * c.reader_packet_ns;
                Some((Work::Read { packets }, cost))
            }
            Role::Worker(w) => {
                let own = if pipe.per_core {
                    pipe.per_worker[w].pop_front()
                } else {
                    None
                };
                let item = own.or_else(|| pipe.shared.pop_front())?;
                match item {
                    Item::Crypt { peer, seq, packets } => {
                        pipe.sig.crypt_items += 1;
                        let cost = Self::crypt_cost(pipe, packets);
                        Some((Work::Crypt { peer, seq, packets }, cost))
                    }
                    Item::Serial { peer } => Some(pipe.serial_step(peer, serial_budget, true)),
                }
            }
            Role::SerialThread(t) => {
                let p = pipe.thread_peers[t].pop_front()?;
                Some(pipe.serial_step(p, serial_budget, true))
            }
            Role::Background(c) => {
                let pending = sim.take_background(c);
                (pending > 0.0).then_some((Work::Background, pending))
            }
        }
    }

    /// Applies the effects of a step that ended.
    pub fn complete(sim: &mut Sim, ctx: usize, work: Work, core: usize) {
        match work {
            Work::HostPoll { queue, packets } => {
                let n = packets.len();
                if sim.params.platform.reader_threads == 0 {
                    Self::ingest(sim, packets, core, ctx);
                } else {
                    Self::to_sockets(sim, packets, Some(ctx));
                }
                let pipe = &mut sim.pipe;
                if !pipe.host[queue].is_empty() && !pipe.host_listed[queue] {
                    pipe.host_listed[queue] = true;
                    pipe.softirq_list[queue].push_back(Pollable::Host(queue));
                }
                Self::count_softirq(sim, ctx, n);
            }
            Work::Read { packets } => Self::ingest(sim, packets, core, ctx),
            Work::Resume => {
                let Role::Reader(r) = sim.ctxs[ctx].role else {
                    unreachable!("only readers hold groups")
                };
                let groups = std::mem::take(&mut sim.pipe.held[r]);
                Self::queue_groups(sim, groups, core, ctx);
            }
            Work::Crypt { peer, seq, packets } => {
                let pipe = &mut sim.pipe;
                pipe.crypt_ring -= packets as usize;
                let pe = &mut pipe.peers[peer as usize];
                let i = (seq - pe.head_seq) as usize;
                pe.queue[i].done = true;
                Self::schedule_serial(sim, peer, core, ctx);
            }
            Work::Serial(step) => Self::serial_done(sim, ctx, step, core),
            Work::Background | Work::Spin => {}
        }
    }

    /// A softirq run that has handled its budget goes on at normal priority.
    pub(super) fn count_softirq(sim: &mut Sim, ctx: usize, n: usize) {
        let budget = sim.params.platform.softirq_budget;
        let c = &mut sim.ctxs[ctx];
        if matches!(c.role, Role::Softirq(_) | Role::Poller(_)) {
            c.run_packets += n;
            if c.run_packets >= budget {
                c.prio = Prio::Normal;
            }
        }
    }
}

pub(super) fn new_ctx(role: Role, prio: Prio, pinned: Option<usize>) -> Ctx {
    Ctx {
        role,
        prio,
        pinned,
        state: State::Sleeping,
        last_core: None,
        resume: None,
        debt_ns: 0.0,
        work_debt_ns: 0.0,
        busy_ns: 0,
        run_packets: 0,
        continuation: None,
        overhead_ns: 0,
        spun: false,
        woken: false,
        queued_at: 0,
    }
}
