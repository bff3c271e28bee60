//! A byte limit on one peer's transmit ring (its ordered queue: packets that have their
//! nonce, being sealed or waiting to be sent) that adapts as the kernel's dynamic queue
//! limits adapt a NIC's transmit ring: it grows when the ring ran dry while the limit
//! held packets back, and falls, slowly, by the slack it never needed.
//!
//! Why: the ring sits behind the flow queues (`stages::fq`), where fairness and CoDel
//! act; every byte in it is ahead of a sparse flow's next packet, and nothing can
//! overtake it there. It must hold enough to keep the crypt workers and the serial send
//! busy and no more, and how much that is depends on the packet size and on how soon
//! the serial stage runs after a batch is sealed: in a fixed 256 packets a jumbo-frame
//! peer holds six times the bytes of an MTU-1420 one, and a machine whose flush runs at
//! once needs fewer than one whose flush waits for a core (on the lab's two shared
//! cores the limit stays at its ceiling under bulk: BENCHMARKS, "Latency under load").
//!
//! The rule, once per completion (a run of the peer's serial TX stage that sent `sent`
//! bytes and left `left` bytes in the ring):
//! - **Starved:** the ring is empty and a pump stopped at the limit since the last
//!   completion, with packets waiting in the flow queues. The limit was too small by at
//!   least what this completion took, so it grows by that at once.
//! - **Slack:** with bytes still in the ring, the limit less twice this completion (one
//!   completion's worth being sealed while another is sent) is room the ring did not
//!   need just then. The lowest slack over [`HOLD_NS`] is taken off the limit when the
//!   hold time ends. A ring that went idle says nothing about the limit and changes
//!   nothing.
//! The limit stays within [`MIN_BYTES`], [`MAX_BYTES`]; `stages::fq` keeps the packet
//! bound (`RING_PACKETS`) beside it for small packets.
//!
//! Races: `completed` runs only in the peer's serial TX stage, one run at a time per
//! peer (`OrderedQueue::schedule`), so the fields only it writes have one writer; they
//! are atomics so that the peer stays `Sync` and pumps on other threads can read the
//! limit. `held_back` is set by any pump and taken by `completed`: a pump that sets it
//! just after the take counts towards the next completion, which judges the ring as it
//! is then. A pump reading the limit while it changes admits by the old one, at most
//! one batch more or less.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};

/// The floor: about one full UDP GSO send of MTU-sized packets, so that one bulk flow
/// always has a send's worth sealed while the previous one leaves.
pub const MIN_BYTES: u32 = 64 * 1024;

/// The ceiling: the fixed bound this replaced (`RING_PACKETS` of 1,500 bytes).
pub const MAX_BYTES: u32 = 4 * crate::packet::MAX_BATCH as u32 * 1500;

/// How long the lowest slack is watched before the limit falls by it (the kernel's
/// default `slack_hold_time`, one second).
pub const HOLD_NS: u64 = 1_000_000_000;

#[derive(Debug)]
pub struct RingLimit {
    limit: AtomicU32,
    /// A pump stopped at the limit with packets waiting, since the last completion.
    held_back: AtomicBool,
    /// The lowest slack seen since `hold_since`; `u32::MAX` while none was.
    lowest_slack: AtomicU32,
    /// When the current hold began, in ms on the interface's clock (wrapping: only
    /// differences of at most a hold time matter); 0: not yet. 32 bits rather than 64
    /// since every configured peer has one, idle or not.
    hold_since: AtomicU32,
}

impl Default for RingLimit {
    fn default() -> RingLimit {
        RingLimit {
            limit: AtomicU32::new(MIN_BYTES),
            held_back: AtomicBool::new(false),
            lowest_slack: AtomicU32::new(u32::MAX),
            hold_since: AtomicU32::new(0),
        }
    }
}

impl RingLimit {
    /// Bytes the ring may hold now.
    pub fn limit(&self) -> usize {
        self.limit.load(Relaxed) as usize
    }

    /// Bytes that may still enter a ring holding `queued`: a pump admits packets while
    /// this is above 0, so the ring may pass the limit by one packet, as DQL allows.
    pub fn room(&self, queued: usize) -> usize {
        self.limit().saturating_sub(queued)
    }

    /// A pump stopped at the limit with packets still in the flow queues.
    pub fn note_held_back(&self) {
        self.held_back.store(true, Relaxed);
    }

