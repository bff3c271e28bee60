//! One emulated WireGuard peer of the star scenario, driven from `proto`: its own key
//! pair, the initiator's side of the handshake (with the cookie mechanism), and the
//! session it yields, which seals the peer's traffic ahead of the timed phase and opens
//! samples of what the gateway sends it. No I/O here: the generator owns the sockets.
//!
//! Rekeying follows the whitepaper's rule for an initiator that receives (§6.2): once
//! its session is REJECT_AFTER_TIME − KEEPALIVE_TIMEOUT − REKEY_TIMEOUT old, data it
//! hears makes it initiate again. Until the new session's response arrives the old one
//! stays current; after it, the old one is kept as `previous`, because the gateway
//! goes on sealing with it until our first message on the new one confirms it.
//!
//! Like any peer, it answers data it heard with a keepalive once KEEPALIVE_TIMEOUT
//! passed without its sending anything (the passive keepalive, §6.5). Without it, a
//! gateway that only sends to it would take the silence for a dead session and
//! initiate handshakes of its own every few seconds.
//!
//! It also answers the gateway's initiations, as any peer does: the gateway initiates
//! when data it sent drew nothing back for 15 s, for instance when a rekey storm filled
//! its handshake queue and our initiation was dropped (sending it cancelled our
//! passive keepalive). The session we answer waits as `next` until the gateway's first
//! transport message under it, which makes it current. Unlike a real responder, the
//! peer still rekeys that session on receive, as it does its own: the generator's
//! rekey schedule stays the same whoever began the session.

use rand_core::{OsRng, RngCore};
use std::time::{Duration, Instant};
use wirelane_proto::cookie::CookieGenerator;
use wirelane_proto::crypto::TAG_LEN;
use wirelane_proto::handshake::{consume_initiation_phase1, Handshake, LocalIdentity};
use wirelane_proto::keypair::REJECT_AFTER_TIME;
use wirelane_proto::messages::{
    classify, CookieReply, Initiation, Kind, Response, TransportHeader, TRANSPORT_HEADER_LEN,
};
use wirelane_proto::timers::{KEEPALIVE_TIMEOUT, REKEY_TIMEOUT};
use wirelane_proto::{Keypair, Sealer};

/// A receiving initiator starts a new handshake once its session is this old.
pub const REKEY_ON_RECEIVE: Duration = REJECT_AFTER_TIME
    .saturating_sub(KEEPALIVE_TIMEOUT)
    .saturating_sub(REKEY_TIMEOUT);
/// Sender indices of one peer's successive handshakes (its initiations and its
/// answers) are this far apart: the low bits stay the peer's own, so no two peers'
/// indices meet, and a message names the session it belongs to (must exceed
/// `generator::MAX_PEERS`).
const SESSION_STRIDE: u32 = 1 << 16;
/// TAI64N keeps time to 2^24 ns: a retry sooner than this after the last initiation
/// would carry the same timestamp, which the responder must refuse as a replay.
const TIMESTAMP_STEP: Duration = Duration::from_millis(17);

pub struct EmulatedPeer {
    identity: LocalIdentity,
    handshake: Handshake,
    cookie: CookieGenerator,
    /// Our sender index of the first handshake: the peer's position plus one, unique
    /// among the emulated peers; handshake k's is `SESSION_STRIDE * k` above it.
    first_index: u32,
    /// Handshake messages we created (initiations and responses), each with its own
    /// sender index.
    handshakes: u32,
    /// Sessions established so far.
    pub sessions: u32,
    /// The current session.
    pub keypair: Option<Keypair>,
    /// The session before it, still opened: the gateway seals with it until it hears
    /// on the new one.
    previous: Option<Keypair>,
    /// A session we answered the gateway's initiation with, until its first message.
    next: Option<Keypair>,
    /// An initiation is unanswered.
    pending: bool,
    /// The counter of our next keepalive on the current session.
    next_counter: u64,
    /// When we first heard data that nothing we sent has followed since: the passive
    /// keepalive's timer.
    unanswered_since: Option<Instant>,
    /// The wall clock of the last initiation (kept increasing, see TIMESTAMP_STEP).
    last_wall: Duration,
    /// When the last initiation left (retries are due REKEY_TIMEOUT after it).
    pub last_initiation: Option<Instant>,
    /// When the current session was established.
    pub established_at: Option<Instant>,
    pub initiations: u32,
    pub cookie_replies: u32,
    /// The gateway's initiations we answered.
    pub responses: u32,
}

