//! A peer at run time: its protocol state behind one mutex, its staged packets (waiting
//! for a session), its two ordered queues, and its counters.
//!
//! Lock order (outermost first): device peer table → `state` → index table. The state
//! mutex is held only for protocol bookkeeping, never during crypto or I/O.

use crate::packet::Packet;
use crate::queue::OrderedQueue;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use wirelane_proto::PeerState;

/// Most packets a peer without a session holds while its handshake runs (the kernel's
/// MAX_STAGED_PACKETS); the oldest are dropped first.
pub const MAX_STAGED_PACKETS: usize = 128;

pub struct Peer {
    /// Small stable identifier: the AllowedIPs trie stores it instead of a pointer.
    pub id: u32,
    pub public_key: [u8; 32],
    state: Mutex<PeerState>,
    staged: Mutex<VecDeque<Packet>>,
    pub tx_queue: OrderedQueue,
    pub rx_queue: OrderedQueue,
    pub rx_bytes: AtomicU64,
    pub tx_bytes: AtomicU64,
    removed: AtomicBool,
    /// Deadline (ns on the device clock) of the entry this peer has in the timer queue;
    /// `u64::MAX` when it has none.
    pub timer_at: AtomicU64,
}

impl Peer {
    pub fn new(id: u32, public_key: [u8; 32], psk: [u8; 32]) -> Peer {
        Peer {
            id,
            public_key,
            state: Mutex::new(PeerState::new(public_key, psk)),
            staged: Mutex::new(VecDeque::new()),
            tx_queue: OrderedQueue::default(),
            rx_queue: OrderedQueue::default(),
            rx_bytes: AtomicU64::new(0),
            tx_bytes: AtomicU64::new(0),
            removed: AtomicBool::new(false),
            timer_at: AtomicU64::new(u64::MAX),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, PeerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stages packets until a session exists, dropping the oldest beyond the bound.
    pub fn stage(&self, packets: impl IntoIterator<Item = Packet>) -> usize {
        let mut q = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        let mut dropped = 0;
        for p in packets {
            if q.len() >= MAX_STAGED_PACKETS {
                q.pop_front();
                dropped += 1;
            }
            q.push_back(p);
        }
        dropped
    }

    pub fn take_staged(&self) -> Vec<Packet> {
        let mut q = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        q.drain(..).collect()
    }

    pub fn staged_len(&self) -> usize {
        self.staged.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn mark_removed(&self) {
        self.removed.store(true, Ordering::Release);
        self.take_staged();
        self.tx_queue.clear();
        self.rx_queue.clear();
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::HEADROOM;

    #[test]
    fn staging_is_bounded_and_drops_the_oldest() {
        let peer = Peer::new(1, [7; 32], [0; 32]);
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
}
