//! The simulated WireGuard pipeline and each execution model's rules for it. Flow, one
//! direction (costs per direction, `params::StageCosts`):
//!
//! burst arrives → host queue of its RSS core (softirq: `host_packet_ns`)
//!   → reader: a reader thread's socket queue (wirelane), or the same softirq (kernel)
//!   → classify/route into per-peer entries, each queued in its peer's ordered queue
//!     and dealt to the crypt stage as one item (wirelane: one per peer per read; the
//!     kernel: one per packet)
//!   → crypt (any worker) marks its entry done and schedules the peer's serial stage
//!   → serial stage drains done entries from the head of the peer's queue, in order.
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

/// Packets that arrived together for one peer: what a crypt item carries.
struct Entry {
    packets: u32,
    done: bool,
    arrived: Ns,
}

struct PeerState {
    queue: VecDeque<Entry>,
    head_seq: u64,
    queued: usize,
    scheduled: bool,
    host_queue: usize,
    reader: usize,
    thread: Option<usize>,
}

enum Item {
    Crypt { peer: u32, seq: u64, packets: u32 },
    Serial { peer: u32 },
}

#[derive(Clone, Copy)]
enum Pollable {
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
    Crypt {
        peer: u32,
        seq: u64,
        packets: u32,
    },
    Serial {
        peer: u32,
        entries: usize,
        packets: u32,
        budget: usize,
        /// The invocation's first step (later ones continue an unbounded drain).
        first: bool,
    },
    Background,
    /// Looking for work before sleeping.
    Spin,
}

/// Packets one step of an unbounded drain handles: it delivers as it goes, as the
/// daemon writes packet by packet, rather than all at the end of one long step.
const DRAIN_CHUNK: usize = 64;

/// Linux's minimum retransmission timeout (TCP_RTO_MIN), 200 ms.
const RTO_MIN_NS: Ns = 200_000_000;

/// Largest item the `workqueue` model's readers run themselves
/// (`exec::workqueue::SHORTCUT_MAX_PACKETS`).
const SHORTCUT_MAX_PACKETS: usize = 4;

/// Packets lost, by where.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Drops {
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
        }
    }
}

