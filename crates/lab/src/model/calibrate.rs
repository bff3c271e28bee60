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

use super::params::{Direction, Params, Platform, Pool, SchedCosts, StageCosts};
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
    pub reader_s: f64,
    /// Workers and serial threads or pollers: the crypt and serial stages.
    pub stages_s: f64,
    pub aead_floor_s_per_gb: f64,
    /// Share of each core taken by other work.
    pub background_share: f64,
}

impl Observation {
    pub fn packets_per_poll(&self) -> f64 {
        self.packets as f64 / self.invocations.max(1) as f64
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
    if r.error.is_some() || star.error.is_some() || sig.packets == 0 {
        return None;
    }
    let Ok(Impl::Wirelane(fl)) = r.implementation.parse::<Impl>() else {
        return None;
    };
    let cores = r.env.cores.max(1);
    let (mut reader_s, mut stages_s) = (0.0, 0.0);
    for t in &sig.threads {
        let n = t.name.as_str();
        if n.starts_with("wl-tun-") || (n.starts_with("wl-udp") && n.contains("-read-")) {
            reader_s += t.busy_s;
        } else if ["wl-worker-", "wl-crypt-", "wl-poll-", "wl-peer-"]
            .iter()
            .any(|p| n.starts_with(p))
        {
            stages_s += t.busy_s;
        }
    }
    let busy_core_s: f64 = star.core_busy.iter().sum::<f64>() * star.seconds;
    let background = ((busy_core_s - star.daemon_cpu_s) / (cores as f64 * star.seconds)).max(0.0);
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
        reader_s,
        stages_s,
        aead_floor_s_per_gb: star.aead_floor_s_per_gb,
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
        reader_s: o.busy.reader_s,
        stages_s: o.busy.worker_s + o.busy.serial_s,
        aead_floor_s_per_gb: floor,
        background_share: o.busy.background_s / (cores as f64 * o.seconds),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Least squares of y = a + b·x1 + c·x2 (normal equations, Cramer's rule). None when
/// the runs do not vary x1 and x2 independently.
pub fn fit3(rows: &[(f64, f64, f64)]) -> Option<[f64; 3]> {
    let mut m = [[0.0f64; 3]; 3];
    let mut v = [0.0f64; 3];
    for &(y, x1, x2) in rows {
        let x = [1.0, x1, x2];
        for i in 0..3 {
            for j in 0..3 {
                m[i][j] += x[i] * x[j];
            }
            v[i] += x[i] * y;
        }
    }
    let det = |a: &[[f64; 3]; 3]| {
        a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
            - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0])
    };
    let d = det(&m);
    let scale = m[0][0] * m[1][1] * m[2][2];
    if !d.is_finite() || d.abs() <= 1e-12 * scale.abs().max(1e-300) {
        return None;
    }
    let mut out = [0.0; 3];
    for (k, o) in out.iter_mut().enumerate() {
        let mut a = m;
        for i in 0..3 {
            a[i][k] = v[i];
        }
        *o = det(&a) / d;
    }
    Some(out)
}

/// Fits one direction's stage costs from its observations.
pub fn fit_direction(obs: &[&Observation]) -> Result<StageCosts> {
    if obs.len() < 3 {
        return Err(format!(
            "{} runs: at least 3 are needed to fit a direction",
            obs.len()
        )
        .into());
    }
    let byte_ns = median(obs.iter().map(|o| o.aead_floor_s_per_gb).collect());
    let reader_packet_ns = obs.iter().map(|o| o.reader_s).sum::<f64>() * 1e9
        / obs.iter().map(|o| o.packets as f64).sum::<f64>();
    let rows: Vec<(f64, f64, f64)> = obs
        .iter()
        .map(|o| {
            let p = o.packets as f64;
            (
                o.stages_s * 1e9 / p,
                o.batches as f64 / p,
                o.invocations as f64 / p,
            )
        })
        .collect();
    let [per_packet, per_item, per_invocation] = fit3(&rows).ok_or(
        "the runs do not vary items and invocations per packet independently: \
         add runs at other peer counts or models",
    )?;
    let size = median(obs.iter().map(|o| o.size as f64).collect());
    Ok(StageCosts {
        host_packet_ns: 0.0,
        reader_batch_ns: 0.0,
        reader_packet_ns,
        crypt_item_ns: per_item.max(0.0),
        crypt_packet_ns: 0.0,
        crypt_byte_ns: byte_ns,
        serial_invocation_ns: per_invocation.max(0.0),
        serial_batch_ns: 0.0,
        serial_packet_ns: (per_packet - size * byte_ns).max(0.0),
    })
}

/// wirelane's fixed arrangement (the daemon's constants), on `cores` cores.
pub fn wirelane_platform(cores: usize, background_share: f64) -> Platform {
    Platform {
        cores,
        pool: Pool::Shared,
        reader_threads: 1,
        group_by_peer: true,
        reader_batch: wirelane_dataplane::packet::MAX_BATCH,
        poll_budget: wirelane_dataplane::exec::softirq::NAPI_BUDGET,
        softirq_budget: wirelane_dataplane::exec::softirq::SOFTIRQ_PACKETS,
        host_queue_packets: 1000,
        socket_packets: 4096,
        crypt_ring_packets: 0,
        peer_queue_packets: 1024,
        inflight_packets: wirelane_dataplane::budget::RX_BUDGET_PACKETS,
        serial_threads_max: wirelane_dataplane::exec::threaded::MAX_SERIAL_THREADS,
        rss_skew: 0.0,
        line_gbit: 0.0,
        background_share,
    }
}

/// A whole parameter set from `obs`, with `sched` measured apart (`sched_probe`).
pub fn fit(obs: &[Observation], sched: SchedCosts, provenance: Vec<String>) -> Result<Params> {
    let dir = |d| obs.iter().filter(|o| o.direction == d).collect::<Vec<_>>();
    let (rx, tx) = (dir(Direction::Rx), dir(Direction::Tx));
    let cores = obs.iter().map(|o| o.cores).max().unwrap_or(1);
    let background = median(obs.iter().map(|o| o.background_share).collect());
    let params = Params {
        provenance,
        platform: wirelane_platform(cores, background),
        sched,
        rx: fit_direction(&rx).map_err(|e| format!("rx: {e}"))?,
        tx: fit_direction(&tx).map_err(|e| format!("tx: {e}"))?,
    };
    params.check()?;
    Ok(params)
}
