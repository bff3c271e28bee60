//! Stage TX-3, assign nonce. Input: one peer's packets in order. Output: a batch with
//! consecutive counters under the current keypair, entered into the peer's ordered TX
//! queue and the shared crypt queue in that same order; or, without a usable session,
//! the packets are staged and a handshake is started.
//!
//! Ordering: counters are reserved and the batch is queued while the peer's state lock
//! is held, so queue order equals counter order even with several TUN readers.

use crate::device::Device;
use crate::exec::Work;
use crate::packet::{Batch, Packet, MAX_BATCH};
use crate::peer::Peer;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub fn assign_and_enqueue(dev: &Device, peer: &Arc<Peer>, packets: Vec<Packet>) {
    if peer.is_removed() {
        return;
    }
    let mut packets = packets;
    while !packets.is_empty() {
        let rest = if packets.len() > MAX_BATCH {
            packets.split_off(MAX_BATCH)
        } else {
            Vec::new()
        };
        let chunk = std::mem::replace(&mut packets, rest);
        let n = chunk.len();
        let pending = dev.with_peer(peer, |state, ctx, out| {
            match state.prepare_send(ctx, n as u64, out) {
                Some((kp, first)) => {
                    let mut chunk = chunk;
                    for (i, p) in chunk.iter_mut().enumerate() {
                        p.counter = first + i as u64;
                    }
                    let batch = Batch::new(peer.clone(), kp, chunk);
                    if peer.tx_queue.push(batch.clone(), n) {
                        Ok(batch)
                    } else {
                        Err(None)
                    }
                }
                None => Err(Some(chunk)),
            }
        });
        match pending {
            Ok(batch) => dev.submit(Work::Encrypt(batch)),
            Err(Some(chunk)) => {
                let dropped = peer.stage(chunk);
                dev.stats
                    .tx_dropped
                    .fetch_add(dropped as u64, Ordering::Relaxed);
            }
            Err(None) => {
                dev.stats.tx_dropped.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
}
