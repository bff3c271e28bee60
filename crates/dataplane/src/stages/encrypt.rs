//! Stage TX-4, encrypt (parallel). Input: a batch with assigned counters. Output: the
//! same batch sealed in place (header, padded payload, tag), each packet with the ECN
//! field its outer header will carry (`inner::encapsulated_ecn`), and marked done; the
//! peer's TX flush is handed to the scheduler if it was not scheduled already. Any
//! worker may run any batch: there is no per-peer lock here.
//!
//! Why the ECN field is chosen here: the plaintext is read for the last time here, and
//! after any CE mark the flow queues (`fq`) set on it.

use super::StageCtx;
use crate::inner;
use crate::packet::{Batch, HEADROOM};
use crate::peer::Peer;
use crate::sched::{Direction, Serial};
use std::sync::Arc;
use wirelane_proto::messages::padded_len;

pub fn encrypt(c: StageCtx<'_>, peer: &Arc<Peer>, batch: Arc<Batch>) {
    seal_batch(&batch, c.iface.mtu());
    if peer.tx_queue.schedule() {
        c.sched.schedule_serial(Serial {
            iface: c.iface,
            peer,
            dir: Direction::Tx,
        });
    }
}

/// Seals every packet of `batch` in place, padding to `mtu` rules, and marks it done.
/// Afterwards each packet holds its transport message at `buf[..len]`.
pub fn seal_batch(batch: &Batch, mtu: usize) {
    {
        let sealer = batch.keypair.sealer();
        let mut body = batch.body();
        for p in body.packets.iter_mut() {
            let mtu = match p.route_mtu {
                0 => mtu,
                route => route as usize,
            };
            p.outer_ecn = inner::encapsulated_ecn(p.plaintext());
            let padded = padded_len(p.len, mtu);
            let end = HEADROOM + padded + 16;
            if p.buf.len() < end {
                p.buf.resize(end, 0);
            }
            // Pooled buffers hold stale bytes: the padding must be zeroed here.
            p.buf[HEADROOM + p.len..HEADROOM + padded].fill(0);
            sealer.seal(p.counter, &mut p.buf[..end]);
            p.len = end;
            p.ok = true;
        }
    }
    batch.mark_done();
}
