//! Stage TX-5, per-peer ordered flush. Input: the peer's TX queue. Output: every sealed
//! batch at its head sent to the peer's endpoint in queue order, then timer
//! bookkeeping. Runs of equal-sized datagrams with one outer ECN field (RFC 6040
//! encapsulation, chosen at `encrypt`) go out as one UDP GSO send (UDP_SEGMENT); where
//! the kernel refuses that, sendmmsg. Runs as one work item per peer at a time
//! (see `OrderedQueue`). Each packet sent counts its sojourn since its TUN read
//! (`tx_sojourn_ns`). With `--queue fq-codel` it then pumps the peer's flow queues
//! into the room it made (`fq::pump`).

use super::nonce::step;
use super::StageCtx;
use crate::fq_codel::QueueDiscipline;
use crate::peer::Peer;
use crate::ports::UdpPort;
use crate::queue::{Drained, Ordered};
use crate::stats::SojournTally;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use wirelane_io::udp::{LocalAddr, GSO_MAX_BYTES, GSO_MAX_SEGMENTS};

/// A sealed datagram and the ECN field of its outer header.
type Datagram<'a> = (&'a [u8], u8);

/// Sends datagrams in order; returns how many left. Consecutive datagrams of one size
/// (the last of a run may be shorter) and one ECN field share one GSO send, gathered
/// from the packets' own buffers: the ECN field is the whole send's.
fn send_all(
    sock: &dyn UdpPort,
    dgrams: &[Datagram<'_>],
    ep: SocketAddr,
    src: Option<LocalAddr>,
) -> usize {
    let mut sent = 0;
    let mut i = 0;
    while i < dgrams.len() {
        let ecn = dgrams[i].1;
        if !sock.gso_enabled() {
            let run = dgrams[i..].iter().take_while(|d| d.1 == ecn);
            let run: Vec<(&[u8], SocketAddr)> = run.map(|d| (d.0, ep)).collect();
            let took = sock.send_batch(&run, src, ecn).unwrap_or(0);
            sent += took;
            if took < run.len() {
                return sent;
            }
            i += run.len();
            continue;
        }
        let seg = dgrams[i].0.len();
        let (mut j, mut bytes) = (i, 0);
        while j < dgrams.len()
            && j - i < GSO_MAX_SEGMENTS
            && dgrams[j].0.len() <= seg
            && dgrams[j].1 == ecn
            && bytes + dgrams[j].0.len() <= GSO_MAX_BYTES
        {
            bytes += dgrams[j].0.len();
            j += 1;
            if dgrams[j - 1].0.len() < seg {
                break; // Only the last segment of a send may be short.
            }
        }
        let ok = if j - i == 1 {
            sock.send_from(dgrams[i].0, &ep, src, ecn).is_ok()
        } else {
            let mut pieces: [&[u8]; GSO_MAX_SEGMENTS] = [&[]; GSO_MAX_SEGMENTS];
            for (piece, d) in pieces.iter_mut().zip(&dgrams[i..j]) {
                *piece = d.0;
            }
            match sock.send_segmented(&pieces[..j - i], seg as u16, &ep, src, ecn) {
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
    let mut sojourns = SojournTally::default();
    let now = dev.wall().as_nanos() as u64;
    let mut completed_bytes = 0;
    let drained = peer.tx_queue.drain(budget, |batch| {
        completed_bytes += batch.bytes();
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
        let dgrams: Vec<Datagram<'_>> = body
            .packets
            .iter()
            .filter(|p| p.ok)
            .map(|p| (p.datagram(), p.outer_ecn))
            .collect();
        let sockets = dev.sockets();
        let Some(sock) = sockets.for_destination(&ep) else {
            return;
        };
        let n = send_all(&**sock, &dgrams, ep, src);
        // Timed: as many sealed packets as were sent, from the first (a send that
        // fails midway is too rare to bias a sojourn). Keepalives have no read time.
        let sent = body.packets.iter().filter(|p| p.ok).take(n);
        for p in sent.filter(|p| p.arrival_ns != 0) {
            sojourns.add(p.arrival_ns, now);
        }
        let bytes: usize = dgrams[..n].iter().map(|d| d.0.len()).sum();
        peer.tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        sent_any |= n > 0;
        // A keepalive is a transport message carrying only the 16-byte tag.
        sent_data |= dgrams[..n].iter().any(|d| d.0.len() > 32);
    });
    dev.stats.record_serial_run(&drained);
    dev.stats.record_tx_sojourns(&sojourns);
    if sent_any {
        step(c, peer, |state, ctx, _| state.on_sent(ctx, sent_data));
    }
    // The ordered queue has room now: adapt its limit to what this run found, then let
    // the flow queues refill it.
    if dev.queue == QueueDiscipline::FqCodel && drained.packets > 0 {
        let left = peer.tx_queue.queued_bytes();
        let at = dev.now().as_nanos() as u64;
        if peer.tx_ring_limit.completed(completed_bytes, left, at) {
            dev.stats.tx_ring_starved.fetch_add(1, Ordering::Relaxed);
        }
        super::fq::pump(c, peer);
    }
    drained
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::os::fd::RawFd;
    use std::sync::Mutex;
    use wirelane_io::udp::{Received, RecvBatch};

    /// A socket that records each send as (datagrams, ECN field).
    struct Recorder {
        gso: bool,
        sends: Mutex<Vec<(usize, u8)>>,
    }

    impl Recorder {
        fn record(&self, n: usize, ecn: u8) {
            self.sends.lock().unwrap().push((n, ecn));
        }
    }

    impl UdpPort for Recorder {
        fn fd(&self) -> RawFd {
            -1
        }
        fn gro_enabled(&self) -> bool {
            false
        }
        fn gso_enabled(&self) -> bool {
            self.gso
        }
        fn recv_each(
            &self,
            _: &mut RecvBatch,
            _: &mut dyn FnMut(Received<'_>),
        ) -> io::Result<usize> {
            Err(io::ErrorKind::WouldBlock.into())
        }
        fn send_batch(
            &self,
            msgs: &[(&[u8], SocketAddr)],
            _: Option<LocalAddr>,
            ecn: u8,
        ) -> io::Result<usize> {
            self.record(msgs.len(), ecn);
            Ok(msgs.len())
        }
        fn try_send_replies(
            &self,
            msgs: &[(&[u8], SocketAddr, Option<LocalAddr>)],
        ) -> io::Result<usize> {
            Ok(msgs.len())
        }
        fn send_segmented(
            &self,
            dgrams: &[&[u8]],
            _: u16,
            _: &SocketAddr,
            _: Option<LocalAddr>,
            ecn: u8,
        ) -> io::Result<bool> {
            self.record(dgrams.len(), ecn);
            Ok(true)
        }
        fn send_from(
            &self,
            p: &[u8],
            _: &SocketAddr,
            _: Option<LocalAddr>,
            ecn: u8,
        ) -> io::Result<usize> {
            self.record(1, ecn);
            Ok(p.len())
        }
    }

    /// One segmented send carries one outer ECN field, so a run ends where the field
    /// changes as well as where the size does; without GSO, each batch too.
    #[test]
    fn sends_split_where_the_outer_ecn_field_changes() {
        let (big, small) = (vec![0u8; 1000], vec![0u8; 500]);
        let dgrams: Vec<Datagram<'_>> = vec![
            (&big, 0b10),
            (&big, 0b10),
            (&big, 0b10),
            (&big, 0),
            (&big, 0),
            (&small, 0), // A short last segment still joins its run.
            (&big, 0b01),
        ];
        let ep: SocketAddr = "192.0.2.1:51820".parse().unwrap();
        for gso in [true, false] {
            let sock = Recorder {
                gso,
                sends: Mutex::new(Vec::new()),
            };
            assert_eq!(send_all(&sock, &dgrams, ep, None), dgrams.len());
            assert_eq!(
                *sock.sends.lock().unwrap(),
                [(3, 0b10), (3, 0), (1, 0b01)],
                "gso={gso}"
            );
        }
    }
}
