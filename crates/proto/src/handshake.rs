//! The Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s handshake (whitepaper §5.4.2–§5.4.5).
//!
//! Flow: the initiator builds an initiation from its [`LocalIdentity`] and the peer's
//! static key; the responder decrypts it in two phases (phase one reveals the initiator's
//! static key so the caller can find the peer, phase two finishes with that peer's
//! precomputed static-static secret and preshared key) and answers with a response; both
//! sides then split the chaining key into a send and a receive key.
//!
//! Invariant: every consume function works on copies of the symmetric state and commits
//! only after all authentication succeeded, so a bad message never changes state.

use crate::crypto::{self, KEY_LEN};
use crate::messages::{Initiation, Response};
use rand_core::RngCore;
use std::sync::OnceLock;
use std::time::Duration;
use x25519_dalek::StaticSecret;
use zeroize::Zeroize;

pub const CONSTRUCTION: &[u8] = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
pub const IDENTIFIER: &[u8] = b"WireGuard v1 zx2c4 Jason@zx2c4.com";
pub const LABEL_MAC1: &[u8] = b"mac1----";
pub const LABEL_COOKIE: &[u8] = b"cookie--";

/// Minimum spacing between two initiations we accept from one peer: 50 per second.
pub const INITIATIONS_PER_SECOND: u32 = 50;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("handshake message failed to decrypt")]
    Decrypt,
    #[error("Diffie-Hellman produced a low-order point")]
    LowOrderPoint,
    #[error("initiation timestamp is not newer than the last one (replay)")]
    Replay,
    #[error("initiations from this peer arrive faster than 50 per second")]
    Flood,
    #[error("response does not match an initiation we sent")]
    UnexpectedResponse,
    #[error("no private key is configured")]
    NoPrivateKey,
}

fn initial_chain_and_hash() -> &'static ([u8; 32], [u8; 32]) {
    static INIT: OnceLock<([u8; 32], [u8; 32])> = OnceLock::new();
    INIT.get_or_init(|| {
        let chain = crypto::hash(&[CONSTRUCTION]);
        let hash = crypto::hash(&[&chain, IDENTIFIER]);
        (chain, hash)
    })
}

/// This interface's static identity plus the keys derived from it once.
pub struct LocalIdentity {
    secret: StaticSecret,
    pub public: [u8; KEY_LEN],
    /// HASH(LABEL_MAC1 || our public): checks mac1 on messages sent to us.
    pub mac1_key: [u8; 32],
    /// HASH(LABEL_COOKIE || our public): encrypts the cookie replies we send.
    pub cookie_key: [u8; 32],
}

impl LocalIdentity {
    /// Takes the key clamped (see [`crypto::clamp_private`]), so that
    /// [`LocalIdentity::private_bytes`] reports what the kernel would.
    pub fn new(private: [u8; KEY_LEN]) -> Self {
        let secret = StaticSecret::from(crypto::clamp_private(private));
        let public = crypto::public_key(&secret);
        LocalIdentity {
            mac1_key: crypto::hash(&[LABEL_MAC1, &public]),
            cookie_key: crypto::hash(&[LABEL_COOKIE, &public]),
            secret,
            public,
        }
    }

    pub fn private_bytes(&self) -> [u8; KEY_LEN] {
        self.secret.to_bytes()
    }

    /// DH(our static, theirs): the static-static secret a peer precomputes once.
    pub fn static_static(&self, remote: &[u8; KEY_LEN]) -> Option<[u8; KEY_LEN]> {
        crypto::dh(&self.secret, remote)
    }
}

/// Noise symmetric state: chaining key and transcript hash.
#[derive(Clone)]
struct Symmetric {
    chain: [u8; 32],
    hash: [u8; 32],
}

impl Drop for Symmetric {
    fn drop(&mut self) {
        self.chain.zeroize();
        self.hash.zeroize();
    }
}

