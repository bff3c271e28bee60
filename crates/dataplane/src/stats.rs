//! Interface-wide counters. Relaxed atomics: they are statistics, not synchronisation.

use crate::queue::Drained;
use std::sync::atomic::{AtomicU64, Ordering};

/// Declares the counters once: the struct, and `fields()` listing them by name (for the
/// UAPI `stats` operation and the shutdown log).
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        #[derive(Default, Debug)]
        pub struct Stats {
            $($(#[$doc])* pub $name: AtomicU64,)*
            /// Packets handled per serial-stage invocation, in buckets of powers of two:
            /// bucket `i` counts invocations that handled `[2^(i-1), 2^i)` packets, and
            /// bucket 0 those that handled none.
            pub serial_packets_hist: [AtomicU64; SERIAL_HIST_BUCKETS],
            /// Received packets by sojourn (see `rx_sojourn_ns`), in buckets of powers
            /// of two microseconds: bucket `i` counts sojourns in `[2^(i-1), 2^i)` µs,
            /// bucket 0 those under 1 µs, the last everything longer.
            pub rx_sojourn_hist: [AtomicU64; SOJOURN_HIST_BUCKETS],
            /// Transmitted packets by sojourn (see `tx_sojourn_ns`), in the buckets of
            /// `rx_sojourn_hist`.
            pub tx_sojourn_hist: [AtomicU64; SOJOURN_HIST_BUCKETS],
        }

        impl Stats {
            /// Every counter with its name, in declaration order, then the histogram's
            /// buckets as `serial_packets_hist_LOWER` (their lower bounds).
            pub fn fields(&self) -> Vec<(String, u64)> {
                let mut v = vec![$((stringify!($name).to_string(), self.$name.load(Ordering::Relaxed)),)*];
                for (i, b) in self.serial_packets_hist.iter().enumerate() {
                    v.push((format!("serial_packets_hist_{}", hist_lower_bound(i)), b.load(Ordering::Relaxed)));
                }
                for (i, b) in self.rx_sojourn_hist.iter().enumerate() {
                    v.push((format!("rx_sojourn_hist_us_{}", hist_lower_bound(i)), b.load(Ordering::Relaxed)));
                }
                for (i, b) in self.tx_sojourn_hist.iter().enumerate() {
                    v.push((format!("tx_sojourn_hist_us_{}", hist_lower_bound(i)), b.load(Ordering::Relaxed)));
                }
                v
            }
        }
    };
}

