//! Calibration: a wirelane parameter set fitted from the lab's `star:N` runs of wirelane
//! on this machine. Flow: records → one `Observation` per run (thread CPU by role,
//! the serial stage's counters, the AEAD floor) → per direction, a least-squares fit of
//! the CPU per packet against items and invocations per packet → `Params`.
//!
//! What the runs can tell apart, and so what is fitted (the rest is fixed and said so
//! in the provenance):
//! - the reader's cost per packet (its thread's CPU over packets; the daemon does not
//!   count read calls, so nothing per batch);
//! - the AEAD's cost per byte: the floor measured in the same runs;
//! - of the crypt and serial stages, three sums: per packet beyond the AEAD, per
//!   item, per invocation. Runs at different peer counts and models vary items and
//!   invocations per packet widely (64 packets per invocation at one peer, one at a
//!   thousand), which separates the three. The per-packet sum is charged to the serial
//!   stage (the TUN write or the UDP send, a system call per packet or run), the
//!   per-item sum to the crypt stage.
//! - the share of the cores that other work takes (the generator, the sink, the
//!   kernel's delivery, which is charged to their threads here).

use super::params::{Direction, Params, Platform, Pool, QueueFull, SchedCosts, StageCosts};
use super::{Outcome, Scenario};
use crate::impls::Impl;
use crate::record::RunRecord;
use crate::star::Way;
use crate::Result;
use wirelane_dataplane::exec::Model;

/// One wirelane star run, reduced to what the model needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub model: Model,
    pub workers: usize,
    pub cores: usize,
    pub peers: usize,
    pub direction: Direction,
    pub size: usize,
    /// Offered load, Gbit/s; None: unlimited.
    pub offered_gbit: Option<f64>,
    pub seconds: f64,
    pub goodput_gbit: f64,
    pub cpu_s_per_gb: f64,
    /// Serial-stage packets, items (batches) and invocations.
    pub packets: u64,
    pub batches: u64,
    pub invocations: u64,
    /// Of the invocations, transmit flushes run inside a reader's plug, and the sends
    /// the plugs made (0 and 0 in records from before the daemon counted them).
    pub plugged: u64,
    pub plug_sends: u64,
    pub reader_s: f64,
    /// Workers and serial threads or pollers: the crypt and serial stages.
    pub stages_s: f64,
    pub aead_floor_s_per_gb: f64,
    /// Busiest core's busy share minus the idlest's.
    pub spread: f64,
    /// Share of each core the daemon did not get (other work, and time the machine
    /// left idle although the daemon was saturated).
    pub background_share: f64,
}

impl Observation {
    pub fn packets_per_poll(&self) -> f64 {
        self.packets as f64 / self.invocations.max(1) as f64
    }

    /// The serial stage's send calls (transmit) or invocations (receive): a plugged
    /// flush adds its datagrams to its plug's one send.
    pub fn serial_calls(&self) -> u64 {
        (self.invocations + self.plug_sends).saturating_sub(self.plugged)
    }
}

/// The wirelane star runs among `records` that carry signatures; the rest are skipped.
pub fn observations(records: &[RunRecord]) -> Vec<Observation> {
    records.iter().filter_map(observe).collect()
}

