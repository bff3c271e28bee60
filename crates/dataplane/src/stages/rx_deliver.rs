//! Stage RX-4, per-peer ordered delivery. Input: the peer's RX queue. Output: for each
//! opened batch at the head, in order: replay check, roaming and timer bookkeeping,
//! inner-header validation, the cryptokey-routing source check, and the write to the
//! TUN. Keepalives stop after the bookkeeping. Runs as one work item per peer at a time.

use crate::device::Device;
use crate::inner;
use crate::packet::HEADROOM;
use crate::peer::Peer;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub fn deliver(dev: &Device, peer: &Arc<Peer>) {
    let handled = peer.rx_queue.drain(|batch| {
        if peer.is_removed() {
            return;
        }
        let mut body = batch.body();
        let mut last_src = None;
        let mut any_data = false;
        let mut to_write: Vec<(usize, usize)> = Vec::with_capacity(body.packets.len());
        for (i, p) in body.packets.iter().enumerate() {
            if !p.ok {
                dev.stats.rx_auth_failed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if !batch.keypair.accept_counter(p.counter) {
                dev.stats.rx_replayed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // Authenticated and fresh: this packet may move the endpoint.
            last_src = p.src;
            peer.rx_bytes
                .fetch_add((p.len + HEADROOM + 16) as u64, Ordering::Relaxed);
            if p.len == 0 {
                continue;
            }
            any_data = true;
            to_write.push((i, p.len));
        }
        if let Some(src) = last_src {
            let kp = batch.keypair.clone();
            dev.with_peer(peer, |state, ctx, out| {
                state.on_authenticated_transport(ctx, &kp, src, any_data, out)
            });
        }
        if to_write.is_empty() {
            return;
        }
        let table = dev.table();
        for (i, _) in to_write {
            let p = &mut body.packets[i];
            let Some(h) = inner::parse(p.plaintext()) else {
                dev.stats.rx_bad_inner.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            if table.allowed.lookup(h.src) != Some(peer.id) {
                dev.stats.rx_bad_source.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // Padding beyond the header's length is not part of the packet.
            let _ = dev.tun.write_packet(&mut p.buf, HEADROOM, h.total_len);
        }
    });
    dev.stats.record_serial_run(handled);
}
