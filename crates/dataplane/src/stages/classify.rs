//! Stage RX-2, classify. Input: received datagrams in arrival order. Output: handshake
//! messages to the gate (`stages::gate`), whose cookie replies leave together once the
//! batch is classified; transport messages grouped into batches
//! by receiver index (O(1) hash lookup) and entered into their peer's ordered RX queue
//! and the crypt queue, in arrival order. Everything else is dropped and counted.

use crate::device::Device;
use crate::exec::Work;
use crate::packet::{Batch, Packet};
use std::sync::atomic::Ordering;
use wirelane_proto::messages::{classify as kind_of, Kind, TransportHeader};

pub fn classify(dev: &Device, packets: Vec<Packet>) {
    let now = dev.now();
    // Runs of consecutive packets for the same receiver index become one batch.
    let mut run: Option<(u32, Vec<Packet>)> = None;
    for mut p in packets {
        let Some(src) = p.src else { continue };
        let dgram = p.datagram();
        match kind_of(dgram) {
            Ok(Kind::Transport) => {
                let h = TransportHeader::parse(dgram).expect("classified as transport");
                p.counter = h.counter;
                match &mut run {
                    Some((idx, v)) if *idx == h.receiver => v.push(p),
                    _ => {
                        if let Some((idx, v)) = run.take() {
                            dispatch(dev, idx, v, now);
                        }
                        run = Some((h.receiver, vec![p]));
                    }
                }
            }
            // The gate copies what it admits, so the packet's buffer goes back to the
            // pool either way.
            Ok(kind) => super::gate::admit(dev, kind, dgram, src, p.local),
            Err(_) => {
                dev.stats.rx_malformed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if let Some((idx, v)) = run {
        dispatch(dev, idx, v, now);
    }
    super::gate::flush_replies(dev);
}

fn dispatch(dev: &Device, index: u32, packets: Vec<Packet>, now: std::time::Duration) {
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
    let batch = Batch::new(peer.clone(), kp, packets);
    if peer.rx_queue.push(batch.clone(), n) {
        dev.submit(Work::Decrypt(batch));
    } else {
        dev.stats
            .rx_queue_full
            .fetch_add(n as u64, Ordering::Relaxed);
    }
}
