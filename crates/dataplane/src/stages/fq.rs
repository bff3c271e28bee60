//! Stage TX-3a, flow queue (`--queue fq-codel`, the default). Input: one peer's routed
//! packets from the TUN reader. Output: the same packets in deficit-round-robin order
//! over their flows, less CoDel's drops and with its CE marks (`fq_codel`), handed to
//! the nonce stage while the peer's ordered queue (its ring) holds fewer than
//! [`RING_PACKETS`] and less than its adaptive byte limit (`ring_limit`).
//! Packets that find the peer's flow queues idle (nothing queued, no controller state)
//! and room behind them go to the nonce stage at once, as the queues would pass them.
//!
//! Why before the nonce: a packet with a counter must leave in counter order, so
//! fairness, drops and marks can only happen before it gets one. The ordered queue
//! behind this one is kept short because every packet in it is ahead of any new flow's
//! packet: its bound is the wait a sparse flow sees behind a bulk one.
//!
//! The pump (moving packets on) runs on the TUN reader after each enqueue and on the
//! serial TX stage after each flush, which is when the ordered queue gains room. It
//! assigns counters with the flow queues locked, so the order it dequeues a flow's
//! packets in is their counter order; see `SharedFlowQueues` for the hand-off between
//! pumps. Handshake messages and keepalives never pass through here.

use super::nonce::{assign_and_enqueue, Budget, BACKPRESSURE_WAIT};
use super::StageCtx;
use crate::fq_codel::Verdicts;
use crate::inner::flow_hash;
use crate::packet::{Packet, MAX_BATCH};
use crate::peer::Peer;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

/// Most packets the pump lets into a peer's ordered queue (counted until they are
/// sent): four batches, two for the crypt workers and two sealed or being sent. The
/// byte limit (`ring_limit`) is what usually binds; this bounds small packets, whose
/// bytes would let thousands in.
pub const RING_PACKETS: usize = 4 * MAX_BATCH;

/// What may still enter `peer`'s ring: (packets, bytes). A pump admits while both
/// are above 0.
fn ring_room(peer: &Peer) -> (usize, usize) {
    let q = &peer.tx_queue;
    let packets = RING_PACKETS.saturating_sub(q.queued_packets());
    (packets, peer.tx_ring_limit.room(q.queued_bytes()))
}

/// Queues `packets` of `peer` by flow, stamped as entering at `now` (the interface's
/// clock in ns, read once per TUN read: a backpressure wait before this call counts
/// in their sojourn, as the packets waited it), then pumps. The reader waits while
/// the peer's flow queues are full, or the interface's transmit budget, as it does on
/// the FIFO; after [`BACKPRESSURE_WAIT`] it makes room by dropping from the peer's
/// fattest flow, or, with nothing of the peer's queued, drops the new packet.
pub fn enqueue(c: StageCtx<'_>, peer: &Arc<Peer>, packets: Vec<Packet>, now: u64) {
    let mut overflow = 0u64;
    if !peer.tx_fq.budget_fits(packets.len()) {
        super::tx_flush::send_plugged_before_waiting(c);
    }
    {
        let mut q = peer.tx_fq.lock_with_room(packets.len(), BACKPRESSURE_WAIT);
        // A removal clears the queues under this lock after marking the peer removed:
        // packets routed before it and queued after the clear would never be pumped,
        // and would hold budget room until the peer was freed.
        if peer.is_removed() {
            let n = packets.len() as u64;
            c.iface
                .stats
                .removed_dropped
                .fetch_add(n, Ordering::Relaxed);
            return;
        }
        let mut room = q.budget_room();
        // Through idle flow queues with room behind them, packets would leave as soon
        // as they came, in the same order bar the interleaving of their flows, with a
        // sojourn of nothing and no controller state to act on: they skip the queues.
        // Why: at many peers nearly every packet finds its peer idle, and queuing it
        // built the peer's table (four allocations) only for the dequeue to release
        // it. The lock is held throughout, as the pump holds it, so no packet of the
        // peer's can take a counter between the check and these packets' counters.
        let n = packets.len();
        let (ring_packets, ring_bytes) = ring_room(peer);
        let bytes: usize = packets.iter().map(|p| p.len).sum();
        // The budget was checked just above, as every producer checks it; enforced
        // again at the push, a race with another peer's producer would drop the whole
        // group (a lost batch the wake-up stress run caught).
        let fits = n <= ring_packets && bytes <= ring_bytes;
        if q.is_idle() && fits && n <= room {
            assign_and_enqueue(c, peer, packets, Budget::Bypassed);
            drop(q);
            let passed = Verdicts {
                delivered: n as u64,
                ..Verdicts::default()
            };
            return record(c, &passed);
        }
        for p in packets {
            if q.len() >= crate::fq_codel::FQ_LIMIT || room == 0 {
                overflow += 1;
                if !q.drop_from_fattest() {
                    continue;
                }
            } else {
                room -= 1;
            }
            q.enqueue(flow_hash(p.plaintext()), p, now);
        }
        q.note_mtu(c.iface.mtu());
    }
    if overflow > 0 {
        c.iface
            .stats
            .tx_fq_overflow
            .fetch_add(overflow, Ordering::Relaxed);
    }
    // The wait for room may have taken a while: the dequeue time is read afresh.
    pump(c, peer);
}