counters! {
    /// Packets read from the TUN with no peer routing their destination.
    tx_no_route,
    /// ICMP/ICMPv6 destination-unreachable errors written back for them.
    tx_icmp_unreachable,
    /// Errors not sent for the rate limit.
    tx_icmp_rate_limited,
    /// Our own outer datagrams routed back into the TUN (a routing loop), dropped.
    tx_routing_loop,
    /// Packets dropped on transmit: queue full, staged overflow, handshake gave up.
    tx_dropped,
    /// Datagrams that could not be sent because the peer has no endpoint.
    tx_no_endpoint,
    /// FQ-CoDel: packets CoDel dropped (sojourn above target for an interval), packets
    /// it marked CE instead, and packets dropped from the fattest flow when a peer's
    /// flow queues stayed full.
    tx_codel_dropped,
    tx_codel_marked,
    tx_fq_overflow,
    /// FQ-CoDel: packets that left the flow queues, the sum of their sojourn times
    /// there (the mean is the quotient), and the longest sojourn seen.
    tx_fq_dequeued,
    tx_fq_sojourn_ns,
    tx_fq_sojourn_max_ns,
    /// Packets sent with their TUN read time, the sum of their sojourn times from it
    /// to the send (flow queues, staging, the ordered queue and the crypt stage; the
    /// mean is the quotient), and the longest seen.
    tx_timed,
    tx_sojourn_ns,
    tx_sojourn_max_ns,
    /// Datagrams that are not WireGuard messages at all.
    rx_malformed,
    /// Transport messages for an unknown receiver index or an expired keypair.
    rx_unknown_index,
    /// Transport messages that failed authentication.
    rx_auth_failed,
    /// Transport messages refused by the replay window.
    rx_replayed,
    /// Inner packets whose source address the sending peer is not allowed to use.
    rx_bad_source,
    /// Inner packets that are not well-formed IPv4 or IPv6.
    rx_bad_inner,
    /// Packets the kernel refused to take from a TUN write.
    rx_tun_write_failed,
    /// Received transport messages dropped because the peer's queue was full.
    rx_queue_full,
    /// Receive-side queue management (`stages::rx_aqm`): inner packets dropped because
    /// their outer header said CE and they are not ECN-capable (RFC 6040); packets the
    /// receive CoDel dropped, and packets it marked CE instead.
    rx_ce_not_ect,
    rx_codel_dropped,
    rx_codel_marked,
    /// Received packets with a kernel arrival time, the sum of their sojourn times from
    /// it to the TUN write (socket buffer, crypt and ordered queues; the mean is the
    /// quotient), and the longest seen.
    rx_timed,
    rx_sojourn_ns,
    rx_sojourn_max_ns,
    /// Handshake messages dropped because the handshake queue was full.
    handshake_queue_full,
    /// Handshake messages taken off the handshake lanes (cookie lane and plain), the
    /// sum of their waits there, from the reader's enqueue to the handshake stage's
    /// dequeue (the mean is the quotient), and the longest seen.
    handshake_dequeued,
    handshake_sojourn_ns,
    handshake_sojourn_max_ns,
    /// Handshake messages dropped for an invalid mac1 (no DH spent on them).
    handshake_invalid_mac1,
    /// Handshake messages dropped by the per-source rate limit.
    handshake_rate_limited,
    /// Cookie replies sent while under load.
    cookie_replies_sent,
    /// Cookie replies dropped unsent: no room in the socket buffer, or no socket of the
    /// destination's family.
    cookie_replies_unsent,
    /// Handshake messages that authenticated with mac1 but failed later.
    handshake_failed,
    /// Handshakes completed here: initiations answered with a response, and responses
    /// consumed (each derives a new keypair; a rekey counts once per side).
    handshakes_completed,
    /// Diffie-Hellman operations spent on received handshake messages.
    handshake_dh,
    /// Serial-stage invocations (ordered flush or delivery), the execution-order
    /// signatures of design.md §4: how many ran, the batches and packets they handled,
    /// how many found nothing ready ("empty polls"), how many stopped at a head batch
    /// whose crypt stage had not finished, and how many used up a budget with more
    /// ready (the `softirq` model's NAPI budget).
    serial_invocations,
    serial_batches,
    serial_packets,
    serial_empty_polls,
    serial_head_pending,
    serial_budget_exhausted,
    /// Nanoseconds the runtime's threads spent on this interface's crypt and serial
    /// items (its share of the pool).
    busy_ns,
}

/// Buckets of [`Stats::serial_packets_hist`]: 0, 1, 2–3, … 512–1023, 1024 and more.
pub const SERIAL_HIST_BUCKETS: usize = 12;

/// Buckets of [`Stats::rx_sojourn_hist`]: under 1 µs, 1 µs, 2–3 µs, … 16.4 ms and more.
pub const SOJOURN_HIST_BUCKETS: usize = 16;

/// The bucket of a sojourn of `ns` nanoseconds in [`Stats::rx_sojourn_hist`].
pub fn sojourn_bucket(ns: u64) -> usize {
    let us = ns / 1000;
    ((u64::BITS - us.leading_zeros()) as usize).min(SOJOURN_HIST_BUCKETS - 1)
}

/// Sojourn times of one run of packets, summed before the counters are touched once.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SojournTally {
    pub timed: u64,
    pub sum_ns: u64,
    pub max_ns: u64,
    pub hist: [u64; SOJOURN_HIST_BUCKETS],
}

