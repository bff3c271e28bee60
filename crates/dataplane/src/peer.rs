//! A peer at run time: its protocol state behind one mutex, its staged packets (waiting
//! for a session), its transmit flow queues, its two ordered queues, and its counters.
//!
//! Lock order (outermost first): device peer table → `state` → index table. The state
//! mutex is held only for protocol bookkeeping, never during crypto or I/O.

use crate::budget::{Budgets, QueueBudget};
use crate::cookie_slot::CookieReplySlot;
use crate::fq_codel::SharedFlowQueues;
use crate::packet::Batch;
use crate::packet::Packet;
use crate::queue::OrderedQueue;
use crate::ring_limit::RingLimit;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use wirelane_io::udp::LocalAddr;
use wirelane_proto::PeerState;

/// Most packets a peer without a session holds while its handshake runs (the kernel's
/// MAX_STAGED_PACKETS); the oldest are dropped first. All peers together hold at most
/// `budget::STAGED_BUDGET_PACKETS`.
pub const MAX_STAGED_PACKETS: usize = 128;

pub struct Peer {
    /// Small stable identifier: the AllowedIPs trie stores it instead of a pointer.
    pub id: u32,
    pub public_key: [u8; 32],
    state: Mutex<PeerState>,
    staged: Mutex<VecDeque<Packet>>,
    /// What every peer's staged packets count against. Invariant: it counts exactly
    /// what `staged` holds, changed under `staged`'s lock.
    staged_budget: Arc<QueueBudget>,
    /// Transmit packets before their nonce, with `--queue fq-codel` (see `stages::fq`).
    pub tx_fq: SharedFlowQueues<Packet>,
    pub tx_queue: OrderedQueue<Batch>,
    /// How many bytes `tx_fq` may let into `tx_queue` (see `ring_limit`).
    pub tx_ring_limit: RingLimit,
    pub rx_queue: OrderedQueue<Batch>,
    pub rx_bytes: AtomicU64,
    pub tx_bytes: AtomicU64,
    removed: AtomicBool,
    /// Deadline (ns on the device clock) of the entry this peer has in the timer queue;
    /// `timer_queue::UNARMED` when it has none.
    pub timer_at: AtomicU64,
    /// The local end its authenticated packets arrive at, to send from. Boxed: it
    /// changes rarely, and an idle peer (most of a large gateway's) then pays 8 bytes
    /// for it instead of 64.
    sticky: Mutex<Option<Box<StickySource>>>,
    /// Whether the gate may queue a cookie reply for this peer (see `cookie_slot`).
    pub cookie_reply: CookieReplySlot,
}

/// A sticky source: the local address (and interface) that the peer's authenticated
/// packets from `endpoint` arrive at. Replies leave from it, so a peer that chose one
/// of several addresses, or sits behind NAT or a firewall that pins it, is answered
/// from the address it expects. It applies only while the peer's endpoint is still
/// `endpoint`: a new endpoint set by `wg` starts without one, as in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StickySource {
    pub endpoint: SocketAddr,
    pub local: LocalAddr,
    /// The `NetWatch` generation it was last found usable in.
    pub checked: u64,
}

/// `StickySource::checked` of a source never checked: newly learnt.
pub const UNCHECKED: u64 = 0;

