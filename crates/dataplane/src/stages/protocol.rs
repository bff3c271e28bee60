//! Not a stage of its own: the protocol step any stage (and the UAPI) may take on a
//! peer, and what the step asks for afterwards. Input: a closure over the peer's
//! `PeerState` and a fully built protocol context. Output: the closure's result; the
//! peer's timer re-armed; handshake messages sent; staged packets and keepalives
//! entered into the TX pipeline (stage TX-3, `nonce`) in order.

use super::StageCtx;
use crate::packet::Packet;
use crate::peer::Peer;
use rand_core::OsRng;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use wirelane_proto::crypto::KeystreamRng;
use wirelane_proto::{Ctx, Output, PeerState};

thread_local! {
    /// Randomness for protocol steps: ephemeral keys, session indices and the rekey
    /// jitter that every data send draws. Seeded once per thread from the OS; drawing
    /// from the OS instead cost a `getrandom` syscall per request on an idle tunnel.
    /// The generator erases its key as it goes (see [`KeystreamRng`]). Per thread, not
    /// per interface: a thread serving several interfaces draws from one stream.
    static STEP_RNG: RefCell<KeystreamRng> = RefCell::new(KeystreamRng::from_rng(&mut OsRng));
}

/// Runs `f` with this thread's protocol-step generator (see `STEP_RNG`).
pub(crate) fn with_step_rng<R>(f: impl FnOnce(&mut KeystreamRng) -> R) -> R {
    STEP_RNG.with_borrow_mut(f)
}

/// Runs one protocol step on `peer`, then re-arms its timer and carries out whatever
/// the step asked for (after the peer's state lock is released).
pub fn step<R>(
    c: StageCtx<'_>,
    peer: &Arc<Peer>,
    f: impl FnOnce(&mut PeerState, &mut Ctx, &mut Vec<Output>) -> R,
) -> R {
    let iface = c.iface;
    let identity = iface.identity();
    let mut out = Vec::new();
    let (r, deadline) = {
        let mut state = peer.state();
        let mut indices = iface.index_table(peer);
        let r = with_step_rng(|rng| {
            let mut ctx = Ctx {
                now: iface.now(),
                wall: iface.wall(),
                rng,
                local: identity.as_deref(),
                indices: &mut indices,
            };
            f(&mut state, &mut ctx, &mut out)
        });
        (r, state.next_deadline())
    };
    iface.rearm(peer, deadline);
    carry_out(c, peer, out);
    r
}

/// Carries out protocol outputs for `peer`.
fn carry_out(c: StageCtx<'_>, peer: &Arc<Peer>, outs: Vec<Output>) {
    for o in outs {
        match o {
            Output::Handshake(bytes) => send_to_peer(c, peer, &bytes),
            Output::SendStaged { keepalive_if_empty } => {
                let mut staged = peer.take_staged();
                if staged.is_empty() && keepalive_if_empty {
                    staged.push(Packet::with_capacity(0));
                }
                if !staged.is_empty() {
                    super::nonce::assign_and_enqueue(c, peer, staged);
                }
            }
            Output::Keepalive => {
                super::nonce::assign_and_enqueue(c, peer, vec![Packet::with_capacity(0)])
            }
            Output::DropStaged => {
                let n = peer.take_staged().len();
                c.iface
                    .stats
                    .tx_dropped
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
}

/// Sends one datagram (a handshake message) to the peer's current endpoint, if it has
/// one, from its sticky source.
fn send_to_peer(c: StageCtx<'_>, peer: &Peer, bytes: &[u8]) {
    let iface = c.iface;
    let Some(ep) = peer.state().endpoint() else {
        iface.stats.tx_no_endpoint.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let src = iface.source_for(peer, ep);
    let sockets = iface.sockets();
    if let Some(s) = sockets.for_destination(&ep) {
        if s.send_from(bytes, &ep, src).is_ok() {
            peer.tx_bytes
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
    }
}