fn observe(r: &RunRecord) -> Option<Observation> {
    let star = r.star.as_ref()?;
    let spec = star.spec.as_ref()?;
    let sig = star.signatures.as_ref()?;
    // The model simulates one interface: runs over several tunnels are not its inputs.
    if r.error.is_some() || star.error.is_some() || sig.packets == 0 || spec.tunnels > 1 {
        return None;
    }
    let Ok(Impl::Wirelane(fl)) = r.implementation.parse::<Impl>() else {
        return None;
    };
    let cores = r.env.cores.max(1);
    let (mut reader_s, mut stages_s) = (0.0, 0.0);
    for t in &sig.threads {
        let n = t.name.as_str();
        if n.starts_with("wl-tun") || (n.starts_with("wl-udp") && n.contains("-read")) {
            reader_s += t.busy_s;
        } else if ["wl-worker-", "wl-crypt-", "wl-poll-", "wl-peer-"]
            .iter()
            .any(|p| n.starts_with(p))
        {
            stages_s += t.busy_s;
        }
    }
    // Saturated runs: whatever share of the cores the daemon did not use, it could not
    // get (other work, or time the machine idled while the daemon's threads waited).
    let background = (1.0 - star.daemon_cpu_s / (cores as f64 * star.seconds)).max(0.0);
    Some(Observation {
        model: fl.model.unwrap_or(Model::Workqueue),
        workers: fl.workers.map_or(cores, usize::from),
        cores,
        peers: spec.peers,
        direction: match spec.way {
            Way::Rx => Direction::Rx,
            Way::Tx => Direction::Tx,
        },
        size: spec.size,
        offered_gbit: spec
            .offered_pps
            .map(|pps| pps * spec.size as f64 * 8.0 / 1e9),
        seconds: star.seconds,
        goodput_gbit: star.goodput_bps / 1e9,
        cpu_s_per_gb: star.cpu_s_per_gb.unwrap_or(0.0),
        packets: sig.packets,
        batches: sig.batches,
        invocations: sig.invocations,
        plugged: sig.plugged,
        plug_sends: sig.plug_sends,
        reader_s,
        stages_s,
        aead_floor_s_per_gb: star.aead_floor_s_per_gb,
        spread: crate::cpu::spread(&star.core_busy).unwrap_or(0.0),
        background_share: background.min(0.9),
    })
}

/// The same reduction of a simulated run: what the synthetic calibration test feeds in.
pub fn observe_outcome(sc: &Scenario, cores: usize, floor: f64, o: &Outcome) -> Observation {
    Observation {
        model: sc.model,
        workers: sc.workers,
        cores,
        peers: sc.peers,
        direction: sc.direction,
        size: sc.size,
        offered_gbit: Some(sc.offered_gbit),
        seconds: o.seconds,
        goodput_gbit: o.goodput_gbit,
        cpu_s_per_gb: o.cpu_s_per_gb,
        packets: o.signature.packets,
        batches: o.signature.batches,
        invocations: o.signature.invocations,
        plugged: o.signature.plugged,
        plug_sends: o.signature.plug_sends,
        reader_s: o.busy.reader_s,
        stages_s: o.busy.worker_s + o.busy.serial_s,
        aead_floor_s_per_gb: floor,
        spread: o.spread,
        background_share: 1.0
            - (o.busy.reader_s + o.busy.worker_s + o.busy.serial_s) / (cores as f64 * o.seconds),
    }
}

/// The median, 0 for no values.
fn median(v: Vec<f64>) -> f64 {
    crate::stats::median(&v).unwrap_or(0.0)
}

/// Columns a fit may use, per packet: crypt items, serial invocations, send calls.
pub const COLUMNS: usize = 3;

/// One run for a fit: its cost per packet and its [`COLUMNS`] per packet.
pub type Row = (f64, [f64; COLUMNS]);

/// Weighted least squares of y = a + Σ bₖ·xₖ over the columns `use_x` selects (an
/// unused column's coefficient is 0), by Gaussian elimination on the normal equations;
/// row i counts `weights[i]` times. Returns [a, b₁, …]; None when a selected column
/// does not vary or the system is singular.
pub fn least_squares(
    rows: &[Row],
    weights: &[f64],
    use_x: [bool; COLUMNS],
) -> Option<[f64; COLUMNS + 1]> {
    let cols: Vec<usize> = std::iter::once(0)
        .chain((1..=COLUMNS).filter(|&k| use_x[k - 1]))
        .collect();
    let x = |r: &Row, k: usize| if k == 0 { 1.0 } else { r.1[k - 1] };
    for &k in &cols[1..] {
        let mean = rows.iter().map(|r| x(r, k)).sum::<f64>() / rows.len().max(1) as f64;
        let var =
            rows.iter().map(|r| (x(r, k) - mean).powi(2)).sum::<f64>() / rows.len().max(1) as f64;
        // A column that barely varies cannot be told from the intercept.
        if var <= (0.05 * mean).powi(2) || var == 0.0 {
            return None;
        }
    }
    let n = cols.len();
    let mut m = vec![vec![0.0f64; n + 1]; n];
    for (r, w) in rows.iter().zip(weights) {
        for (i, &ki) in cols.iter().enumerate() {
            for (j, &kj) in cols.iter().enumerate() {
                m[i][j] += w * x(r, ki) * x(r, kj);
            }
            m[i][n] += w * x(r, ki) * r.0;
        }
    }
    for i in 0..n {
        let pivot = (i..n).max_by(|&a, &b| m[a][i].abs().total_cmp(&m[b][i].abs()))?;
        m.swap(i, pivot);
        if m[i][i].abs() < 1e-12 {
            return None;
        }
        let pivot_row = m[i].clone();
        for (j, row) in m.iter_mut().enumerate() {
            if j != i {
                let f = row[i] / pivot_row[i];
                for (x, p) in row.iter_mut().zip(&pivot_row).skip(i) {
                    *x -= f * p;
                }
            }
        }
    }
    let mut out = [0.0; COLUMNS + 1];
    for (i, &k) in cols.iter().enumerate() {
        out[k] = m[i][n] / m[i][i];
    }
    Some(out)
}

