//! Stage TX-3, assign nonce. Input: one peer's packets in order (from `route`, via
//! [`enqueue_routed`], or staged packets and keepalives from a protocol step). Output:
//! batches with consecutive counters under the current keypair, each entered into the
//! peer's ordered TX queue and then handed to the scheduler as crypt work, in that same
//! order; or, without a usable session, the packets are staged and a handshake is
//! started; or, for a peer with no endpoint to send to, each packet is answered with an
//! ICMP "host unreachable" and dropped, as by the kernel.
//!
//! Ordering: counters are reserved and the batch is queued while the peer's state lock
//! is held, so queue order equals counter order even with several TUN readers; staged
//! packets are staged and taken under the same lock, ahead of anything newer (see
//! [`enqueue_after_staged`]).
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
            if !peer.tx_queue.has_room(group.len()) {
                super::tx_flush::send_plugged_before_waiting(c);
            }
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
    carry_out(c, peer, outs);
    r
}

/// Carries out what a protocol step asked for.
fn carry_out(c: StageCtx<'_>, peer: &Arc<Peer>, outs: Vec<Output>) {
    for o in outs {
        match o {
            Output::Initiation { reason, message } => {
                c.iface
                    .stats
                    .initiations(reason)
                    .fetch_add(1, Ordering::Relaxed);
                send_to_peer(c, peer, &message)
            }
            Output::Handshake(bytes) => send_to_peer(c, peer, &bytes),
            Output::SendStaged { keepalive_if_empty } => send_staged(c, peer, keepalive_if_empty),
            Output::DropStaged => {
                let n = peer.take_staged().len();
                c.iface
                    .stats
                    .tx_dropped
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
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

/// Gives `packets` consecutive counters and queues them as batches of at most
/// [`MAX_BATCH`], each entered into the peer's ordered queue and then handed to the
/// scheduler; without a usable session they are staged and a handshake is begun; a
/// peer without an endpoint has them answered "unreachable".
pub fn assign_and_enqueue(c: StageCtx<'_>, peer: &Arc<Peer>, packets: Vec<Packet>, budget: Budget) {
    let mut packets = packets;
    while !packets.is_empty() {
        let rest = if packets.len() > MAX_BATCH {
            packets.split_off(MAX_BATCH)
        } else {
            Vec::new()
        };
        let chunk = std::mem::replace(&mut packets, rest);
        enqueue_after_staged(c, peer, chunk, budget, false);
    }
}

/// What a session that became usable asks for (`Output::SendStaged`): the staged
/// packets, or a keepalive if there are none and `keepalive_if_empty`.
pub(crate) fn send_staged(c: StageCtx<'_>, peer: &Arc<Peer>, keepalive_if_empty: bool) {
    enqueue_after_staged(c, peer, Vec::new(), Budget::Bypassed, keepalive_if_empty);
}

/// The batches one step queued: rarely more than one, so the first needs no vector.
#[derive(Default)]
struct Queued {
    first: Option<Arc<Batch>>,
    more: Vec<Arc<Batch>>,
}

impl Queued {
    fn push(&mut self, b: Arc<Batch>) {
        match self.first {
            None => self.first = Some(b),
            Some(_) => self.more.push(b),
        }
    }
}

/// The batches a step queued in its peer's ordered queue and has not yet handed to the
/// workers. Invariant: a queued batch must be completed, or the queue waits on it for
/// good and every later packet of the peer with it. If the step panics (a bug) after
/// queuing some, they are completed here as the panic unwinds (after the state lock
/// is released), their packets counted as lost to it, as a crypt panic's are.
struct Unsubmitted<'a> {
    c: StageCtx<'a>,
    peer: &'a Arc<Peer>,
    queued: Queued,
}

impl Drop for Unsubmitted<'_> {
    fn drop(&mut self) {
        let q = std::mem::take(&mut self.queued);
        let batches = q.first.into_iter().chain(q.more);
        super::complete_as_lost(self.c, self.peer, Direction::Tx, batches);
    }
}

/// Queues the peer's staged packets, then `chunk` (at most [`MAX_BATCH`] packets),
/// with counters reserved under the peer's state lock, and hands them on in that order
/// once it is released.
///
/// Race and invariant: packets are staged and taken from the staging queue only here,
/// under the state lock, in the same step that finds no session (and begins the
/// handshake) or reserves counters. So staged packets always get counters before any
/// packet that came after them, and a session that becomes usable always finds what
/// was staged before it. Staging after the step, as before, let the handshake's
/// response be consumed between the initiation's send and the staging: its
/// `SendStaged` found nothing, and the packet waited for the next handshake, minutes
/// later, behind every packet sent meanwhile.
fn enqueue_after_staged(
    c: StageCtx<'_>,
    peer: &Arc<Peer>,
    chunk: Vec<Packet>,
    budget: Budget,
    keepalive_if_empty: bool,
) {
    if peer.is_removed() {
        // Routed before the removal, or dequeued by a pump that raced it.
        let n = chunk.len() as u64;
        if n > 0 {
            c.iface
                .stats
                .removed_dropped
                .fetch_add(n, Ordering::Relaxed);
        }
        return;
    }
    // The step's outputs (a handshake it started) are carried out after its batches
    // are handed to the workers: queued, a batch must reach them whatever a send
    // does, or its peer's ordered queue waits on it for good.
    let mut unsent = Unsubmitted {
        c,
        peer,
        queued: Queued::default(),
    };
    let queued = &mut unsent.queued;
    let ((dropped, unreachable), outs) = take_step(c, peer, |state, ctx, out| {
        // A peer with no endpoint (configured without one, and not heard from) cannot
        // be sent to: its packets are answered "host unreachable" and dropped, as the
        // kernel's `wg_xmit` does (`-EDESTADDRREQ`), rather than staged where the
        // sender hears nothing until it gives up.
        if state.endpoint().is_none() && !chunk.is_empty() {
            return (0, chunk);
        }
        let mut dropped = 0;
        let mut queue = |packets: Vec<Packet>, budget: Budget| -> Result<(), Vec<Packet>> {
            let n = packets.len();
            let Some((kp, first)) = state.prepare_send(ctx, n as u64, out) else {
                return Err(packets);
            };
            let mut packets = packets;
            for (i, p) in packets.iter_mut().enumerate() {
                p.counter = first + i as u64;
            }
            let batch = Batch::new(kp, packets);
            let pushed = match budget {
                Budget::Enforced => peer.tx_queue.push(batch.clone(), n),
                Budget::Bypassed => peer.tx_queue.push_past_budget(batch.clone(), n),
            };
            if pushed {
                queued.push(batch);
            } else {
                dropped += n;
            }
            Ok(())
        };
        let mut staged = peer.take_staged();
        let mut chunk = chunk;
        if staged.is_empty() && chunk.is_empty() && keepalive_if_empty {
            chunk.push(Packet::with_capacity(0));
        }
        // Once no session is found, this and everything after it waits (staged) in
        // order.
        let mut waiting: Vec<Packet> = Vec::new();
        let mut queue_or_wait = |packets: Vec<Packet>, budget: Budget| {
            if !waiting.is_empty() {
                waiting.extend(packets);
            } else if let Err(left) = queue(packets, budget) {
                waiting = left;
            }
        };
        while !staged.is_empty() {
            let rest = staged.split_off(staged.len().min(MAX_BATCH));
            queue_or_wait(staged, Budget::Bypassed);
            staged = rest;
        }
        if !chunk.is_empty() {
            queue_or_wait(chunk, budget);
        }
        if !waiting.is_empty() {
            dropped += peer.stage(waiting);
        }
        (dropped, Vec::new())
    });
    if !unreachable.is_empty() {
        let n = unreachable.len() as u64;
        c.iface.stats.tx_no_endpoint.fetch_add(n, Ordering::Relaxed);
        for p in &unreachable {
            super::route::answer_unreachable(c.iface, p.plaintext());
        }
    }
    let queued = std::mem::take(&mut unsent.queued);
    if dropped > 0 {
        c.iface
            .stats
            .tx_dropped
            .fetch_add(dropped as u64, Ordering::Relaxed);
    }
    for batch in queued.first.into_iter().chain(queued.more) {
        c.sched.submit_crypt(Crypt {
            iface: c.iface,
            peer,
            batch,
            dir: Direction::Tx,
        });
    }
    carry_out(c, peer, outs);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Budgets;
    use crate::interface::Interface;
    use crate::sched::{Scheduler, Serial};
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::atomic::AtomicUsize;

    /// Counts the serial stages it is asked to run.
    #[derive(Default)]
    struct Recording(AtomicUsize);

    impl Scheduler for Recording {
        fn submit_crypt(&self, _: Crypt<'_>) {}
        fn schedule_serial(&self, _: Serial<'_>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn submit_handshake(&self, _: &Arc<Interface>) {}
    }

    /// A step that panics (a bug) after queuing batches leaves none of them pending in
    /// the peer's ordered queue: each is completed with its packets counted as lost,
    /// and the serial stage is scheduled to take them off. Pending, they held every
    /// later packet of the peer back for good.
    #[test]
    fn batches_queued_by_a_step_that_panics_are_completed() {
        let iface = Interface::for_tests();
        let peer = Arc::new(Peer::new(1, [7; 32], [0; 32], &Budgets::default()));
        let kp = Arc::new(wirelane_proto::sim::keypair(false));
        let packets = (0..3).map(|_| Packet::with_capacity(4)).collect();
        let batch = Batch::new(kp, packets);
        assert!(peer.tx_queue.push(batch.clone(), 3));
        let sched = Recording::default();
        let c = StageCtx {
            iface: &iface,
            sched: &sched,
        };
        let step = catch_unwind(AssertUnwindSafe(|| {
            let mut unsent = Unsubmitted {
                c,
                peer: &peer,
                queued: Queued::default(),
            };
            unsent.queued.push(batch.clone());
            panic!("a bug in the step");
        }));
        assert!(step.is_err());
        assert!(batch.is_done());
        assert_eq!(sched.0.load(Ordering::Relaxed), 1);
        assert_eq!(iface.stats.total(|c| &c.crypt_panic_dropped), 3);
        // Nothing is lost or counted when the step returns: the guard is emptied first.
        let unsent = Unsubmitted {
            c,
            peer: &peer,
            queued: Queued::default(),
        };
        drop(unsent);
        assert_eq!(sched.0.load(Ordering::Relaxed), 1);
    }
}
