//! Stage RX-2, classify. Input: received datagrams in arrival order. Output: handshake
//! messages to the gate (`stages::gate`), whose cookie replies leave together once the
//! batch is classified; transport messages grouped into batches by receiver index
//! (O(1) hash lookup; runs of consecutive packets, cut at `packet::RX_BATCH_MAX`),
//! each entered into its peer's ordered RX queue and then handed to the scheduler as
//! crypt work, in arrival order. Everything else is dropped and counted. Runs on a UDP
//! reader, which may wait for room in a peer's queue (backpressure) but never runs
//! crypto of its own unless the model says so.

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
    let mut runs = Runs::default();
    for mut p in packets.drain(..) {
        let Some(src) = p.src else { continue };
        let dgram = p.datagram();
        match kind_of(dgram) {
            Ok(Kind::Transport) => {
                let h = TransportHeader::parse(dgram).expect("classified as transport");
                p.counter = h.counter;
                if let Some((idx, v)) = runs.push(h.receiver, p) {
                    dispatch(c, idx, v, now);
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
    if let Some((idx, v)) = runs.open.take() {
        dispatch(c, idx, v, now);
    }
    super::gate::flush_replies(c, replies);
}

/// The batch being gathered: consecutive packets for one receiver index, at most
/// [`RX_BATCH_MAX`] of them.
#[derive(Default)]
struct Runs {
    open: Option<(u32, Vec<Packet>)>,
}

impl Runs {
    /// Adds `p`, for receiver index `index`, to the open run, or opens a new one with
    /// it; returns the run that closed, if one did, for dispatch.
    fn push(&mut self, index: u32, p: Packet) -> Option<(u32, Vec<Packet>)> {
        match &mut self.open {
            Some((idx, v)) if *idx == index && v.len() < RX_BATCH_MAX => {
                v.push(p);
                None
            }
            _ => self.open.replace((index, vec![p])),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A long run of one index is cut at the bound, and another index ends a run:
    /// every packet comes out once, in order, in batches of one index each.
    #[test]
    fn runs_are_cut_at_the_bound_and_at_another_index() {
        let src = "10.0.0.1:1".parse().unwrap();
        let mut runs = Runs::default();
        let mut out = Vec::new();
        let indices = (0..RX_BATCH_MAX * 2 + 10).map(|_| 7).chain([8, 8, 7]);
        for (seq, index) in indices.enumerate() {
            let mut p = Packet::from_datagram(&[0; 32], src, None);
            p.counter = seq as u64;
            out.extend(runs.push(index, p));
        }
        out.extend(runs.open.take());
        let shape: Vec<(u32, usize)> = out.iter().map(|(i, v)| (*i, v.len())).collect();
        assert_eq!(
            shape,
            [
                (7, RX_BATCH_MAX),
                (7, RX_BATCH_MAX),
                (7, 10),
                (8, 2),
                (7, 1)
            ]
        );
        let order: Vec<u64> = out
            .iter()
            .flat_map(|(_, v)| v.iter().map(|p| p.counter))
            .collect();
        assert_eq!(order, (0..order.len() as u64).collect::<Vec<_>>());
    }
}