impl Symmetric {
    /// State after the prologue and the responder's static key were mixed in.
    fn new(responder_static: &[u8; 32]) -> Self {
        let (chain, hash) = initial_chain_and_hash();
        Symmetric {
            chain: *chain,
            hash: crypto::hash(&[hash, responder_static]),
        }
    }
    fn mix_hash(&mut self, data: &[u8]) {
        self.hash = crypto::hash(&[&self.hash, data]);
    }
    fn mix_key(&mut self, input: &[u8]) {
        let [c] = crypto::kdf::<1>(&self.chain, input);
        self.chain = c;
    }
    fn mix_dh(&mut self, shared: &[u8; 32]) -> [u8; 32] {
        let [c, k] = crypto::kdf::<2>(&self.chain, shared);
        self.chain = c;
        k
    }
    fn mix_key_and_hash(&mut self, psk: &[u8; 32]) -> [u8; 32] {
        let [c, t, k] = crypto::kdf::<3>(&self.chain, psk);
        self.chain = c;
        self.mix_hash(&t);
        k
    }
    fn encrypt_and_hash(&mut self, key: &[u8; 32], plain: &[u8]) -> Vec<u8> {
        let ct = crypto::aead_seal(key, 0, plain, &self.hash);
        self.mix_hash(&ct);
        ct
    }
    fn decrypt_and_hash(&mut self, key: &[u8; 32], ct: &[u8]) -> Result<Vec<u8>, HandshakeError> {
        let pt = crypto::aead_open(key, 0, ct, &self.hash).map_err(|_| HandshakeError::Decrypt)?;
        self.mix_hash(ct);
        Ok(pt)
    }
    /// Split: (initiator→responder key, responder→initiator key).
    fn split(&self) -> ([u8; 32], [u8; 32]) {
        let [a, b] = crypto::kdf::<2>(&self.chain, &[]);
        (a, b)
    }
}

/// TAI64N label of a wall-clock time since the Unix epoch. Nanoseconds are rounded down
/// to 2^24 ns, as the kernel does, so the timestamp does not leak precise clock readings.
pub fn tai64n(wall: Duration) -> [u8; 12] {
    let mut out = [0u8; 12];
    let secs = 0x4000_0000_0000_000a_u64.wrapping_add(wall.as_secs());
    let nanos = wall.subsec_nanos() & !((1u32 << 24) - 1);
    out[..8].copy_from_slice(&secs.to_be_bytes());
    out[8..].copy_from_slice(&nanos.to_be_bytes());
    out
}

/// Keys a completed handshake yields, before they become a [`crate::Keypair`].
pub struct SessionKeys {
    pub send: [u8; 32],
    pub recv: [u8; 32],
    pub local_index: u32,
    pub remote_index: u32,
    pub is_initiator: bool,
}

impl Drop for SessionKeys {
    fn drop(&mut self) {
        self.send.zeroize();
        self.recv.zeroize();
    }
}

/// Phase one of consuming an initiation: done with our static key only, before we know
/// which peer sent it.
pub struct InitiationPhase1 {
    sym: Symmetric,
    pub remote_static: [u8; 32],
    remote_ephemeral: [u8; 32],
    sender: u32,
    encrypted_timestamp: [u8; 28],
}

/// Decrypts an initiation's static field. Costs one DH; callers check mac1 first.
pub fn consume_initiation_phase1(
    local: &LocalIdentity,
    msg: &Initiation,
) -> Result<InitiationPhase1, HandshakeError> {
    let mut sym = Symmetric::new(&local.public);
    sym.mix_key(&msg.ephemeral);
    sym.mix_hash(&msg.ephemeral);
    let shared = crypto::dh(&local.secret, &msg.ephemeral).ok_or(HandshakeError::LowOrderPoint)?;
    let k = sym.mix_dh(&shared);
    let static_pt = sym.decrypt_and_hash(&k, &msg.encrypted_static)?;
    Ok(InitiationPhase1 {
        sym,
        remote_static: static_pt
            .try_into()
            .expect("static field decrypts to 32 bytes"),
        remote_ephemeral: msg.ephemeral,
        sender: msg.sender,
        encrypted_timestamp: msg.encrypted_timestamp,
    })
}

enum State {
    Idle,
    /// We sent an initiation and wait for its response. Boxed: at any moment most of a
    /// large gateway's peers have none in flight, and pay 8 bytes instead of about 110.
    InitiationSent(Box<InFlight>),
}

struct InFlight {
    sym: Symmetric,
    ephemeral: StaticSecret,
    local_index: u32,
}

