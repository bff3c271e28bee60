//! Stage TX-5, per-peer ordered flush. Input: the peer's TX queue. Output: every sealed
//! batch at its head sent to the peer's endpoint in queue order, then timer
//! bookkeeping. Runs of equal-sized datagrams go out as one UDP GSO send (UDP_SEGMENT);
//! where the kernel refuses that, sendmmsg. Runs as one work item per peer at a time
//! (see `OrderedQueue`). With `--queue fq-codel` it then pumps the peer's flow queues
//! into the room it made (`fq::pump`).

use super::nonce::step;
use super::StageCtx;
use crate::fq_codel::QueueDiscipline;
use crate::peer::Peer;
use crate::ports::UdpPort;
use crate::queue::Drained;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use wirelane_io::udp::{LocalAddr, GSO_MAX_BYTES, GSO_MAX_SEGMENTS};

/// Sends datagrams in order; returns how many left. Consecutive datagrams of one size
/// (the last of a run may be shorter) share one GSO send, gathered from the packets'
/// own buffers.
fn send_all(sock: &dyn UdpPort, dgrams: &[&[u8]], ep: SocketAddr, src: Option<LocalAddr>) -> usize {
    let mut sent = 0;
    let mut i = 0;
    while i < dgrams.len() {
        if !sock.gso_enabled() {
            let rest: Vec<(&[u8], SocketAddr)> = dgrams[i..].iter().map(|d| (*d, ep)).collect();
            return sent + sock.send_batch(&rest, src).unwrap_or(0);
        }
        let seg = dgrams[i].len();
        let (mut j, mut bytes) = (i, 0);
        while j < dgrams.len()
            && j - i < GSO_MAX_SEGMENTS
            && dgrams[j].len() <= seg
            && bytes + dgrams[j].len() <= GSO_MAX_BYTES
        {
            bytes += dgrams[j].len();
            j += 1;
            if dgrams[j - 1].len() < seg {
                break; // Only the last segment of a send may be short.
            }
        }
        let ok = if j - i == 1 {
            sock.send_from(dgrams[i], &ep, src).is_ok()
        } else {
            match sock.send_segmented(&dgrams[i..j], seg as u16, &ep, src) {
                Ok(true) => true,
                Ok(false) => continue, // GSO refused: the loop falls back above.
                Err(_) => false,
            }
        };
        if ok {
            sent += j - i;
        }
        i = j;
    }
    sent
}

/// Flushes what is ready at the head of the peer's TX queue, at most `budget` packets
/// (see `OrderedQueue::drain`).
pub fn flush(c: StageCtx<'_>, peer: &Arc<Peer>, budget: usize) -> Drained {
    let dev = c.iface;
    let mut sent_data = false;
    let mut sent_any = false;
    let drained = peer.tx_queue.drain(budget, |batch| {
        if peer.is_removed() {
            return;
        }
        let Some(ep) = peer.state().endpoint() else {
            dev.stats
                .tx_no_endpoint
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            return;
        };
        // Before the socket table's read lock: the check may read it too.
        let src = dev.source_for(peer, ep);
        let body = batch.body();
        let dgrams: Vec<&[u8]> = body
            .packets
            .iter()
            .filter(|p| p.ok)
            .map(|p| p.datagram())
            .collect();
        let sockets = dev.sockets();
        let Some(sock) = sockets.for_destination(&ep) else {
            return;
        };
        let n = send_all(&**sock, &dgrams, ep, src);
        let bytes: usize = dgrams[..n].iter().map(|b| b.len()).sum();
        peer.tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        sent_any |= n > 0;
        // A keepalive is a transport message carrying only the 16-byte tag.
        sent_data |= dgrams[..n].iter().any(|b| b.len() > 32);
    });
    dev.stats.record_serial_run(&drained);
    if sent_any {
        step(c, peer, |state, ctx, _| state.on_sent(ctx, sent_data));
    }
    // The ordered queue has room now: let the flow queues refill it.
    if dev.queue == QueueDiscipline::FqCodel && drained.packets > 0 {
        super::fq::pump(c, peer);
    }
    drained
}
