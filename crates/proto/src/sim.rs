//! Deterministic two-endpoint harness on a simulated clock, for the protocol tests and
//! the fuzz targets.
//!
//! Two `Node`s, each one interface with one peer, exchange messages through an
//! in-memory network that can drop or hold traffic. The harness carries out the
//! `Output`s exactly as the data plane does (send handshake bytes, send or drop staged
//! packets, send keepalives) but with no threads or sockets.

use crate::cookie::{Gate, GateVerdict};
use crate::handshake::{consume_initiation_phase1, HandshakeError, LocalIdentity};
use crate::messages::*;
use crate::peer::{Ctx, IndexTable, Output, PeerState};
use crate::timers::InitiationReason;
use rand_core::{CryptoRng, RngCore};
use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

/// Deterministic generator (splitmix64); fine for tests, never for keys in production.
pub struct TestRng(pub u64);
impl RngCore for TestRng {
    fn next_u32(&mut self) -> u32 {
        self.next_u64() as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}
impl CryptoRng for TestRng {}

#[derive(Default)]
pub struct Indices {
    pub live: HashSet<u32>,
    next: u32,
}
impl IndexTable for Indices {
    fn allocate(&mut self) -> u32 {
        self.next += 1;
        self.live.insert(self.next);
        self.next
    }
    fn release(&mut self, index: u32) {
        assert!(self.live.remove(&index), "released unknown index {index}");
    }
}

pub const EPOCH: Duration = Duration::from_secs(1_700_000_000);

#[derive(Default, Debug)]
pub struct Stats {
    pub initiations_sent: usize,
    /// Why each initiation left, in order.
    pub initiation_reasons: Vec<InitiationReason>,
    pub responses_sent: usize,
    pub cookie_replies_sent: usize,
    pub keepalives_sent: usize,
    pub data_sent: usize,
    pub handshake_errors: Vec<HandshakeError>,
    pub replays_dropped: usize,
    pub decrypt_failures: usize,
    /// Initiations that authenticated a static key this node does not know.
    pub unknown_peers: usize,
}

pub struct Node {
    pub local: LocalIdentity,
    pub peer: PeerState,
    pub indices: Indices,
    pub gate: Gate,
    pub rng: TestRng,
    pub addr: SocketAddr,
    pub under_load: bool,
    pub staged: Vec<Vec<u8>>,
    pub delivered: Vec<Vec<u8>>,
    pub stats: Stats,
    /// Every datagram this node sent, for replay tests.
    pub sent_log: Vec<Vec<u8>>,
}

pub struct Sim {
    pub nodes: [Node; 2],
    /// In flight: (destination node, bytes).
    pub net: VecDeque<(usize, Vec<u8>)>,
    pub now: Duration,
    /// When set, datagrams towards node i are silently dropped.
    pub drop_to: [bool; 2],
}

pub fn key(seed: u8) -> [u8; 32] {
    let mut k = [0u8; 32];
    let mut r = TestRng(seed as u64 * 7919);
    r.fill_bytes(&mut k);
    k
}

/// A keypair of fixed keys made without a handshake, for tests that need one in hand
/// (queues, batches, limits), not a session with a peer.
pub fn keypair(is_initiator: bool) -> crate::Keypair {
    let keys = crate::handshake::SessionKeys {
        send: [1; 32],
        recv: [1; 32],
        local_index: 7,
        remote_index: 9,
        is_initiator,
    };
    crate::Keypair::new(&keys, Duration::ZERO)
}

impl Node {
    pub fn new(
        private: [u8; 32],
        peer_public: [u8; 32],
        psk: [u8; 32],
        seed: u64,
        port: u16,
    ) -> Node {
        let local = LocalIdentity::new(private);
        Node {
            gate: Gate::new(&local.public, 1024),
            local,
            peer: PeerState::new(peer_public, psk),
            indices: Indices::default(),
            rng: TestRng(seed),
            addr: SocketAddr::from(([192, 0, 2, port as u8], port)),
            under_load: false,
            staged: Vec::new(),
            delivered: Vec::new(),
            stats: Stats::default(),
            sent_log: Vec::new(),
        }
    }
}

impl Default for Sim {
    fn default() -> Self {
        Sim::new()
    }
}

impl Sim {
    pub fn new_with_psks(psk_a: [u8; 32], psk_b: [u8; 32]) -> Sim {
        let (ka, kb) = (key(1), key(2));
        let pa = LocalIdentity::new(ka).public;
        let pb = LocalIdentity::new(kb).public;
        let mut a = Node::new(ka, pb, psk_a, 11, 1);
        let mut b = Node::new(kb, pa, psk_b, 22, 2);
        a.peer.set_endpoint(b.addr);
        b.peer.set_endpoint(a.addr);
        Sim {
            nodes: [a, b],
            net: VecDeque::new(),
            now: Duration::from_secs(100),
            drop_to: [false; 2],
        }
    }