/// Per-peer handshake state: the peer's static key, the preshared key, replay and
/// flood protection for initiations, and an in-flight initiation if any.
pub struct Handshake {
    pub remote_static: [u8; 32],
    psk: [u8; 32],
    /// DH(our static, their static), computed on first use so that loading thousands of
    /// peers costs no scalar multiplications; cleared when our private key changes.
    static_static: Option<[u8; 32]>,
    state: State,
    latest_timestamp: [u8; 12],
    last_initiation_consumed: Option<Duration>,
}

impl Drop for Handshake {
    fn drop(&mut self) {
        self.psk.zeroize();
        if let Some(ss) = self.static_static.as_mut() {
            ss.zeroize();
        }
    }
}

impl Handshake {
    pub fn new(remote_static: [u8; 32], psk: [u8; 32]) -> Self {
        Handshake {
            remote_static,
            psk,
            static_static: None,
            state: State::Idle,
            latest_timestamp: [0; 12],
            last_initiation_consumed: None,
        }
    }

    pub fn psk(&self) -> &[u8; 32] {
        &self.psk
    }

    pub fn set_psk(&mut self, psk: [u8; 32]) {
        self.psk = psk;
    }

    /// Our private key changed: forget the precomputed secret (wiped, not only let go)
    /// and any initiation in flight.
    pub fn local_identity_changed(&mut self) -> Option<u32> {
        if let Some(ss) = self.static_static.as_mut() {
            ss.zeroize();
        }
        self.static_static = None;
        self.clear()
    }