impl SojournTally {
    /// Counts a packet that arrived at `arrival_ns` and left at `now_ns` (wall clock;
    /// a clock that stepped back gives a sojourn of none); its sojourn.
    pub fn add(&mut self, arrival_ns: u64, now_ns: u64) -> u64 {
        let ns = now_ns.saturating_sub(arrival_ns);
        self.timed += 1;
        self.sum_ns += ns;
        self.max_ns = self.max_ns.max(ns);
        self.hist[sojourn_bucket(ns)] += 1;
        ns
    }

    /// Adds the tally to one direction's counters.
    fn record(&self, timed: &AtomicU64, sum: &AtomicU64, max: &AtomicU64, hist: &[AtomicU64]) {
        if self.timed == 0 {
            return;
        }
        timed.fetch_add(self.timed, Ordering::Relaxed);
        sum.fetch_add(self.sum_ns, Ordering::Relaxed);
        max.fetch_max(self.max_ns, Ordering::Relaxed);
        for (counter, &n) in hist.iter().zip(&self.hist) {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

/// The smallest value (packet count, or µs) bucket `i` holds.
pub fn hist_lower_bound(i: usize) -> u64 {
    match i {
        0 => 0,
        i => 1 << (i - 1),
    }
}

fn hist_bucket(packets: usize) -> usize {
    let bits = (usize::BITS - packets.leading_zeros()) as usize;
    bits.min(SERIAL_HIST_BUCKETS - 1)
}

impl Stats {
    /// Adds time spent on one of the interface's items.
    pub fn add_busy(&self, d: std::time::Duration) {
        self.busy_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Records the sojourns of received packets delivered to the TUN.
    pub fn record_rx_sojourns(&self, t: &SojournTally) {
        t.record(
            &self.rx_timed,
            &self.rx_sojourn_ns,
            &self.rx_sojourn_max_ns,
            &self.rx_sojourn_hist,
        );
    }

    /// Records the sojourns of packets sent to a peer.
    pub fn record_tx_sojourns(&self, t: &SojournTally) {
        t.record(
            &self.tx_timed,
            &self.tx_sojourn_ns,
            &self.tx_sojourn_max_ns,
            &self.tx_sojourn_hist,
        );
    }

    /// Records one serial-stage invocation.
    pub fn record_serial_run(&self, d: &Drained) {
        let add = |c: &AtomicU64, n: usize| c.fetch_add(n as u64, Ordering::Relaxed);
        add(&self.serial_invocations, 1);
        add(&self.serial_batches, d.batches);
        add(&self.serial_packets, d.packets);
        add(&self.serial_empty_polls, usize::from(d.packets == 0));
        add(&self.serial_head_pending, usize::from(d.head_pending));
        add(&self.serial_budget_exhausted, usize::from(d.more));
        add(&self.serial_packets_hist[hist_bucket(d.packets)], 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_powers_of_two() {
        let cases = [
            (0, 0),
            (1, 1),
            (2, 2),
            (3, 2),
            (4, 3),
            (63, 6),
            (64, 7),
            (5000, 11),
        ];
        for (packets, bucket) in cases {
            assert_eq!(hist_bucket(packets), bucket, "{packets}");
            assert!(hist_lower_bound(bucket) <= packets as u64);
        }
        let s = Stats::default();
        s.record_serial_run(&Drained {
            batches: 2,
            packets: 70,
            more: true,
            head_pending: false,
        });
        let f = s.fields();
        let get = |k: &str| f.iter().find(|(n, _)| n == k).unwrap().1;
        assert_eq!(get("serial_packets"), 70);
        assert_eq!(get("serial_packets_hist_64"), 1);
        assert_eq!(get("serial_budget_exhausted"), 1);
        assert_eq!(get("serial_empty_polls"), 0);
    }
}
