//! `wirelane-lab model …`: one run, calibration, validation against held-out lab runs,
//! seed 000's reproduction and the predictions (`studies`). Tables go to stdout as
//! Markdown; with `--out DIR`, also to DIR/model.md and charts to DIR/model.html.

use super::calibrate::{self, lab_scenario, Observation};
use super::params::{Direction, Params};
use super::{probe, simulate, Outcome, Scenario};
use crate::Result;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use wirelane_dataplane::exec::Model;

/// wirelane's parameter set fitted on this project's lab machine (see its provenance).
pub const WIRELANE_PARAMS: &str = include_str!("../../../../lab/model/wirelane.toml");
/// The kernel-like parameter set read off seed 000.
pub const KERNEL_PARAMS: &str = include_str!("../../../../lab/model/kernel-seed000.toml");

/// A built-in set, or the file given.
pub fn params_or(path: Option<&Path>, builtin: &str) -> Result<Params> {
    match path {
        Some(p) => Params::load(p),
        None => {
            let p: Params = toml::from_str(builtin)?;
            p.check()?;
            Ok(p)
        }
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum ModelCmd {
    /// Simulate one run and print what it measured.
    Run(RunArgs),
    /// Fit a wirelane parameter set from star runs recorded on this machine (the
    /// directories' results.jsonl) plus a probe of the scheduling costs; writes TOML.
    Calibrate {
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        #[arg(long)]
        out: PathBuf,
        /// Take the scheduling costs from this parameter set instead of probing this
        /// machine: to re-fit runs recorded on another machine with that machine's
        /// probe.
        #[arg(long)]
        sched_from: Option<PathBuf>,
    },
    /// Compare the model with held-out lab runs, cell by cell.
    Validate {
        #[arg(long)]
        params: Option<PathBuf>,
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Seed 000's gateway (18 cores, 25 Gbit/s, 25 Mbit/s per client) under the
    /// kernel-like parameters, against the paper's figures.
    Seed000 {
        #[arg(long)]
        params: Option<PathBuf>,
        /// Simulated seconds per point.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// wirelane under each model at 4, 16, 32 and 64 cores, 1,000 and 10,000 peers.
    Predict {
        #[arg(long)]
        params: Option<PathBuf>,
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Parameter set (TOML); default: wirelane's, or with --kernel the seed-000 set.
    #[arg(long)]
    pub params: Option<PathBuf>,
    #[arg(long, conflicts_with = "params")]
    pub kernel: bool,
    #[arg(long, default_value = "workqueue")]
    pub model: Model,
    /// Crypt workers (default: one per core).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Cores (default: the parameter set's).
    #[arg(long)]
    pub cores: Option<usize>,
    /// Reader threads (default: the parameter set's; wirelane has one per socket and,
    /// on transmit, one per worker, so more on receive is a what-if: SO_REUSEPORT
    /// sockets). Given, it holds in both directions.
    #[arg(long)]
    pub readers: Option<usize>,
    #[arg(long, default_value_t = 1000)]
    pub peers: usize,
    #[arg(long, default_value = "rx")]
    pub direction: Direction,
    #[arg(long, default_value_t = 8.0)]
    pub offered_gbit: f64,
    #[arg(long, default_value_t = 1420)]
    pub size: usize,
    #[arg(long, default_value_t = 8)]
    pub burst: usize,
    #[arg(long)]
    pub poisson: bool,
    /// Window-limited (TCP-like) peers with this round trip outside the gateway, µs.
    #[arg(long)]
    pub tcp_rtt_us: Option<f64>,
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    #[arg(long, default_value_t = 0.2)]
    pub warmup: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the whole outcome as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run_cli(cmd: &ModelCmd) -> Result<()> {
    match cmd {
        ModelCmd::Run(a) => run_one(a),
        ModelCmd::Calibrate {
            dirs,
            out,
            sched_from,
        } => calibrate_cli(dirs, out, sched_from.as_deref()),
        ModelCmd::Validate { params, dirs, out } => {
            validate_cli(params.as_deref(), dirs, out.as_deref())
        }
        ModelCmd::Seed000 {
            params,
            seconds,
            out,
        } => super::studies::seed000_cli(params.as_deref(), *seconds, out.as_deref()),
        ModelCmd::Predict {
            params,
            seconds,
            out,
        } => super::studies::predict_cli(params.as_deref(), *seconds, out.as_deref()),
    }
}

fn run_one(a: &RunArgs) -> Result<()> {
    let builtin = if a.kernel {
        KERNEL_PARAMS
    } else {
        WIRELANE_PARAMS
    };
    let mut p = params_or(a.params.as_deref(), builtin)?;
    if let Some(c) = a.cores {
        p.platform.cores = c;
    }
    if let Some(r) = a.readers {
        if !(1..=1024).contains(&r) || p.platform.reader_threads == 0 {
            return Err(
                "--readers must be 1 to 1024, on a parameter set with reader threads".into(),
            );
        }
        p.platform.reader_threads = r;
        p.platform.tun_queue_per_worker = false;
    }
    let sc = Scenario {
        model: a.model,
        workers: a.workers.unwrap_or(p.platform.cores),
        peers: a.peers,
        direction: a.direction,
        size: a.size,
        offered_gbit: a.offered_gbit,
        burst: a.burst,
        poisson: a.poisson,
        tcp_rtt_us: a.tcp_rtt_us,
        seconds: a.seconds,
        warmup_s: a.warmup,
        seed: a.seed,
    };
    let started = std::time::Instant::now();
    let o = simulate(&p, &sc)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&o)?);
        return Ok(());
    }
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{} cores, {} {} workers, {} peers, {}: offered {:.2} Gbit/s, goodput {:.2} Gbit/s, \
         {:.2} CPU-s/GB, {:.1} packets/poll ({:.0}% empty), delay p50/p99/p99.9 {:.0}/{:.0}/{:.0} µs",
        p.platform.cores,
        sc.workers,
        sc.model,
        sc.peers,
        sc.direction.name(),
        o.offered_gbit,
        o.goodput_gbit,
        o.cpu_s_per_gb,
        o.packets_per_poll,
        o.empty_share * 100.0,
        o.latency_p50_us,
        o.latency_p99_us,
        o.latency_p999_us
    );
    println!("core busy: {}", percents(&o.core_busy));
    println!("core busy at high priority: {}", percents(&o.core_high));
    println!(
        "packets per poll by core: {}",
        fixed(&o.core_packets_per_poll, 1)
    );
    println!(
        "drops: line {} host {} socket {} crypt ring {} peer queue {}; {} threads; {} events in {wall:.2} s",
        o.drops.line, o.drops.host, o.drops.socket, o.drops.crypt_ring, o.drops.peer_queue, o.threads, o.sched.events
    );
    Ok(())
}

pub fn percents(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{:.0}%", x * 100.0))
        .collect::<Vec<_>>()
        .join(" ")
}

fn fixed(v: &[f64], digits: usize) -> String {
    v.iter()
        .map(|x| format!("{x:.digits$}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The star runs in `dirs`, in order; a later directory's runs of a cell (model,
/// workers, N, direction, size) replace an earlier one's, so a cell measured again
/// after a change to the daemon needs no copy of the rest.
fn load_observations(dirs: &[PathBuf]) -> Result<(Vec<Observation>, String)> {
    let mut obs: Vec<Observation> = Vec::new();
    let mut cpu = String::new();
    for dir in dirs {
        let sets = crate::report::load_sets(std::slice::from_ref(dir))?;
        let records: Vec<_> = sets.into_values().flatten().collect();
        if cpu.is_empty() {
            cpu = records
                .first()
                .map_or_else(String::new, |r| r.env.cpu_model.clone());
        }
        let newer = calibrate::observations(&records);
        let cell = |o: &Observation| (o.model, o.workers, o.peers, o.direction, o.size);
        obs.retain(|o| !newer.iter().any(|n| cell(n) == cell(o)));
        obs.extend(newer);
    }
    if obs.is_empty() {
        return Err("no wirelane star runs with signatures in these results".into());
    }
    Ok((obs, cpu))
}

fn calibrate_cli(dirs: &[PathBuf], out: &Path, sched_from: Option<&Path>) -> Result<()> {
    let (obs, cpu) = load_observations(dirs)?;
    let (sched, sched_note) = match sched_from {
        Some(p) => (
            Params::load(p)?.sched,
            format!("sched: taken from {}", p.display()),
        ),
        None => (
            probe::measure()?,
            "sched: measured by the probe (model/probe.rs) on the same machine".into(),
        ),
    };
    let mut provenance = vec![
        format!(
            "Fitted by `wirelane-lab model calibrate` on {}",
            crate::record::now_rfc3339()
        ),
        format!("CPU: {cpu}, {} cores", obs[0].cores),
        format!(
            "{} runs from: {}",
            obs.len(),
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        sched_note,
        "fitted net of the scheduling overhead the model charges in each cell, in rounds; \
         fixed: reader_batch_ns, crypt_packet_ns and serial_batch_ns are 0 (their sums are \
         in reader_packet_ns, serial_packet_ns and crypt_item_ns); host_packet_ns is 0 (the \
         host's delivery is charged to the generator's threads); background_share is the \
         median share of the cores the saturated daemon did not use"
            .into(),
    ];
    provenance.push(format!(
        "cells: {}",
        obs.iter()
            .map(|o| format!(
                "{}/{} N={} {}",
                o.model,
                o.workers,
                o.peers,
                o.direction.name()
            ))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
            .join("; ")
    ));
    let params = calibrate::fit(&obs, sched, provenance, 0.3)?;
    // Printed first: a fit that cannot be written (a missing directory) is not lost.
    let text = params.to_toml()?;
    println!("{text}");
    std::fs::write(out, &text).map_err(|e| format!("{}: {e}", out.display()))?;
    let rows = validate(&params, &obs, 0.5)?;
    print!(
        "In-sample (the calibration's own runs):\n\n{}",
        validation_table(&rows, &cpu)
    );
    println!("written: {}", out.display());
    Ok(())
}

/// One validation row: the cell, the lab's medians, the model's figures, the errors.
pub struct Row {
    pub key: CellKey,
    pub cell: String,
    pub lab: (f64, f64, f64),
    pub model: (f64, f64, f64),
    /// Busiest minus idlest core: the lab's median, the model's.
    pub spread: (f64, f64),
    pub runs: usize,
}

impl Row {
    pub fn errors(&self) -> (f64, f64, f64) {
        let e = |m: f64, l: f64| (m / l - 1.0) * 100.0;
        (
            e(self.model.0, self.lab.0),
            e(self.model.1, self.lab.1),
            e(self.model.2, self.lab.2),
        )
    }
}

/// A validation cell: model, workers, peers, direction.
pub type CellKey = (String, usize, usize, Direction);

/// Simulates every cell of `obs` and sets the model's figures beside the medians of
/// the lab's runs in that cell.
pub fn validate(params: &Params, obs: &[Observation], seconds: f64) -> Result<Vec<Row>> {
    let mut cells: std::collections::BTreeMap<CellKey, Vec<&Observation>> = Default::default();
    for o in obs {
        let key = (o.model.to_string(), o.workers, o.peers, o.direction);
        cells.entry(key).or_default().push(o);
    }
    let mut rows = Vec::new();
    for (key, runs) in cells {
        let (model, workers, peers, dir) = key.clone();
        let col = |f: fn(&Observation) -> f64| {
            crate::stats::median(&runs.iter().map(|o| f(o)).collect::<Vec<_>>()).unwrap_or(f64::NAN)
        };
        let mut p = params.clone();
        p.platform.cores = runs[0].cores;
        let out: Outcome = simulate(&p, &lab_scenario(runs[0], seconds))?;
        rows.push(Row {
            key,
            spread: (col(|o| o.spread), out.spread),
            cell: format!("{model}/{workers} N={peers} {}", dir.name()),
            lab: (
                col(|o| o.goodput_gbit),
                col(|o| o.cpu_s_per_gb),
                col(|o| o.packets_per_poll()),
            ),
            model: (out.goodput_gbit, out.cpu_s_per_gb, out.packets_per_poll),
            runs: runs.len(),
        });
    }
    Ok(rows)
}

pub fn validation_table(rows: &[Row], cpu: &str) -> String {
    let mut s = format!(
        "Validation against held-out lab runs (CPU: {cpu}; lab figures are medians of the runs \
         shown; error = model / lab − 1)\n\n\
         | cell | runs | goodput lab | model | err | CPU-s/GB lab | model | err | pkts/poll lab | model | err |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut worst = (0.0f64, 0.0f64, 0.0f64);
    for r in rows {
        let (eg, ec, ep) = r.errors();
        worst = (
            worst.0.max(eg.abs()),
            worst.1.max(ec.abs()),
            worst.2.max(ep.abs()),
        );
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {:.2} | {:+.0}% | {:.2} | {:.2} | {:+.0}% | {:.1} | {:.1} | {:+.0}% |",
            r.cell, r.runs, r.lab.0, r.model.0, eg, r.lab.1, r.model.1, ec, r.lab.2, r.model.2, ep
        );
    }
    let within = |limit: f64, i: usize| {
        rows.iter()
            .filter(|r| {
                let e = r.errors();
                [e.0, e.1, e.2][i].abs() <= limit
            })
            .count()
    };
    let _ = writeln!(
        s,
        "\nWithin bounds: goodput {}/{} (±15%), CPU per GB {}/{} (±15%), packets per poll {}/{} (±25%). \
         Worst errors: {:.0}%, {:.0}%, {:.0}%.",
        within(15.0, 0),
        rows.len(),
        within(15.0, 1),
        rows.len(),
        within(25.0, 2),
        rows.len(),
        worst.0,
        worst.1,
        worst.2
    );
    s
}

fn validate_cli(params: Option<&Path>, dirs: &[PathBuf], out: Option<&Path>) -> Result<()> {
    let p = params_or(params, WIRELANE_PARAMS)?;
    let (obs, cpu) = load_observations(dirs)?;
    let rows = validate(&p, &obs, 0.5)?;
    let table = validation_table(&rows, &cpu);
    print!("{table}");
    if let Some(dir) = out {
        let named = |e: std::io::Error| format!("{}: {e}", dir.display());
        std::fs::create_dir_all(dir).map_err(named)?;
        std::fs::write(dir.join("validation.md"), &table).map_err(named)?;
        std::fs::write(dir.join("validation.html"), validation_charts(&rows, &cpu))
            .map_err(named)?;
    }
    Ok(())
}

/// The model's curves beside the lab's medians against N, per direction and model:
/// goodput, packets per poll, and the busiest-minus-idlest core spread.
pub fn validation_charts(rows: &[Row], cpu: &str) -> String {
    type Figure = fn(&Row) -> ((f64, f64), &'static str);
    let figures: [(&str, Figure); 3] = [
        ("goodput", |r| ((r.lab.0, r.model.0), "Gbit/s")),
        ("packets per poll", |r| ((r.lab.2, r.model.2), "packets")),
        ("core spread", |r| (r.spread, "busiest − idlest")),
    ];
    let mut out = format!(
        "<!doctype html><meta charset=utf-8><title>model against the lab</title>\
         <body><p>Model (lines marked model) against the lab's medians (marked lab), {cpu}.</p>"
    );
    let mut groups: Vec<(String, Direction)> =
        rows.iter().map(|r| (r.key.0.clone(), r.key.3)).collect();
    groups.dedup();
    groups.sort();
    groups.dedup();
    for (model, dir) in groups {
        out.push_str(&format!("<h2>{model}, {}</h2><div>", dir.name()));
        for (what, f) in figures {
            let mut series: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
            let mut unit = "";
            for r in rows.iter().filter(|r| r.key.0 == model && r.key.3 == dir) {
                let ((lab, sim), u) = f(r);
                unit = u;
                for (who, v) in [("lab", lab), ("model", sim)] {
                    let name = format!("{} workers, {who}", r.key.1);
                    match series.iter_mut().find(|s| s.0 == name) {
                        Some(s) => s.1.push((r.key.2, v)),
                        None => series.push((name, vec![(r.key.2, v)])),
                    }
                }
            }
            out.push_str(&crate::star::report::line_chart(
                &format!("{what} against N"),
                unit,
                &series,
            ));
        }
        out.push_str("</div>");
    }
    out
}