pub struct Pipeline {
    peers: Vec<PeerState>,
    host: Vec<VecDeque<(u32, Ns)>>,
    host_listed: Vec<bool>,
    sockets: Vec<VecDeque<(u32, Ns)>>,
    reader_waiting: Vec<bool>,
    shared: VecDeque<Item>,
    per_worker: Vec<VecDeque<Item>>,
    /// Whether workers are pinned one per core, each with a queue of its own for the
    /// work queued to that core (the `softirq` model; the kernel).
    per_core: bool,
    /// Whether crypt items go to those queues round robin (wirelane's `softirq`
    /// model), rather than to the shared FIFO. The kernel deals only the wake-ups
    /// round robin: its workers all consume one device-wide ring
    /// (`wg_packet_decrypt_worker`), so a busy core holds no packet hostage.
    crypt_per_core: bool,
    rr: usize,
    softirq_list: Vec<VecDeque<Pollable>>,
    poller_list: Vec<VecDeque<u32>>,
    thread_peers: Vec<VecDeque<u32>>,
    inflight: usize,
    crypt_ring: usize,
    softirq_ctx: Vec<usize>,
    poller_ctx: Vec<usize>,
    pub reader_ctx: Vec<usize>,
    pub worker_ctx: Vec<usize>,
    pub thread_ctx: Vec<usize>,
    pub background_ctx: Vec<usize>,
    worker_on_core: Vec<usize>,
    costs: StageCosts,
    model: Model,
    dir: Direction,
    size: f64,
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
        let peers = (0..sc.peers)
            .map(|i| PeerState {
                queue: VecDeque::new(),
                head_seq: 0,
                queued: 0,
                scheduled: false,
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
            shared: VecDeque::new(),
            per_worker: (0..sc.workers).map(|_| VecDeque::new()).collect(),
            per_core: sc.model == Model::Softirq || p.pool == Pool::PerCore,
            crypt_per_core: sc.model == Model::Softirq && p.pool == Pool::Shared,
            rr: 0,
            softirq_list: vec![VecDeque::new(); p.cores],
            poller_list: vec![VecDeque::new(); sc.workers],
            thread_peers: Vec::new(),
            inflight: 0,
            crypt_ring: 0,
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
        self.background_ctx = (0..p.cores)
            .map(|c| new(Role::Background(c), Prio::Normal, Some(c)))
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

    /// `n` packets of `peer` reach the host: its RSS queue, or a drop when that is full.
    /// Where the host's delivery costs nothing on these cores (the lab's veth path,
    /// where the sender's own thread pays for it), they go straight to the socket.
    pub fn arrive(sim: &mut Sim, peer: u32, n: u32, now: Ns) {
        if sim.pipe.costs.host_packet_ns == 0.0 && sim.params.platform.reader_threads > 0 {
            if now >= sim.warmup {
                sim.pipe.offered += u64::from(n);
            }
            let packets = vec![(peer, now); n as usize];
            Self::to_sockets(sim, packets, None);
            return;
        }
        let q = sim.pipe.peers[peer as usize].host_queue;
        let room = sim
            .params
            .platform
            .host_queue_packets
            .saturating_sub(sim.pipe.host[q].len());
        let taken = (n as usize).min(room);
        sim.pipe.host[q].extend(std::iter::repeat_n((peer, now), taken));
        if now >= sim.warmup {
            sim.pipe.offered += u64::from(n);
        }
        let lost = n - taken as u32;
        if lost > 0 {
            Self::lose(sim, peer, lost, |d| &mut d.host);
        }
        if taken > 0 && !sim.pipe.host_listed[q] {
            sim.pipe.host_listed[q] = true;
            sim.pipe.softirq_list[q].push_back(Pollable::Host(q));
            let ctx = sim.pipe.softirq_ctx[q];
            sim.raise(ctx);
        }
    }

    fn lose(sim: &mut Sim, peer: u32, n: u32, place: fn(&mut Drops) -> &mut u64) {
        if sim.now >= sim.warmup {
            *place(&mut sim.pipe.drops) += u64::from(n);
        }
        if let Some(w) = sim.windows.get(peer as usize) {
            // Enough in flight for three duplicate acknowledgements: fast retransmit
            // a round trip later; otherwise the retransmission timer.
            let wait = if w.in_flight >= 4 {
                sim.rtt
            } else {
                RTO_MIN_NS
            };
            sim.push(sim.now + wait, Event::Lost { peer, packets: n });
        }
    }

    /// The next step of context `ctx`, with its cost; None: it sleeps.
    pub fn next_step(sim: &mut Sim, ctx: usize) -> Option<(Work, f64)> {
        let plat = &sim.params.platform;
        let (budget, readers, batch) = (plat.poll_budget, plat.reader_threads, plat.reader_batch);
        let cap = plat.inflight_packets;
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
                if cap > 0 && pipe.inflight >= cap {
                    // The daemon's reader sleeps and looks again (`budget::POLL`):
                    // no one wakes it when room frees.
                    pipe.reader_waiting[r] = true;
                    sim.ctxs[ctx].spun = true;
                    let at = now + wirelane_dataplane::budget::POLL.as_nanos() as Ns;
                    sim.push(at, Event::Timer(ctx));
                    return None;
                }
                pipe.reader_waiting[r] = false;
                let n = pipe.read_len(r, batch);
                if n == 0 {
                    return None;
                }
                let packets: Vec<_> = pipe.sockets[r].drain(..n).collect();
                pipe.sig.reader_batches += 1;
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

    /// Packets one read takes from reader `r`'s queue: `batch` datagrams, where on
    /// receive a datagram is a run of one peer's packets that UDP GRO coalesced (at
    /// most 64 KiB of them), so a read never splits a sender's GSO burst.
    fn read_len(&self, r: usize, batch: usize) -> usize {
        let q = &self.sockets[r];
        if self.dir == Direction::Tx {
            return batch.min(q.len());
        }
        let per_run = (65_535 / (self.size as usize + 60)).max(1);
        let (mut n, mut runs, mut run_len) = (0, 0, 0);
        let mut last = None;
        for &(p, _) in q.iter() {
            if last == Some(p) && run_len < per_run {
                run_len += 1;
            } else {
                if runs == batch {
                    break;
                }
                runs += 1;
                run_len = 1;
                last = Some(p);
            }
            n += 1;
        }
        n
    }

    /// A step of `peer`'s serial stage: the done entries at the head, up to `budget`
    /// packets (an unbounded drain goes in steps of [`DRAIN_CHUNK`]). Only an
    /// invocation's first step pays the per-invocation cost.
    fn serial_step(&mut self, peer: u32, budget: usize, first: bool) -> (Work, f64) {
        let (mut entries, mut packets) = (0usize, 0u32);
        let limit = if budget == usize::MAX {
            DRAIN_CHUNK
        } else {
            budget
        };
        for e in &self.peers[peer as usize].queue {
            if !e.done || packets as usize >= limit {
                break;
            }
            entries += 1;
            packets += e.packets;
        }
        let c = &self.costs;
        let invocation = if first { c.serial_invocation_ns } else { 0.0 };
        let cost = invocation
            + entries as f64 * c.serial_batch_ns
            + f64::from(packets) * c.serial_packet_ns;
        let work = Work::Serial {
            peer,
            entries,
            packets,
            budget,
            first,
        };
        (work, cost)
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
            Work::Crypt { peer, seq, packets } => {
                let pipe = &mut sim.pipe;
                pipe.crypt_ring -= packets as usize;
                let pe = &mut pipe.peers[peer as usize];
                let i = (seq - pe.head_seq) as usize;
                pe.queue[i].done = true;
                Self::schedule_serial(sim, peer, core, ctx);
            }
            Work::Serial {
                peer,
                entries,
                packets,
                budget,
                first,
            } => {
                Self::deliver(sim, peer, entries, packets);
                let pipe = &mut sim.pipe;
                let s = &mut pipe.sig;
                s.invocations += u64::from(first);
                s.packets += u64::from(packets);
                s.batches += entries as u64;
                sim.cores[core].invocations += u64::from(first);
                sim.cores[core].serial_packets += u64::from(packets);
                let pe = &mut pipe.peers[peer as usize];
                if first && packets == 0 {
                    s.empty_polls += 1;
                    if !pe.queue.is_empty() {
                        s.head_pending += 1;
                    }
                }
                if pe.queue.front().is_some_and(|e| e.done) {
                    if budget == usize::MAX {
                        // The drain goes on in this context's next step.
                        sim.ctxs[ctx].continuation = Some(peer);
                        Self::count_softirq(sim, ctx, packets as usize);
                        return;
                    }
                    if packets as usize >= budget {
                        s.budget_exhausted += 1;
                    }
                    match sim.ctxs[ctx].role {
                        Role::Softirq(q) => pipe.softirq_list[q].push_back(Pollable::Peer(peer)),
                        Role::Poller(i) => pipe.poller_list[i].push_back(peer),
                        Role::SerialThread(t) => pipe.thread_peers[t].push_front(peer),
                        Role::Worker(w) if pipe.per_core => {
                            pipe.per_worker[w].push_back(Item::Serial { peer })
                        }
                        _ => pipe.shared.push_front(Item::Serial { peer }),
                    }
                } else {
                    pe.scheduled = false;
                }
                Self::count_softirq(sim, ctx, packets as usize);
            }
            Work::Background | Work::Spin => {}
        }
    }

    /// A softirq run that has handled its budget goes on at normal priority.
    fn count_softirq(sim: &mut Sim, ctx: usize, n: usize) {
        let budget = sim.params.platform.softirq_budget;
        let c = &mut sim.ctxs[ctx];
        if matches!(c.role, Role::Softirq(_) | Role::Poller(_)) {
            c.run_packets += n;
            if c.run_packets >= budget {
                c.prio = Prio::Normal;
            }
        }
    }

    fn to_sockets(sim: &mut Sim, packets: Vec<(u32, Ns)>, waker: Option<usize>) {
        let cap = sim.params.platform.socket_packets;
        let mut touched = [false; 64];
        for (peer, t) in packets {
            let r = sim.pipe.peers[peer as usize].reader;
            if sim.pipe.sockets[r].len() >= cap {
                Self::lose(sim, peer, 1, |d| &mut d.socket);
                continue;
            }
            sim.pipe.sockets[r].push_back((peer, t));
            touched[r % 64] = true;
        }
        for r in 0..sim.pipe.sockets.len() {
            if touched[r % 64] && !sim.pipe.reader_waiting[r] {
                let ctx = sim.pipe.reader_ctx[r];
                sim.wake(ctx, waker);
            }
        }
    }

    /// Classify (RX) or route (TX): packets into per-peer entries, each queued in order
    /// and dealt to the crypt stage.
    fn ingest(sim: &mut Sim, packets: Vec<(u32, Ns)>, core: usize, ctx: usize) {
        let plat = &sim.params.platform;
        let (peer_cap, ring_cap) = (plat.peer_queue_packets, plat.crypt_ring_packets);
        let mut groups: Vec<(u32, u32, Ns)> = Vec::new();
        if plat.group_by_peer && sim.pipe.dir == Direction::Rx {
            // Classify: each run of consecutive packets of one peer is one item.
            for (p, t) in packets {
                match groups.last_mut() {
                    Some(g) if g.0 == p => g.1 += 1,
                    _ => groups.push((p, 1, t)),
                }
            }
        } else if plat.group_by_peer {
            // Route: all of a peer's packets in the read are one item, in order.
            for (p, t) in packets {
                match groups.iter_mut().find(|g| g.0 == p) {
                    Some(g) => g.1 += 1,
                    None => groups.push((p, 1, t)),
                }
            }
        } else {
            groups = packets.into_iter().map(|(p, t)| (p, 1, t)).collect();
        }
        for (peer, n, arrived) in groups {
            let pipe = &mut sim.pipe;
            if pipe.peers[peer as usize].queued + n as usize > peer_cap {
                Self::lose(sim, peer, n, |d| &mut d.peer_queue);
                continue;
            }
            if ring_cap > 0 && pipe.crypt_ring + n as usize > ring_cap {
                Self::lose(sim, peer, n, |d| &mut d.crypt_ring);
                continue;
            }
            let pe = &mut pipe.peers[peer as usize];
            let seq = pe.head_seq + pe.queue.len() as u64;
            pe.queue.push_back(Entry {
                packets: n,
                done: false,
                arrived,
            });
            pe.queued += n as usize;
            pipe.inflight += n as usize;
            pipe.crypt_ring += n as usize;
            sim.ctxs[ctx].work_debt_ns += pipe.costs.reader_item_ns;
            if Self::shortcut(sim, ctx, n as usize) {
                // The reader seals or opens it itself (see `shortcut`).
                let cost = Self::crypt_cost(&sim.pipe, n);
                sim.ctxs[ctx].work_debt_ns += cost;
                sim.pipe.sig.crypt_items += 1;
                Self::complete(
                    sim,
                    ctx,
                    Work::Crypt {
                        peer,
                        seq,
                        packets: n,
                    },
                    core,
                );
                continue;
            }
            let pipe = &mut sim.pipe;
            let item = Item::Crypt {
                peer,
                seq,
                packets: n,
            };
            if pipe.per_core {
                let w = pipe.rr % pipe.per_worker.len();
                pipe.rr += 1;
                match pipe.crypt_per_core {
                    true => pipe.per_worker[w].push_back(item),
                    false => pipe.shared.push_back(item),
                }
                let wctx = pipe.worker_ctx[w];
                sim.wake(wctx, Some(ctx));
            } else {
                pipe.shared.push_back(item);
                Self::wake_a_worker(sim, ctx);
            }
        }
    }

    /// The `workqueue` model's idle shortcut (`exec::workqueue`): a reader that finds
    /// the shared FIFO empty runs an item of at most 4 packets itself, rather than
    /// waking a worker for it. Its cost is the reader's.
    fn shortcut(sim: &Sim, ctx: usize, packets: usize) -> bool {
        sim.pipe.model == Model::Workqueue
            && !sim.pipe.per_core
            && matches!(sim.ctxs[ctx].role, Role::Reader(_))
            && packets <= SHORTCUT_MAX_PACKETS
            && sim.pipe.shared.is_empty()
    }

    fn crypt_cost(pipe: &Pipeline, packets: u32) -> f64 {
        let c = &pipe.costs;
        c.crypt_item_ns + f64::from(packets) * (c.crypt_packet_ns + pipe.size * c.crypt_byte_ns)
    }

    fn wake_a_worker(sim: &mut Sim, waker: usize) {
        let sleeping = sim
            .pipe
            .worker_ctx
            .iter()
            .copied()
            .find(|&w| sim.ctxs[w].state == State::Sleeping);
        if let Some(w) = sleeping {
            sim.wake(w, Some(waker));
        }
    }

    /// Schedules `peer`'s serial stage where the model puts it, unless it is already.
    fn schedule_serial(sim: &mut Sim, peer: u32, core: usize, waker: usize) {
        let pipe = &mut sim.pipe;
        let pe = &mut pipe.peers[peer as usize];
        if pe.scheduled {
            return;
        }
        pe.scheduled = true;
        let kernel = sim.params.platform.reader_threads == 0;
        let percore_pool = sim.params.platform.pool == Pool::PerCore;
        let fixed_tx = pipe.dir == Direction::Tx && (pipe.model == Model::Softirq || percore_pool);
        if fixed_tx {
            // A peer's transmit work runs on a core fixed per peer, at worker priority.
            let w = peer as usize % pipe.per_worker.len();
            pipe.per_worker[w].push_back(Item::Serial { peer });
            let wctx = pipe.worker_ctx[w];
            sim.wake(wctx, Some(waker));
            return;
        }
        match pipe.model {
            Model::Workqueue if percore_pool => {
                let w = pipe.worker_on_core[core];
                pipe.per_worker[w].push_back(Item::Serial { peer });
                let wctx = pipe.worker_ctx[w];
                sim.wake(wctx, Some(waker));
            }
            Model::Workqueue => {
                let queued = pipe.peers[peer as usize].queued;
                if Self::shortcut(sim, waker, queued) {
                    let (work, cost) = sim.pipe.serial_step(peer, usize::MAX, true);
                    sim.ctxs[waker].work_debt_ns += cost;
                    Self::complete(sim, waker, work, core);
                    return;
                }
                let pipe = &mut sim.pipe;
                pipe.shared.push_back(Item::Serial { peer });
                Self::wake_a_worker(sim, waker);
            }
            Model::Threaded => {
                let t = Self::thread_for(sim, peer);
                sim.pipe.thread_peers[t].push_back(peer);
                let tctx = sim.pipe.thread_ctx[t];
                sim.wake(tctx, Some(waker));
            }
            Model::Softirq if kernel => {
                pipe.softirq_list[core].push_back(Pollable::Peer(peer));
                let sctx = pipe.softirq_ctx[core];
                sim.raise(sctx);
            }
            Model::Softirq => {
                // The completing worker's own poller (pollers are per worker).
                let i = match sim.ctxs[waker].role {
                    Role::Worker(w) => w,
                    _ => pipe.worker_on_core[core],
                };
                pipe.poller_list[i].push_back(peer);
                let pctx = pipe.poller_ctx[i];
                sim.wake(pctx, Some(waker));
            }
        }
    }

    /// The serial thread of `peer`, started on first use; past the bound, peers share.
    fn thread_for(sim: &mut Sim, peer: u32) -> usize {
        if let Some(t) = sim.pipe.peers[peer as usize].thread {
            return t;
        }
        let max = sim.params.platform.serial_threads_max;
        let t = if sim.pipe.thread_ctx.len() < max {
            let t = sim.pipe.thread_ctx.len();
            sim.ctxs
                .push(new_ctx(Role::SerialThread(t), Prio::Normal, None));
            sim.pipe.thread_ctx.push(sim.ctxs.len() - 1);
            sim.pipe.thread_peers.push(VecDeque::new());
            t
        } else {
            (hash(u64::from(peer)) % max as u64) as usize
        };
        sim.pipe.peers[peer as usize].thread = Some(t);
        t
    }

    /// Hands `entries` head entries of `peer` on (the TUN write or the UDP send).
    fn deliver(sim: &mut Sim, peer: u32, entries: usize, packets: u32) {
        let now = sim.now;
        let in_window = now >= sim.warmup;
        for _ in 0..entries {
            let pe = &mut sim.pipe.peers[peer as usize];
            let Some(e) = pe.queue.pop_front() else {
                break;
            };
            pe.head_seq += 1;
            if in_window {
                sim.pipe.delivered += u64::from(e.packets);
                for _ in 0..e.packets {
                    sim.latency.record(now - e.arrived);
                }
            }
            if !sim.windows.is_empty() {
                let at = now + sim.rtt;
                sim.push(
                    at,
                    Event::Acked {
                        peer,
                        packets: e.packets,
                    },
                );
            }
        }
        let pipe = &mut sim.pipe;
        pipe.peers[peer as usize].queued -= packets as usize;
        pipe.inflight -= packets as usize;
    }
}

fn new_ctx(role: Role, prio: Prio, pinned: Option<usize>) -> Ctx {
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
    }
}
