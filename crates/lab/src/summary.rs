//! Aggregation of run records into per-cell, per-implementation figures: medians of
//! the repeats with min and max, and ratios against the baseline implementation.

use crate::record::RunRecord;
use crate::stats::{median, paired_ratios, ratio, summarize, Summary};
use std::collections::BTreeMap;

/// The headline figure of a cell kind, and whether higher is better.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub unit: &'static str,
    pub higher_is_better: bool,
    pub extract: fn(&RunRecord) -> Option<f64>,
    pub scale: f64,
}

fn goodput(r: &RunRecord) -> Option<f64> {
    r.goodput_bps()
}
fn udp_pps(r: &RunRecord) -> Option<f64> {
    r.udp.map(|u| u.delivered_pps)
}
fn p50(r: &RunRecord) -> Option<f64> {
    r.latency.map(|l| l.p50_us)
}
fn p99(r: &RunRecord) -> Option<f64> {
    r.latency.map(|l| l.p99_us)
}
pub fn udp_loss(r: &RunRecord) -> Option<f64> {
    r.udp.map(|u| u.loss_pct)
}
/// Share of the datagrams sent that the sender's host dropped on transmit, in percent.
fn udp_sender_drops(r: &RunRecord) -> Option<f64> {
    r.udp
        .filter(|u| u.sent > 0)
        .map(|u| u.sender_drops as f64 * 100.0 / u.sent as f64)
}
/// Share of the datagrams sent that the receiving socket dropped, in percent.
fn udp_receiver_drops(r: &RunRecord) -> Option<f64> {
    r.udp
        .filter(|u| u.sent > 0)
        .map(|u| u.receiver_drops as f64 * 100.0 / u.sent as f64)
}
pub fn retrans(r: &RunRecord) -> Option<f64> {
    (!r.tcp.is_empty()).then(|| r.tcp.iter().map(|t| t.retransmits as f64).sum())
}
/// Daemon CPU-seconds (both ends, all threads) per GB of payload delivered.
pub fn cpu_per_gb(r: &RunRecord) -> Option<f64> {
    let bytes = r.delivered_bytes();
    (bytes > 0 && r.cpu.daemon_s > 0.0).then(|| r.cpu.daemon_s / (bytes as f64 / 1e9))
}
/// The larger host's daemon memory (each host's processes summed: see `RunRecord`).
pub fn peak_rss(r: &RunRecord) -> Option<f64> {
    r.peak_rss_kib.iter().max().map(|k| *k as f64)
}

pub const GOODPUT: Metric = Metric {
    name: "goodput",
    unit: "Gbit/s",
    higher_is_better: true,
    extract: goodput,
    scale: 1e-9,
};
pub const UDP_PPS: Metric = Metric {
    name: "delivered",
    unit: "kpps",
    higher_is_better: true,
    extract: udp_pps,
    scale: 1e-3,
};
pub const P50: Metric = Metric {
    name: "p50",
    unit: "µs",
    higher_is_better: false,
    extract: p50,
    scale: 1.0,
};
pub const P99: Metric = Metric {
    name: "p99",
    unit: "µs",
    higher_is_better: false,
    extract: p99,
    scale: 1.0,
};

/// The metrics reported for the kind of cell a record belongs to (first is headline).
pub fn metrics_for(r: &RunRecord) -> &'static [Metric] {
    match r.cell {
        crate::matrix::Cell::Tcp { .. } => &[GOODPUT],
        crate::matrix::Cell::Udp { .. } => &[UDP_PPS],
        crate::matrix::Cell::Rr { .. } => &[P50, P99],
        crate::matrix::Cell::Star { .. } => &[GOODPUT],
    }
}

/// Records of one result set grouped by cell id, then implementation, in first-seen
/// order of cells.
pub struct Grouped<'a> {
    pub cells: Vec<String>,
    pub by_cell: BTreeMap<String, BTreeMap<String, Vec<&'a RunRecord>>>,
}

