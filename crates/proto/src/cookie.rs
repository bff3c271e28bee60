//! mac1, mac2 and cookie replies (whitepaper §5.4.4 and §5.4.7).
//!
//! [`CookieChecker`] is the responder's side: it verifies mac1 on every handshake
//! message (before any Diffie-Hellman), verifies mac2 while under load, and builds cookie
//! replies. [`CookieGenerator`] is the initiator's side, one per peer: it stamps mac1 and,
//! while it holds a fresh cookie, mac2 on each handshake message it sends.

use crate::crypto::{self, MAC_LEN, XNONCE_LEN};
use crate::handshake::{LABEL_COOKIE, LABEL_MAC1};
use crate::messages::CookieReply;
use rand_core::RngCore;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// How long a responder keeps one cookie secret.
pub const COOKIE_SECRET_MAX_AGE: Duration = Duration::from_secs(120);
/// Allowance for a cookie in flight: the initiator drops its cookie this much earlier.
pub const COOKIE_SECRET_LATENCY: Duration = Duration::from_secs(5);

/// Byte string a cookie is bound to: the sender's IP address and UDP port, in a buffer
/// of the largest size (IPv6) with its used length. No allocation: under a flood this
/// runs for every message answered.
fn source_bytes(src: &SocketAddr) -> ([u8; 18], usize) {
    let mut b = [0u8; 18];
    let ip_len = match src.ip() {
        IpAddr::V4(a) => {
            b[..4].copy_from_slice(&a.octets());
            4
        }
        IpAddr::V6(a) => {
            b[..16].copy_from_slice(&a.octets());
            16
        }
    };
    b[ip_len..ip_len + 2].copy_from_slice(&src.port().to_be_bytes());
    (b, ip_len + 2)
}

/// What the responder concluded about a handshake message's MACs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacVerdict {
    /// mac1 is wrong: drop without any further work.
    InvalidMac1,
    /// mac1 is right; mac2 is missing or stale.
    Mac1Only,
    /// Both MACs are right: the source address is proven reachable.
    Mac2Valid,
}

/// Responder side of the cookie mechanism, one per interface.
pub struct CookieChecker {
    mac1_key: [u8; 32],
    cookie_key: [u8; 32],
    secret: [u8; 32],
    secret_born: Option<Duration>,
}

impl CookieChecker {
    pub fn new(our_public: &[u8; 32]) -> Self {
        CookieChecker {
            mac1_key: crypto::hash(&[LABEL_MAC1, our_public]),
            cookie_key: crypto::hash(&[LABEL_COOKIE, our_public]),
            secret: [0; 32],
            secret_born: None,
        }
    }

    /// The cookie for `src` under the current secret, rotating it every two minutes.
    fn cookie(&mut self, src: &SocketAddr, now: Duration, rng: &mut dyn RngCore) -> [u8; MAC_LEN] {
        let stale = match self.secret_born {
            None => true,
            Some(born) => now.saturating_sub(born) >= COOKIE_SECRET_MAX_AGE,
        };
        if stale {
            rng.fill_bytes(&mut self.secret);
            self.secret_born = Some(now);
        }
        let (bytes, len) = source_bytes(src);
        crypto::mac(&self.secret, &[&bytes[..len]])
    }

    /// Checks mac1 only; cheap, and the gate before any Diffie-Hellman work.
    pub fn mac1_valid(&self, msg: &[u8]) -> bool {
        let off = msg.len() - 2 * MAC_LEN;
        let expect = crypto::mac(&self.mac1_key, &[&msg[..off]]);
        crypto::ct_eq(&expect, &msg[off..off + MAC_LEN])
    }

    /// Full verdict on a handshake message (`msg` is the whole message, macs included).
    pub fn verify(
        &mut self,
        msg: &[u8],
        src: &SocketAddr,
        now: Duration,
        rng: &mut dyn RngCore,
    ) -> MacVerdict {
        if !self.mac1_valid(msg) {
            return MacVerdict::InvalidMac1;
        }
        let off = msg.len() - MAC_LEN;
        // An initiator without a cookie sends mac2 as zeros (whitepaper §5.4.4); a real
        // mac2 is zero with chance 2^-128. Skipping the cookie and the mac2 for it
        // saves most of the BLAKE2s work of answering a flood.
        if msg[off..].iter().all(|&b| b == 0) {
            return MacVerdict::Mac1Only;
        }
        let cookie = self.cookie(src, now, rng);
        let expect = crypto::mac(&cookie, &[&msg[..off]]);
        if crypto::ct_eq(&expect, &msg[off..]) {
            MacVerdict::Mac2Valid
        } else {
            MacVerdict::Mac1Only
        }
    }

