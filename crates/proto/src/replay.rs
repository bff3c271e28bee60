//! Sliding replay window for transport data counters (RFC 6479 style, as the kernel
//! sizes it): 8192 bits of bitmap, of which the newest 8128 counters are always tracked.
//!
//! Invariant: `last` is one more than the greatest counter accepted so far (so that
//! counter 0 is acceptable in a fresh window), and bits for counters in
//! `(last - WINDOW_SIZE, last]` reflect exactly which were seen.

use crate::keypair::REJECT_AFTER_MESSAGES;

const WORD_BITS: u64 = 64;
const WORDS: usize = 128;
/// Counters this far behind the newest one are still accepted once.
pub const WINDOW_SIZE: u64 = WORDS as u64 * WORD_BITS - WORD_BITS;

#[derive(Clone)]
pub struct ReplayWindow {
    last: u64,
    bitmap: [u64; WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            last: 0,
            bitmap: [0; WORDS],
        }
    }
}

impl ReplayWindow {
    /// Returns true and records `counter` if it is fresh; false if it is a duplicate, too
    /// old, or beyond the message limit. Call only after the packet authenticated, or an
    /// attacker could advance the window.
    pub fn accept(&mut self, counter: u64) -> bool {
        if counter >= REJECT_AFTER_MESSAGES {
            return false;
        }
        let c = counter + 1;
        if c + WINDOW_SIZE < self.last {
            return false;
        }
        let word = c / WORD_BITS;
        if c > self.last {
            let current = self.last / WORD_BITS;
            let advance = (word - current).min(WORDS as u64);
            for i in 1..=advance {
                self.bitmap[((current + i) % WORDS as u64) as usize] = 0;
            }
            self.last = c;
        }
        let slot = (word % WORDS as u64) as usize;
        let bit = 1u64 << (c % WORD_BITS);
        if self.bitmap[slot] & bit != 0 {
            return false;
        }
        self.bitmap[slot] |= bit;
        true
    }

    /// Greatest counter accepted so far, if any.
    pub fn greatest(&self) -> Option<u64> {
        self.last.checked_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order() {
        let mut w = ReplayWindow::default();
        for c in 0..20_000 {
            assert!(w.accept(c), "counter {c}");
        }
        assert_eq!(w.greatest(), Some(19_999));
    }

    #[test]
    fn duplicates_rejected() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(0));
        assert!(!w.accept(0));
        assert!(w.accept(5));
        assert!(!w.accept(5));
        assert!(w.accept(3));
        assert!(!w.accept(3));
    }

    #[test]
    fn out_of_order_within_window() {
        let mut w = ReplayWindow::default();
        let mut order: Vec<u64> = (0..1000).collect();
        // Deterministic shuffle: swap pairs and reverse blocks.
        for chunk in order.chunks_mut(37) {
            chunk.reverse();
        }
        for c in &order {
            assert!(w.accept(*c));
        }
        for c in &order {
            assert!(!w.accept(*c));
        }
    }

    #[test]
    fn too_old_and_window_edge() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(10_000));
        // Exactly WINDOW_SIZE behind the newest is still inside the window.
        assert!(w.accept(10_000 - WINDOW_SIZE));
        assert!(!w.accept(10_000 - WINDOW_SIZE - 1));
        assert!(!w.accept(0));
        assert!(w.accept(9_999));
    }

    #[test]
    fn window_jump_clears_old_bits() {
        let mut w = ReplayWindow::default();
        for c in 0..100 {
            assert!(w.accept(c));
        }
        // Jump far ahead: everything old falls out, nothing stale blocks new counters.
        assert!(w.accept(1_000_000));
        assert!(!w.accept(99));
        for c in 1_000_001..1_000_200 {
            assert!(w.accept(c));
        }
        // Counters just behind the jump were never seen and are inside the window.
        assert!(w.accept(999_000));
        assert!(!w.accept(999_000));
        // A jump of less than a full bitmap keeps the bits that are still in range.
        assert!(w.accept(1_004_000));
        assert!(!w.accept(1_000_100));
        assert!(w.accept(1_000_300));
    }

    #[test]
    fn reject_after_messages() {
        let mut w = ReplayWindow::default();
        assert!(!w.accept(REJECT_AFTER_MESSAGES));
        assert!(!w.accept(u64::MAX));
        assert!(w.accept(REJECT_AFTER_MESSAGES - 1));
    }
}
