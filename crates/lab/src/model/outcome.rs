//! What a simulation reports, over its measured interval (after the warm-up): the same
//! figures the lab records for a daemon, so that the two compare line by line.

use super::engine::{Role, SchedCounts, Sim};
use super::pipeline::{Drops, Signature};
use serde::Serialize;

/// CPU seconds by what ran.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RoleBusy {
    /// The host's softirq (delivery; the whole reader stage on the kernel platform).
    pub host_s: f64,
    pub reader_s: f64,
    /// Crypt workers (and, under `workqueue`, the serial stages they run).
    pub worker_s: f64,
    /// Serial threads (`threaded`) and pollers (`softirq`).
    pub serial_s: f64,
    pub background_s: f64,
    /// Of the reader's CPU, and of the workers', serial threads' and pollers', what
    /// scheduling cost (switches, migrations, wake-ups, preemptions, spinning).
    pub reader_overhead_s: f64,
    pub stages_overhead_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub seconds: f64,
    pub offered_gbit: f64,
    pub goodput_gbit: f64,
    pub delivered_pps: f64,
    /// The daemon's CPU (readers, workers, serial threads, pollers) per GB delivered;
    /// on the kernel platform, all of WireGuard's including its softirq.
    pub cpu_s_per_gb: f64,
    pub core_busy: Vec<f64>,
    /// Each core's share spent at high priority (softirq, pollers).
    pub core_high: Vec<f64>,
    /// Busiest minus idlest core.
    pub spread: f64,
    pub packets_per_poll: f64,
    pub core_packets_per_poll: Vec<f64>,
    pub empty_share: f64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    pub latency_p999_us: f64,
    /// Mean wait in the host queue before the poll, µs.
    pub host_wait_mean_us: f64,
    pub drops: Drops,
    pub signature: Signature,
    pub busy: RoleBusy,
    pub threads: usize,
    pub sched: SchedCounts,
}

pub fn gather(sim: &Sim) -> Outcome {
    let seconds = (sim.end - sim.warmup) as f64 / 1e9;
    let size = sim.scenario.size as f64;
    let pipe = &sim.pipe;
    let bits = |packets: u64| packets as f64 * size * 8.0 / seconds / 1e9;
    let mut busy = RoleBusy::default();
    for c in &sim.ctxs {
        let s = c.busy_ns as f64 / 1e9;
        let o = c.overhead_ns as f64 / 1e9;
        match c.role {
            Role::Reader(_) => busy.reader_overhead_s += o,
            Role::Worker(_) | Role::Poller(_) | Role::SerialThread(_) => {
                busy.stages_overhead_s += o
            }
            _ => {}
        }
        match c.role {
            Role::Softirq(_) => busy.host_s += s,
            Role::Reader(_) => busy.reader_s += s,
            Role::Worker(_) => busy.worker_s += s,
            Role::Poller(_) | Role::SerialThread(_) => busy.serial_s += s,
            Role::Background(_) => busy.background_s += s,
        }
    }
    let kernel = sim.params.platform.reader_threads == 0;
    let daemon_s =
        busy.reader_s + busy.worker_s + busy.serial_s + if kernel { busy.host_s } else { 0.0 };
    let gb = pipe.delivered as f64 * size / 1e9;
    let window = seconds * 1e9;
    let core_busy: Vec<f64> = sim
        .cores
        .iter()
        .map(|c| (c.busy_high_ns + c.busy_normal_ns) as f64 / window)
        .collect();
    let core_high: Vec<f64> = sim
        .cores
        .iter()
        .map(|c| c.busy_high_ns as f64 / window)
        .collect();
    let spread = crate::cpu::spread(&core_busy).unwrap_or(0.0);
    let (cores_then, sig_then) = sim
        .at_warmup
        .clone()
        .unwrap_or_else(|| (vec![(0, 0); sim.cores.len()], Default::default()));
    let sig = &pipe.sig.since(&sig_then);
    let q = |p: f64| sim.latency.quantile(p) as f64 / 1e3;
    Outcome {
        seconds,
        offered_gbit: bits(pipe.offered),
        goodput_gbit: bits(pipe.delivered),
        delivered_pps: pipe.delivered as f64 / seconds,
        cpu_s_per_gb: if gb > 0.0 { daemon_s / gb } else { 0.0 },
        core_busy,
        core_high,
        spread,
        packets_per_poll: sig.packets as f64 / sig.invocations.max(1) as f64,
        core_packets_per_poll: sim
            .cores
            .iter()
            .zip(&cores_then)
            .map(|(c, t)| (c.serial_packets - t.1) as f64 / (c.invocations - t.0).max(1) as f64)
            .collect(),
        empty_share: sig.empty_polls as f64 / sig.invocations.max(1) as f64,
        latency_p50_us: q(0.5),
        latency_p99_us: q(0.99),
        latency_p999_us: q(0.999),
        host_wait_mean_us: pipe.host_wait.mean() / 1e3,
        drops: pipe.drops.clone(),
        signature: sig.clone(),
        busy,
        threads: pipe.reader_ctx.len()
            + pipe.worker_ctx.len()
            + pipe.thread_ctx.len()
            + pipe.poller_ctx.len(),
        sched: sim.counts.clone(),
    }
}
