//! `wirelane-lab model`: a discrete-event simulation of the WireGuard pipeline on many
//! cores and many peers (design.md §5, "Beyond one machine's cores"; MODEL.md).
//!
//! - `params`: the platform, per-stage and scheduling costs, as TOML with provenance;
//! - `source`: when peers send (paced or Poisson, open loop or window-limited);
//! - `engine`: cores, contexts and their scheduling, the event loop;
//! - `pipeline`: the pipeline's state, and each context's next step and its effects;
//!   `ingress` the host and the reader stage, `serial` the serial stage and where each
//!   execution model runs it;
//! - `outcome`: what a run reports, in the lab's terms;
//! - `calibrate`: fitting a wirelane parameter set from lab runs, with `probe`
//!   measuring the scheduling costs;
//! - `cli` and `studies`: the subcommands, seed 000's reproduction, the predictions.

pub mod calibrate;
pub mod cli;
mod context;
pub mod engine;
mod inflight;
mod ingress;
pub mod outcome;
pub mod params;
pub mod pipeline;
pub mod probe;
mod serial;
pub mod source;
pub mod studies;

pub use outcome::Outcome;
pub use params::{Direction, Params};

use crate::Result;
use source::{Rng, Schedule};
use wirelane_dataplane::exec::{Model, MAX_WORKERS};

/// Most peers a simulation takes.
pub const MAX_PEERS: usize = 1_000_000;
/// Longest simulated interval, s.
pub const MAX_SECONDS: f64 = 3600.0;

/// One simulated run.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub model: Model,
    /// Crypt workers (the kernel: one per core).
    pub workers: usize,
    pub peers: usize,
    pub direction: Direction,
    /// Inner packet size, bytes.
    pub size: usize,
    /// Offered load over all peers, Gbit/s of inner packets.
    pub offered_gbit: f64,
    /// Packets each send of a peer carries (the star generator's GSO runs; a TCP
    /// sender's segments per TSO burst).
    pub burst: usize,
    /// Poisson arrivals instead of paced ones with random phases.
    pub poisson: bool,
    /// Window-limited (TCP-like) peers with this round-trip time outside the
    /// gateway, µs; None: open loop.
    pub tcp_rtt_us: Option<f64>,
    /// Simulated interval, s, of which the first `warmup_s` are not measured.
    pub seconds: f64,
    pub warmup_s: f64,
    pub seed: u64,
}

impl Scenario {
    /// A saturating open-loop run of `peers` peers, as the lab's star cells send:
    /// on receive each peer's GSO runs of 45 packets (64 KiB of 1,452-byte
    /// datagrams), on transmit packets rotating over the peers.
    pub fn star(model: Model, workers: usize, peers: usize, direction: Direction) -> Scenario {
        Scenario {
            model,
            workers,
            peers,
            direction,
            size: 1420,
            offered_gbit: 8.0,
            burst: match direction {
                Direction::Rx => 45,
                Direction::Tx => 1,
            },
            poisson: false,
            tcp_rtt_us: None,
            seconds: 0.5,
            warmup_s: 0.1,
            seed: 1,
        }
    }

    pub fn check(&self) -> std::result::Result<(), String> {
        if !(1..=MAX_WORKERS).contains(&self.workers) {
            return Err(format!(
                "workers must be 1 to {MAX_WORKERS}, not {}",
                self.workers
            ));
        }
        if !(1..=MAX_PEERS).contains(&self.peers) {
            return Err(format!(
                "peers must be 1 to {MAX_PEERS}, not {}",
                self.peers
            ));
        }
        if !(28..=65_535).contains(&self.size) {
            return Err(format!(
                "packet size must be 28 to 65535 bytes, not {}",
                self.size
            ));
        }
        // Past 10 Tbit/s a run would simulate more arrivals than it could finish.
        if !(self.offered_gbit.is_finite() && self.offered_gbit > 0.0 && self.offered_gbit <= 1e4) {
            return Err("offered load must be more than 0 and at most 10,000 Gbit/s".into());
        }
        if !(1..=1024).contains(&self.burst) {
            return Err(format!(
                "burst must be 1 to 1024 packets, not {}",
                self.burst
            ));
        }
        if let Some(rtt) = self.tcp_rtt_us {
            if !(rtt.is_finite() && rtt > 0.0 && rtt <= 1e7) {
                return Err("the round-trip time must be more than 0 and at most 10 s".into());
            }
        }
        let ok = self.seconds.is_finite()
            && self.warmup_s.is_finite()
            && self.warmup_s >= 0.0
            && self.seconds > self.warmup_s
            && self.seconds <= MAX_SECONDS;
        if !ok {
            return Err(format!(
                "the run must last more than its warm-up and at most {MAX_SECONDS} s"
            ));
        }
        Ok(())
    }
}

/// Runs one simulation.
pub fn simulate(params: &Params, sc: &Scenario) -> Result<Outcome> {
    params.check()?;
    sc.check()?;
    let line = params.platform.line_gbit;
    let offered = if line > 0.0 {
        sc.offered_gbit.min(line)
    } else {
        sc.offered_gbit
    };
    let bursts_per_s = offered * 1e9 / 8.0 / sc.size as f64 / sc.burst as f64;
    let period_ns = 1e9 * sc.peers as f64 / bursts_per_s;
    let mut rng = Rng::new(sc.seed);
    let schedule = Schedule::new(sc.peers, period_ns, sc.poisson, &mut rng);
    Ok(engine::Sim::new(params.clone(), sc.clone(), schedule).run())
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_transmit;