    pub fn new() -> Sim {
        Sim::new_with_psks([0; 32], [0; 32])
    }

    /// Runs one protocol step on node `i` with a fresh context.
    pub fn with_ctx<R>(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut PeerState, &mut Ctx, &mut Vec<Output>) -> R,
    ) -> R {
        let now = self.now;
        let n = &mut self.nodes[i];
        let mut out = Vec::new();
        let r = {
            let mut ctx = Ctx {
                now,
                wall: EPOCH + now,
                rng: &mut n.rng,
                local: Some(&n.local),
                indices: &mut n.indices,
            };
            f(&mut n.peer, &mut ctx, &mut out)
        };
        self.carry_out(i, out);
        r
    }

    pub fn transmit(&mut self, from: usize, bytes: Vec<u8>) {
        self.nodes[from].sent_log.push(bytes.clone());
        let to = 1 - from;
        if !self.drop_to[to] {
            self.net.push_back((to, bytes));
        }
    }

    pub fn carry_out(&mut self, i: usize, outs: Vec<Output>) {
        for o in outs {
            match o {
                Output::Initiation { reason, message } => {
                    assert_eq!(message[0], TYPE_INITIATION);
                    let stats = &mut self.nodes[i].stats;
                    stats.initiations_sent += 1;
                    stats.initiation_reasons.push(reason);
                    self.transmit(i, message);
                }
                Output::Handshake(b) => {
                    assert_eq!(b[0], TYPE_RESPONSE);
                    self.nodes[i].stats.responses_sent += 1;
                    self.transmit(i, b);
                }
                Output::SendStaged { keepalive_if_empty } => {
                    self.send_staged(i, keepalive_if_empty)
                }
                Output::DropStaged => self.nodes[i].staged.clear(),
            }
        }
    }

    /// The staged packets, or a keepalive if none are staged and `keepalive_if_empty`
    /// (as the daemon's `nonce::send_staged`).
    fn send_staged(&mut self, i: usize, keepalive_if_empty: bool) {
        let staged = std::mem::take(&mut self.nodes[i].staged);
        if staged.is_empty() && keepalive_if_empty {
            self.send(i, Vec::new());
        }
        for p in staged {
            self.send(i, p);
        }
    }

    /// Sends one transport payload (empty = keepalive) from node `i`.
    pub fn send(&mut self, i: usize, payload: Vec<u8>) {
        let got = self.with_ctx(i, |p, ctx, out| p.prepare_send(ctx, 1, out));
        let Some((kp, counter)) = got else {
            self.nodes[i].staged.push(payload);
            return;
        };
        let padded = padded_len(payload.len(), 1420);
        let mut msg = vec![0u8; TRANSPORT_HEADER_LEN + padded + 16];
        msg[TRANSPORT_HEADER_LEN..TRANSPORT_HEADER_LEN + payload.len()].copy_from_slice(&payload);
        kp.seal(counter, &mut msg);
        let data = !payload.is_empty();
        if data {
            self.nodes[i].stats.data_sent += 1;
        } else {
            self.nodes[i].stats.keepalives_sent += 1;
        }
        self.transmit(i, msg);
        self.with_ctx(i, |p, ctx, _| p.on_sent(ctx, data));
    }

