//! CoDel (RFC 8289) as a per-packet controller: told each dequeued packet's sojourn
//! time, it answers whether to drop (or, for an ECN-capable packet, mark) that packet.
//! The queue itself is the caller's: a flow bucket of the transmit side's FQ-CoDel
//! (`fq_codel`), or, on the receive side, the socket buffer and the pipeline behind it,
//! whose sojourn starts at the kernel's arrival timestamp (`stages::rx_deliver`).
//!
//! Per packet, the rule is the RFC's dequeue loop unrolled: once the sojourn has stayed
//! above `target` for an `interval`, drop one packet and enter the dropping state; in
//! it, drop again each time the next drop time passes, spacing drops by
//! interval/√count, and leave it at the first packet below target. Time is a
//! caller-given nanosecond clock, so the tests run on a simulated one.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodelParams {
    /// Acceptable standing sojourn, ns.
    pub target: u64,
    /// The window a sojourn above target must persist for before the first drop, and
    /// the base of the drop spacing, ns: on the order of the worst expected RTT.
    pub interval: u64,
    /// Mark ECN-capable packets instead of dropping them.
    pub ecn: bool,
}

impl CodelParams {
    /// RFC 8289's defaults (5 ms, 100 ms): they suit paths of up to a few hundred ms of
    /// RTT, which a tunnel's inner flows may cross.
    pub const RFC: CodelParams = CodelParams::new(Self::RFC_TARGET, Self::RFC_INTERVAL);
    pub const RFC_TARGET: Duration = Duration::from_millis(5);
    pub const RFC_INTERVAL: Duration = Duration::from_millis(100);

    pub const fn new(target: Duration, interval: Duration) -> CodelParams {
        CodelParams {
            target: target.as_nanos() as u64,
            interval: interval.as_nanos() as u64,
            ecn: true,
        }
    }
}

impl Default for CodelParams {
    fn default() -> Self {
        CodelParams::RFC
    }
}

/// One queue's controller state (RFC 8289 §5).
#[derive(Debug, Default, Clone, Copy)]
pub struct Codel {
    /// When the sojourn first went above target, plus an interval; 0 when below.
    first_above: u64,
    drop_next: u64,
    count: u32,
    last_count: u32,
    dropping: bool,
}

impl Codel {
    /// The verdict on one packet leaving the queue at `now` after waiting `sojourn` ns:
    /// true when the controller drops or marks it. `standing` says whether more than
    /// one full packet stays queued behind it (RFC 8289's maxpacket rule: a queue that
    /// small is no standing queue, whatever its age); pass true when unknown.
    pub fn judge(&mut self, p: &CodelParams, now: u64, sojourn: u64, standing: bool) -> bool {
        let ok_to_drop = self.above_for_an_interval(p, now, sojourn, standing);
        if self.dropping {
            if !ok_to_drop {
                self.dropping = false;
                return false;
            }
            if now < self.drop_next {
                return false;
            }
            self.count += 1;
            self.drop_next = control_law(p, self.drop_next, self.count);
            return true;
        }
        if !ok_to_drop {
            return false;
        }
        // Re-entering soon after leaving: resume near the old rate (RFC 8289 §5.4).
        let delta = self.count.saturating_sub(self.last_count);
        self.count = if delta > 1 && now.saturating_sub(self.drop_next) < 16 * p.interval {
            delta
        } else {
            1
        };
        self.dropping = true;
        self.last_count = self.count;
        self.drop_next = control_law(p, now, self.count);
        true
    }

    /// The queue ran empty: nothing stands.
    pub fn on_empty(&mut self) {
        self.first_above = 0;
        self.dropping = false;
    }

    /// Whether this controller, its queue empty, now and from now on acts as a fresh
    /// one would: all an idle controller remembers is the drop count to resume from
    /// (RFC 8289 §5.4), and that lapses 16 intervals after its last drop time or when
    /// the last episode dropped too little to resume from.
    pub fn forgettable(&self, p: &CodelParams, now: u64) -> bool {
        !self.dropping
            && self.first_above == 0
            && (self.count.saturating_sub(self.last_count) <= 1
                || now.saturating_sub(self.drop_next) >= 16 * p.interval)
    }

    /// Whether the controller is in its dropping state.
    pub fn dropping(&self) -> bool {
        self.dropping
    }

    /// RFC 8289's `dodequeue` test: has the sojourn been above target for at least an
    /// interval?
    fn above_for_an_interval(
        &mut self,
        p: &CodelParams,
        now: u64,
        sojourn: u64,
        standing: bool,
    ) -> bool {
        if sojourn < p.target || !standing {
            self.first_above = 0;
            return false;
        }
        if self.first_above == 0 {
            self.first_above = now + p.interval;
            return false;
        }
        now >= self.first_above
    }
}

fn control_law(p: &CodelParams, t: u64, count: u32) -> u64 {
    t + (p.interval as f64 / (count.max(1) as f64).sqrt()) as u64
}
