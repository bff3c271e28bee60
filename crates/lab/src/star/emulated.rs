//! One emulated WireGuard peer of the star scenario, driven from `proto`: its own key
//! pair, the initiator's side of the handshake (with the cookie mechanism), and the
//! session it yields, which seals the peer's traffic ahead of the timed phase and opens
//! samples of what the gateway sends it. No I/O here: the generator owns the sockets.

use rand_core::{OsRng, RngCore};
use std::time::{Duration, Instant};
use wirelane_proto::cookie::CookieGenerator;
use wirelane_proto::crypto::TAG_LEN;
use wirelane_proto::handshake::{Handshake, LocalIdentity};
use wirelane_proto::messages::{
    classify, CookieReply, Kind, Response, TransportHeader, TRANSPORT_HEADER_LEN,
};
use wirelane_proto::{Keypair, Sealer};

/// The initiator retries an unanswered initiation after this (whitepaper §6.4).
pub const REKEY_TIMEOUT: Duration = Duration::from_secs(5);
/// TAI64N keeps time to 2^24 ns: a retry sooner than this after the last initiation
/// would carry the same timestamp, which the responder must refuse as a replay.
const TIMESTAMP_STEP: Duration = Duration::from_millis(17);

pub struct EmulatedPeer {
    identity: LocalIdentity,
    handshake: Handshake,
    cookie: CookieGenerator,
    /// Our sender index: the peer's position plus one, unique among the emulated peers.
    pub local_index: u32,
    pub keypair: Option<Keypair>,
    /// The wall clock of the last initiation (kept increasing, see TIMESTAMP_STEP).
    last_wall: Duration,
    /// When the last initiation left (retries are due REKEY_TIMEOUT after it).
    pub last_initiation: Option<Instant>,
    pub established_at: Option<Instant>,
    pub initiations: u32,
    pub cookie_replies: u32,
}

/// What a datagram from the gateway means for the peer.
#[derive(Debug, PartialEq, Eq)]
pub enum Heard {
    /// The handshake completed: the session is up.
    Established,
    /// A cookie reply: the gateway is under load; initiate again, now with mac2.
    Cookie,
    /// Transport data of our session (its counter and the message's length).
    Transport { counter: u64 },
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
            local_index: position as u32 + 1,
            keypair: None,
            last_wall: Duration::ZERO,
            last_initiation: None,
            established_at: None,
            initiations: 0,
            cookie_replies: 0,
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
        let (msg, _) = self
            .handshake
            .create_initiation(&self.identity, self.local_index, wall, &mut OsRng)
            .expect("the gateway's public key is a valid point");
        let mut bytes = msg.to_bytes().to_vec();
        self.cookie.stamp(&mut bytes, since);
        self.last_initiation = Some(now);
        self.initiations += 1;
        bytes
    }

    /// Whether an unanswered initiation is due for a retry at `now`.
    pub fn retry_due(&self, now: Instant) -> bool {
        self.keypair.is_none()
            && self
                .last_initiation
                .is_some_and(|t| now.duration_since(t) >= REKEY_TIMEOUT)
    }

    /// Takes one datagram from the gateway.
    pub fn hear(&mut self, msg: &[u8], now: Instant, since: Duration) -> Heard {
        match classify(msg) {
            Ok(Kind::Response) if self.keypair.is_none() => {
                let Ok(r) = Response::parse(msg) else {
                    return Heard::Ignored;
                };
                match self.handshake.consume_response(&self.identity, &r) {
                    Ok(keys) => {
                        self.keypair = Some(Keypair::new(&keys, since));
                        self.established_at = Some(now);
                        Heard::Established
                    }
                    Err(_) => Heard::Ignored,
                }
            }
            Ok(Kind::CookieReply) if self.keypair.is_none() => {
                let Ok(r) = CookieReply::parse(msg) else {
                    return Heard::Ignored;
                };
                match self.cookie.consume_reply(&r, since) {
                    Ok(()) => {
                        self.cookie_replies += 1;
                        Heard::Cookie
                    }
                    Err(_) => Heard::Ignored,
                }
            }
            Ok(Kind::Transport) => match (TransportHeader::parse(msg), &self.keypair) {
                (Ok(h), Some(k)) if h.receiver == k.local_index => {
                    Heard::Transport { counter: h.counter }
                }
                _ => Heard::Ignored,
            },
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

    /// Opens a transport message of our session in place; the plaintext length.
    pub fn open(&self, counter: u64, msg: &mut [u8]) -> Option<usize> {
        self.keypair.as_ref()?.open(counter, msg).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wirelane_proto::handshake::consume_initiation_phase1;
    use wirelane_proto::messages::Initiation;

    /// A responder built from `proto` answers the emulated peer's initiation: the two
    /// sessions then seal and open each other's messages.
    #[test]
    fn completes_a_handshake_and_seals_for_the_responder() {
        let mut gw_private = [0u8; 32];
        OsRng.fill_bytes(&mut gw_private);
        let gateway = LocalIdentity::new(gw_private);
        let mut peer = EmulatedPeer::new(7, &gateway.public);
        let now = Instant::now();
        let init = peer.initiation(now, Duration::from_secs(1), Duration::from_secs(1_000));
        assert_eq!(init.len(), wirelane_proto::messages::INITIATION_LEN);

        let mut responder = Handshake::new(peer.public(), [0; 32]);
        let phase1 =
            consume_initiation_phase1(&gateway, &Initiation::parse(&init).unwrap()).unwrap();
        let (resp, keys, _) = responder
            .consume_initiation_and_respond(&gateway, phase1, 99, Duration::ZERO, &mut OsRng)
            .unwrap();
        let mut resp = resp.to_bytes().to_vec();
        CookieGenerator::new(&peer.public()).stamp(&mut resp, Duration::ZERO);
        assert_eq!(
            peer.hear(&resp, now, Duration::from_secs(1)),
            Heard::Established
        );

        let theirs = Keypair::new(&keys, Duration::ZERO);
        let mut msg = vec![0u8; EmulatedPeer::sealed_len(32)];
        msg[TRANSPORT_HEADER_LEN..TRANSPORT_HEADER_LEN + 32].fill(0xab);
        peer.seal(5, &mut msg);
        assert_eq!(theirs.open(5, &mut msg), Ok(32));
        assert!(msg[TRANSPORT_HEADER_LEN..TRANSPORT_HEADER_LEN + 32]
            .iter()
            .all(|&b| b == 0xab));
    }
}
