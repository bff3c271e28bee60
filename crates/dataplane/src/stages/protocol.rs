//! Not a stage of its own: the protocol step any stage (and the UAPI) may take on a
//! peer. Input: a closure over the peer's `PeerState` and a fully built protocol
//! context. Output: the closure's result, the peer's timer re-armed, and the outputs
//! the step asked for, which `nonce::step` carries out (handshake messages through
//! [`send_to_peer`], packets into stage TX-3).

use super::StageCtx;
use crate::peer::Peer;
use rand_core::OsRng;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use wirelane_io::udp::NOT_ECT;
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

/// Runs one protocol step on `peer` and re-arms its timer; returns the closure's
/// result and what the step asks for, to carry out once the peer's state lock is
/// released (`nonce::step` does both).
pub fn take_step<R>(
    c: StageCtx<'_>,
    peer: &Arc<Peer>,
    f: impl FnOnce(&mut PeerState, &mut Ctx, &mut Vec<Output>) -> R,
) -> (R, Vec<Output>) {
    let iface = c.iface;
    let mut out = Vec::new();
    let (r, deadline) = {
        let mut state = peer.state();
        // Read under the state lock: a key change sets the identity, then steps each
        // peer to forget what it derived from the old one. Read before the lock, an
        // old identity could be used after that step and its DH result kept for good.
        let identity = iface.identity_now();
        let mut indices = iface.index_table(peer);
        let r = with_step_rng(|rng| {
            let now = iface.now();
            let mut ctx = Ctx {
                now,
                wall: iface.wall_at(now),
                rng,
                local: identity.as_deref(),
                indices: &mut indices,
            };
            f(&mut state, &mut ctx, &mut out)
        });
        // Under the lock, before any message of this step leaves (`cookie_slot`).
        peer.cookie_reply.follow(state.awaits_cookie_reply());
        (r, state.next_deadline())
    };
    // A peer removed while this step ran (it was found before): nothing it asked for
    // is carried out, and it is not armed again. Its indices are not kept either
    // (`PeerIndices::allocate`).
    if peer.is_removed() {
        out.clear();
        return (r, out);
    }
    iface.rearm(peer, deadline);
    (r, out)
}

/// Sends one datagram (a handshake message) to the peer's current endpoint, if it has
/// one, from its sticky source, by the handshake socket (`Sockets::for_handshake_to`).
pub fn send_to_peer(c: StageCtx<'_>, peer: &Peer, bytes: &[u8]) {
    let iface = c.iface;
    let Some(ep) = peer.state().endpoint() else {
        iface.stats.tx_no_endpoint.fetch_add(1, Ordering::Relaxed);
        return;
    };
    // Set down, the interface sends nothing (the kernel's has closed its sockets).
    if iface.netwatch.is_down() {
        return;
    }
    let src = iface.source_for(peer, ep);
    let sockets = iface.sockets();
    let sent = sockets
        .for_handshake_to(&ep)
        .is_some_and(|s| s.send_from(bytes, &ep, src, NOT_ECT).is_ok());
    if sent {
        peer.tx_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    } else {
        // No socket of the endpoint's family, or the kernel refused it: the timers
        // retry; the loss is counted, not silent.
        iface.stats.tx_send_failed.fetch_add(1, Ordering::Relaxed);
    }
}
