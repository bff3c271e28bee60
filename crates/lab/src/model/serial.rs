//! The serial stage of the simulated pipeline and where each execution model runs it:
//! a crypt completion schedules the peer's stage (once: a scheduled stage is not
//! scheduled again); a step drains the done entries at the head of the peer's queue in
//! order and delivers them; a stage that ends with a done head runs again, so no
//! completion is left undelivered.

use super::engine::{Event, Prio, Role, Sim};
use super::params::{Direction, Pool};
use super::pipeline::{new_ctx, Item, Pipeline, Pollable, SerialStep, Work, DRAIN_CHUNK};
use super::source::hash;
use std::collections::VecDeque;
use wirelane_dataplane::exec::Model;

impl Pipeline {
    /// A step of `peer`'s serial stage: the done entries at the head, up to `budget`
    /// packets (an unbounded drain goes in steps of [`DRAIN_CHUNK`]). Only an
    /// invocation's first step pays the per-invocation cost.
    pub(super) fn serial_step(&mut self, peer: u32, budget: usize, first: bool) -> (Work, f64) {
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
        let invocation = if first {
            c.serial_invocation_ns + c.serial_send_ns
        } else {
            0.0
        };
        let cost = invocation
            + entries as f64 * c.serial_batch_ns
            + f64::from(packets) * c.serial_packet_ns;
        let work = Work::Serial(SerialStep {
            peer,
            entries,
            packets,
            budget,
            first,
        });
        (work, cost)
    }

    /// A serial step ended: deliver, count the signatures, and run the stage again
    /// (or go on draining) while the head is done; otherwise unschedule it.
    pub(super) fn serial_done(sim: &mut Sim, ctx: usize, step: SerialStep, core: usize) {
        let SerialStep {
            peer,
            entries,
            packets,
            budget,
            first,
        } = step;
        Self::deliver(sim, peer, entries, packets);
        if packets > 0 {
            let pe = &sim.pipe.peers[peer as usize];
            if let Some(ring) = &pe.ring {
                // `tx_flush::finish`: the limit learns from what this flush sent and
                // what it left, before the pump fills the room it made.
                let size = sim.pipe.size as usize;
                ring.completed(packets as usize * size, pe.queued * size, sim.now);
            }
            Self::pump(sim, peer, core, ctx);
            Self::wake_held_readers(sim, ctx);
        }
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
        // The kernel's NAPI (every model there) polls once more where it ran when a
        // completion came while it was scheduled (`napi_complete_done`): a peer polled
        // late on a busy core keeps coming back to it while its packets keep coming.
        let missed = std::mem::take(&mut pe.missed);
        let more = pe.queue.front().is_some_and(|e| e.done) || missed;
        if more && budget == usize::MAX {
            // The drain goes on in this context's next step.
            sim.ctxs[ctx].continuation = Some(peer);
        } else if more {
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

    /// Schedules `peer`'s serial stage where the model puts it, unless it is already.
    pub(super) fn schedule_serial(sim: &mut Sim, peer: u32, core: usize, waker: usize) {
        let kernel = sim.params.platform.reader_threads == 0;
        let pipe = &mut sim.pipe;
        let pe = &mut pipe.peers[peer as usize];
        if pe.scheduled {
            pe.missed = kernel;
            return;
        }
        pe.scheduled = true;
        let percore_pool = sim.params.platform.pool == Pool::PerCore;
        let fixed_tx = pipe.dir == Direction::Tx && (pipe.model == Model::Softirq || percore_pool);
        if fixed_tx {
            // A peer's transmit work runs on a core fixed per peer, at worker priority.
            let w = peer as usize % pipe.per_worker.len();
            Self::to_worker(sim, w, Item::Serial { peer }, waker);
            return;
        }
        match pipe.model {
            Model::Workqueue if percore_pool => {
                let w = pipe.worker_on_core[core];
                Self::to_worker(sim, w, Item::Serial { peer }, waker);
            }
            Model::Workqueue => {
                let queued = pipe.peers[peer as usize].queued;
                if Self::shortcut(sim, waker, queued) {
                    let (work, mut cost) = sim.pipe.serial_step(peer, usize::MAX, true);
                    if let (Direction::Tx, Role::Reader(r)) = (sim.pipe.dir, sim.ctxs[waker].role) {
                        // The reader's plug: the read's flushes leave in one send, which
                        // the first pays for.
                        let pipe = &mut sim.pipe;
                        pipe.sig.plugged += 1;
                        if std::mem::replace(&mut pipe.plug_open[r], true) {
                            cost -= pipe.costs.serial_send_ns;
                        } else {
                            pipe.sig.plug_sends += 1;
                        }
                    }
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
    pub(super) fn thread_for(sim: &mut Sim, peer: u32) -> usize {
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
    /// Wakes each reader that holds a group its peer's queue now has room for (the
    /// daemon's drain notifies the queue's waiters).
    fn wake_held_readers(sim: &mut Sim, waker: usize) {
        let cap = sim.params.platform.peer_queue(sim.pipe.dir);
        for r in 0..sim.pipe.held.len() {
            let fits = match sim.pipe.held[r].front() {
                Some(&(peer, n, _)) => sim.pipe.peer_room(cap, peer, n),
                None => false,
            };
            if fits && sim.pipe.reader_waiting[r] {
                sim.pipe.reader_waiting[r] = false;
                let ctx = sim.pipe.reader_ctx[r];
                sim.wake(ctx, Some(waker));
            }
        }
    }

    pub(super) fn deliver(sim: &mut Sim, peer: u32, entries: usize, packets: u32) {
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
        pipe.inflight.drain(packets as usize);
    }
}
