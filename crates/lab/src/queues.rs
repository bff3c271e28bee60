//! What wirelane's queues did over a run (`stats=1`), per tunnel end: how long packets
//! waited in each and what the CoDel controllers dropped or marked. The transmit
//! figures are the flow queues' sojourn (before the nonce, `--queue fq-codel` only) and
//! the whole path's, from the TUN read to the send (flow queues, the ordered queue and
//! the crypt stage); the receive figure runs from the kernel's arrival timestamp to the
//! TUN write, so it covers the UDP socket buffer, the crypt queue and the ordered
//! queue; the handshake figure is the handshake lanes' wait. The lab reports them per
//! cell beside the latency they explain.

use crate::record::RunRecord;
use crate::signatures::Snapshot;
use crate::summary::{markdown_table, rows_per_group, summary_of, Grouped};
use crate::uapi;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct QueueSig {
    pub tx_dequeued: u64,
    pub tx_sojourn_ns: u64,
    pub tx_dropped: u64,
    pub tx_marked: u64,
    pub tx_overflow: u64,
    pub rx_timed: u64,
    pub rx_sojourn_ns: u64,
    /// The longest receive sojourn since the daemon started (a high-water mark, not a
    /// growth).
    pub rx_sojourn_max_ns: u64,
    pub rx_dropped: u64,
    pub rx_marked: u64,
    pub rx_ce_not_ect: u64,
    /// Receive sojourns by bucket of powers of two µs (bucket 0 under 1 µs, bucket i
    /// in [2^(i-1), 2^i) µs).
    #[serde(default)]
    pub rx_hist: Vec<u64>,
    /// Packets sent with their TUN read time, their summed sojourn from it to the send,
    /// and those sojourns by bucket (as `rx_hist`).
    #[serde(default)]
    pub tx_timed: u64,
    #[serde(default)]
    pub tx_path_sojourn_ns: u64,
    #[serde(default)]
    pub tx_hist: Vec<u64>,
    /// Handshake messages taken off the handshake lanes, and their summed wait there.
    #[serde(default)]
    pub hs_dequeued: u64,
    #[serde(default)]
    pub hs_sojourn_ns: u64,
    /// Times a data socket's receive buffer was shrunk for a standing queue behind the
    /// kernel's drops, and given its configured size back.
    #[serde(default)]
    pub rx_buffer_shrunk: u64,
    #[serde(default)]
    pub rx_buffer_restored: u64,
}

impl QueueSig {
    /// Growth of the queue counters from `before` to `after`.
    pub fn between(before: &Snapshot, after: &Snapshot) -> QueueSig {
        let d = |k: &str| uapi::delta(before, after, k);
        let hist = |dir: &str| -> Vec<u64> {
            (0..)
                .map(|i: u32| match i {
                    0 => format!("{dir}_sojourn_hist_us_0"),
                    i => format!("{dir}_sojourn_hist_us_{}", 1u64 << (i - 1)),
                })
                .take_while(|k| after.contains_key(k))
                .map(|k| d(&k))
                .collect()
        };
        QueueSig {
            tx_dequeued: d("tx_fq_dequeued"),
            tx_sojourn_ns: d("tx_fq_sojourn_ns"),
            tx_dropped: d("tx_codel_dropped"),
            tx_marked: d("tx_codel_marked"),
            tx_overflow: d("tx_fq_overflow"),
            rx_timed: d("rx_timed"),
            rx_sojourn_ns: d("rx_sojourn_ns"),
            rx_sojourn_max_ns: after.get("rx_sojourn_max_ns").copied().unwrap_or(0),
            rx_dropped: d("rx_codel_dropped"),
            rx_marked: d("rx_codel_marked"),
            rx_ce_not_ect: d("rx_ce_not_ect"),
            rx_hist: hist("rx"),
            tx_timed: d("tx_timed"),
            tx_path_sojourn_ns: d("tx_sojourn_ns"),
            tx_hist: hist("tx"),
            hs_dequeued: d("handshake_dequeued"),
            hs_sojourn_ns: d("handshake_sojourn_ns"),
            rx_buffer_shrunk: d("rx_buffer_shrunk"),
            rx_buffer_restored: d("rx_buffer_restored"),
        }
    }