    /// Drops an in-flight initiation; returns its index so the caller can release it.
    pub fn clear(&mut self) -> Option<u32> {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::InitiationSent(f) => Some(f.local_index),
            State::Idle => None,
        }
    }

    /// Index of the initiation in flight, if any.
    pub fn pending_index(&self) -> Option<u32> {
        match &self.state {
            State::InitiationSent(f) => Some(f.local_index),
            State::Idle => None,
        }
    }

    fn static_static(&mut self, local: &LocalIdentity) -> Result<[u8; 32], HandshakeError> {
        if self.static_static.is_none() {
            self.static_static = local.static_static(&self.remote_static);
        }
        self.static_static.ok_or(HandshakeError::LowOrderPoint)
    }

    /// Builds an initiation (mac fields zero: the cookie generator fills them).
    /// Replaces any initiation in flight; returns the replaced index, if any.
    pub fn create_initiation(
        &mut self,
        local: &LocalIdentity,
        local_index: u32,
        wall: Duration,
        rng: &mut dyn RngCore,
    ) -> Result<(Initiation, Option<u32>), HandshakeError> {
        let ss = self.static_static(local)?;
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        let ephemeral = StaticSecret::from(seed);
        seed.zeroize();
        let e_pub = crypto::public_key(&ephemeral);

        let mut sym = Symmetric::new(&self.remote_static);
        sym.mix_key(&e_pub);
        sym.mix_hash(&e_pub);
        let es =
            crypto::dh(&ephemeral, &self.remote_static).ok_or(HandshakeError::LowOrderPoint)?;
        let k = sym.mix_dh(&es);
        let encrypted_static = sym.encrypt_and_hash(&k, &local.public);
        let k = sym.mix_dh(&ss);
        let encrypted_timestamp = sym.encrypt_and_hash(&k, &tai64n(wall));

        let msg = Initiation {
            sender: local_index,
            ephemeral: e_pub,
            encrypted_static: encrypted_static.try_into().expect("32 + 16 bytes"),
            encrypted_timestamp: encrypted_timestamp.try_into().expect("12 + 16 bytes"),
            mac1: [0; 16],
            mac2: [0; 16],
        };
        let replaced = self.clear();
        self.state = State::InitiationSent(Box::new(InFlight {
            sym,
            ephemeral,
            local_index,
        }));
        Ok((msg, replaced))
    }

    /// Phase two of consuming an initiation from this peer, then building our response.
    /// Checks the TAI64N replay protection and the 50-per-second flood limit; on success
    /// any initiation we had in flight is abandoned (its index is returned in `replaced`).
    pub fn consume_initiation_and_respond(
        &mut self,
        local: &LocalIdentity,
        phase1: InitiationPhase1,
        local_index: u32,
        now: Duration,
        rng: &mut dyn RngCore,
    ) -> Result<(Response, SessionKeys, Option<u32>), HandshakeError> {
        let ss = self.static_static(local)?;
        let mut sym = phase1.sym.clone();
        let k = sym.mix_dh(&ss);
        let ts = sym.decrypt_and_hash(&k, &phase1.encrypted_timestamp)?;
        let ts: [u8; 12] = ts.try_into().expect("12-byte timestamp");
        // Big-endian TAI64N compares correctly as bytes.
        if ts <= self.latest_timestamp {
            return Err(HandshakeError::Replay);
        }
        let min_gap = Duration::from_secs(1) / INITIATIONS_PER_SECOND;
        if let Some(last) = self.last_initiation_consumed {
            if now < last + min_gap {
                return Err(HandshakeError::Flood);
            }
        }

        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        let ephemeral = StaticSecret::from(seed);
        seed.zeroize();
        let e_pub = crypto::public_key(&ephemeral);
        sym.mix_key(&e_pub);
        sym.mix_hash(&e_pub);
        let ee = crypto::dh(&ephemeral, &phase1.remote_ephemeral)
            .ok_or(HandshakeError::LowOrderPoint)?;
        sym.mix_key(&ee);
        let se =
            crypto::dh(&ephemeral, &self.remote_static).ok_or(HandshakeError::LowOrderPoint)?;
        sym.mix_key(&se);
        let k = sym.mix_key_and_hash(&self.psk);
        let encrypted_nothing = sym.encrypt_and_hash(&k, &[]);
        let (i_to_r, r_to_i) = sym.split();

        // Authenticated and fresh: commit.
        self.latest_timestamp = ts;
        self.last_initiation_consumed = Some(now);
        let replaced = self.clear();
        let msg = Response {
            sender: local_index,
            receiver: phase1.sender,
            ephemeral: e_pub,
            encrypted_nothing: encrypted_nothing.try_into().expect("16-byte tag"),
            mac1: [0; 16],
            mac2: [0; 16],
        };
        let keys = SessionKeys {
            send: r_to_i,
            recv: i_to_r,
            local_index,
            remote_index: phase1.sender,
            is_initiator: false,
        };
        Ok((msg, keys, replaced))
    }

    /// Consumes a response to our in-flight initiation. On success the initiation is
    /// finished and its index becomes the new session's local index.
    pub fn consume_response(
        &mut self,
        local: &LocalIdentity,
        msg: &Response,
    ) -> Result<SessionKeys, HandshakeError> {
        let keys = self.response_work(msg)?.compute(local, msg)?;
        self.finish_response(&keys)?;
        Ok(keys)
    }

    /// What `msg` needs from the initiation in flight, copied out: the first of the
    /// three steps [`Handshake::consume_response`] takes, for a caller that runs the
    /// second ([`ResponseWork::compute`], two Diffie-Hellman operations) without the
    /// lock it keeps this state under, as the kernel's `consume_response` does. A
    /// forged response then costs the lock a copy, not the two operations.
    pub fn response_work(&self, msg: &Response) -> Result<ResponseWork, HandshakeError> {
        let State::InitiationSent(in_flight) = &self.state else {
            return Err(HandshakeError::UnexpectedResponse);
        };
        if msg.receiver != in_flight.local_index {
            return Err(HandshakeError::UnexpectedResponse);
        }
        Ok(ResponseWork {
            sym: in_flight.sym.clone(),
            ephemeral: in_flight.ephemeral.clone(),
            local_index: in_flight.local_index,
            psk: self.psk,
        })
    }

    /// The third step: takes the keys computed from a [`ResponseWork`] if the
    /// initiation they answer is still the one in flight (another may have replaced it,
    /// or a response to it been taken, while they were computed).
    pub fn finish_response(&mut self, keys: &SessionKeys) -> Result<(), HandshakeError> {
        if self.pending_index() != Some(keys.local_index) {
            return Err(HandshakeError::UnexpectedResponse);
        }
        self.state = State::Idle;
        Ok(())
    }
}

/// A response's work, copied from the initiation in flight ([`Handshake::response_work`]).
pub struct ResponseWork {
    sym: Symmetric,
    ephemeral: StaticSecret,
    local_index: u32,
    psk: [u8; 32],
}

