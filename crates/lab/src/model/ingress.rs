//! The host and the reader stage of the simulated pipeline: bursts reach the host
//! queue of their RSS core (or, where the host's delivery costs these cores nothing,
//! the reader's socket at once); the host's softirq hands them to the reader's socket
//! (or, in the kernel, classifies them itself); a read takes a batch, groups it into
//! items per peer, queues each in its peer's ordered queue and deals it to the crypt
//! stage, or runs it on the reader (the `workqueue` model's idle shortcut).

use super::engine::{Event, Ns, Role, Sim, State};
use super::params::{Direction, QueueFull};
use super::pipeline::{
    Drops, Entry, Item, Pipeline, Pollable, Work, RTO_MIN_NS, SHORTCUT_MAX_PACKETS,
    TCP_TIMEOUT_MIN_NS,
};
use std::collections::VecDeque;
use wirelane_dataplane::exec::Model;

impl Pipeline {
    /// `n` packets of `peer` reach the host: its RSS queue, or a drop when that is full.
    /// Where the host's delivery costs nothing on these cores (the lab's veth path,
    /// where the sender's own thread pays for it), they go straight to the socket.
    pub fn arrive(sim: &mut Sim, peer: u32, n: u32, now: Ns) {
        if now >= sim.warmup {
            sim.pipe.offered += u64::from(n);
        }
        if sim.pipe.costs.host_packet_ns == 0.0 && sim.params.platform.reader_threads > 0 {
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

    /// The switch port ahead of the gateway: packets leave it one after the other at
    /// the line's rate, and reach the host as they do; a burst that finds the buffer
    /// full loses what does not fit.
    pub(super) fn queue_on_link(sim: &mut Sim, peer: u32, n: u32) {
        let plat = &sim.params.platform;
        let packet_ns = sim.scenario.size as f64 * 8.0 / plat.line_gbit;
        let free = sim.pipe.link_free.max(sim.now);
        let queued = ((free - sim.now) as f64 / packet_ns) as usize;
        let room = plat.line_buffer_packets.saturating_sub(queued);
        let taken = (n as usize).min(room) as u32;
        if taken < n {
            Self::lose(sim, peer, n - taken, |d| &mut d.line);
        }
        if taken > 0 {
            sim.pipe.link_free = free + (f64::from(taken) * packet_ns).round() as Ns;
            let at = sim.pipe.link_free;
            sim.push(
                at,
                Event::Arrive {
                    peer,
                    packets: taken,
                },
            );
        }
    }

    pub(super) fn lose(sim: &mut Sim, peer: u32, n: u32, place: fn(&mut Drops) -> &mut u64) {
        if sim.now >= sim.warmup {
            *place(&mut sim.pipe.drops) += u64::from(n);
        }
        if let Some(w) = sim.windows.get(peer as usize) {
            // Linux finds losses by RACK-TLP (RFC 8985): a quarter round trip after a
            // packet sent later is acknowledged; with nothing else in flight, by the
            // tail loss probe two round trips plus `TCP_TIMEOUT_MIN` later; with one
            // packet in flight, only by the retransmission timer.
            let rtt = sim.rtt;
            let (wait, timeout) = match w.in_flight {
                f if f > n => (rtt + rtt / 4, false),
                f if f >= 2 => (2 * rtt + TCP_TIMEOUT_MIN_NS, false),
                _ => (RTO_MIN_NS, true),
            };
            sim.push(
                sim.now + wait,
                Event::Lost {
                    peer,
                    packets: n,
                    timeout,
                },
            );
        }
    }

    pub(super) fn to_sockets(sim: &mut Sim, packets: Vec<(u32, Ns)>, waker: Option<usize>) {
        let cap = sim.params.platform.socket_packets;
        for (peer, t) in packets {
            let r = sim.pipe.peers[peer as usize].reader;
            if sim.pipe.sockets[r].len() >= cap {
                Self::lose(sim, peer, 1, |d| &mut d.socket);
                continue;
            }
            sim.pipe.sockets[r].push_back((peer, t));
        }
        // A reader sleeps only with an empty socket or while it waits for room (then
        // its own timer wakes it): one with data and not waiting is woken (`wake`
        // ignores a reader that is awake).
        for r in 0..sim.pipe.sockets.len() {
            if !sim.pipe.sockets[r].is_empty() && !sim.pipe.reader_waiting[r] {
                let ctx = sim.pipe.reader_ctx[r];
                sim.wake(ctx, waker);
            }
        }
    }

    /// Packets one read takes from reader `r`'s queue: `batch` datagrams, where on
    /// receive a datagram is a run of one peer's packets that UDP GRO coalesced (at
    /// most 64 KiB of them), so a read never splits a sender's GSO burst.
    pub(super) fn read_len(&self, r: usize, batch: usize) -> usize {
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

    /// Classify (RX) or route (TX): packets into per-peer entries, each queued in order
    /// and dealt to the crypt stage.
    pub(super) fn ingest(sim: &mut Sim, packets: Vec<(u32, Ns)>, core: usize, ctx: usize) {
        let plat = &sim.params.platform;
        let mut groups: Vec<(u32, u32, Ns)> = Vec::new();
        if plat.group_by_peer && sim.pipe.dir == Direction::Rx {
            // Classify: each run of consecutive packets of one peer is one item, cut
            // at the platform's bound.
            let max = match plat.rx_item_packets {
                0 => u32::MAX,
                m => m as u32,
            };
            for (p, t) in packets {
                match groups.last_mut() {
                    Some(g) if g.0 == p && g.1 < max => g.1 += 1,
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
        Self::queue_groups(sim, groups.into(), core, ctx);
    }

    /// Whether `n` more packets fit in `peer`'s ordered queue. An empty queue takes any
    /// item, so an item larger than the whole queue cannot wait forever.
    pub(super) fn peer_room(&self, cap: usize, peer: u32, n: u32) -> bool {
        let queued = self.peers[peer as usize].queued;
        queued == 0 || queued + n as usize <= cap
    }

    /// Queues each group in its peer's ordered queue and deals it to the crypt stage.
    /// A reader thread whose next group finds its peer's queue full holds that group
    /// and the rest of the read, and waits (`QueueFull::Wait`) until the serial stage
    /// drains room ([`Pipeline::wake_held_readers`]); elsewhere the group is dropped.
    pub(super) fn queue_groups(
        sim: &mut Sim,
        mut groups: VecDeque<(u32, u32, Ns)>,
        core: usize,
        ctx: usize,
    ) {
        let plat = &sim.params.platform;
        let dir = sim.pipe.dir;
        let (peer_cap, ring_cap) = (plat.peer_queue(dir), plat.crypt_ring_packets);
        let waits = plat.peer_queue_full == QueueFull::Wait;
        let flow_queues = dir == Direction::Tx && plat.tx_peer_queue_packets > 0;
        // The crypt items of the read the reader may run itself (`loops::take_shortcut`).
        let queues = match dir {
            Direction::Tx if plat.tun_queue_per_worker => plat.reader_threads,
            _ => 1,
        };
        let mut shortcuts_left = wirelane_dataplane::loops::shortcuts_per_read(queues);
        while let Some((peer, n, arrived)) = groups.pop_front() {
            let pipe = &mut sim.pipe;
            if flow_queues {
                // The daemon's flow queues (`fq::enqueue`): a group that finds them
                // idle and fits whole in the ring's room skips them; otherwise its
                // packets wait there, before their nonce, and a pump moves what fits.
                let (packets, bytes) = pipe.ring_room(peer_cap, peer);
                let fits = n as usize <= packets && n as usize * pipe.size as usize <= bytes;
                if !(fits && pipe.peers[peer as usize].backlog.is_empty()) {
                    pipe.peers[peer as usize].backlog.push_back((n, arrived));
                    pipe.inflight.add(n as usize);
                    Self::pump(sim, peer, core, ctx);
                    continue;
                }
            }
            let room = pipe.peer_room(peer_cap, peer, n);
            if !room {
                if let (true, Role::Reader(r)) = (waits, sim.ctxs[ctx].role) {
                    groups.push_front((peer, n, arrived));
                    pipe.held[r] = groups;
                    return;
                }
                Self::lose(sim, peer, n, |d| &mut d.peer_queue);
                continue;
            }
            if ring_cap > 0 && pipe.crypt_ring + n as usize > ring_cap {
                Self::lose(sim, peer, n, |d| &mut d.crypt_ring);
                continue;
            }
            pipe.inflight.add(n as usize);
            if Self::admit(sim, (peer, n, arrived), core, ctx, shortcuts_left > 0) {
                shortcuts_left -= 1;
            }
        }
    }

    /// `fq::pump`, after a read's enqueue and a flush's end: the peer's flow-queued
    /// packets go into the room its ordered queue has, in chunks of at most a batch,
    /// and on to the crypt stage, from `ctx`. As in the daemon, a packet enters while
    /// any byte of room is left (the ring may pass its limit by one packet), and a pump
    /// that stops at the limit with packets waiting tells the limit so.
    pub(super) fn pump(sim: &mut Sim, peer: u32, core: usize, ctx: usize) {
        let cap = sim.params.platform.peer_queue(sim.pipe.dir);
        let size = sim.pipe.size as usize;
        while let Some(&(n, arrived)) = sim.pipe.peers[peer as usize].backlog.front() {
            let (packets, bytes) = sim.pipe.ring_room(cap, peer);
            let pe = &mut sim.pipe.peers[peer as usize];
            if packets == 0 || bytes == 0 {
                if let Some(ring) = &pe.ring {
                    ring.note_held_back();
                }
                break;
            }
            let take = (n as usize)
                .min(packets)
                .min(bytes.div_ceil(size))
                .min(wirelane_dataplane::packet::MAX_BATCH) as u32;
            if take == n {
                pe.backlog.pop_front();
            } else if let Some(front) = pe.backlog.front_mut() {
                front.0 -= take;
            }
            Self::admit(sim, (peer, take, arrived), core, ctx, false);
        }
    }

    /// What may still enter `peer`'s transmit ring: (packets, bytes), as `fq::ring_room`.
    pub(super) fn ring_room(&self, cap: usize, peer: u32) -> (usize, usize) {
        let pe = &self.peers[peer as usize];
        let bytes = match &pe.ring {
            Some(ring) => ring.room(pe.queued * self.size as usize),
            None => usize::MAX,
        };
        (cap.saturating_sub(pe.queued), bytes)
    }

    /// Enters a group in its peer's ordered queue and deals its crypt item on, or runs
    /// it on `ctx` where `shortcut` allows it and the idle shortcut applies. Returns
    /// whether it ran it.
    fn admit(
        sim: &mut Sim,
        (peer, n, arrived): (u32, u32, Ns),
        core: usize,
        ctx: usize,
        shortcut: bool,
    ) -> bool {
        let pipe = &mut sim.pipe;
        let pe = &mut pipe.peers[peer as usize];
        let seq = pe.head_seq + pe.queue.len() as u64;
        pe.queue.push_back(Entry {
            packets: n,
            done: false,
            arrived,
        });
        pe.queued += n as usize;
        pipe.crypt_ring += n as usize;
        sim.ctxs[ctx].work_debt_ns += pipe.costs.reader_item_ns;
        let work = Work::Crypt {
            peer,
            seq,
            packets: n,
        };
        if shortcut && Self::shortcut(sim, ctx, n as usize) {
            // The reader seals or opens it itself (see `shortcut`).
            let cost = Self::crypt_cost(&sim.pipe, n);
            sim.ctxs[ctx].work_debt_ns += cost;
            sim.pipe.sig.crypt_items += 1;
            Self::complete(sim, ctx, work, core);
            return true;
        }
        let pipe = &mut sim.pipe;
        let item = Item::Crypt {
            peer,
            seq,
            packets: n,
        };
        if pipe.per_core {
            // Dealt round robin: the item itself (wirelane's `softirq`), or only
            // the wake-up, the item going to the shared ring (the kernel).
            let w = pipe.rr % pipe.per_worker.len();
            pipe.rr += 1;
            if pipe.crypt_per_core {
                Self::to_worker(sim, w, item, ctx);
            } else {
                pipe.shared.push_back(item);
                let wctx = pipe.worker_ctx[w];
                sim.wake(wctx, Some(ctx));
            }
        } else {
            pipe.shared.push_back(item);
            Self::wake_a_worker(sim, ctx);
        }
        false
    }

    /// The `workqueue` model's idle shortcut (`exec::workqueue`): a reader that finds
    /// the shared FIFO empty runs an item of at most 4 packets itself, rather than
    /// waking a worker for it (as many crypt items per read as `shortcuts_per_read`
    /// allows). Its cost is the reader's.
    pub(super) fn shortcut(sim: &Sim, ctx: usize, packets: usize) -> bool {
        sim.pipe.model == Model::Workqueue
            && !sim.pipe.per_core
            && matches!(sim.ctxs[ctx].role, Role::Reader(_))
            && packets <= SHORTCUT_MAX_PACKETS
            && sim.pipe.shared.is_empty()
    }

    pub(super) fn crypt_cost(pipe: &Pipeline, packets: u32) -> f64 {
        let c = &pipe.costs;
        c.crypt_item_ns + f64::from(packets) * (c.crypt_packet_ns + pipe.size * c.crypt_byte_ns)
    }

    /// Queues `item` on worker `w`'s own queue and wakes it.
    pub(super) fn to_worker(sim: &mut Sim, w: usize, item: Item, waker: usize) {
        sim.pipe.per_worker[w].push_back(item);
        let wctx = sim.pipe.worker_ctx[w];
        sim.wake(wctx, Some(waker));
    }

    pub(super) fn wake_a_worker(sim: &mut Sim, waker: usize) {
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
}