    fn add(&mut self, o: &QueueSig) {
        self.tx_dequeued += o.tx_dequeued;
        self.tx_sojourn_ns += o.tx_sojourn_ns;
        self.tx_dropped += o.tx_dropped;
        self.tx_marked += o.tx_marked;
        self.tx_overflow += o.tx_overflow;
        self.rx_timed += o.rx_timed;
        self.rx_sojourn_ns += o.rx_sojourn_ns;
        self.rx_sojourn_max_ns = self.rx_sojourn_max_ns.max(o.rx_sojourn_max_ns);
        self.rx_dropped += o.rx_dropped;
        self.rx_marked += o.rx_marked;
        self.rx_ce_not_ect += o.rx_ce_not_ect;
        add_hist(&mut self.rx_hist, &o.rx_hist);
        self.tx_timed += o.tx_timed;
        self.tx_path_sojourn_ns += o.tx_path_sojourn_ns;
        add_hist(&mut self.tx_hist, &o.tx_hist);
        self.hs_dequeued += o.hs_dequeued;
        self.hs_sojourn_ns += o.hs_sojourn_ns;
        self.rx_buffer_shrunk += o.rx_buffer_shrunk;
        self.rx_buffer_restored += o.rx_buffer_restored;
    }

    /// The receive sojourn below which a share `q` of the packets stayed, in µs, as
    /// the upper bound of its histogram bucket (so within a factor of two).
    pub fn rx_quantile_us(&self, q: f64) -> Option<f64> {
        quantile_us(&self.rx_hist, q)
    }

    /// The transmit path's sojourn below which a share `q` of the packets stayed, µs,
    /// as `rx_quantile_us`.
    pub fn tx_quantile_us(&self, q: f64) -> Option<f64> {
        quantile_us(&self.tx_hist, q)
    }
}

fn add_hist(sum: &mut Vec<u64>, o: &[u64]) {
    if sum.len() < o.len() {
        sum.resize(o.len(), 0);
    }
    for (a, b) in sum.iter_mut().zip(o) {
        *a += b;
    }
}

/// The upper bound of the power-of-two µs bucket that a share `q` of `hist` falls in.
fn quantile_us(hist: &[u64], q: f64) -> Option<f64> {
    let total: u64 = hist.iter().sum();
    let mut seen = 0;
    for (i, n) in hist.iter().enumerate() {
        seen += n;
        if total > 0 && seen as f64 >= q * total as f64 {
            return Some((1u64 << i) as f64);
        }
    }
    None
}

/// Both ends of a run together; None for a run without wirelane's queue counters.
fn both_ends(r: &RunRecord) -> Option<QueueSig> {
    let mut sum = QueueSig::default();
    for s in &r.signatures {
        sum.add(&s.queues);
    }
    (sum.rx_timed > 0 || sum.tx_dequeued > 0 || sum.tx_timed > 0).then_some(sum)
}

/// Seconds the daemons' threads waited for a CPU per second they ran: above 1, every
/// packet a thread holds waits longer for the CPU than for the work on it.
fn runqueue_wait_per_cpu_s(r: &RunRecord) -> Option<f64> {
    let cpu: f64 = r.cpu.threads.iter().map(|t| t.cpu_s).sum();
    let wait: f64 = r.cpu.threads.iter().map(|t| t.wait_s).sum();
    (cpu > 0.0 && wait > 0.0).then(|| wait / cpu)
}

/// The same for the lab's workload threads (the test applications); None in records
/// from before the lab counted them.
fn apps_runqueue_wait_per_cpu_s(r: &RunRecord) -> Option<f64> {
    (r.cpu.apps_s > 0.0).then(|| r.cpu.apps_wait_s / r.cpu.apps_s)
}

const HEADER: [&str; 15] = [
    "cell",
    "implementation",
    "RX sojourn mean µs",
    "RX sojourn p50 µs (≤)",
    "RX sojourn p99 µs (≤)",
    "RX sojourn max µs",
    "TX flow-queue sojourn mean µs",
    "TX sojourn mean µs",
    "TX sojourn p99 µs (≤)",
    "handshake lane wait mean µs",
    "CoDel drops/s",
    "CoDel CE marks/s",
    "RFC 6040 drops",
    "daemon run-queue wait per CPU-s",
    "applications' run-queue wait per CPU-s",
];

fn per_s(n: u64, r: &RunRecord) -> f64 {
    n as f64 / r.seconds.max(1e-9)
}

