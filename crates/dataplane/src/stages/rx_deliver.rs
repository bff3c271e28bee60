//! Stage RX-4, per-peer ordered delivery. Input: the peer's RX queue. Output: for each
//! opened batch at the head, in order: replay check, roaming and timer bookkeeping,
//! inner-header validation, the cryptokey-routing source check, queue management
//! (`rx_aqm`: ECN decapsulation, the receive CoDel) and the write to the TUN, through
//! the peer's TUN queue. Keepalives stop after the bookkeeping. Runs as one work item
//! per peer at a time.

use super::nonce::step;
use super::StageCtx;
use crate::inner;
use crate::interface::Interface;
use crate::packet::HEADROOM;
use crate::peer::Peer;
use crate::queue::{Drained, Ordered};
use std::cell::RefCell;
use std::io::IoSlice;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use wirelane_io::offload;

thread_local! {
    /// Per-worker buffer for a super-packet's vnet and IP/TCP or IP/UDP headers (reused).
    static COALESCE: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(offload::VNET_HDR_LEN + 120));
}

/// Writes packets to the TUN through queue `q`; with offloads on, runs of one TCP flow
/// (and of one UDP flow, where the TUN took USO) become a single GSO super-packet, so
/// the kernel's stack sees one large packet instead of dozens of writes.
fn write_to_tun(dev: &Interface, q: usize, segs: &[&[u8]]) {
    if !dev.tun.has_vnet_hdr() {
        for s in segs {
            if dev.tun.write_pieces(q, &[IoSlice::new(s)]).is_err() {
                dev.stats
                    .rx_tun_write_failed
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        return;
    }
    COALESCE.with(|scratch| {
        offload::coalesce(
            segs,
            &mut scratch.borrow_mut(),
            dev.tun.has_uso(),
            |pieces, packets| {
                let failed = match dev.tun.write_pieces(q, pieces) {
                    Ok(_) => 0,
                    // The kernel refused the super-packet itself (its virtio-header
                    // checks): every packet in it still goes, one by one.
                    Err(e) if packets.len() > 1 && e.raw_os_error() == Some(libc::EINVAL) => {
                        let none = [0u8; offload::VNET_HDR_LEN];
                        packets
                            .iter()
                            .filter(|p| {
                                let alone = [IoSlice::new(&none), IoSlice::new(p)];
                                dev.tun.write_pieces(q, &alone).is_err()
                            })
                            .count()
                    }
                    Err(_) => packets.len(),
                };
                dev.stats
                    .rx_tun_write_failed
                    .fetch_add(failed as u64, Ordering::Relaxed);
            },
        )
    });
}

/// Delivers what is ready at the head of the peer's RX queue, at most `budget` packets
/// (see `OrderedQueue::drain`).
pub fn deliver(c: StageCtx<'_>, peer: &Arc<Peer>, budget: usize) -> Drained {
    let dev = c.iface;
    let drained = peer.rx_queue.drain(budget, |batch| {
        if peer.is_removed() {
            // Drained before the removal's clear, or queued after it.
            let n = batch.packets() as u64;
            dev.stats.removed_dropped.fetch_add(n, Ordering::Relaxed);
            return;
        }
        let mut body = batch.body();
        let mut last_src = None;
        let mut any_data = false;
        let mut to_write: Vec<usize> = Vec::with_capacity(body.packets.len());
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
            last_src = p.src.map(|s| (s, p.local));
            peer.rx_bytes
                .fetch_add((p.len + HEADROOM + 16) as u64, Ordering::Relaxed);
            if p.len == 0 {
                continue;
            }
            any_data = true;
            to_write.push(i);
        }
        if let Some((src, local)) = last_src {
            let kp = batch.keypair.clone();
            step(c, peer, |state, ctx, out| {
                state.on_authenticated_transport(ctx, &kp, src, any_data, out)
            });
            peer.learn_source(src, local);
        }
        if to_write.is_empty() {
            return;
        }
        let table = dev.table();
        let mut keep: Vec<(usize, usize)> = Vec::with_capacity(to_write.len());
        for i in to_write {
            let Some(h) = inner::parse(body.packets[i].plaintext()) else {
                dev.stats.rx_bad_inner.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            if table.allowed.lookup(h.src) != Some(peer.id) {
                dev.stats.rx_bad_source.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // Padding beyond the header's length is not part of the packet.
            keep.push((i, h.total_len));
        }
        drop(table);
        super::rx_aqm::manage(dev, &mut body.packets, &mut keep);
        let segs: Vec<&[u8]> = keep
            .iter()
            .map(|&(i, len)| &body.packets[i].plaintext()[..len])
            .collect();
        // A multi-queue TUN reads a flow from the queue its packets were written
        // through: one queue per peer spreads the replies to many peers over the TUN
        // readers, and keeps each flow on one of them.
        let q = peer.id as usize % dev.tun.queues();
        write_to_tun(dev, q, &segs);
    });
    dev.stats.record_serial_run(&drained);
    drained
}
