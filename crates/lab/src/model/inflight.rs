//! The bound on packets between the reader and the serial stage: the daemon's own
//! interface budget (`wirelane_dataplane::budget::QueueBudget`), so that the model
//! sizes it exactly as the daemon does. Flow: the reader adds what it queues, the
//! serial stage drains what it delivers, and the reader waits while no room is left.
//!
//! Simulated time drives the budget's clock: the daemon's timer thread re-sizes it
//! every `loops::TIMER_TICK`, and here each look at the bound first catches up on the
//! ticks that passed. Invariant: ticks are taken in order, each once, at its own
//! simulated instant, so a run is deterministic.

use super::engine::Ns;
use super::params::Platform;
use std::time::{Duration, Instant};
use wirelane_dataplane::budget::QueueBudget;
use wirelane_dataplane::loops::TIMER_TICK;

pub(super) struct Inflight {
    /// None: the platform has no such bound (the kernel drops at a full ring).
    budget: Option<QueueBudget>,
    /// The instant simulated time 0 stands for.
    epoch: Instant,
    /// The next tick's simulated time.
    next_tick: Ns,
}

impl Inflight {
    pub(super) fn new(p: &Platform) -> Inflight {
        let budget = match (p.inflight_packets, p.inflight_target_us) {
            (0, _) => None,
            (max, t) if t > 0.0 => Some(QueueBudget::sized_by_drain(
                p.inflight_min_packets,
                max,
                Duration::from_secs_f64(t / 1e6),
            )),
            (max, _) => Some(QueueBudget::new(max)),
        };
        let epoch = Instant::now();
        if let Some(b) = &budget {
            b.resize(epoch);
        }
        Inflight {
            budget,
            epoch,
            next_tick: TIMER_TICK.as_nanos() as Ns,
        }
    }

    /// The reader queued `n` packets.
    pub(super) fn add(&self, n: usize) {
        if let Some(b) = &self.budget {
            b.add(n);
        }
    }

    /// The serial stage delivered `n` packets.
    pub(super) fn drain(&self, n: usize) {
        if let Some(b) = &self.budget {
            b.drain(n);
        }
    }

    /// Whether the reader must wait at `now`, after the ticks up to it.
    pub(super) fn full(&mut self, now: Ns) -> bool {
        let Some(b) = &self.budget else { return false };
        while self.next_tick <= now {
            b.resize(self.epoch + Duration::from_nanos(self.next_tick));
            self.next_tick += TIMER_TICK.as_nanos() as Ns;
        }
        b.room() == 0
    }
}