/// Moves packets from `peer`'s flow queues into the nonce stage while its ordered queue
/// has room. Never waits: if another thread holds the queues, that thread pumps again.
/// The dequeue time is read for each chunk, with the queues held: every packet in them
/// was stamped before this thread took the lock, so none looks younger than it is (a
/// sojourn of 0 would end CoDel's dropping state), and a long pass, whose chunks the
/// workqueue's shortcut may seal and send inline, ages what stays as the clock does.
///
/// Race (no lost pump): a thread that finds the queues held sets `pump_again` and
/// leaves; the holder reads it after unlocking. That is a store-buffer pattern between
/// the flag and the lock, whose operations are not all SeqCst: the two fences make
/// "the holder saw the flag, or the other thread took the lock" hold in the language's
/// model, not only on x86 and ARMv8.
pub fn pump(c: StageCtx<'_>, peer: &Arc<Peer>) {
    let fq = &peer.tx_fq;
    loop {
        fq.pump_again.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let Some(mut q) = fq.try_lock() else {
            return;
        };
        let mut v = Verdicts::default();
        while fq.pump_again.swap(false, Ordering::SeqCst) {
            loop {
                if q.is_empty() || peer.is_removed() {
                    break;
                }
                let (room, mut room_bytes) = ring_room(peer);
                if room == 0 || room_bytes == 0 {
                    // Only the byte limit learns from being the bound, as DQL grows
                    // only when its own limit held packets back: small packets stopped
                    // by the packet bound would otherwise ratchet it to its ceiling,
                    // and sparse flows would then wait behind that many bytes.
                    if room_bytes == 0 {
                        peer.tx_ring_limit.note_held_back();
                    }
                    break;
                }
                let now = c.iface.now().as_nanos() as u64;
                let want = room.min(MAX_BATCH);
                // Sized to what is queued, not to a full batch: at thousands of peers
                // most chunks hold a packet or two and wait in the ordered queue, and
                // 64 slots each (7 KiB) came to tens of MiB under the budget.
                let mut chunk = Vec::with_capacity(want.min(q.len()));
                while chunk.len() < want && room_bytes > 0 {
                    match q.dequeue(&c.iface.codel, now, &mut v) {
                        Some(p) => {
                            room_bytes = room_bytes.saturating_sub(p.len);
                            chunk.push(p);
                        }
                        None => break,
                    }
                }
                fq.wake_waiters();
                if chunk.is_empty() {
                    break;
                }
                // Before the ordered queue counts them: never twice at once.
                q.settle();
                // Counted in the budget since they entered the flow queues.
                assign_and_enqueue(c, peer, chunk, Budget::Bypassed);
            }
        }
        drop(q);
        fence(Ordering::SeqCst);
        record(c, &v);
        if !fq.pump_again.load(Ordering::SeqCst) {
            return;
        }
    }
}

fn record(c: StageCtx<'_>, v: &Verdicts) {
    let s = &c.iface.stats;
    if v.dropped > 0 {
        s.tx_codel_dropped.fetch_add(v.dropped, Ordering::Relaxed);
    }
    if v.marked > 0 {
        s.tx_codel_marked.fetch_add(v.marked, Ordering::Relaxed);
    }
    if v.delivered > 0 {
        s.tx_fq_dequeued.fetch_add(v.delivered, Ordering::Relaxed);
        s.tx_fq_sojourn_ns
            .fetch_add(v.sojourn_ns, Ordering::Relaxed);
        s.tx_fq_sojourn_max_ns
            .fetch_max(v.sojourn_max_ns, Ordering::Relaxed);
    }
}
