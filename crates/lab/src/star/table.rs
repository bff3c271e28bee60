//! The star sweep's tables: the medians of each cell's repeats per implementation, and
//! each implementation against a baseline repeat by repeat.
//!
//! Why the second: the lab interleaves implementations within a repeat, so two
//! implementations' runs of one repeat are seconds apart, while this kind of host
//! passes through slow phases of tens of seconds in which the generator and the
//! daemon both cost a third more per packet. A median over repeats moves with how many
//! runs a phase caught, and two implementations' medians can differ by that alone; a
//! ratio within a repeat compares runs that share the host's state.

use super::{Shape, StarRecord};
use crate::stats::{median, paired_ratios, summarize};
use crate::summary::markdown_table;

/// The mean time a packet spent inside the daemon, ms, by its own counters: receive
/// from the kernel's arrival stamp to the TUN write, transmit from the TUN read to the
/// send. None where the daemon does not count it (not wirelane) or timed nothing.
fn daemon_sojourn_ms(r: &StarRecord) -> Option<f64> {
    let q = &r.signatures.as_ref()?.queues;
    let (timed, ns) = match r.spec.as_ref()?.way {
        super::Way::Rx => (q.rx_timed, q.rx_sojourn_ns),
        super::Way::Tx => (q.tx_timed, q.tx_path_sojourn_ns),
    };
    (timed > 0).then(|| ns as f64 / timed as f64 / 1e6)
}

/// The share of `sent` not delivered, %; None when nothing was sent.
fn lost_pct(sent: u64, delivered: u64) -> Option<f64> {
    (sent > 0).then(|| 100.0 * sent.saturating_sub(delivered) as f64 / sent as f64)
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |v| format!("{v:.digits$}"))
}

