//! When each burst of a paced send really left. The sink measures a packet's one-way
//! delay from its scheduled send time, which the packet carries (fixed when it was
//! sealed, before the phase), and also from the moment its burst left, read here: the
//! difference is the generator's own lateness, which must never be charged to the
//! gateway under test. A generator that falls behind (a slow phase of the host, or
//! kernel receive work done inside its sends) would otherwise show up as gateway delay.
//!
//! Races: the sender stores a burst's time just before the send call that carries it;
//! the sink loads it after receiving one of its packets. The two system calls between
//! them order the store before the load; the Release/Acquire pair says so in the
//! language's model too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// One sender's log: `at[j]` is when burst j left, ns after the phase start (0: not
/// yet). Burst j's packets carry `j * interval_ns` as their scheduled time.
#[derive(Debug)]
pub struct SendLog {
    interval_ns: u64,
    at: Vec<AtomicU64>,
}

/// The logs of a receive run's two senders, set by the generator once it has sealed
/// (the sink starts before it knows the schedule): the heavy peers' and the light ones'.
#[derive(Debug, Default)]
pub struct SendLogs {
    pub heavy: OnceLock<SendLog>,
    pub light: OnceLock<SendLog>,
}

impl SendLog {
    /// For `bursts` bursts scheduled `interval_ns` apart; None when unpaced (no
    /// schedule, so no delay is measured).
    pub fn new(interval_ns: u64, bursts: usize) -> Option<SendLog> {
        (interval_ns > 0).then(|| SendLog {
            interval_ns,
            at: (0..bursts).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Burst `j` leaves `ns` after the phase start.
    pub fn record(&self, j: usize, ns: u64) {
        if let Some(a) = self.at.get(j) {
            a.store(ns.max(1), Ordering::Release);
        }
    }

    /// When the burst of a packet scheduled `scheduled_ns` after the phase start
    /// left, ns after it; None if that burst is unknown or not recorded.
    pub fn sent_ns(&self, scheduled_ns: u64) -> Option<u64> {
        let j = usize::try_from(scheduled_ns / self.interval_ns).ok()?;
        let ns = self.at.get(j)?.load(Ordering::Acquire);
        (ns > 0).then_some(ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet of burst 3 (scheduled 3 ms in), whose burst left 5 ms late, is looked
    /// up by its scheduled time; a burst not sent yet, and one past the log, are None.
    #[test]
    fn a_burst_is_found_by_its_scheduled_time() {
        assert!(SendLog::new(0, 10).is_none(), "unpaced: no log");
        let log = SendLog::new(1_000_000, 10).unwrap();
        log.record(3, 8_000_000);
        assert_eq!(log.sent_ns(3_000_000), Some(8_000_000));
        assert_eq!(log.sent_ns(4_000_000), None);
        assert_eq!(log.sent_ns(50_000_000), None);
        log.record(0, 0);
        assert_eq!(
            log.sent_ns(0),
            Some(1),
            "sent at the start still counts as sent"
        );
    }
}
