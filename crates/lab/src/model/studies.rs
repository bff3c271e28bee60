//! The model's two studies: seed 000's gateway under kernel-like parameters (does the
//! model reproduce the paper?) and wirelane on machines larger than ours (which model
//! and how many workers?).

use super::cli::{params_or, percents, KERNEL_PARAMS, WIRELANE_PARAMS};
use super::params::{Direction, Params};
use super::{simulate, Outcome, Scenario};
use crate::Result;
use std::fmt::Write as _;
use std::path::Path;
use wirelane_dataplane::exec::Model;

/// Seed 000's clients: 25 Mbit/s each, TCP (window-limited here), on one switch.
pub const SEED000_CLIENT_GBIT: f64 = 0.025;
/// Round trip outside the gateway: clients and targets on one switch.
pub const SEED000_RTT_US: f64 = 200.0;

/// The paper's receive throughput (Fig. 8), Gbit/s: (model, clients, figure).
pub const SEED000_PAPER: [(Model, usize, f64); 4] = [
    (Model::Softirq, 500, 11.7),
    (Model::Softirq, 1000, 4.5),
    (Model::Threaded, 1000, 14.4),
    (Model::Workqueue, 1000, 18.0),
];

/// Seed 000's receive scenario with `clients` clients under `model`.
pub fn seed000_scenario(params: &Params, model: Model, clients: usize, seconds: f64) -> Scenario {
    Scenario {
        offered_gbit: clients as f64 * SEED000_CLIENT_GBIT,
        burst: 4,
        tcp_rtt_us: Some(SEED000_RTT_US),
        seconds,
        warmup_s: seconds / 4.0,
        ..Scenario::star(model, params.platform.cores, clients, Direction::Rx)
    }
}

pub fn seed000(params: &Params, seconds: f64) -> Result<Vec<(Model, usize, f64, Outcome)>> {
    SEED000_PAPER
        .iter()
        .map(|&(m, n, paper)| {
            let o = simulate(params, &seed000_scenario(params, m, n, seconds))?;
            Ok((m, n, paper, o))
        })
        .collect()
}

/// The busiest core's busy share, the others' mean, and the same two for packets per
/// poll.
pub(super) fn busiest_and_rest(o: &Outcome) -> (f64, f64, f64, f64) {
    let (i, busiest) = o
        .core_busy
        .iter()
        .copied()
        .enumerate()
        .fold((0, 0.0), |a, (i, b)| if b > a.1 { (i, b) } else { a });
    // The mean over every core but the busiest.
    let rest = |v: &[f64]| {
        let others: Vec<f64> = v
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, x)| *x)
            .collect();
        others.iter().sum::<f64>() / others.len().max(1) as f64
    };
    let ppp = &o.core_packets_per_poll;
    (busiest, rest(&o.core_busy), ppp[i], rest(ppp))
}

pub fn seed000_table(rows: &[(Model, usize, f64, Outcome)]) -> String {
    let mut s = String::from(
        "| configuration | clients | paper Gbit/s | model Gbit/s | error | busiest core | other cores (mean) | pkts/poll busiest | pkts/poll others | delay p99 |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (m, n, paper, o) in rows {
        let (busiest, rest, ppp_b, ppp_r) = busiest_and_rest(o);
        let name = match m {
            Model::Softirq => "softirq baseline",
            Model::Threaded => "threaded",
            Model::Workqueue => "workqueue",
        };
        let _ = writeln!(
            s,
            "| {name} | {n} | {paper:.1} | {:.1} | {:+.0}% | {:.0}% | {:.0}% | {ppp_b:.1} | {ppp_r:.1} | {:.1} ms |",
            o.goodput_gbit,
            (o.goodput_gbit / paper - 1.0) * 100.0,
            busiest * 100.0,
            rest * 100.0,
            o.latency_p99_us / 1e3
        );
    }
    s
}