    /// Builds the cookie reply to a handshake message whose sender index is `receiver`.
    pub fn create_reply(
        &mut self,
        msg: &[u8],
        receiver: u32,
        src: &SocketAddr,
        now: Duration,
        rng: &mut dyn RngCore,
    ) -> CookieReply {
        let off = msg.len() - 2 * MAC_LEN;
        let mac1 = &msg[off..off + MAC_LEN];
        let cookie = self.cookie(src, now, rng);
        let mut nonce = [0u8; XNONCE_LEN];
        rng.fill_bytes(&mut nonce);
        let sealed = crypto::xaead_seal(&self.cookie_key, &nonce, &cookie, mac1);
        CookieReply {
            receiver,
            nonce,
            encrypted_cookie: sealed.try_into().expect("16-byte cookie plus tag"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CookieError {
    #[error("cookie reply arrived but no handshake message is awaiting one")]
    Unexpected,
    #[error("cookie reply failed to decrypt")]
    Decrypt,
}

/// Initiator side of the cookie mechanism, one per peer.
pub struct CookieGenerator {
    mac1_key: [u8; 32],
    cookie_key: [u8; 32],
    cookie: Option<([u8; MAC_LEN], Duration)>,
    /// mac1 of the last handshake message we sent: the cookie reply's associated data.
    last_mac1: Option<[u8; MAC_LEN]>,
}

impl CookieGenerator {
    pub fn new(peer_public: &[u8; 32]) -> Self {
        CookieGenerator {
            mac1_key: crypto::hash(&[LABEL_MAC1, peer_public]),
            cookie_key: crypto::hash(&[LABEL_COOKIE, peer_public]),
            cookie: None,
            last_mac1: None,
        }
    }

    /// Fills mac1 and mac2 of a serialised handshake message in place.
    pub fn stamp(&mut self, msg: &mut [u8], now: Duration) {
        let off1 = msg.len() - 2 * MAC_LEN;
        let mac1 = crypto::mac(&self.mac1_key, &[&msg[..off1]]);
        msg[off1..off1 + MAC_LEN].copy_from_slice(&mac1);
        self.last_mac1 = Some(mac1);
        self.stamp_mac2(msg, now);
    }

    /// Fills mac2 only, of a message stamped before and sent again: its mac1, and so
    /// the associated data of a reply to it, is unchanged, and a reply already taken
    /// for it is not taken again.
    pub fn stamp_mac2(&self, msg: &mut [u8], now: Duration) {
        let off2 = msg.len() - MAC_LEN;
        let fresh = self.cookie.filter(|(_, born)| {
            now.saturating_sub(*born) < COOKIE_SECRET_MAX_AGE - COOKIE_SECRET_LATENCY
        });
        let mac2 = match fresh {
            Some((cookie, _)) => crypto::mac(&cookie, &[&msg[..off2]]),
            None => [0; MAC_LEN],
        };
        msg[off2..].copy_from_slice(&mac2);
    }

    /// Whether a handshake message we sent awaits its cookie reply: one was stamped
    /// since the last reply taken.
    pub fn awaits_reply(&self) -> bool {
        self.last_mac1.is_some()
    }

    /// Takes the cookie out of a reply to our last handshake message.
    pub fn consume_reply(&mut self, reply: &CookieReply, now: Duration) -> Result<(), CookieError> {
        let mac1 = self.last_mac1.ok_or(CookieError::Unexpected)?;
        let cookie = crypto::xaead_open(
            &self.cookie_key,
            &reply.nonce,
            &reply.encrypted_cookie,
            &mac1,
        )
        .map_err(|_| CookieError::Decrypt)?;
        self.cookie = Some((cookie.try_into().expect("16-byte cookie"), now));
        // A reply is good for one message: a second reply with the same AD is a replay.
        self.last_mac1 = None;
        Ok(())
    }
}

/// Why the handshake gate dropped a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateDrop {
    InvalidMac1,
    RateLimited,
}

/// What to do with a handshake message before any Diffie-Hellman is spent on it.
#[derive(Debug, PartialEq, Eq)]
pub enum GateVerdict {
    Process,
    /// Under load and the sender has not proven its address: answer with this.
    SendCookieReply(CookieReply),
    Drop(GateDrop),
}

/// The responder's admission policy (whitepaper §5.3), one per interface: mac1
/// always; while under load, a valid mac2 and the per-source rate limit as well.
pub struct Gate {
    pub checker: CookieChecker,
    pub limiter: crate::ratelimiter::RateLimiter,
}

impl Gate {
    pub fn new(our_public: &[u8; 32], limiter_capacity: usize) -> Self {
        Gate {
            checker: CookieChecker::new(our_public),
            limiter: crate::ratelimiter::RateLimiter::new(limiter_capacity),
        }
    }

    pub fn admit(
        &mut self,
        msg: &[u8],
        sender_index: u32,
        src: &SocketAddr,
        under_load: bool,
        now: Duration,
        rng: &mut dyn RngCore,
    ) -> GateVerdict {
        if !under_load {
            return if self.checker.mac1_valid(msg) {
                GateVerdict::Process
            } else {
                GateVerdict::Drop(GateDrop::InvalidMac1)
            };
        }
        match self.checker.verify(msg, src, now, rng) {
            MacVerdict::InvalidMac1 => GateVerdict::Drop(GateDrop::InvalidMac1),
            MacVerdict::Mac1Only => GateVerdict::SendCookieReply(self.checker.create_reply(
                msg,
                sender_index,
                src,
                now,
                rng,
            )),
            MacVerdict::Mac2Valid => {
                if self.limiter.allow(src.ip(), now) {
                    GateVerdict::Process
                } else {
                    GateVerdict::Drop(GateDrop::RateLimited)
                }
            }
        }
    }
}