/// Which of a peer's sessions a transport message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Session {
    Current,
    Previous,
}

/// What a datagram from the gateway means for the peer.
#[derive(Debug, PartialEq, Eq)]
pub enum Heard {
    /// The handshake completed: the session is up.
    Established,
    /// A cookie reply: the gateway is under load; initiate again, now with mac2.
    Cookie,
    /// Transport data of one of our sessions, with its counter.
    Transport { counter: u64, session: Session },
    /// The gateway's first message on a session we answered: that session is current
    /// now, and the message is its first.
    Confirmed { counter: u64 },
    /// The gateway initiated: send it this response.
    Answer(Vec<u8>),
    /// Anything else (a late duplicate, a keepalive of an older session, garbage).
    Ignored,
}

impl EmulatedPeer {
    /// Peer `position` with a fresh key pair, facing a gateway whose public key is
    /// `gateway`.
    pub fn new(position: usize, gateway: &[u8; 32]) -> EmulatedPeer {
        let mut private = [0u8; 32];
        OsRng.fill_bytes(&mut private);
        EmulatedPeer {
            identity: LocalIdentity::new(private),
            handshake: Handshake::new(*gateway, [0; 32]),
            cookie: CookieGenerator::new(gateway),
            first_index: position as u32 + 1,
            handshakes: 0,
            sessions: 0,
            keypair: None,
            previous: None,
            next: None,
            pending: false,
            next_counter: 0,
            unanswered_since: None,
            last_wall: Duration::ZERO,
            last_initiation: None,
            established_at: None,
            initiations: 0,
            cookie_replies: 0,
            responses: 0,
        }
    }

    pub fn public(&self) -> [u8; 32] {
        self.identity.public
    }

    /// A new initiation, macs filled; `since` is the generator's monotonic clock
    /// (cookie ages), `wall` the real time of day.
    pub fn initiation(&mut self, now: Instant, since: Duration, wall: Duration) -> Vec<u8> {
        let wall = wall.max(self.last_wall + TIMESTAMP_STEP);
        self.last_wall = wall;
        let index = self.fresh_index();
        let (msg, _) = self
            .handshake
            .create_initiation(&self.identity, index, wall, &mut OsRng)
            .expect("the gateway's public key is a valid point");
        let mut bytes = msg.to_bytes().to_vec();
        self.cookie.stamp(&mut bytes, since);
        self.last_initiation = Some(now);
        self.initiations += 1;
        self.pending = true;
        self.unanswered_since = None;
        bytes
    }

    /// A sender index no earlier handshake of ours used.
    fn fresh_index(&mut self) -> u32 {
        let index = self.first_index + SESSION_STRIDE.wrapping_mul(self.handshakes);
        self.handshakes += 1;
        index
    }

    /// Answers the gateway's initiation; the session waits in `next`.
    fn answer(&mut self, msg: &[u8], since: Duration) -> Heard {
        let Ok(init) = Initiation::parse(msg) else {
            return Heard::Ignored;
        };
        let Ok(phase1) = consume_initiation_phase1(&self.identity, &init) else {
            return Heard::Ignored;
        };
        if phase1.remote_static != self.handshake.remote_static {
            return Heard::Ignored;
        }
        let index = self.fresh_index();
        let Ok((resp, keys, _)) = self.handshake.consume_initiation_and_respond(
            &self.identity,
            phase1,
            index,
            since,
            &mut OsRng,
        ) else {
            return Heard::Ignored;
        };
        // Answering abandons an initiation of ours in flight, as in the kernel.
        self.pending = false;
        self.next = Some(Keypair::new(&keys, since));
        self.unanswered_since = None;
        self.responses += 1;
        let mut bytes = resp.to_bytes().to_vec();
        self.cookie.stamp(&mut bytes, since);
        Heard::Answer(bytes)
    }

    /// A keepalive on the current session, with its next counter; None before the
    /// first handshake.
    pub fn keepalive(&mut self) -> Option<Vec<u8>> {
        let k = self.keypair.as_ref()?;
        let mut msg = vec![0u8; Self::sealed_len(0)];
        k.seal(self.next_counter, &mut msg);
        self.next_counter += 1;
        self.unanswered_since = None;
        Some(msg)
    }

    /// Whether data heard KEEPALIVE_TIMEOUT ago or more still waits for anything of
    /// ours (then a keepalive is due).
    pub fn keepalive_due(&self, now: Instant) -> bool {
        self.unanswered_since
            .is_some_and(|t| now.duration_since(t) >= KEEPALIVE_TIMEOUT)
    }

