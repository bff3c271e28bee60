//! Admission of cookie replies, one slot per peer, decided on the UDP reader without
//! the peer's state lock.
//!
//! Why: a cookie reply carries no MAC the gate could check, only a receiver index, and
//! a live session's index is in the clear on every transport packet. Admitted on the
//! index alone, forged replies from anyone who saw one could be queued without end,
//! each an XChaCha20-Poly1305 open on the handshake thread, in the cookie lane that
//! cookie-bearing initiations need under load. The protocol takes at most one reply
//! per handshake message we sent (`CookieGenerator::consume_reply`); the slot lets at
//! most one wait in the lane per peer, and none while no message of ours awaits one.
//!
//! States: [`NONE`] (no message awaits a reply), [`OPEN`] (one does, no reply is
//! queued), or a claim: the device-clock time (ns, plus one) a reply was queued.
//! Invariant: the moves between NONE and OPEN ([`CookieReplySlot::follow`],
//! [`CookieReplySlot::settle`]) happen under the peer's state lock, from the
//! protocol's own answer, so the slot is OPEN or claimed whenever the protocol awaits
//! a reply; and before the handshake message leaves, since it is sent after the lock
//! is released. The gate only claims (OPEN → claim) and gives a claim back if the lane
//! had no room. Race: `follow` may store NONE over a claim; the queued reply then meets
//! a protocol that no longer awaits it and is refused there, and the slot stays NONE.
//! A claimed reply that never reaches the handshake stage (its index retired meanwhile,
//! or the private key removed) would hold the slot for ever: a claim expires after
//! [`CLAIM_TTL`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const NONE: u64 = u64::MAX;
const OPEN: u64 = 0;

/// How long a claim holds the slot if its reply is never taken. Longer than a reply
/// waits in a full cookie lane (1,024 jobs of up to four Diffie-Hellman operations,
/// about 0.2 s here), shorter than REKEY_TIMEOUT, so a lost claim costs at most the
/// cookie of one retry.
pub const CLAIM_TTL: Duration = Duration::from_secs(1);

/// One peer's cookie-reply admission (see the module comment).
pub struct CookieReplySlot(AtomicU64);

impl Default for CookieReplySlot {
    fn default() -> Self {
        CookieReplySlot(AtomicU64::new(NONE))
    }
}

impl CookieReplySlot {
    /// After any protocol step, under the peer's state lock: opens the slot when a
    /// message now awaits a reply, closes it when none does. A claim stays while a
    /// message awaits: its reply is still in the lane.
    pub fn follow(&self, awaits_reply: bool) {
        if awaits_reply {
            let _ = self
                .0
                .compare_exchange(NONE, OPEN, Ordering::AcqRel, Ordering::Relaxed);
        } else if self.0.load(Ordering::Relaxed) != NONE {
            // Every step of a peer comes here, most with nothing awaited: a load, not
            // a store, keeps the line clean.
            self.0.store(NONE, Ordering::Release);
        }
    }

    /// After the handshake stage took a queued reply, under the peer's state lock:
    /// the claim ends, whether the reply was good or not.
    pub fn settle(&self, awaits_reply: bool) {
        self.0
            .store(if awaits_reply { OPEN } else { NONE }, Ordering::Release);
    }

    /// On the reader: whether a reply for this peer may be queued now. True takes the
    /// slot; the caller gives it back with [`Self::unclaim`] if the queue refuses.
    pub fn claim(&self, now_ns: u64) -> bool {
        let cur = self.0.load(Ordering::Acquire);
        let expired = cur != OPEN && cur != NONE && now_ns.saturating_sub(cur - 1) >= ttl_ns();
        (cur == OPEN || expired)
            && self
                .0
                .compare_exchange(cur, now_ns + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Gives back a claim made at `now_ns` whose reply was not queued. A slot that
    /// changed meanwhile (closed, or settled) is left as it is.
    pub fn unclaim(&self, now_ns: u64) {
        let _ = self
            .0
            .compare_exchange(now_ns + 1, OPEN, Ordering::AcqRel, Ordering::Relaxed);
    }
}

fn ttl_ns() -> u64 {
    CLAIM_TTL.as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Closed until a message awaits a reply; then one claim at a time, until the
    /// handshake stage settles it or it expires.
    #[test]
    fn one_reply_at_a_time_and_only_when_awaited() {
        let s = CookieReplySlot::default();
        assert!(!s.claim(10), "nothing sent: no reply admitted");
        s.follow(true);
        assert!(s.claim(10));
        for t in [11, 500, 10 + ttl_ns() - 1] {
            assert!(!s.claim(t), "one already queued");
        }
        s.follow(true);
        assert!(!s.claim(20), "another step keeps the claim");
        s.settle(true);
        assert!(s.claim(30), "a forged reply taken: the slot opens again");
        s.settle(false);
        assert!(!s.claim(40), "the real reply taken: closed");
        s.follow(false);
        assert!(!s.claim(50));
    }

    #[test]
    fn a_claim_not_queued_is_given_back_and_a_lost_one_expires() {
        let s = CookieReplySlot::default();
        s.follow(true);
        assert!(s.claim(0), "the device clock's first instant too");
        s.unclaim(0);
        assert!(s.claim(5));
        assert!(!s.claim(5 + ttl_ns() - 1));
        assert!(s.claim(5 + ttl_ns()), "a lost claim expires");
        // A claim given back after the slot was closed leaves it closed.
        s.follow(false);
        s.unclaim(5 + ttl_ns());
        assert!(!s.claim(u64::MAX / 2));
    }
}