impl Drop for ResponseWork {
    fn drop(&mut self) {
        self.psk.zeroize();
    }
}

impl ResponseWork {
    /// The second step: the two Diffie-Hellman operations and the decryption that
    /// authenticates `msg`; the session's keys.
    pub fn compute(
        &self,
        local: &LocalIdentity,
        msg: &Response,
    ) -> Result<SessionKeys, HandshakeError> {
        let mut sym = self.sym.clone();
        sym.mix_key(&msg.ephemeral);
        sym.mix_hash(&msg.ephemeral);
        let ee =
            crypto::dh(&self.ephemeral, &msg.ephemeral).ok_or(HandshakeError::LowOrderPoint)?;
        sym.mix_key(&ee);
        let se = crypto::dh(&local.secret, &msg.ephemeral).ok_or(HandshakeError::LowOrderPoint)?;
        sym.mix_key(&se);
        let k = sym.mix_key_and_hash(&self.psk);
        sym.decrypt_and_hash(&k, &msg.encrypted_nothing)?;
        let (i_to_r, r_to_i) = sym.split();
        Ok(SessionKeys {
            send: i_to_r,
            recv: r_to_i,
            local_index: self.local_index,
            remote_index: msg.sender,
            is_initiator: true,
        })
    }
}

/// The Noise core with every input supplied, for checking against published Noise test
/// vectors (which fix the ephemerals and use arbitrary prologues and payloads).
#[cfg(test)]
pub(crate) mod noise_vector {
    use super::*;

    pub struct Transcript {
        pub msg0: Vec<u8>,
        pub msg1: Vec<u8>,
        pub handshake_hash: [u8; 32],
        pub initiator_send: [u8; 32],
        pub initiator_recv: [u8; 32],
    }

    /// Runs IKpsk2 as the initiator would and returns both messages as Noise encodes
    /// them (ephemeral || ciphertexts). The responder's side is implied by the vectors.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        prologue: &[u8],
        init_static: [u8; 32],
        init_ephemeral: [u8; 32],
        resp_static: [u8; 32],
        resp_ephemeral: [u8; 32],
        psk: [u8; 32],
        payload0: &[u8],
        payload1: &[u8],
    ) -> Transcript {
        let s_i = StaticSecret::from(init_static);
        let e_i = StaticSecret::from(init_ephemeral);
        let s_r = StaticSecret::from(resp_static);
        let e_r = StaticSecret::from(resp_ephemeral);
        let s_r_pub = crypto::public_key(&s_r);
        let s_i_pub = crypto::public_key(&s_i);
        let e_i_pub = crypto::public_key(&e_i);
        let e_r_pub = crypto::public_key(&e_r);

        let chain = crypto::hash(&[CONSTRUCTION]);
        let mut sym = Symmetric { chain, hash: chain };
        sym.mix_hash(prologue);
        sym.mix_hash(&s_r_pub);
        // -> e, es, s, ss
        let mut msg0 = e_i_pub.to_vec();
        sym.mix_hash(&e_i_pub);
        sym.mix_key(&e_i_pub); // psk modifier: e also mixes into the key
        let k = sym.mix_dh(&crypto::dh(&e_i, &s_r_pub).unwrap());
        msg0.extend(sym.encrypt_and_hash(&k, &s_i_pub));
        let k = sym.mix_dh(&crypto::dh(&s_i, &s_r_pub).unwrap());
        msg0.extend(sym.encrypt_and_hash(&k, payload0));
        // <- e, ee, se, psk
        let mut msg1 = e_r_pub.to_vec();
        sym.mix_hash(&e_r_pub);
        sym.mix_key(&e_r_pub);
        sym.mix_key(&crypto::dh(&e_r, &e_i_pub).unwrap());
        sym.mix_key(&crypto::dh(&e_r, &s_i_pub).unwrap());
        let k = sym.mix_key_and_hash(&psk);
        msg1.extend(sym.encrypt_and_hash(&k, payload1));
        let (a, b) = sym.split();
        Transcript {
            msg0,
            msg1,
            handshake_hash: sym.hash,
            initiator_send: a,
            initiator_recv: b,
        }
    }
}
