//! Stage RX-2, classify. Input: received datagrams in arrival order. Output: handshake
//! messages to the gate (`stages::gate`), whose cookie replies leave together once the
//! batch is classified; transport messages grouped into batches by receiver index
//! (runs of consecutive packets, cut at `packet::RX_BATCH_MAX`)
//! (O(1) hash lookup), each entered into its peer's ordered RX queue and then handed
//! to the scheduler as crypt work, in arrival order. Everything else is dropped and
//! counted. Runs on a UDP reader, which may wait for room in a peer's queue
//! (backpressure) but never runs crypto of its own unless the model says so.

use super::gate::Replies;
use super::StageCtx;
use crate::packet::{Batch, Packet, RX_BATCH_MAX};
use crate::sched::{Crypt, Direction};
use std::sync::atomic::Ordering;
use wirelane_proto::messages::{classify as kind_of, Kind, TransportHeader};

/// Takes every packet out of `packets` (leaving its allocation for the next receive).
pub fn classify(c: StageCtx<'_>, packets: &mut Vec<Packet>, replies: &mut Replies) {
    let dev = c.iface;
    let now = dev.now();
    // Runs of consecutive packets for the same receiver index become batches of at
    // most `RX_BATCH_MAX`.
    let mut run: Option<(u32, Vec<Packet>)> = None;
    for mut p in packets.drain(..) {
        let Some(src) = p.src else { continue };
        let dgram = p.datagram();
        match kind_of(dgram) {
            Ok(Kind::Transport) => {
                let h = TransportHeader::parse(dgram).expect("classified as transport");
                p.counter = h.counter;
                match &mut run {
                    Some((idx, v)) if *idx == h.receiver && v.len() < RX_BATCH_MAX => v.push(p),
                    _ => {
                        if let Some((idx, v)) = run.take() {
                            dispatch(c, idx, v, now);
                        }
                        run = Some((h.receiver, vec![p]));
                    }
                }
            }
            // The gate copies what it admits, so the packet's buffer goes back to the
            // pool either way.
            Ok(kind) => super::gate::admit(c, kind, dgram, src, p.local, replies),
            Err(_) => {
                dev.stats.rx_malformed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if let Some((idx, v)) = run {
        dispatch(c, idx, v, now);
    }
    super::gate::flush_replies(c, replies);
}

fn dispatch(c: StageCtx<'_>, index: u32, packets: Vec<Packet>, now: std::time::Duration) {
    let dev = c.iface;
    let n = packets.len();
    let found = dev.peer_by_index(index).and_then(|peer| {
        let kp = peer.state().keypair_for(index, now);
        kp.map(|kp| (peer, kp))
    });
    let Some((peer, kp)) = found else {
        dev.stats
            .rx_unknown_index
            .fetch_add(n as u64, Ordering::Relaxed);
        return;
    };
    // Called only from UDP reader threads, which may wait: backpressure instead of
    // dropping authenticated-to-be packets when the peer's queue is full.
    peer.rx_queue
        .wait_for_room(n, std::time::Duration::from_millis(100));
    let batch = Batch::new(kp, packets);
    if peer.rx_queue.push(batch.clone(), n) {
        c.sched.submit_crypt(Crypt {
            iface: dev,
            peer: &peer,
            batch,
            dir: Direction::Rx,
        });
    } else {
        dev.stats
            .rx_queue_full
            .fetch_add(n as u64, Ordering::Relaxed);
    }
}
