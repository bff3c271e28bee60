//! One interface's timer queue: (deadline, peer id) entries in deadline order, exactly
//! one per peer with a deadline.
//!
//! Each peer keeps the deadline of its entry in an atomic (`Peer::timer_at`,
//! [`UNARMED`] for none), so arming no earlier than that (nearly every protocol step)
//! costs one load and no lock. Arming earlier moves the entry: an ordered set finds the
//! old one by its deadline, where a heap would leave it behind. A heap did: each stale
//! entry, when due, ran a step that armed the peer again, so they were never given up,
//! and a busy peer gathered about one per traffic burst, for good.
//!
//! Invariant: `timer_at` is changed under the set's lock only (or by [`take`], for an
//! entry already popped), and names the peer's one entry. Race: a step that arms while
//! the timer thread pops the peer's entry either still sees that entry's deadline, and
//! if it is no later than its own does nothing: the popped entry's step locks the
//! peer's state after this step's change and arms from it; or it sees [`UNARMED`] and
//! arms.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// No entry.
pub const UNARMED: u64 = u64::MAX;

#[derive(Default)]
pub struct TimerQueue {
    entries: Mutex<BTreeSet<(u64, u32)>>,
}

impl TimerQueue {
    /// Makes sure the peer `id`, whose entry's deadline is `timer_at`, has its entry
    /// no later than `at` (ns on the device clock).
    pub fn arm(&self, timer_at: &AtomicU64, id: u32, at: u64) {
        if at >= timer_at.load(Ordering::Acquire) {
            return;
        }
        let mut entries = self.lock();
        let cur = timer_at.load(Ordering::Acquire);
        if at < cur {
            if cur != UNARMED {
                entries.remove(&(cur, id));
            }
            entries.insert((at, id));
            timer_at.store(at, Ordering::Release);
        }
    }

    /// Removes the peer's entry, if it has one (the peer is being removed).
    pub fn disarm(&self, timer_at: &AtomicU64, id: u32) {
        let mut entries = self.lock();
        let cur = timer_at.swap(UNARMED, Ordering::AcqRel);
        if cur != UNARMED {
            entries.remove(&(cur, id));
        }
    }

    /// Pops the entries due at `now`: (deadline, peer id). The caller [`take`]s each
    /// from its peer before running the peer's step.
    pub fn pop_due(&self, now: u64) -> Vec<(u64, u32)> {
        let mut entries = self.lock();
        let mut due = Vec::new();
        while let Some(&(at, id)) = entries.first() {
            if at > now {
                break;
            }
            entries.pop_first();
            due.push((at, id));
        }
        due
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<(u64, u32)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Marks the peer's entry, popped due `at`, spent, so its step arms a new one. A step
/// that armed the peer earlier in between has put a new entry in its place, which
/// stays: the peer's step runs either way, and finds what is due.
pub fn take(timer_at: &AtomicU64, at: u64) {
    let _ = timer_at.compare_exchange(at, UNARMED, Ordering::AcqRel, Ordering::Acquire);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer whose next deadline keeps moving earlier (data resets its keepalive
    /// before a far key-zeroing deadline) and back after each run: one entry, always,
    /// and each due deadline runs once.
    #[test]
    fn a_peer_has_one_entry_however_its_deadline_moves() {
        let q = TimerQueue::default();
        let timer_at = AtomicU64::new(UNARMED);
        let far = 1_000_000;
        q.arm(&timer_at, 7, far);
        let mut runs = 0;
        for burst in 0..1000u64 {
            let now = burst * 10;
            q.arm(&timer_at, 7, now + 5);
            q.arm(&timer_at, 7, now + 8);
            assert_eq!(q.len(), 1);
            for (at, id) in q.pop_due(now + 5) {
                assert_eq!((at, id), (now + 5, 7));
                take(&timer_at, at);
                runs += 1;
                // The step: its next deadline is the far one again.
                q.arm(&timer_at, 7, far);
            }
            assert_eq!(q.len(), 1, "burst {burst}");
        }
        assert_eq!(runs, 1000);
        assert_eq!(q.pop_due(far), [(far, 7)]);
        assert!(q.is_empty());
    }

    /// An arm between the pop and the take keeps its entry; disarming removes it.
    #[test]
    fn an_arm_racing_the_pop_keeps_its_entry_and_disarm_removes_it() {
        let q = TimerQueue::default();
        let (timer_at, other) = (AtomicU64::new(UNARMED), AtomicU64::new(UNARMED));
        q.arm(&timer_at, 1, 50);
        q.arm(&other, 2, 60);
        let due = q.pop_due(55);
        assert_eq!(due, [(50, 1)]);
        q.arm(&timer_at, 1, 20);
        take(&timer_at, 50);
        assert_eq!(timer_at.load(Ordering::Relaxed), 20);
        assert_eq!(q.len(), 2);
        q.disarm(&timer_at, 1);
        assert_eq!(timer_at.load(Ordering::Relaxed), UNARMED);
        assert_eq!(q.pop_due(100), [(60, 2)]);
    }
}
