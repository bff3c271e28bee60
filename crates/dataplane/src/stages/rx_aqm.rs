//! Stage RX-4a, receive-side queue management. Runs inside the ordered delivery
//! (`rx_deliver`), on packets that authenticated, passed the replay window and the
//! source check, just before their TUN write. Input: those packets, with the kernel's
//! arrival time and outer ECN field of each. Output: the same packets less the ones
//! dropped, some marked Congestion Experienced; counters by reason.
//!
//! - RFC 6040 decapsulation: CE on the outer header becomes CE on an ECN-capable inner
//!   packet; a not-ECT inner packet under an outer CE is dropped (its sender could not
//!   hear the mark any other way); an ECT(0) inner packet under an outer ECT(1) leaves
//!   as ECT(1).
//! - The sojourn of each packet, from the kernel's arrival timestamp to here, covers
//!   the socket buffer, the crypt queue and the ordered queue: on the receive side the
//!   standing queue builds in the socket, before any wirelane queue, when decryption is
//!   the bottleneck. It is always counted; with `--queue fq-codel` a CoDel controller
//!   (`codel`) acts on it, marking ECN-capable packets and dropping the rest.
//!
//! Why here and not earlier: what a packet carries (ECT or not) is known only once it
//! is decrypted, and a drop chosen before the replay check could be undone by a replayed
//! copy. Dropping after the counter is accepted loses only that packet, which is what
//! an AQM drop means.

use crate::codel::{Codel, CodelParams};
use crate::fq_codel::QueueDiscipline;
use crate::inner;
use crate::interface::Interface;
use crate::packet::{Packet, HEADROOM};
use crate::stats::{SojournTally, Stats};
use std::sync::atomic::Ordering;

/// What one delivery run decided, summed before the counters are touched once.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub ce_not_ect: u64,
    pub dropped: u64,
    pub marked: u64,
    pub sojourn: SojournTally,
}

/// When a delivery run is judged, in ns on two clocks: the wall clock, which the
/// kernel's arrival stamps use (sojourns are measured on it), and the monotonic one,
/// which the controller keeps its own times on, so that a step of the wall clock
/// neither holds its drops back nor hurries them.
#[derive(Debug, Clone, Copy)]
pub struct JudgedAt {
    pub wall: u64,
    pub monotonic: u64,
}

/// Applies ECN decapsulation and the controller to `packets[i]` for each `(i, len)` of
/// `keep`, in delivery order, and removes the dropped ones from `keep`.
pub fn manage(dev: &Interface, packets: &mut [Packet], keep: &mut Vec<(usize, usize)>) {
    let monotonic = dev.now();
    let now = JudgedAt {
        wall: dev.wall_at(monotonic).as_nanos() as u64,
        monotonic: monotonic.as_nanos() as u64,
    };
    let t = {
        let mut codel = (dev.queue == QueueDiscipline::FqCodel).then(|| {
            dev.rx_codel
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        });
        let codel = codel.as_deref_mut().map(|c| (c, &dev.codel));
        judge_all(codel, now, packets, keep)
    };
    record(&dev.stats, &t);
}

/// The decisions of [`manage`] at `now`, with the controller and its parameters when
/// one runs.
pub fn judge_all(
    mut codel: Option<(&mut Codel, &CodelParams)>,
    now: JudgedAt,
    packets: &mut [Packet],
    keep: &mut Vec<(usize, usize)>,
) -> Tally {
    let mut t = Tally::default();
    // A packet stands in a queue when another waited behind it: one read after it from
    // the socket, or a later one delivered in this same run. The last packet of an
    // idle moment has neither, so its sojourn, however long (a slow wake-up, a socket
    // rebound), never counts as a standing queue and resets the controller.
    let last = keep.last().map(|&(i, _)| i);
    keep.retain(|&(i, len)| {
        let p = &mut packets[i];
        let plain = &mut p.buf[HEADROOM..HEADROOM + len];
        match p.outer_ecn {
            inner::CE if !inner::set_ce(plain) => {
                t.ce_not_ect += 1;
                return false;
            }
            inner::ECT_1 => inner::set_ect1_under_outer_ect1(plain),
            _ => {}
        }
        if p.arrival_ns == 0 {
            return true;
        }
        let sojourn = t.sojourn.add(p.arrival_ns, now.wall);
        let Some((codel, params)) = codel.as_mut() else {
            return true;
        };
        let standing = p.queued_behind || Some(i) != last;
        if !codel.judge(params, now.monotonic, sojourn, standing) {
            return true;
        }
        if params.ecn && inner::set_ce(plain) {
            t.marked += 1;
            return true;
        }
        t.dropped += 1;
        false
    });
    t
}

fn record(s: &Stats, t: &Tally) {
    for (counter, n) in [
        (&s.rx_ce_not_ect, t.ce_not_ect),
        (&s.rx_codel_dropped, t.dropped),
        (&s.rx_codel_marked, t.marked),
    ] {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }
    s.record_rx_sojourns(&t.sojourn);
}

#[cfg(test)]
#[path = "rx_aqm_tests.rs"]
mod tests;