/// The weighted sum of squared residuals of `c` over `rows`.
fn residual(rows: &[Row], weights: &[f64], c: &[f64; COLUMNS + 1]) -> f64 {
    rows.iter()
        .zip(weights)
        .map(|(r, w)| {
            let fitted = c[0] + r.1.iter().zip(&c[1..]).map(|(x, b)| x * b).sum::<f64>();
            w * (r.0 - fitted).powi(2)
        })
        .sum()
}

/// The least-squares fit with the most columns whose coefficients are all ≥ 0 (a
/// negative cost is a sign that the runs cannot tell two terms apart); of the fits
/// with that many columns, the one that leaves the smaller residual. Taking the
/// per-item column whenever it was not negative charged transmit's per-send cost to
/// every item: at 300 peers items are one packet each while a flush sends one to
/// three, and the runs fit per-invocation costs better.
pub fn fit_nonneg(rows: &[Row], weights: &[f64]) -> [f64; COLUMNS + 1] {
    let nonneg =
        |use_x| least_squares(rows, weights, use_x).filter(|c| c.iter().all(|v| *v >= 0.0));
    let subsets = |k: u32| {
        (1u32..1 << COLUMNS)
            .filter(move |m| m.count_ones() == k)
            .map(|m| std::array::from_fn(|i| m & (1 << i) != 0))
    };
    for k in (1..=COLUMNS as u32).rev() {
        let best = subsets(k)
            .filter_map(nonneg)
            .min_by(|a, b| residual(rows, weights, a).total_cmp(&residual(rows, weights, b)));
        if let Some(c) = best {
            return c;
        }
    }
    let mean = rows.iter().map(|r| r.0).sum::<f64>() / rows.len().max(1) as f64;
    let mut c = [0.0; COLUMNS + 1];
    c[0] = mean.max(0.0);
    c
}

/// What the simulation charged to scheduling in an observation's cell, ns per packet:
/// on the reader, and on all the daemon's threads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Overhead {
    pub reader: f64,
    pub total: f64,
}