    /// One completion of the serial TX stage at `now_ns`: it sent `sent` bytes and left
    /// `left` in the ring. Returns whether the ring was starved (and the limit grew).
    pub fn completed(&self, sent: usize, left: usize, now_ns: u64) -> bool {
        let held_back = self.held_back.swap(false, Relaxed);
        let limit = self.limit.load(Relaxed);
        if left == 0 && held_back {
            let grown = (limit as usize + sent).min(MAX_BYTES as usize) as u32;
            self.limit.store(grown, Relaxed);
            self.restart_hold(now_ns);
            return true;
        }
        if left == 0 || sent == 0 {
            return false;
        }
        let slack = (limit as usize).saturating_sub(2 * sent) as u32;
        let lowest = self.lowest_slack.load(Relaxed).min(slack);
        let since = self.hold_since.load(Relaxed);
        if since == 0 {
            self.hold_since.store(millis(now_ns), Relaxed);
            self.lowest_slack.store(lowest, Relaxed);
        } else if u64::from(millis(now_ns).wrapping_sub(since)) >= HOLD_NS / 1_000_000 {
            self.limit
                .store(limit.saturating_sub(lowest).max(MIN_BYTES), Relaxed);
            self.restart_hold(now_ns);
        } else {
            self.lowest_slack.store(lowest, Relaxed);
        }
        false
    }

    fn restart_hold(&self, now_ns: u64) {
        self.lowest_slack.store(u32::MAX, Relaxed);
        self.hold_since.store(millis(now_ns), Relaxed);
    }
}

/// `now_ns` in wrapping milliseconds, never 0 (which means "no hold yet").
fn millis(now_ns: u64) -> u32 {
    ((now_ns / 1_000_000) as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const BATCH: usize = 64 * 1420;

    #[test]
    fn a_ring_that_runs_dry_while_packets_wait_grows_by_what_left() {
        let r = RingLimit::default();
        assert_eq!(r.limit(), MIN_BYTES as usize);
        r.note_held_back();
        assert!(r.completed(BATCH, 0, MS));
        assert_eq!(r.limit(), MIN_BYTES as usize + BATCH);
        // Dry, but nothing was held back: the load, not the limit, emptied it.
        assert!(!r.completed(BATCH, 0, 2 * MS));
        assert_eq!(r.limit(), MIN_BYTES as usize + BATCH);
        // Held back, but the ring still had work: not starved.
        r.note_held_back();
        assert!(!r.completed(BATCH, 1420, 3 * MS));
        assert_eq!(r.limit(), MIN_BYTES as usize + BATCH);
    }

    #[test]
    fn growth_stops_at_the_ceiling() {
        let r = RingLimit::default();
        for t in 1..100 {
            r.note_held_back();
            r.completed(BATCH, 0, t * MS);
        }
        assert_eq!(r.limit(), MAX_BYTES as usize);
    }

    #[test]
    fn the_limit_falls_by_the_lowest_slack_of_a_hold_time_and_no_sooner() {
        let r = RingLimit::default();
        for t in 1..20 {
            r.note_held_back();
            r.completed(BATCH, 0, t * MS);
        }
        let top = r.limit();
        assert_eq!(top, MAX_BYTES as usize);
        // Completions of half a batch with work left: the ring needs one batch. The
        // hold began with the last growth, at 19 ms.
        let hold_began = 19 * MS;
        let mut t = hold_began + MS;
        while t < hold_began + HOLD_NS {
            r.completed(BATCH / 2, BATCH, t);
            assert_eq!(r.limit(), top, "fell before the hold time ended");
            t += MS;
        }
        r.completed(BATCH / 2, BATCH, t);
        assert_eq!(r.limit(), BATCH.max(MIN_BYTES as usize));
        // One larger completion in the next hold keeps more.
        for i in 0..1100 {
            let sent = if i == 500 { 2 * BATCH } else { BATCH / 4 };
            r.completed(sent, BATCH, t + (i + 1) * MS);
        }
        assert_eq!(
            r.limit(),
            BATCH.max(MIN_BYTES as usize),
            "the largest completion sets the floor"
        );
    }

    #[test]
    fn an_idle_ring_changes_nothing_and_the_floor_holds() {
        let r = RingLimit::default();
        for t in 1..5000 {
            r.completed(1420, 0, t * MS);
        }
        assert_eq!(r.limit(), MIN_BYTES as usize);
        for t in 5000..8000 {
            r.completed(100, 1420, t * MS);
        }
        assert_eq!(r.limit(), MIN_BYTES as usize);
    }
}
