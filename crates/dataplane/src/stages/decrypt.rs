//! Stage RX-3, decrypt (parallel). Input: a batch of transport messages for one
//! keypair. Output: the same batch opened in place, each packet flagged ok or not, and
//! marked done; the peer's RX delivery is handed to the scheduler if it was not
//! scheduled already (the hand-off of `sched`). No per-peer lock: the replay check
//! waits for the ordered stage.

use super::StageCtx;
use crate::packet::Batch;
use crate::peer::Peer;
use crate::sched::{Direction, Serial};
use std::sync::Arc;

pub fn decrypt(c: StageCtx<'_>, peer: &Arc<Peer>, batch: Arc<Batch>) {
    open_batch(&batch);
    if peer.rx_queue.schedule() {
        c.sched.schedule_serial(Serial {
            iface: c.iface,
            peer,
            dir: Direction::Rx,
        });
    }
}

/// Opens every packet of `batch` in place and marks it done. A packet that fails
/// authentication is flagged, not removed: the ordered stage counts it.
pub fn open_batch(batch: &Batch) {
    {
        let opener = batch.keypair.opener();
        let mut body = batch.body();
        for p in body.packets.iter_mut() {
            match opener.open(p.counter, &mut p.buf[..p.len]) {
                Ok(plain_len) => {
                    p.len = plain_len;
                    p.ok = true;
                }
                Err(_) => p.ok = false,
            }
        }
    }
    batch.mark_done();
}