    pub fn receive(&mut self, i: usize, bytes: Vec<u8>) {
        let src = self.nodes[1 - i].addr;
        let now = self.now;
        match classify(&bytes) {
            Ok(Kind::Initiation) => {
                let Ok(msg) = Initiation::parse(&bytes) else {
                    return;
                };
                let n = &mut self.nodes[i];
                match n
                    .gate
                    .admit(&bytes, msg.sender, &src, n.under_load, now, &mut n.rng)
                {
                    GateVerdict::Process => {}
                    GateVerdict::SendCookieReply(r) => {
                        n.stats.cookie_replies_sent += 1;
                        self.transmit(i, r.to_bytes().to_vec());
                        return;
                    }
                    GateVerdict::Drop(_) => return,
                }
                let phase1 = match consume_initiation_phase1(&n.local, &msg) {
                    Ok(p) => p,
                    Err(e) => return n.stats.handshake_errors.push(e),
                };
                if &phase1.remote_static != n.peer.remote_static() {
                    n.stats.unknown_peers += 1;
                    return;
                }
                if let Err(e) =
                    self.with_ctx(i, |p, ctx, out| p.consume_initiation(ctx, phase1, src, out))
                {
                    self.nodes[i].stats.handshake_errors.push(e);
                }
            }
            Ok(Kind::Response) => {
                let Ok(msg) = Response::parse(&bytes) else {
                    return;
                };
                let n = &mut self.nodes[i];
                if !matches!(
                    n.gate
                        .admit(&bytes, msg.sender, &src, n.under_load, now, &mut n.rng),
                    GateVerdict::Process
                ) {
                    return;
                }
                if let Err(e) =
                    self.with_ctx(i, |p, ctx, out| p.consume_response(ctx, &msg, src, out))
                {
                    self.nodes[i].stats.handshake_errors.push(e);
                }
            }
            Ok(Kind::CookieReply) => {
                let Ok(r) = CookieReply::parse(&bytes) else {
                    return;
                };
                let _ = self.with_ctx(i, |p, ctx, out| p.consume_cookie_reply(ctx, &r, out));
            }
            Ok(Kind::Transport) => {
                let Ok(h) = TransportHeader::parse(&bytes) else {
                    return;
                };
                let Some(kp) = self.nodes[i].peer.keypair_for(h.receiver, now) else {
                    self.nodes[i].stats.decrypt_failures += 1;
                    return;
                };
                let mut buf = bytes.clone();
                let Ok(len) = kp.open(h.counter, &mut buf) else {
                    self.nodes[i].stats.decrypt_failures += 1;
                    return;
                };
                if !kp.accept_counter(h.counter) {
                    self.nodes[i].stats.replays_dropped += 1;
                    return;
                }
                let payload = buf[TRANSPORT_HEADER_LEN..TRANSPORT_HEADER_LEN + len].to_vec();
                let data = !payload.is_empty();
                self.with_ctx(i, |p, ctx, out| {
                    p.on_authenticated_transport(ctx, &kp, src, data, out)
                });
                if data {
                    self.nodes[i].delivered.push(payload);
                }
            }
            Err(_) => {}
        }
    }

    /// Delivers everything in flight, including what the deliveries provoke.
    pub fn flush(&mut self) {
        let mut guard = 0;
        while let Some((to, b)) = self.net.pop_front() {
            self.receive(to, b);
            guard += 1;
            assert!(guard < 100_000, "message storm");
        }
    }

    /// Advances the clock in `step`s up to `dur`, running timers and the network.
    pub fn advance(&mut self, dur: Duration, step: Duration) {
        let end = self.now + dur;
        while self.now < end {
            self.now = (self.now + step).min(end);
            for i in 0..2 {
                self.with_ctx(i, |p, ctx, out| p.tick(ctx, out));
            }
            self.flush();
        }
    }

    pub fn app_send(&mut self, i: usize, payload: &[u8]) {
        self.send(i, payload.to_vec());
        self.flush();
    }
}