pub fn seed000_cli(params: Option<&Path>, seconds: f64, out: Option<&Path>) -> Result<()> {
    let p = params_or(params, KERNEL_PARAMS)?;
    let rows = seed000(&p, seconds)?;
    let mut s = seed000_table(&rows);
    for (m, n, _, o) in &rows {
        let _ = writeln!(
            s,
            "\n{m} at {n} clients, core busy: {}",
            percents(&o.core_busy)
        );
    }
    // The curve against the client count (seed 000's Fig. 8), every model.
    let mut series = Vec::new();
    for m in [Model::Softirq, Model::Threaded, Model::Workqueue] {
        let mut points = Vec::new();
        for n in (1..=10).map(|k| k * 100) {
            let o = simulate(&p, &seed000_scenario(&p, m, n, seconds))?;
            points.push((n, o.goodput_gbit));
        }
        series.push((format!("kernel {m} (model)"), points));
    }
    let _ = writeln!(
        s,
        "\n| clients | {} |",
        series
            .iter()
            .map(|x| x.0.as_str())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(s, "|---|{}", "---|".repeat(series.len()));
    for i in 0..10 {
        let _ = writeln!(
            s,
            "| {} | {} |",
            series[0].1[i].0,
            series
                .iter()
                .map(|x| format!("{:.1}", x.1[i].1))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    print!("{s}");
    if let Some(dir) = out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("seed000.md"), &s)?;
        let chart = crate::star::report::line_chart(
            "receive throughput against clients",
            "Gbit/s",
            &series,
        );
        std::fs::write(dir.join("seed000.html"), format!("<!doctype html><meta charset=utf-8><title>seed 000 in the model</title><body>{chart}</body>"))?;
    }
    Ok(())
}

/// The platform of a prediction: `cores` cores, no load generator beside the
/// gateway, a 100 Gbit/s link.
pub fn prediction_params(base: &Params, cores: usize) -> Params {
    let mut p = base.clone();
    p.platform.cores = cores;
    p.rx.background_share = 0.0;
    p.tx.background_share = 0.0;
    p.platform.line_gbit = 100.0;
    p
}

/// Offered load of a prediction: seed 000's 25 Mbit/s per peer, up to the link's rate,
/// sent as in the lab's star runs, the regime the validation covers: on receive each
/// peer's GSO runs of 45 packets, on transmit packets rotating over the peers.
pub fn prediction_scenario(
    model: Model,
    workers: usize,
    peers: usize,
    dir: Direction,
    seconds: f64,
) -> Scenario {
    Scenario {
        offered_gbit: peers as f64 * SEED000_CLIENT_GBIT,
        seconds,
        warmup_s: seconds / 5.0,
        ..Scenario::star(model, workers, peers, dir)
    }
}

pub fn predict_cli(params: Option<&Path>, seconds: f64, out: Option<&Path>) -> Result<()> {
    let base = params_or(params, WIRELANE_PARAMS)?;
    let mut s = String::from(
        "| cores | peers | dir | offered | workqueue | threaded | softirq | best (workers) | what if: workqueue, a UDP reader per 4 cores |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut series: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
    for dir in [Direction::Rx, Direction::Tx] {
        for peers in [1000, 10_000] {
            for cores in [4, 16, 32, 64] {
                let p = prediction_params(&base, cores);
                let mut best: Option<(f64, Model, usize)> = None;
                let mut cols = Vec::new();
                let mut offered = 0.0;
                for model in Model::ALL {
                    let mut top: Option<(f64, usize)> = None;
                    for workers in [cores / 2, cores] {
                        let o = simulate(
                            &p,
                            &prediction_scenario(model, workers, peers, dir, seconds),
                        )?;
                        offered = o.offered_gbit;
                        if top.is_none_or(|t| o.goodput_gbit > t.0 * 1.01) {
                            top = Some((o.goodput_gbit, workers));
                        }
                    }
                    let (g, w) = top.unwrap_or((0.0, cores));
                    cols.push(format!("{g:.1} ({w})"));
                    if best.is_none_or(|b| g > b.0 * 1.01) {
                        best = Some((g, model, w));
                    }
                    let name = format!("{model} {} N={peers}", dir.name());
                    match series.iter_mut().find(|x| x.0 == name) {
                        Some(x) => x.1.push((cores, g)),
                        None => series.push((name, vec![(cores, g)])),
                    }
                }
                let (g, m, w) = best.unwrap_or((0.0, Model::Workqueue, cores));
                // Receive: today's single reader per socket against several
                // (SO_REUSEPORT sockets), what the reader costs the gateway. Transmit
                // already has a reader per worker (the TUN's queues).
                let what_if = match dir {
                    Direction::Rx => {
                        let mut more = p.clone();
                        more.platform.reader_threads = (cores / 4).max(1);
                        let sc = prediction_scenario(Model::Workqueue, cores, peers, dir, seconds);
                        format!("{:.1}", simulate(&more, &sc)?.goodput_gbit)
                    }
                    Direction::Tx => "–".to_string(),
                };
                let _ = writeln!(
                    s,
                    "| {cores} | {peers} | {} | {offered:.0} | {} | {m} ({w}): {g:.1} | {what_if} |",
                    dir.name(),
                    cols.join(" | ")
                );
            }
        }
    }
    print!("{s}");
    if let Some(dir) = out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("predict.md"), &s)?;
        let chart =
            crate::star::report::line_chart("predicted goodput against cores", "Gbit/s", &series);
        std::fs::write(dir.join("predict.html"), format!("<!doctype html><meta charset=utf-8><title>wirelane on more cores</title><body>{chart}</body>"))?;
    }
    Ok(())
}