/// The queue table in Markdown (medians of the repeats), or nothing when no run has
/// the counters.
pub fn table(g: &Grouped<'_>, impl_order: &[String]) -> String {
    let rows = rows_per_group(g, impl_order, |cell, name, runs| {
        let med = |f: fn(&RunRecord) -> Option<f64>| summary_of(runs, f).map(|s| s.median);
        let rx_mean =
            med(|r| both_ends(r).map(|q| q.rx_sojourn_ns as f64 / q.rx_timed.max(1) as f64 / 1e3))?;
        let rx_p50 = med(|r| both_ends(r).and_then(|q| q.rx_quantile_us(0.5)));
        let rx_p99 = med(|r| both_ends(r).and_then(|q| q.rx_quantile_us(0.99)));
        let rx_max = med(|r| both_ends(r).map(|q| q.rx_sojourn_max_ns as f64 / 1e3));
        let tx_mean = med(|r| {
            both_ends(r)
                .filter(|q| q.tx_dequeued > 0)
                .map(|q| q.tx_sojourn_ns as f64 / q.tx_dequeued as f64 / 1e3)
        });
        let tx_path_mean = med(|r| {
            both_ends(r)
                .filter(|q| q.tx_timed > 0)
                .map(|q| q.tx_path_sojourn_ns as f64 / q.tx_timed as f64 / 1e3)
        });
        let tx_path_p99 = med(|r| both_ends(r).and_then(|q| q.tx_quantile_us(0.99)));
        let hs_mean = med(|r| {
            both_ends(r)
                .filter(|q| q.hs_dequeued > 0)
                .map(|q| q.hs_sojourn_ns as f64 / q.hs_dequeued as f64 / 1e3)
        });
        let drops =
            med(|r| both_ends(r).map(|q| per_s(q.tx_dropped + q.rx_dropped + q.tx_overflow, r)));
        let marks = med(|r| both_ends(r).map(|q| per_s(q.tx_marked + q.rx_marked, r)));
        let ce = med(|r| both_ends(r).map(|q| q.rx_ce_not_ect as f64));
        let wait = med(runqueue_wait_per_cpu_s);
        let apps_wait = med(apps_runqueue_wait_per_cpu_s);
        let f = |x: Option<f64>| x.map_or("–".to_string(), |x| format!("{x:.0}"));
        Some([
            cell.to_string(),
            name.to_string(),
            format!("{rx_mean:.0}"),
            f(rx_p50),
            f(rx_p99),
            f(rx_max),
            f(tx_mean),
            f(tx_path_mean),
            f(tx_path_p99),
            f(hs_mean),
            f(drops),
            f(marks),
            f(ce),
            wait.map_or("–".to_string(), |x| format!("{x:.2}")),
            apps_wait.map_or("–".to_string(), |x| format!("{x:.2}")),
        ])
    });
    markdown_table(
        "Queues (wirelane only; both ends, medians): receive sojourn from the kernel's \
         arrival time to the TUN write, transmit flow-queue sojourn and the transmit \
         path's from the TUN read to the send, the handshake lanes' wait, controller \
         verdicts, and how long the daemons' threads and the test applications waited \
         for a CPU:",
        &HEADER,
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_and_quantiles_of_the_receive_and_transmit_sojourns() {
        let snap = |n: u64| -> Snapshot {
            [
                ("rx_timed", 100 * n),
                ("rx_sojourn_ns", 50_000 * n),
                ("rx_sojourn_max_ns", 9_000 * n),
                ("rx_codel_dropped", n),
                ("rx_sojourn_hist_us_0", 0),
                ("rx_sojourn_hist_us_1", 90 * n),
                ("rx_sojourn_hist_us_2", 9 * n),
                ("rx_sojourn_hist_us_4", n),
                ("tx_timed", 10 * n),
                ("tx_sojourn_ns", 70_000 * n),
                ("tx_sojourn_hist_us_0", 0),
                ("tx_sojourn_hist_us_1", 0),
                ("tx_sojourn_hist_us_2", 0),
                ("tx_sojourn_hist_us_4", 10 * n),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
        };
        let q = QueueSig::between(&snap(1), &snap(3));
        assert_eq!(
            (q.rx_timed, q.rx_sojourn_ns, q.rx_dropped),
            (200, 100_000, 2)
        );
        assert_eq!(
            q.rx_sojourn_max_ns, 27_000,
            "a high-water mark, not a growth"
        );
        assert_eq!(q.rx_hist, [0, 180, 18, 2]);
        // 180 of 200 sojourns are under 2 µs, 198 under 4 µs.
        assert_eq!(q.rx_quantile_us(0.5), Some(2.0));
        assert_eq!(q.rx_quantile_us(0.99), Some(4.0));
        assert_eq!(QueueSig::default().rx_quantile_us(0.5), None);
        assert_eq!((q.tx_timed, q.tx_path_sojourn_ns), (20, 140_000));
        assert_eq!(q.tx_hist, [0, 0, 0, 20]);
        assert_eq!(q.tx_quantile_us(0.99), Some(8.0));
    }
}