impl<'a> Grouped<'a> {
    /// Any record of `cell` (they all share the cell's kind).
    pub fn first_of(&self, cell: &str) -> &'a RunRecord {
        self.by_cell[cell]
            .values()
            .next()
            .and_then(|v| v.first())
            .expect("groups are never empty")
    }
}

pub fn group(records: &[RunRecord]) -> Grouped<'_> {
    let mut cells = Vec::new();
    let mut by_cell: BTreeMap<String, BTreeMap<String, Vec<&RunRecord>>> = BTreeMap::new();
    for r in records {
        if !by_cell.contains_key(&r.cell_id) {
            cells.push(r.cell_id.clone());
        }
        by_cell
            .entry(r.cell_id.clone())
            .or_default()
            .entry(r.implementation.clone())
            .or_default()
            .push(r);
    }
    Grouped { cells, by_cell }
}

pub fn summary_of(runs: &[&RunRecord], f: fn(&RunRecord) -> Option<f64>) -> Option<Summary> {
    let xs: Vec<f64> = runs
        .iter()
        .filter(|r| r.error.is_none())
        .filter_map(|r| f(r))
        .collect();
    summarize(&xs)
}

/// The median over repeats of each run's figure divided by the baseline's figure in
/// the same repeat (`stats::paired_ratios`); a failed run pairs with nothing.
pub fn paired_ratio(
    runs: &[&RunRecord],
    base: &[&RunRecord],
    f: fn(&RunRecord) -> Option<f64>,
) -> Option<f64> {
    let value = |r: &RunRecord| f(r).filter(|_| r.error.is_none());
    median(&paired_ratios(runs, base, |r| r.repeat, value))
}