impl Peer {
    /// A peer whose queues count against its interface's `budgets`.
    pub fn new(id: u32, public_key: [u8; 32], psk: [u8; 32], budgets: &Budgets) -> Peer {
        Peer {
            id,
            public_key,
            state: Mutex::new(PeerState::new(public_key, psk)),
            staged: Mutex::new(VecDeque::new()),
            staged_budget: budgets.staged.clone(),
            tx_fq: SharedFlowQueues::with_budget(budgets.tx.clone()),
            tx_queue: OrderedQueue::with_budget(budgets.tx.clone()),
            tx_ring_limit: RingLimit::default(),
            rx_queue: OrderedQueue::with_budget(budgets.rx.clone()),
            rx_bytes: AtomicU64::new(0),
            tx_bytes: AtomicU64::new(0),
            removed: AtomicBool::new(false),
            timer_at: AtomicU64::new(crate::timer_queue::UNARMED),
            sticky: Mutex::new(None),
            cookie_reply: CookieReplySlot::default(),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, PeerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stages packets until a session exists; returns how many were dropped. Beyond
    /// the peer's bound, or the interface's, the peer's oldest goes first; with the
    /// interface's bound reached and nothing of its own staged, the new packet goes.
    pub fn stage(&self, packets: impl IntoIterator<Item = Packet>) -> usize {
        let mut q = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        let mut dropped = 0;
        for p in packets {
            if q.len() >= MAX_STAGED_PACKETS || !self.staged_budget.fits(1) {
                dropped += 1;
                if q.pop_front().is_none() {
                    continue;
                }
            } else {
                self.staged_budget.add(1);
            }
            q.push_back(p);
        }
        dropped
    }

    pub fn take_staged(&self) -> Vec<Packet> {
        let mut q = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        // Every packet sent looks here first (`nonce`): nearly always nothing, and the
        // budget is a line every peer's sender shares, not to be written for nothing.
        if q.is_empty() {
            return Vec::new();
        }
        self.staged_budget.sub(q.len());
        q.drain(..).collect()
    }

    pub fn staged_len(&self) -> usize {
        self.staged.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Remembers that an authenticated packet from `endpoint` arrived at `local`. A
    /// source unchanged keeps its check; a new one is checked before its first use.
    pub fn learn_source(&self, endpoint: SocketAddr, local: Option<LocalAddr>) {
        let mut s = self.sticky.lock().unwrap_or_else(|p| p.into_inner());
        match (local, s.as_ref()) {
            (Some(l), Some(cur)) if cur.endpoint == endpoint && cur.local == l => {}
            (Some(local), _) => {
                *s = Some(Box::new(StickySource {
                    endpoint,
                    local,
                    checked: UNCHECKED,
                }))
            }
            (None, _) => *s = None,
        }
    }

    /// The sticky source for sending to `endpoint`, if there is one.
    pub fn sticky_source(&self, endpoint: SocketAddr) -> Option<StickySource> {
        let s = self.sticky.lock().unwrap_or_else(|p| p.into_inner());
        s.as_deref().copied().filter(|s| s.endpoint == endpoint)
    }

    /// Records the outcome of checking `was`: still usable in `generation`, or gone.
    /// A source learnt meanwhile is left alone.
    pub fn checked_source(&self, was: StickySource, usable: bool, generation: u64) {
        let mut s = self.sticky.lock().unwrap_or_else(|p| p.into_inner());
        if s.as_deref() == Some(&was) {
            *s = usable.then(|| {
                Box::new(StickySource {
                    checked: generation,
                    ..was
                })
            });
        }
    }

    /// Forgets the sticky source (a handshake retry: the source may be the trouble).
    pub fn forget_source(&self) {
        *self.sticky.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Marks the peer removed and drops what it had queued; returns how many packets
    /// that was (staged, flow-queued, and in the ordered queues, crypt work in flight
    /// included: it completes, but its batch is gone).
    pub fn mark_removed(&self) -> usize {
        self.removed.store(true, Ordering::Release);
        let staged = self.take_staged().len();
        let queued = self.tx_queue.clear() + self.rx_queue.clear();
        let mut fq = self.tx_fq.lock();
        let flow_queued = fq.len();
        fq.clear();
        drop(fq);
        self.tx_fq.wake_waiters();
        staged + queued + flow_queued
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let q = self.staged.get_mut().unwrap_or_else(|p| p.into_inner());
        self.staged_budget.sub(q.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::HEADROOM;

    #[test]
    fn staging_is_bounded_and_drops_the_oldest() {
        let peer = Peer::new(1, [7; 32], [0; 32], &Budgets::default());
        let packets = (0..1000u32).map(|i| {
            let mut p = Packet::with_capacity(4);
            p.len = 4;
            p.buf[HEADROOM..HEADROOM + 4].copy_from_slice(&i.to_le_bytes());
            p
        });
        assert_eq!(peer.stage(packets), 1000 - MAX_STAGED_PACKETS);
        assert_eq!(peer.staged_len(), MAX_STAGED_PACKETS);
        let kept = peer.take_staged();
        let first = u32::from_le_bytes(kept[0].plaintext()[..4].try_into().unwrap());
        assert_eq!(
            first,
            1000 - MAX_STAGED_PACKETS as u32,
            "the newest are kept"
        );
        assert_eq!(peer.staged_len(), 0);
    }

    /// A removal drops what the peer had queued anywhere and says how much; the
    /// budgets get their room back.
    #[test]
    fn a_removal_counts_what_it_drops() {
        use crate::packet::Batch;
        let budgets = Budgets::default();
        let peer = Peer::new(1, [7; 32], [0; 32], &budgets);
        let packets = |n: usize| (0..n).map(|_| Packet::with_capacity(4)).collect::<Vec<_>>();
        let kp = Arc::new(wirelane_proto::sim::keypair(false));
        assert_eq!(peer.stage(packets(3)), 0);
        assert!(peer.tx_queue.push(Batch::new(kp.clone(), packets(5)), 5));
        assert!(peer.rx_queue.push(Batch::new(kp, packets(2)), 2));
        {
            let mut fq = peer.tx_fq.lock();
            for (i, p) in packets(4).into_iter().enumerate() {
                fq.enqueue(i as u32, p, 0);
            }
        }
        assert_eq!(peer.mark_removed(), 3 + 5 + 2 + 4);
        assert!(peer.is_removed());
        assert_eq!(budgets.staged.used(), 0);
        assert_eq!(budgets.tx.used(), 0);
        assert_eq!(budgets.rx.used(), 0);
    }

    /// All peers together stage at most the interface's budget: past it a peer keeps
    /// its newest in place of its oldest, and one with nothing staged drops the new
    /// packet; taking or dropping a peer gives its share back.
    #[test]
    fn staging_over_all_peers_is_bounded() {
        let budgets = Budgets::default();
        let limit = crate::budget::STAGED_BUDGET_PACKETS;
        let peers: Vec<Peer> = (0..limit / MAX_STAGED_PACKETS + 2)
            .map(|i| Peer::new(i as u32, [i as u8; 32], [0; 32], &budgets))
            .collect();
        let packets = |n: usize| (0..n).map(|_| Packet::with_capacity(4));
        let full = limit / MAX_STAGED_PACKETS;
        for p in &peers[..full] {
            assert_eq!(p.stage(packets(MAX_STAGED_PACKETS)), 0);
        }
        assert_eq!(budgets.staged.used(), limit);
        assert_eq!(
            peers[full].stage(packets(10)),
            10,
            "nothing of its own to give up"
        );
        assert_eq!(peers[full].staged_len(), 0);
        assert_eq!(peers[0].stage(packets(5)), 5, "its oldest make room");
        assert_eq!(peers[0].staged_len(), MAX_STAGED_PACKETS);
        assert_eq!(peers[0].take_staged().len(), MAX_STAGED_PACKETS);
        assert_eq!(peers[full].stage(packets(10)), 0);
        assert_eq!(budgets.staged.used(), limit - MAX_STAGED_PACKETS + 10);
        drop(peers);
        assert_eq!(budgets.staged.used(), 0);
    }
}