    /// Whether an unanswered initiation is due for a retry at `now`.
    pub fn retry_due(&self, now: Instant) -> bool {
        self.pending
            && self
                .last_initiation
                .is_some_and(|t| now.duration_since(t) >= REKEY_TIMEOUT)
    }

    /// Whether data heard at `now` should start a new handshake: the session is
    /// `after` old (REKEY_ON_RECEIVE, as the whitepaper has it) and no initiation is
    /// out yet.
    pub fn rekey_due(&self, now: Instant, after: Duration) -> bool {
        !self.pending
            && self
                .established_at
                .is_some_and(|t| now.duration_since(t) >= after)
    }

    /// Takes one datagram from the gateway.
    pub fn hear(&mut self, msg: &[u8], now: Instant, since: Duration) -> Heard {
        match classify(msg) {
            Ok(Kind::Response) if self.pending => {
                let Ok(r) = Response::parse(msg) else {
                    return Heard::Ignored;
                };
                match self.handshake.consume_response(&self.identity, &r) {
                    Ok(keys) => {
                        self.previous = self.keypair.replace(Keypair::new(&keys, since));
                        self.sessions += 1;
                        self.pending = false;
                        self.next_counter = 0;
                        self.established_at = Some(now);
                        Heard::Established
                    }
                    Err(_) => Heard::Ignored,
                }
            }
            // A cookie reply to our initiation asks for it again, with mac2; one to our
            // response only leaves the cookie for the next response, since the
            // gateway retries its initiation (a responder never resends).
            Ok(Kind::CookieReply) => {
                let Ok(r) = CookieReply::parse(msg) else {
                    return Heard::Ignored;
                };
                match self.cookie.consume_reply(&r, since) {
                    Ok(()) => {
                        self.cookie_replies += 1;
                        match self.pending {
                            true => Heard::Cookie,
                            false => Heard::Ignored,
                        }
                    }
                    Err(_) => Heard::Ignored,
                }
            }
            Ok(Kind::Initiation) => self.answer(msg, since),
            Ok(Kind::Transport) => {
                let Ok(h) = TransportHeader::parse(msg) else {
                    return Heard::Ignored;
                };
                let confirmed = self
                    .next
                    .as_ref()
                    .is_some_and(|k| k.local_index == h.receiver);
                if confirmed {
                    self.previous = self.keypair.take();
                    self.keypair = self.next.take();
                    self.sessions += 1;
                    self.next_counter = 0;
                    self.established_at = Some(now);
                }
                let Some(session) = self.session_of(h.receiver) else {
                    return Heard::Ignored;
                };
                if msg.len() > Self::sealed_len(0) {
                    self.unanswered_since.get_or_insert(now);
                }
                match confirmed {
                    true => Heard::Confirmed { counter: h.counter },
                    false => Heard::Transport {
                        counter: h.counter,
                        session,
                    },
                }
            }
            _ => Heard::Ignored,
        }
    }

    /// The outer length of a transport message carrying `padded` bytes of plaintext.
    pub fn sealed_len(padded: usize) -> usize {
        TRANSPORT_HEADER_LEN + padded + TAG_LEN
    }

    /// Seals `msg` in place as message `counter`: `msg` holds the header room, the
    /// padded plaintext (its padding zero) and the tag room. For many messages, take
    /// a [`EmulatedPeer::sealer`].
    pub fn seal(&self, counter: u64, msg: &mut [u8]) {
        if let Some(k) = &self.keypair {
            k.seal(counter, msg);
        }
    }

    /// Our session's send key, prepared once for sealing many messages; None before
    /// the handshake.
    pub fn sealer(&self) -> Option<Sealer> {
        self.keypair.as_ref().map(|k| k.sealer())
    }

    fn session_of(&self, receiver: u32) -> Option<Session> {
        let is = |k: &Option<Keypair>| k.as_ref().is_some_and(|k| k.local_index == receiver);
        if is(&self.keypair) {
            Some(Session::Current)
        } else if is(&self.previous) {
            Some(Session::Previous)
        } else {
            None
        }
    }

    /// Opens a transport message of `session` in place; the plaintext length.
    pub fn open(&self, session: Session, counter: u64, msg: &mut [u8]) -> Option<usize> {
        let k = match session {
            Session::Current => &self.keypair,
            Session::Previous => &self.previous,
        };
        k.as_ref()?.open(counter, msg).ok()
    }
}

#[cfg(test)]
#[path = "emulated_tests.rs"]
mod tests;