fn fmt_num(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn fmt_ratio(x: f64) -> String {
    if x < 0.1 {
        format!("{x:.3}")
    } else {
        format!("{x:.2}")
    }
}

/// The Markdown summary: one table per result set, ready to paste into notes.
pub fn markdown(records: &[RunRecord], baseline: &str, impl_order: &[String]) -> String {
    let g = group(records);
    let mut out = String::new();
    if let Some(r) = records.first() {
        out.push_str(&format!(
            "Matrix `{}`, set `{}`: {} cores ({}), kernel {}, commit {}. Medians of {} repeat(s), (min–max); ratio against {baseline}: of the medians, and (paired) the median of each repeat's ratio to {baseline}'s run of the same repeat.\n\n",
            r.matrix,
            r.set,
            r.env.cores,
            r.env.cpu_model,
            r.env.kernel,
            r.env.commit,
            records.iter().map(|r| r.repeat + 1).max().unwrap_or(0)
        ));
        let versions: Vec<String> = r
            .env
            .versions
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        out.push_str(&format!("Versions: {}.\n\n", versions.join("; ")));
    }
    out.push_str("| cell | implementation | figure | median (min–max) | vs baseline | retrans / loss | daemon CPU-s per GB | peak RSS MiB |\n");
    out.push_str("|---|---|---|---|---|---|---|---|\n");
    for cell in &g.cells {
        let impls = &g.by_cell[cell];
        let first = g.first_of(cell);
        for m in metrics_for(first) {
            let base_runs = impls.get(baseline);
            let base = base_runs
                .and_then(|v| summary_of(v, m.extract))
                .map(|s| s.median);
            for name in impl_order {
                let Some(runs) = impls.get(name) else {
                    continue;
                };
                let errors: Vec<&str> = runs.iter().filter_map(|r| r.error.as_deref()).collect();
                let Some(s) = summary_of(runs, m.extract) else {
                    out.push_str(&format!(
                        "| {cell} | {name} | {} | failed: {} | | | | |\n",
                        m.name,
                        errors.first().unwrap_or(&"no data")
                    ));
                    continue;
                };
                let paired = base_runs
                    .filter(|_| name != baseline)
                    .and_then(|b| paired_ratio(runs, b, m.extract));
                let rat = match (ratio(s.median, base), paired) {
                    (Some(x), Some(p)) => format!("{}× (paired {}×)", fmt_ratio(x), fmt_ratio(p)),
                    (Some(x), None) => format!("{}×", fmt_ratio(x)),
                    (None, _) => "–".into(),
                };
                let extra = match first.cell {
                    crate::matrix::Cell::Udp { .. } => summary_of(runs, udp_loss).map(|s| {
                        // Where the kernel saw it: the sender's queue, the receiver's
                        // socket; the rest was lost on the way.
                        let at = |f| summary_of(runs, f).map_or(0.0, |s: Summary| s.median);
                        format!(
                            "{:.2}% loss ({:.1}% sender, {:.1}% receiver socket)",
                            s.median,
                            at(udp_sender_drops),
                            at(udp_receiver_drops)
                        )
                    }),
                    crate::matrix::Cell::Tcp { tunnels, .. } if tunnels > 1 => {
                        summary_of(runs, retrans).map(|s| {
                            let jain = summary_of(runs, |r| r.jain_fairness()).map_or(0.0, |j| j.median);
                            let threads = summary_of(runs, |r| Some(r.daemon_threads as f64))
                                .map_or(0.0, |t| t.median);
                            format!(
                                "{:.0} retr, Jain {jain:.3} over {tunnels} tunnels, {threads:.0} daemon threads",
                                s.median
                            )
                        })
                    }
                    _ => summary_of(runs, retrans).map(|s| format!("{:.0} retr", s.median)),
                }
                .unwrap_or_default();
                let cpu = summary_of(runs, cpu_per_gb).map_or(String::new(), |s| fmt_num(s.median));
                let rss = summary_of(runs, peak_rss)
                    .map_or(String::new(), |s| format!("{:.1}", s.median / 1024.0));
                out.push_str(&format!(
                    "| {cell} | {name} | {} {} | {} ({}–{}){} | {rat} | {extra} | {cpu} | {rss} |\n",
                    m.name,
                    m.unit,
                    fmt_num(s.median * m.scale),
                    fmt_num(s.min * m.scale),
                    fmt_num(s.max * m.scale),
                    if errors.is_empty() { String::new() } else { format!(", {} failed", errors.len()) },
                ));
            }
        }
    }
    out.push_str(&signatures_table(&g, impl_order));
    out.push_str(&crate::queues::table(&g, impl_order));
    let stars: Vec<crate::star::StarRecord> =
        records.iter().filter_map(|r| r.star.clone()).collect();
    if !stars.is_empty() {
        let cpu = records.first().map_or("", |r| r.env.cpu_model.as_str());
        out.push_str(&crate::star::table::table(&stars, cpu));
        out.push_str(&crate::star::table::paired_table(&stars, baseline));
    }
    let disagree = records.iter().filter(|r| r.cpu.disagree).count();
    if disagree > 0 {
        out.push_str(&format!(
            "\n{disagree} of {} runs show /proc/stat busy time and per-thread run time more than 20% apart: \
             kernel work outside any thread (softirq, or time accounted as idle) is significant there.\n",
            records.len()
        ));
    }
    out
}

/// The receiving end's signatures of a run: the end whose RX serial stage the cell's
/// traffic drives (b, unless the cell sends b→a), summed over both ends for cells
/// that send both ways.
fn receiver_sigs(r: &RunRecord) -> Option<crate::signatures::Signatures> {
    use crate::matrix::{Cell, Direction};
    let dir = match r.cell {
        Cell::Tcp { direction, .. } | Cell::Udp { direction, .. } => direction,
        Cell::Rr { .. } | Cell::Star { .. } => Direction::Both,
    };
    let side = match dir {
        Direction::AToB => Some("b"),
        Direction::BToA => Some("a"),
        Direction::Both => None,
    };
    // Every interface of that side (several for multi:T); threads are the process's,
    // counted once per process.
    let mut all = r
        .signatures
        .iter()
        .filter(|s| side.is_none_or(|side| s.side == side));
    let mut sum = all.next()?.clone();
    // Threads by side and name: both hosts run threads of the same names, each its
    // own; a side's several interfaces share their process's.
    let mut seen: Vec<(String, String)> = (sum.threads.iter())
        .map(|t| (sum.side.clone(), t.name.clone()))
        .collect();
    for s in all {
        sum.invocations += s.invocations;
        sum.packets += s.packets;
        sum.empty_polls += s.empty_polls;
        sum.head_pending += s.head_pending;
        for t in &s.threads {
            let key = (s.side.clone(), t.name.clone());
            if !seen.contains(&key) {
                seen.push(key);
                sum.threads.push(t.clone());
            }
        }
    }
    // A build without the counters (an older wirelane) reports no serial invocations.
    (sum.invocations > 0).then_some(sum)
}

/// Header of the signature table.
pub const SIGNATURE_HEADER: [&str; 7] = [
    "cell",
    "implementation",
    "packets per serial invocation",
    "empty polls",
    "stopped at an undone head",
    "involuntary switches/s",
    "core spread (busiest − idlest)",
];

/// The execution-order signatures per cell and wirelane model (medians of the
/// repeats), beside the busiest/idlest core spread: seed 000's two symptoms are few
/// packets per serial-stage invocation with many empty polls, and one core busy while
/// the others idle.
pub fn signature_rows(g: &Grouped<'_>, impl_order: &[String]) -> Vec<[String; 7]> {
    rows_per_group(g, impl_order, |cell, name, runs| {
        let med = |f: fn(&RunRecord) -> Option<f64>| summary_of(runs, f).map(|s| s.median);
        let ppi = med(|r| receiver_sigs(r).map(|s| s.packets_per_invocation()))?;
        let empty = med(|r| receiver_sigs(r).map(|s| s.empty_share() * 100.0)).unwrap_or(0.0);
        let pending =
            med(|r| receiver_sigs(r).map(|s| s.head_pending_share() * 100.0)).unwrap_or(0.0);
        let invol = med(|r| {
            receiver_sigs(r).map(|s| s.involuntary_switches() as f64 / r.seconds.max(1e-9))
        })
        .unwrap_or(0.0);
        let spread = med(|r| r.cpu.core_spread().map(|x| x * 100.0));
        Some([
            cell.to_string(),
            name.to_string(),
            fmt_num(ppi),
            format!("{empty:.1}%"),
            format!("{pending:.1}%"),
            format!("{invol:.0}"),
            spread.map_or("–".into(), |s| format!("{s:.0} points")),
        ])
    })
}

/// One row per cell and implementation with runs, cells in first-seen order and
/// implementations in `impl_order`; `row` skips a group by returning None.
pub fn rows_per_group<const N: usize>(
    g: &Grouped<'_>,
    impl_order: &[String],
    mut row: impl FnMut(&str, &str, &[&RunRecord]) -> Option<[String; N]>,
) -> Vec<[String; N]> {
    let mut rows = Vec::new();
    for cell in &g.cells {
        for name in impl_order {
            if let Some(runs) = g.by_cell[cell].get(name) {
                rows.extend(row(cell, name, runs));
            }
        }
    }
    rows
}

/// A Markdown table after the paragraph `intro`, or nothing without rows.
pub fn markdown_table<const N: usize>(
    intro: &str,
    header: &[&str; N],
    rows: &[[String; N]],
) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
    let mut out = format!("\n{intro}\n\n");
    out.push_str(&line(&header.map(String::from)));
    out.push_str(&line(&[(); N].map(|_| "---".to_string())));
    for r in rows {
        out.push_str(&line(r));
    }
    out
}

/// The signature table in Markdown, or nothing when no run has signatures.
pub fn signatures_table(g: &Grouped<'_>, impl_order: &[String]) -> String {
    markdown_table(
        "Execution-order signatures at the receiving end (wirelane only), medians:",
        &SIGNATURE_HEADER,
        &signature_rows(g, impl_order),
    )
}