/// Fits one direction's stage costs from its observations, net of the scheduling
/// overhead the simulation charges in each (`overheads`, same order).
pub fn fit_direction(obs: &[(&Observation, Overhead)]) -> Result<StageCosts> {
    if obs.len() < 3 {
        return Err(format!(
            "{} runs: at least 3 are needed to fit a direction",
            obs.len()
        )
        .into());
    }
    let byte_ns = median(obs.iter().map(|(o, _)| o.aead_floor_s_per_gb).collect());
    let per = |o: &Observation, v: f64| v / o.packets as f64;
    // Each run weighs by the inverse square of its whole CPU per packet, so the fit
    // minimises relative errors, as the validation judges them: in absolute terms the
    // runs that cost most per packet (a thousand serial threads) would set the costs
    // of every other.
    let weight = |o: &Observation| per(o, (o.reader_s + o.stages_s) * 1e9).max(1.0).powi(-2);
    // The reader's own cost, from runs where it ran no items itself (the idle
    // shortcut runs only small items: transmit under `workqueue`).
    let plain: Vec<_> = obs
        .iter()
        .filter(|(o, _)| !(o.model == Model::Workqueue && o.direction == Direction::Tx))
        .collect();
    let reader_obs = if plain.len() >= 3 {
        plain
    } else {
        obs.iter().collect()
    };
    let reader_rows: Vec<Row> = reader_obs
        .iter()
        .map(|(o, ov)| {
            let items = per(o, o.batches as f64);
            (per(o, o.reader_s * 1e9) - ov.reader, [items, 0.0, 0.0])
        })
        .collect();
    let reader_weights: Vec<f64> = reader_obs.iter().map(|(o, _)| weight(o)).collect();
    let [reader_packet_ns, reader_item_ns, ..] = fit_nonneg(&reader_rows, &reader_weights);
    // Send calls apart from invocations only where the readers' plugs made them differ
    // (transmit); elsewhere the column is left out, as one that does not vary is.
    let plugs = obs.iter().any(|(o, _)| o.plugged > 0);
    let rows: Vec<Row> = obs
        .iter()
        .map(|(o, ov)| {
            let items = per(o, o.batches as f64);
            let y = per(o, (o.reader_s + o.stages_s) * 1e9)
                - ov.total
                - o.size as f64 * byte_ns
                - reader_packet_ns
                - reader_item_ns * items;
            let invocations = per(o, o.invocations as f64);
            let sends = if plugs {
                per(o, o.serial_calls() as f64)
            } else {
                0.0
            };
            (y, [items, invocations, sends])
        })
        .collect();
    let weights: Vec<f64> = obs.iter().map(|(o, _)| weight(o)).collect();
    let [per_packet, per_item, per_invocation, per_send] = fit_nonneg(&rows, &weights);
    let background = median(obs.iter().map(|(o, _)| o.background_share).collect());
    Ok(StageCosts {
        background_share: background.min(0.9),
        host_packet_ns: 0.0,
        reader_batch_ns: 0.0,
        reader_packet_ns,
        reader_item_ns,
        crypt_item_ns: per_item,
        crypt_packet_ns: 0.0,
        crypt_byte_ns: byte_ns,
        serial_invocation_ns: per_invocation,
        serial_batch_ns: 0.0,
        serial_packet_ns: per_packet,
        serial_send_ns: per_send,
    })
}

/// wirelane's fixed arrangement (the daemon's constants), on `cores` cores.
pub fn wirelane_platform(cores: usize) -> Platform {
    use wirelane_dataplane::budget;
    Platform {
        cores,
        pool: Pool::Shared,
        reader_threads: 1,
        tun_queue_per_worker: true,
        group_by_peer: true,
        reader_batch: wirelane_dataplane::packet::MAX_BATCH,
        rx_item_packets: wirelane_dataplane::packet::RX_BATCH_MAX,
        reader_runs: wirelane_dataplane::stages::udp_recv::GRO_RECV_BUFFERS,
        poll_budget: wirelane_dataplane::exec::softirq::NAPI_BUDGET,
        softirq_budget: wirelane_dataplane::exec::softirq::SOFTIRQ_PACKETS,
        host_queue_packets: 1000,
        socket_packets: 4096,
        crypt_ring_packets: 0,
        peer_queue_packets: wirelane_dataplane::queue::MAX_QUEUED_PACKETS,
        tx_peer_queue_packets: wirelane_dataplane::stages::fq::RING_PACKETS,
        tx_ring_limit: true,
        peer_queue_full: QueueFull::Wait,
        inflight_packets: budget::BUDGET_MAX_PACKETS,
        inflight_min_packets: budget::BUDGET_MIN_PACKETS,
        inflight_target_us: budget::BUDGET_TARGET.as_secs_f64() * 1e6,
        serial_threads_max: wirelane_dataplane::exec::threaded::MAX_SERIAL_THREADS,
        rss_skew: 0.0,
        line_gbit: 0.0,
        line_buffer_packets: 0,
    }
}