/// Medians per cell shape (direction, N, offered load, storm) and implementation.
pub fn table(records: &[StarRecord], cpu: &str) -> String {
    let mut keys: Vec<(Shape, String)> = Vec::new();
    for r in records {
        let Some(s) = &r.spec else { continue };
        let k = (s.shape(), r.implementation.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.sort_by_key(|k| k.0.order());
    let mut rows = Vec::new();
    for (shape, name) in &keys {
        let (runs, failed): (Vec<&StarRecord>, Vec<&StarRecord>) = records
            .iter()
            .filter(|r| {
                r.implementation == *name && r.spec.as_ref().is_some_and(|s| s.shape() == *shape)
            })
            .partition(|r| r.error.is_none());
        let failed = failed.len();
        let m = |f: &dyn Fn(&StarRecord) -> Option<f64>| {
            median(&runs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
        };
        let per_gb = m(&|r| r.cpu_s_per_gb);
        let lost = m(&|r| lost_pct(r.sent + r.unsent, r.delivered));
        let wrong = match shape.sink {
            super::sink::SinkKind::Blackhole => "unchecked".to_string(),
            super::sink::SinkKind::Socket => runs
                .iter()
                .map(|r| r.reordered + r.duplicates + r.corrupted + r.misdelivered + r.sample_bad)
                .sum::<u64>()
                .to_string(),
        };
        rows.push([
            shape.to_string(),
            name.clone(),
            format!(
                "{}{}",
                runs.len(),
                if failed > 0 {
                    format!(" ({failed} failed)")
                } else {
                    String::new()
                }
            ),
            fmt(m(&|r| Some(r.goodput_bps / 1e9)), 2),
            fmt(per_gb, 2),
            // Each run against the floor measured beside it, then the median.
            fmt(
                m(&|r| {
                    r.cpu_s_per_gb
                        .filter(|_| r.aead_floor_s_per_gb > 0.0)
                        .map(|c| c / r.aead_floor_s_per_gb)
                }),
                2,
            ),
            fmt(lost, 2),
            wrong,
            fmt(m(&|r| r.delay_p99_us.map(|d| d / 1e3)), 2),
            fmt(m(&|r| r.gateway_delay_p99_us.map(|d| d / 1e3)), 2),
            fmt(m(&|r| r.generator_late_p99_us.map(|d| d / 1e3)), 2),
            fmt(m(&|r| daemon_sojourn_ms(r)), 2),
            fmt(
                m(&|r| r.light.as_ref()?.gateway_delay_p99_us.map(|d| d / 1e3)),
                2,
            ),
            fmt(
                m(&|r| r.light.as_ref().and_then(|l| lost_pct(l.sent, l.delivered))),
                2,
            ),
            fmt(m(&|r| r.peak_rss_kib.map(|k| k as f64 / 1024.0)), 0),
            fmt(m(&|r| r.rss_growth_kib().map(|k| k as f64 / 1024.0)), 1),
            fmt(m(&|r| r.handshake.to_all_s), 2),
            fmt(m(&|r| r.storm_during.as_ref().and_then(|s| s.to_all_s)), 2),
            fmt(m(&|r| Some(r.generator_cores)), 2),
            fmt(m(&|r| crate::cpu::spread(&r.core_busy)), 2),
            fmt(m(&|r| r.tunnel_fairness()), 3),
            fmt(m(&|r| r.daemon_threads.map(|t| t as f64)), 0),
        ]);
    }
    markdown_table(
        &format!(
            "Star: one gateway, N emulated peers. Medians of the repeats; CPU: {cpu}. \
             \"wrong\" sums reordered, duplicated, corrupted and misdelivered packets and \
             bad samples over all runs; a blackhole sink only counts. \"× AEAD floor\" is \
             the median of each run's CPU per GB over the floor measured beside it. With \
             light peers, \
             \"delay\" is the heavy peers'. \"delay\" runs from each packet's scheduled \
             send time, so it includes the generator's own lateness (\"generator \
             late\"); \"gateway delay\" runs from when the packet's burst really left, \
             and is the gateway's share. \"daemon sojourn\" is the mean time a packet \
             spent in the daemon, by its own counters (wirelane): receive from the \
             kernel's arrival stamp on the datagram to the TUN write, transmit from the \
             TUN read to the send. \"RSS growth\" (phases of 2 minutes or more): \
             the daemon's largest resident set in the phase's last minute less that in its \
             first. Over several tunnels, peer i is on tunnel i mod T, and \"tunnel \
             fairness\" is Jain's index over what each tunnel delivered per heavy peer \
             it carries. Peak RSS and \
             daemon threads sum the daemon's processes (one per tunnel, but for \
             wirelane)."
        ),
        &[
            "cell",
            "implementation",
            "runs",
            "goodput Gbit/s",
            "daemon CPU-s/GB",
            "× AEAD floor",
            "lost %",
            "wrong",
            "delay p99 ms",
            "gateway delay p99 ms",
            "generator late p99 ms",
            "daemon sojourn ms",
            "light peers: gateway delay p99 ms",
            "light peers: lost %",
            "peak RSS MiB",
            "RSS growth MiB",
            "all handshakes s",
            "storm during: all s",
            "generator cores",
            "core spread",
            "tunnel fairness",
            "daemon threads",
        ],
        &rows,
    )
}

/// One figure of a run, where it has it.
type Figure = fn(&StarRecord) -> Option<f64>;

/// The figures paired repeat by repeat, as ratios of an implementation's run to the
/// baseline's run of the same repeat and cell.
const PAIRED: [(&str, Figure); 4] = [
    ("goodput", |r| Some(r.goodput_bps)),
    ("daemon CPU-s/GB", |r| r.cpu_s_per_gb),
    ("daemon sojourn", daemon_sojourn_ms),
    ("delay p99", |r| r.delay_p99_us),
];

/// Each implementation against `baseline`, repeat by repeat: per cell, the median of
/// the ratios of its runs to the baseline's run of the same repeat, with their range.
/// Empty when the records hold no other implementation, or no run of `baseline`.
pub fn paired_table(records: &[StarRecord], baseline: &str) -> String {
    let ok = |r: &&StarRecord| r.error.is_none() && r.spec.is_some();
    let shape = |r: &StarRecord| r.spec.as_ref().map(|s| s.shape());
    let mut keys: Vec<(Shape, String)> = Vec::new();
    for r in records.iter().filter(ok) {
        let k = (shape(r).expect("filtered"), r.implementation.clone());
        if r.implementation != baseline && !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.sort_by_key(|k| k.0.order());
    let mut rows = Vec::new();
    for (s, name) in &keys {
        let of = |n: &str| -> Vec<&StarRecord> {
            let same = |r: &&StarRecord| r.implementation == n && shape(r).as_ref() == Some(s);
            records.iter().filter(ok).filter(same).collect()
        };
        let (runs, base) = (of(name), of(baseline));
        let pairs = runs
            .iter()
            .filter(|r| base.iter().any(|b| b.repeat == r.repeat))
            .count();
        if pairs == 0 {
            continue;
        }
        let ratio = |f: Figure| match summarize(&paired_ratios(&runs, &base, |r| r.repeat, f)) {
            Some(p) => format!("{:.2}× ({:.2}–{:.2})", p.median, p.min, p.max),
            None => "–".to_string(),
        };
        rows.push([
            s.to_string(),
            name.clone(),
            pairs.to_string(),
            ratio(PAIRED[0].1),
            ratio(PAIRED[1].1),
            ratio(PAIRED[2].1),
            ratio(PAIRED[3].1),
        ]);
    }
    let header = [
        "cell",
        "implementation",
        "pairs",
        PAIRED[0].0,
        PAIRED[1].0,
        PAIRED[2].0,
        PAIRED[3].0,
    ];
    markdown_table(
        &format!(
            "Star, paired: each implementation's run against {baseline}'s run of the same \
             repeat (seconds apart, in the same phase of the host), as a ratio; the median \
             of the pairs, and their range."
        ),
        &header,
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(implementation: &str, repeat: usize, gbit: f64, sojourn_ms: u64) -> StarRecord {
        let spec = serde_json::from_value(serde_json::json!({
            "peers": 1000, "way": "rx", "size": 1420, "offered_pps": null,
            "seconds": 3.0, "handshake_rate": null, "sealed_max_mib": 512,
        }))
        .unwrap();
        let mut signatures = crate::signatures::Signatures::default();
        signatures.queues.rx_timed = 1000;
        signatures.queues.rx_sojourn_ns = 1000 * sojourn_ms * 1_000_000;
        StarRecord {
            implementation: implementation.into(),
            spec: Some(spec),
            repeat,
            goodput_bps: gbit * 1e9,
            cpu_s_per_gb: Some(1.0),
            signatures: Some(signatures),
            ..StarRecord::default()
        }
    }

    /// 1,000 peers over 64 tunnels: the first 40 tunnels carry 16 peers, the rest 15.
    /// Every peer delivering the same is fair; one tunnel's peers delivering half is
    /// not.
    #[test]
    fn tunnel_fairness_is_per_peer() {
        let mut r = run("wirelane", 0, 1.0, 1);
        r.tunnel_delivered = (0..64).map(|t| if t < 40 { 1600 } else { 1500 }).collect();
        assert!((r.tunnel_fairness().unwrap() - 1.0).abs() < 1e-12);
        r.tunnel_delivered[0] = 800;
        assert!(r.tunnel_fairness().unwrap() < 0.999);
    }

    /// Each run is divided by the baseline's run of its own repeat, not by the
    /// baseline's median: here the baseline's repeats differ by half (a slow phase),
    /// and the other implementation is 10% ahead within every repeat.
    #[test]
    fn ratios_pair_runs_of_the_same_repeat() {
        let records = [
            run("base", 0, 8.0, 10),
            run("new", 0, 8.8, 5),
            run("new", 1, 4.4, 5),
            run("base", 1, 4.0, 10),
            run("base", 2, 8.0, 10),
            run("new", 2, 8.8, 5),
            // No baseline run in this repeat (it failed): left out of the pairs.
            run("new", 3, 1.0, 50),
        ];
        let md = paired_table(&records, "base");
        let row = md.lines().find(|l| l.contains("| new |")).unwrap();
        assert!(row.contains("| 3 |"), "{row}");
        assert!(row.contains("1.10× (1.10–1.10)"), "{row}");
        assert!(row.contains("0.50× (0.50–0.50)"), "{row}");
        assert!(!md.contains("| base |"), "{md}");
        assert_eq!(daemon_sojourn_ms(&records[0]), Some(10.0));
    }

    /// Runs of another packet size, or with all peers behind one source, are another
    /// cell: pooled, their medians mixed two workloads.
    #[test]
    fn runs_of_another_size_or_source_are_another_cell() {
        let a = run("x", 0, 1.0, 1).spec.unwrap();
        let (mut b, mut c) = (a.clone(), a.clone());
        b.size = 512;
        c.shared_source = true;
        assert_ne!(a.shape(), b.shape());
        assert_ne!(a.shape(), c.shape());
        assert_eq!(a.shape().to_string(), "rx N=1000 unlimited storm");
        assert!(b.shape().to_string().ends_with(" 512 B"));
        assert!(c.shape().to_string().ends_with(" one source"));
    }

    #[test]
    fn nothing_to_pair_gives_no_table() {
        assert_eq!(paired_table(&[run("base", 0, 8.0, 1)], "base"), "");
        assert_eq!(paired_table(&[run("new", 0, 8.0, 1)], "base"), "");
    }
}
