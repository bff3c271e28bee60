//! Interface-wide counters, sharded by thread (as the kernel keeps its per-CPU
//! statistics): each thread adds to its own shard, and a read sums the shards (or takes
//! their maximum, for the `@max` counters).
//!
//! Why: the counters are written for every packet, often several times, by every
//! reader and worker at once. On one shared cache line each write waited for the line
//! to come from the core that wrote it last; with a thousand peers, one packet per
//! flush, that was about fifteen such writes per packet on transmit. A thread's shard
//! is two cache lines apart from any other's, so its writes stay in its core's cache.
//! Threads share a shard only beyond [`SHARDS`] of them, which costs speed, never a
//! count. Relaxed atomics: they are statistics, not synchronisation, and a read that
//! races a packet may see part of its counts.

use crate::queue::Drained;
use std::cell::Cell;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use wirelane_proto::InitiationReason;

/// Shards per interface: more than the threads that write at once on most machines
/// (readers and workers of a few cores).
pub const SHARDS: usize = 16;

/// One counter of one shard. Only adds and maxima: a count is read whole through
/// [`Stats::fields`] or [`Stats::total`], never from one shard.
#[derive(Default, Debug)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn fetch_add(&self, n: u64, order: Ordering) {
        self.0.fetch_add(n, order);
    }

    pub fn fetch_max(&self, n: u64, order: Ordering) {
        self.0.fetch_max(n, order);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// How a counter's shards combine: summed, or (`@max`) their maximum.
macro_rules! combine {
    (max, $values:expr) => {
        $values.max().unwrap_or(0)
    };
    (, $values:expr) => {
        $values.sum::<u64>()
    };
}

/// Declares the counters once: one shard's struct, and `Stats::fields()` listing them
/// by name (for the UAPI `stats` operation and the shutdown log).
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident $(@$max:ident)?,)*) => {
        /// One thread's shard of an interface's counters (see [`Stats`]).
        #[derive(Default, Debug)]
        pub struct Counters {
            $($(#[$doc])* pub $name: Counter,)*
            /// Packets handled per serial-stage invocation, in buckets of powers of two:
            /// bucket `i` counts invocations that handled `[2^(i-1), 2^i)` packets, and
            /// bucket 0 those that handled none.
            pub serial_packets_hist: [Counter; SERIAL_HIST_BUCKETS],
            /// Received packets by sojourn (see `rx_sojourn_ns`), in buckets of powers
            /// of two microseconds: bucket `i` counts sojourns in `[2^(i-1), 2^i)` µs,
            /// bucket 0 those under 1 µs, the last everything longer.
            pub rx_sojourn_hist: [Counter; SOJOURN_HIST_BUCKETS],
            /// Transmitted packets by sojourn (see `tx_sojourn_ns`), in the buckets of
            /// `rx_sojourn_hist`.
            pub tx_sojourn_hist: [Counter; SOJOURN_HIST_BUCKETS],
        }

        impl Stats {
            /// Every counter with its name, in declaration order, then the histogram's
            /// buckets as `serial_packets_hist_LOWER` (their lower bounds).
            pub fn fields(&self) -> Vec<(String, u64)> {
                let shards = || self.shards.iter().map(|s| &s.0);
                let mut v = vec![$((
                    stringify!($name).to_string(),
                    combine!($($max)?, shards().map(|c| c.$name.get())),
                ),)*];
                let hists: [(&str, fn(&Counters) -> &[Counter]); 3] = [
                    ("serial_packets_hist_", |c| &c.serial_packets_hist),
                    ("rx_sojourn_hist_us_", |c| &c.rx_sojourn_hist),
                    ("tx_sojourn_hist_us_", |c| &c.tx_sojourn_hist),
                ];
                for (prefix, hist) in hists {
                    for (i, n) in self.histogram(hist).into_iter().enumerate() {
                        v.push((format!("{prefix}{}", hist_lower_bound(i)), n));
                    }
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
    /// Packets and handshake messages that could not be sent because the peer has no
    /// endpoint (packets are answered "host unreachable", as by the kernel).
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
    tx_fq_sojourn_max_ns @max,
    /// FQ-CoDel: serial TX runs that found their peer's ring empty while its limit held
    /// packets back in the flow queues; each grew the limit (`ring_limit`).
    tx_ring_starved,
    /// Packets sent with their TUN read time, the sum of their sojourn times from it
    /// to the send (flow queues, staging, the ordered queue and the crypt stage; the
    /// mean is the quotient), and the longest seen.
    tx_timed,
    tx_sojourn_ns,
    tx_sojourn_max_ns @max,
    /// Transport datagrams and handshake messages that did not leave: the socket
    /// refused them (a route or a firewall refusal, a buffer full past the wait), or
    /// the interface has no socket of the endpoint's family.
    tx_send_failed,
    /// Packets a peer had queued, either way, when it was removed: dropped with it.
    removed_dropped,
    /// Datagrams that are not WireGuard messages at all.
    rx_malformed,
    /// Receives the kernel cut short (a coalesced run longer than the reader's
    /// buffer): the datagrams past the buffer are lost, uncounted elsewhere. Each lost
    /// at least one, and is counted once among the drops (how many is unknown).
    rx_truncated,
    /// Transport messages for an unknown receiver index or an expired keypair, and
    /// cookie replies for an unknown receiver index.
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
    rx_sojourn_max_ns @max,
    /// The data sockets' receive buffers (`socket_buffer`, with fq-codel): times one
    /// was shrunk for a standing queue behind kernel drops, and times one was given its
    /// configured size back.
    rx_buffer_shrunk,
    rx_buffer_restored,
    /// Handshake messages dropped because the handshake queue was full.
    handshake_queue_full,
    /// Handshake messages taken off the handshake lanes (cookie lane and plain), the
    /// sum of their waits there, from the reader's enqueue to the handshake stage's
    /// dequeue (the mean is the quotient), and the longest seen.
    handshake_dequeued,
    handshake_sojourn_ns,
    handshake_sojourn_max_ns @max,
    /// Handshake messages dropped for an invalid mac1 (no DH spent on them).
    handshake_invalid_mac1,
    /// Handshake messages dropped by the per-source rate limit.
    handshake_rate_limited,
    /// Cookie replies sent while under load.
    cookie_replies_sent,
    /// Cookie replies dropped unsent: no room in the socket buffer, or no socket of the
    /// destination's family.
    cookie_replies_unsent,
    /// Cookie replies for one of our indices refused: on the reader because the peer
    /// awaited none or had one queued already (`cookie_slot`), or on the handshake
    /// thread because it failed to open (forged, or not for our last message) or its
    /// index was retired meanwhile.
    cookie_replies_refused,
    /// Handshake messages that authenticated with mac1 but failed later.
    handshake_failed,
    /// Handshake messages that arrived while the interface had no private key (nothing
    /// could answer them), or whose key was removed before they were handled.
    handshake_no_identity,
    /// Handshake messages that arrived while the interface was set down (not answered,
    /// as the kernel's closed sockets answer nothing).
    handshake_while_down,
    /// Handshakes completed here: initiations answered with a response, and responses
    /// consumed (each derives a new keypair; a rekey counts once per side).
    handshakes_completed,
    /// Diffie-Hellman operations received handshake messages reached (see
    /// `stages::handshake`: an initiation's static-static one counts though it is
    /// computed once per peer).
    handshake_dh,
    /// Handshake initiations sent, by the rule that started each
    /// (`wirelane_proto::InitiationReason`): data and no session, data and an expired
    /// one, a rekey on sending or on receiving, data sent and unanswered for 15 s, a
    /// retry after REKEY_TIMEOUT, a resend with the cookie a reply brought.
    initiations_no_session,
    initiations_session_expired,
    initiations_rekey_on_send,
    initiations_rekey_on_receive,
    initiations_unanswered,
    initiations_retry,
    initiations_cookie_reply,
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
    /// Transmit flushes drained inside a TUN reader's plug (`stages::tx_flush::plugged`),
    /// and the sends the plugs made, each of all its flushes' datagrams at once: the
    /// send calls of a transmit run are its invocations less the plugged ones plus
    /// these (the model's calibration charges its per-send cost to them).
    serial_plugged,
    serial_plug_sends,
    /// Nanoseconds the runtime's threads spent on this interface's crypt and serial
    /// items (its share of the pool).
    busy_ns,
    /// Pipeline work that panicked (a bug): each loses what it was handling (a batch,
    /// a read, a handshake message), and the pipeline goes on (`stages::run_crypt`,
    /// `run_serial`, `contained`).
    stage_panics,
    /// Packets of batches whose seal or open panicked, dropped with them.
    crypt_panic_dropped,
}

/// The counters that count a packet or message dropped, by reason: the daemon's
/// `wirelane_drops_total` takes its `reason` label from them (rate-limited handshake
/// messages are `handshake_rate_limited`), and a stalled stress run lists them.
pub const DROP_REASONS: &[&str] = &[
    "tx_no_route",
    "tx_routing_loop",
    "tx_dropped",
    "tx_no_endpoint",
    "tx_codel_dropped",
    "tx_fq_overflow",
    "tx_send_failed",
    "rx_malformed",
    "rx_unknown_index",
    "rx_auth_failed",
    "rx_replayed",
    "rx_bad_source",
    "rx_bad_inner",
    "rx_tun_write_failed",
    "rx_queue_full",
    "rx_codel_dropped",
    "rx_ce_not_ect",
    "handshake_queue_full",
    "handshake_invalid_mac1",
    "handshake_rate_limited",
    "handshake_failed",
    "handshake_no_identity",
    "handshake_while_down",
    "cookie_replies_unsent",
    "cookie_replies_refused",
    "crypt_panic_dropped",
    "removed_dropped",
    "rx_truncated",
];

/// Buckets of [`Counters::serial_packets_hist`]: 0, 1, 2–3, … 512–1023, 1024 and more.
pub const SERIAL_HIST_BUCKETS: usize = 12;

/// Buckets of [`Counters::rx_sojourn_hist`]: under 1 µs, 1 µs, 2–3 µs, … 1.05 s and more.
/// Up to a second, not a few milliseconds: a standing queue under overload (the FIFO
/// discipline, a slow host) must land in a bucket of its own, or a quantile of it reads
/// as the highest bound below it.
pub const SOJOURN_HIST_BUCKETS: usize = 22;

/// The bucket of a sojourn of `ns` nanoseconds in [`Counters::rx_sojourn_hist`].
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
    fn record(&self, timed: &Counter, sum: &Counter, max: &Counter, hist: &[Counter]) {
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

/// An interface's counters: [`SHARDS`] shards, of which each thread writes its own
/// (through `Deref`, so a write reads `stats.tx_dropped.fetch_add(1, Relaxed)`).
pub struct Stats {
    shards: Box<[Shard]>,
}

/// A shard on cache lines of its own; 128 bytes, as the adjacent-line prefetcher
/// pulls lines in pairs.
#[repr(align(128))]
#[derive(Default)]
struct Shard(Counters);

impl Default for Stats {
    fn default() -> Self {
        Stats {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stats").finish_non_exhaustive()
    }
}

thread_local! {
    /// This thread's shard, chosen on its first write: threads take the shards in
    /// turn, so the threads of one pool, spawned together, write to different ones.
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn this_threads_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let i = SHARD.get();
    if i != usize::MAX {
        return i;
    }
    let i = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    SHARD.set(i);
    i
}

impl Deref for Stats {
    type Target = Counters;

    /// The calling thread's shard, to write to.
    fn deref(&self) -> &Counters {
        &self.shards[this_threads_shard()].0
    }
}

impl Stats {
    /// One counter over all shards, e.g. `stats.total(|c| &c.serial_invocations)`.
    pub fn total(&self, counter: impl Fn(&Counters) -> &Counter) -> u64 {
        self.shards.iter().map(|s| counter(&s.0).get()).sum()
    }

    /// One histogram's buckets over all shards, e.g.
    /// `stats.histogram(|c| &c.tx_sojourn_hist)`.
    pub fn histogram(&self, hist: impl Fn(&Counters) -> &[Counter]) -> Vec<u64> {
        let mut sums = vec![0; hist(&self.shards[0].0).len()];
        for s in self.shards.iter() {
            for (sum, c) in sums.iter_mut().zip(hist(&s.0)) {
                *sum += c.get();
            }
        }
        sums
    }
}

impl Counters {
    /// The counter of initiations started for `reason` (`stats=1` names it
    /// `initiations_` and the reason's name; `/metrics` relies on that).
    pub fn initiations(&self, reason: InitiationReason) -> &Counter {
        match reason {
            InitiationReason::NoSession => &self.initiations_no_session,
            InitiationReason::SessionExpired => &self.initiations_session_expired,
            InitiationReason::RekeyOnSend => &self.initiations_rekey_on_send,
            InitiationReason::RekeyOnReceive => &self.initiations_rekey_on_receive,
            InitiationReason::Unanswered => &self.initiations_unanswered,
            InitiationReason::Retry => &self.initiations_retry,
            InitiationReason::CookieReply => &self.initiations_cookie_reply,
        }
    }

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
        let add = |c: &Counter, n: usize| c.fetch_add(n as u64, Ordering::Relaxed);
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

    /// Each reason counts under the name `stats=1` and `/metrics` give it, and only
    /// there.
    #[test]
    fn each_initiation_reason_counts_under_its_name() {
        for (i, reason) in InitiationReason::ALL.into_iter().enumerate() {
            let s = Stats::default();
            let n = i as u64 + 1;
            s.initiations(reason).fetch_add(n, Ordering::Relaxed);
            let name = format!("initiations_{}", reason.name());
            let fields = s.fields();
            assert!(fields.iter().any(|(f, _)| *f == name), "{name} missing");
            for (f, v) in &fields {
                let want = if *f == name { n } else { 0 };
                assert_eq!(*v, want, "{f} after counting {reason:?}");
            }
        }
    }

    /// Every counter whose name says it drops packets is a drop reason, so that
    /// `wirelane_drops_total` misses none; and every reason is a counter.
    #[test]
    fn every_dropping_counter_is_a_drop_reason() {
        let fields = Stats::default().fields();
        for (f, _) in &fields {
            let drops = f.ends_with("_dropped") || f.ends_with("_truncated");
            assert!(!drops || DROP_REASONS.contains(&f.as_str()), "{f}");
        }
        for reason in DROP_REASONS {
            assert!(fields.iter().any(|(f, _)| f == reason), "{reason}");
        }
    }

    /// A 100 ms and a 900 ms sojourn land in finite buckets of their own (a standing
    /// queue under overload is measured, not read as the bound below it); past about a
    /// second, the last bucket.
    #[test]
    fn sojourns_up_to_a_second_have_buckets_of_their_own() {
        let last = SOJOURN_HIST_BUCKETS - 1;
        let (b100, b900) = (sojourn_bucket(100_000_000), sojourn_bucket(900_000_000));
        assert!(b100 < b900 && b900 < last, "{b100} {b900}");
        assert!(
            hist_lower_bound(b900 + 1) > 900_000,
            "bucket {b900} holds 900 ms"
        );
        assert_eq!(sojourn_bucket(2_000_000_000), last);
    }

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

    /// Counts written by many threads, each to its own shard (some sharing one past
    /// `SHARDS`), read back whole: sums add up, maxima are the largest of any shard.
    #[test]
    fn shards_written_by_many_threads_read_back_whole() {
        let s = Stats::default();
        std::thread::scope(|scope| {
            for t in 0..2 * SHARDS as u64 {
                let s = &s;
                scope.spawn(move || {
                    for _ in 0..1000 {
                        s.tx_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    s.tx_sojourn_max_ns.fetch_max(t, Ordering::Relaxed);
                    s.tx_sojourn_hist[3].fetch_add(2, Ordering::Relaxed);
                });
            }
        });
        let f = s.fields();
        let get = |k: &str| f.iter().find(|(n, _)| n == k).unwrap().1;
        assert_eq!(get("tx_dropped"), 2000 * SHARDS as u64);
        assert_eq!(s.total(|c| &c.tx_dropped), 2000 * SHARDS as u64);
        assert_eq!(get("tx_sojourn_max_ns"), 2 * SHARDS as u64 - 1);
        assert_eq!(get("tx_sojourn_hist_us_4"), 4 * SHARDS as u64);
    }
}