/// The scenario the lab ran for an observation (`Scenario::star`). Unlimited
/// transmit is offered 20 Gbit/s.
pub fn lab_scenario(o: &Observation, seconds: f64) -> Scenario {
    Scenario {
        size: o.size,
        offered_gbit: o.offered_gbit.unwrap_or(20.0),
        seconds,
        warmup_s: seconds / 5.0,
        ..Scenario::star(o.model, o.workers, o.peers, o.direction)
    }
}

/// Rounds of fitting and re-simulating: the overhead the simulation charges depends
/// on the costs fitted (cheap stages leave threads idle, and idle threads spin and are
/// woken), so each round moves halfway to the new fit, and the rounds settle.
pub const ROUNDS: usize = 8;

fn blend(old: &StageCosts, new: &StageCosts, w: f64) -> StageCosts {
    let m = |a: f64, b: f64| a + w * (b - a);
    StageCosts {
        background_share: new.background_share,
        host_packet_ns: m(old.host_packet_ns, new.host_packet_ns),
        reader_batch_ns: m(old.reader_batch_ns, new.reader_batch_ns),
        reader_packet_ns: m(old.reader_packet_ns, new.reader_packet_ns),
        reader_item_ns: m(old.reader_item_ns, new.reader_item_ns),
        crypt_item_ns: m(old.crypt_item_ns, new.crypt_item_ns),
        crypt_packet_ns: m(old.crypt_packet_ns, new.crypt_packet_ns),
        crypt_byte_ns: m(old.crypt_byte_ns, new.crypt_byte_ns),
        serial_invocation_ns: m(old.serial_invocation_ns, new.serial_invocation_ns),
        serial_batch_ns: m(old.serial_batch_ns, new.serial_batch_ns),
        serial_packet_ns: m(old.serial_packet_ns, new.serial_packet_ns),
        serial_send_ns: m(old.serial_send_ns, new.serial_send_ns),
    }
}

/// A whole parameter set from `obs`, with `sched` measured apart (`probe`): fit the
/// stage costs, simulate every cell to learn its scheduling overhead, fit again net
/// of it, [`ROUNDS`] times. `seconds` is each cell's simulated length.
pub fn fit(
    obs: &[Observation],
    sched: SchedCosts,
    provenance: Vec<String>,
    seconds: f64,
) -> Result<Params> {
    let cores = obs.iter().map(|o| o.cores).max().unwrap_or(1);
    let mut params = Params {
        provenance,
        platform: wirelane_platform(cores),
        sched,
        rx: StageCosts::default(),
        tx: StageCosts::default(),
    };
    let mut overhead = vec![Overhead::default(); obs.len()];
    for round in 0..ROUNDS {
        for dir in [Direction::Rx, Direction::Tx] {
            let mine: Vec<(&Observation, Overhead)> = obs
                .iter()
                .zip(&overhead)
                .filter(|(o, _)| o.direction == dir)
                .map(|(o, ov)| (o, *ov))
                .collect();
            let costs = fit_direction(&mine).map_err(|e| format!("{}: {e}", dir.name()))?;
            let w = if round == 0 { 1.0 } else { 0.5 };
            match dir {
                Direction::Rx => params.rx = blend(&params.rx, &costs, w),
                Direction::Tx => params.tx = blend(&params.tx, &costs, w),
            }
        }
        params.check()?;
        if round + 1 == ROUNDS {
            break;
        }
        let mut cells: std::collections::HashMap<
            (Model, usize, usize, Direction, usize),
            Overhead,
        > = Default::default();
        for (o, ov) in obs.iter().zip(overhead.iter_mut()) {
            let key = (o.model, o.workers, o.peers, o.direction, o.cores);
            if let Some(known) = cells.get(&key) {
                *ov = *known;
                continue;
            }
            let mut p = params.clone();
            p.platform.cores = o.cores;
            let out = super::simulate(&p, &lab_scenario(o, seconds))?;
            let packets = (out.delivered_pps * out.seconds).max(1.0);
            *ov = Overhead {
                reader: out.busy.reader_overhead_s * 1e9 / packets,
                total: (out.busy.reader_overhead_s + out.busy.stages_overhead_s) * 1e9 / packets,
            };
            cells.insert(key, *ov);
        }
    }
    Ok(params)
}
