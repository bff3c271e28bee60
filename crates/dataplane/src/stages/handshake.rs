//! Handshake stage. Input: the bounded handshake queue, holding the messages the gate
//! (`stages::gate`, on the UDP readers) admitted, and cookie replies received. Output:
//! responses and new sessions. Runs apart from the data path, on a thread of lower
//! priority, so Diffie-Hellman work can never starve transport data.
//!
//! Cost control is the gate's: mac1 is checked before a message is queued, so junk
//! costs one BLAKE2s and no Diffie-Hellman, and under load a valid mac2 (cookie) and the
//! per-source rate limit are required too. What reaches this stage is worth its DH.

use super::nonce::step;
use super::StageCtx;
use crate::interface::HandshakeJob;
use std::sync::atomic::Ordering;
use wirelane_proto::handshake::consume_initiation_phase1;
use wirelane_proto::messages::{CookieReply, Initiation, Kind, Response};

enum Message {
    Initiation(Initiation),
    Response(Response),
}

pub fn process(c: StageCtx<'_>, job: HandshakeJob) {
    let dev = c.iface;
    let Some(identity) = dev.identity() else {
        return;
    };
    let msg = match job.kind {
        Kind::Initiation => Initiation::parse(&job.bytes).map(Message::Initiation),
        Kind::Response => Response::parse(&job.bytes).map(Message::Response),
        Kind::CookieReply => return consume_cookie_reply(c, &job),
        Kind::Transport => return,
    };
    let Ok(msg) = msg else { return };
    let (peer, result) = match msg {
        Message::Initiation(msg) => {
            dev.stats.handshake_dh.fetch_add(1, Ordering::Relaxed);
            let Ok(phase1) = consume_initiation_phase1(&identity, &msg) else {
                dev.stats.handshake_failed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let Some(peer) = dev.table().by_key.get(&phase1.remote_static).cloned() else {
                dev.stats.handshake_failed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            dev.stats.handshake_dh.fetch_add(3, Ordering::Relaxed);
            peer.rx_bytes
                .fetch_add(job.bytes.len() as u64, Ordering::Relaxed);
            let r = step(c, &peer, |state, ctx, out| {
                let r = state.consume_initiation(ctx, phase1, job.src, out);
                // Before the response leaves (after this closure): it must leave from
                // the address the initiation arrived at.
                if r.is_ok() {
                    peer.learn_source(job.src, job.local);
                }
                r
            });
            (peer, r)
        }
        Message::Response(msg) => {
            let Some(peer) = dev.peer_by_index(msg.receiver) else {
                dev.stats.handshake_failed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            dev.stats.handshake_dh.fetch_add(2, Ordering::Relaxed);
            peer.rx_bytes
                .fetch_add(job.bytes.len() as u64, Ordering::Relaxed);
            let r = step(c, &peer, |state, ctx, out| {
                state.consume_response(ctx, &msg, job.src, out)
            });
            (peer, r)
        }
    };
    match result {
        Ok(()) => {
            // An authenticated message moves the endpoint, and with it the source.
            peer.learn_source(job.src, job.local);
            dev.stats
                .handshakes_completed
                .fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            dev.stats.handshake_failed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(src = %job.src, error = %e, "handshake message rejected");
        }
    }
}

fn consume_cookie_reply(c: StageCtx<'_>, job: &HandshakeJob) {
    let Ok(reply) = CookieReply::parse(&job.bytes) else {
        return;
    };
    let Some(peer) = c.iface.peer_by_index(reply.receiver) else {
        return;
    };
    // A cookie reply is not authenticated by a session: it never moves the endpoint.
    // It may send our initiation again at once, with the cookie (see PeerState).
    let result = step(c, &peer, |state, ctx, out| {
        let r = state.consume_cookie_reply(ctx, &reply, out);
        peer.cookie_reply.settle(state.awaits_cookie_reply());
        r
    });
    if let Err(e) = result {
        c.iface
            .stats
            .cookie_replies_refused
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(src = %job.src, error = %e, "cookie reply rejected");
    }
}
