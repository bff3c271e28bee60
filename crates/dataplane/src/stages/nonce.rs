//! Stage TX-3, assign nonce. Input: one peer's packets in order (from `route`, via
//! [`enqueue_routed`], or staged packets and keepalives from a protocol step). Output:
//! batches with consecutive counters under the current keypair, each entered into the
//! peer's ordered TX queue and then handed to the scheduler as crypt work, in that same
//! order; or, without a usable session, the packets are staged and a handshake is
//! started.
//!
//! Ordering: counters are reserved and the batch is queued while the peer's state lock
//! is held, so queue order equals counter order even with several TUN readers.
//!
//! Backpressure: the TUN reader waits for room in a full peer queue rather than drop
//! ([`enqueue_routed`]); only readers wait, never workers, which could block the very
//! drain they wait for.
//!
//! Every protocol step a stage takes goes through [`step`] here, because what a step
//! asks for is mostly this stage's work: packets staged during a handshake, and
//! keepalives, enter the TX pipeline; handshake messages leave at once.

use super::protocol::{send_to_peer, take_step};
use super::StageCtx;
use crate::fq_codel::QueueDiscipline;
use crate::packet::{Batch, Packet, MAX_BATCH};
use crate::peer::Peer;
use crate::sched::{Crypt, Direction};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use wirelane_proto::{Ctx, Output, PeerState};

/// Longest a reader waits for room in a peer's queue before dropping.
pub(crate) const BACKPRESSURE_WAIT: Duration = Duration::from_millis(100);

/// What the TUN reader does with `route`'s groups: each peer's packets in chunks of at
/// most a batch, each chunk after waiting for room in the peer's queue.
/// With `--queue fq-codel` the groups go to the flow queue stage instead (`fq`), which
/// feeds this stage as the ordered queue drains.
pub fn enqueue_routed(c: StageCtx<'_>, groups: Vec<(Arc<Peer>, Vec<Packet>)>) {
    if c.iface.queue == QueueDiscipline::FqCodel {
        // One clock read for the whole read: at many peers each group is a packet.
        let now = c.iface.now().as_nanos() as u64;
        for (peer, group) in groups {
            super::fq::enqueue(c, &peer, group, now);
        }
        return;
    }
    for (peer, mut group) in groups {
        while !group.is_empty() {
            let rest = group.split_off(group.len().min(MAX_BATCH));
            peer.tx_queue.wait_for_room(group.len(), BACKPRESSURE_WAIT);
            assign_and_enqueue(c, &peer, group, Budget::Enforced);
            group = rest;
        }
    }
}

/// Runs one protocol step on `peer` (see `protocol::take_step`), then carries out
/// what it asked for, after the peer's state lock is released.
pub fn step<R>(
    c: StageCtx<'_>,
    peer: &Arc<Peer>,
    f: impl FnOnce(&mut PeerState, &mut Ctx, &mut Vec<Output>) -> R,
) -> R {
    let (r, outs) = take_step(c, peer, f);
    for o in outs {
        match o {
            Output::Handshake(bytes) => send_to_peer(c, peer, &bytes),
            Output::SendStaged { keepalive_if_empty } => {
                let mut staged = peer.take_staged();
                if staged.is_empty() && keepalive_if_empty {
                    staged.push(Packet::with_capacity(0));
                }
                if !staged.is_empty() {
                    assign_and_enqueue(c, peer, staged, Budget::Bypassed);
                }
            }
            Output::Keepalive => {
                assign_and_enqueue(c, peer, vec![Packet::with_capacity(0)], Budget::Bypassed)
            }
            Output::DropStaged => {
                let n = peer.take_staged().len();
                c.iface
                    .stats
                    .tx_dropped
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
    r
}

/// Whether packets entering a peer's TX queue must fit the interface's transmit budget
/// (`budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// A reader's new packets, after waiting for room: dropped if it is still full.
    Enforced,
    /// Packets it already counted in the flow queues, and a keepalive or the packets
    /// staged during a handshake, which it must never refuse.
    Bypassed,
}

pub fn assign_and_enqueue(c: StageCtx<'_>, peer: &Arc<Peer>, packets: Vec<Packet>, budget: Budget) {
    if peer.is_removed() {
        return;
    }
    let stats = &c.iface.stats;
    let mut packets = packets;
    while !packets.is_empty() {
        let rest = if packets.len() > MAX_BATCH {
            packets.split_off(MAX_BATCH)
        } else {
            Vec::new()
        };
        let chunk = std::mem::replace(&mut packets, rest);
        let n = chunk.len();
        let pending = step(c, peer, |state, ctx, out| {
            match state.prepare_send(ctx, n as u64, out) {
                Some((kp, first)) => {
                    let mut chunk = chunk;
                    for (i, p) in chunk.iter_mut().enumerate() {
                        p.counter = first + i as u64;
                    }
                    let batch = Batch::new(kp, chunk);
                    let queued = match budget {
                        Budget::Enforced => peer.tx_queue.push(batch.clone(), n),
                        Budget::Bypassed => peer.tx_queue.push_past_budget(batch.clone(), n),
                    };
                    if queued {
                        Ok(batch)
                    } else {
                        Err(None)
                    }
                }
                None => Err(Some(chunk)),
            }
        });
        match pending {
            Ok(batch) => c.sched.submit_crypt(Crypt {
                iface: c.iface,
                peer,
                batch,
                dir: Direction::Tx,
            }),
            Err(Some(chunk)) => {
                let dropped = peer.stage(chunk);
                stats
                    .tx_dropped
                    .fetch_add(dropped as u64, Ordering::Relaxed);
            }
            Err(None) => {
                stats.tx_dropped.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
}
