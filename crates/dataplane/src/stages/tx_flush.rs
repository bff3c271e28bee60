//! Stage TX-5, per-peer ordered flush. Input: the peer's TX queue. Output: every sealed
//! batch at its head sent to the peer's endpoint in queue order (sendmmsg), then timer
//! bookkeeping. Runs as one work item per peer at a time (see `OrderedQueue`).

use crate::device::Device;
use crate::peer::Peer;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub fn flush(dev: &Device, peer: &Arc<Peer>) {
    let mut sent_data = false;
    let mut sent_any = false;
    let handled = peer.tx_queue.drain(|batch| {
        if peer.is_removed() {
            return;
        }
        let Some(ep) = peer.state().endpoint() else {
            dev.stats
                .tx_no_endpoint
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            return;
        };
        let body = batch.body();
        let msgs: Vec<(&[u8], std::net::SocketAddr)> = body
            .packets
            .iter()
            .filter(|p| p.ok)
            .map(|p| (&p.buf[..p.len], ep))
            .collect();
        let sockets = dev.sockets();
        let Some(sock) = sockets.for_destination(&ep) else {
            return;
        };
        if let Ok(n) = sock.send_batch(&msgs) {
            let bytes: usize = msgs[..n].iter().map(|(b, _)| b.len()).sum();
            peer.tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            sent_any |= n > 0;
            // A keepalive is a transport message carrying only the 16-byte tag.
            sent_data |= msgs[..n].iter().any(|(b, _)| b.len() > 32);
        }
    });
    dev.stats.record_serial_run(handled);
    if sent_any {
        dev.with_peer(peer, |state, ctx, _| state.on_sent(ctx, sent_data));
    }
}
