//! Under-load mode, as the kernel's WireGuard has it: while the handshake lanes are
//! deep, or a flood's rate of cookie replies says one is on, the gate demands a valid
//! mac2 (a cookie) before any Diffie-Hellman work, and rate-limits per source.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bound of the handshake queue (the kernel's MAX_QUEUED_INCOMING_HANDSHAKES).
pub const MAX_QUEUED_HANDSHAKES: usize = 4096;
/// Queue depth from which the interface counts as under load: an eighth of the bound.
pub const UNDER_LOAD_THRESHOLD: usize = MAX_QUEUED_HANDSHAKES / 8;
/// How long under-load mode lasts after the queue drops below the threshold.
pub const UNDER_LOAD_AFTER: Duration = Duration::from_secs(1);

/// Cookie replies counted per window of [`UNDER_LOAD_AFTER`]. While the gate answers
/// at least [`UNDER_LOAD_THRESHOLD`] in a window, each further reply renews under-load
/// mode; so the mode lasts as long as a flood, and ends about [`UNDER_LOAD_AFTER`]
/// after it. A trickle of legitimate mac1-only initiations stays below the rate, and
/// does not keep the mode on by itself.
///
/// Race: two UDP readers may both restart the window, or count into one just ended;
/// either way the rate is misjudged by a reply or two, never by a window.
#[derive(Default)]
pub struct ReplyRate {
    window_start_ns: AtomicU64,
    count: AtomicU64,
}

impl ReplyRate {
    /// Counts one reply made at `now_ns` (monotonic); true when the current window has
    /// reached the threshold.
    pub fn note(&self, now_ns: u64) -> bool {
        let start = self.window_start_ns.load(Ordering::Relaxed);
        if now_ns.saturating_sub(start) >= UNDER_LOAD_AFTER.as_nanos() as u64 {
            self.window_start_ns.store(now_ns, Ordering::Relaxed);
            self.count.store(1, Ordering::Relaxed);
            return false;
        }
        self.count.fetch_add(1, Ordering::Relaxed) + 1 >= UNDER_LOAD_THRESHOLD as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: u64 = UNDER_LOAD_AFTER.as_nanos() as u64;

    #[test]
    fn a_flood_rate_of_replies_renews_under_load() {
        let rate = ReplyRate::default();
        let t0 = 10 * WINDOW;
        let step = WINDOW / 10_000; // 10,000 replies per window
        let renewed: Vec<bool> = (0..UNDER_LOAD_THRESHOLD as u64 + 1)
            .map(|i| rate.note(t0 + i * step))
            .collect();
        // The window's first threshold - 1 replies do not renew; from then on each does.
        assert!(renewed[..UNDER_LOAD_THRESHOLD - 1].iter().all(|r| !r));
        assert!(renewed[UNDER_LOAD_THRESHOLD - 1..].iter().all(|r| *r));
        // A new window counts from zero again.
        assert!(!rate.note(t0 + WINDOW + UNDER_LOAD_THRESHOLD as u64 * step));
    }

    #[test]
    fn a_trickle_of_replies_never_renews_under_load() {
        let rate = ReplyRate::default();
        // Ten replies a second for a minute: legitimate peers meeting under-load mode.
        assert!((0..600u64).all(|i| !rate.note(WINDOW + i * WINDOW / 10)));
    }
}
