//! Handshake stage. Input: the bounded handshake queue, fed by classify. Output:
//! responses, cookie replies and new sessions. Runs apart from the data path so a flood
//! of handshakes can never starve transport data.
//!
//! Cost control: mac1 is checked before anything else, so junk costs one BLAKE2s and
//! no Diffie-Hellman; under load a valid mac2 (cookie) and the per-source rate limit
//! are required too. Cookie replies, the one answer a flood earns, are made cheap: their
//! nonces come from a user-space keystream and they leave in batches of
//! [`COOKIE_REPLY_BATCH`], one non-blocking `sendmmsg` each. A batch also leaves when
//! its oldest reply has waited [`COOKIE_REPLY_MAX_WAIT`] or the queues run empty, so
//! a legitimate peer's reply is never held behind a flood that earns no replies (junk).

use crate::device::{Device, HandshakeJob};
use rand_core::OsRng;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wirelane_proto::cookie::{GateDrop, GateVerdict};
use wirelane_proto::crypto::KeystreamRng;
use wirelane_proto::handshake::consume_initiation_phase1;
use wirelane_proto::messages::{CookieReply, Initiation, Kind, Response, COOKIE_REPLY_LEN};

/// Most cookie replies held back before they are sent together.
pub const COOKIE_REPLY_BATCH: usize = 32;
/// Longest a cookie reply waits for its batch to fill.
pub const COOKIE_REPLY_MAX_WAIT: Duration = Duration::from_millis(1);

/// The handshake thread's own state: cookie replies not sent yet, and the generator for
/// their nonces and the cookie secret.
pub struct HandshakeScratch {
    replies: Vec<([u8; COOKIE_REPLY_LEN], SocketAddr)>,
    oldest: Option<Instant>,
    rng: KeystreamRng,
}

impl HandshakeScratch {
    pub fn new() -> HandshakeScratch {
        HandshakeScratch {
            replies: Vec::with_capacity(COOKIE_REPLY_BATCH),
            oldest: None,
            rng: KeystreamRng::from_rng(&mut OsRng),
        }
    }

    fn push(&mut self, dev: &Device, reply: [u8; COOKIE_REPLY_LEN], dst: SocketAddr) {
        self.oldest.get_or_insert_with(Instant::now);
        self.replies.push((reply, dst));
        if self.replies.len() >= COOKIE_REPLY_BATCH {
            self.flush(dev);
        }
    }

    /// Sends the pending replies if the oldest has waited long enough.
    pub fn flush_if_due(&mut self, dev: &Device) {
        if self
            .oldest
            .is_some_and(|t| t.elapsed() >= COOKIE_REPLY_MAX_WAIT)
        {
            self.flush(dev);
        }
    }

    /// Sends the pending cookie replies, one batch per socket. Never waits for room: a
    /// reply that does not fit is dropped (the initiator retries), and the socket table
    /// lock is not held while sending, so a UAPI rebind never waits behind a flood.
    pub fn flush(&mut self, dev: &Device) {
        self.oldest = None;
        if self.replies.is_empty() {
            return;
        }
        // A copy of the socket handles, so the table lock is released before sending.
        let sockets = dev.sockets().clone();
        let mut sent = 0;
        for sock in [&sockets.v4, &sockets.v6].into_iter().flatten() {
            let batch: Vec<(&[u8], SocketAddr)> = self
                .replies
                .iter()
                .filter(|(_, dst)| {
                    sockets
                        .for_destination(dst)
                        .is_some_and(|s| Arc::ptr_eq(s, sock))
                })
                .map(|(b, dst)| (&b[..], *dst))
                .collect();
            if batch.is_empty() {
                continue;
            }
            sent += sock.try_send_batch(&batch).unwrap_or(0);
        }
        let stats = &dev.stats;
        stats
            .cookie_replies_sent
            .fetch_add(sent as u64, Ordering::Relaxed);
        stats
            .cookie_replies_unsent
            .fetch_add((self.replies.len() - sent) as u64, Ordering::Relaxed);
        self.replies.clear();
    }
}

impl Default for HandshakeScratch {
    fn default() -> Self {
        Self::new()
    }
}

enum Message {
    Initiation(Initiation),
    Response(Response),
}

pub fn process(dev: &Device, job: HandshakeJob, scratch: &mut HandshakeScratch) {
    let Some(identity) = dev.identity() else {
        return;
    };
    // Parsed once; the gate needs the sender index, the protocol step the rest.
    let msg = match job.kind {
        Kind::Initiation => Initiation::parse(&job.bytes).map(Message::Initiation),
        Kind::Response => Response::parse(&job.bytes).map(Message::Response),
        Kind::CookieReply => return consume_cookie_reply(dev, &job),
        Kind::Transport => return,
    };
    let Ok(msg) = msg else { return };
    let sender = match &msg {
        Message::Initiation(m) => m.sender,
        Message::Response(m) => m.sender,
    };

    if !screen(dev, &job, sender, scratch) {
        return;
    }

    let result = match msg {
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
            dev.with_peer(&peer, |state, ctx, out| {
                state.consume_initiation(ctx, phase1, job.src, out)
            })
        }
        Message::Response(msg) => {
            let Some(peer) = dev.peer_by_index(msg.receiver) else {
                dev.stats.handshake_failed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            dev.stats.handshake_dh.fetch_add(2, Ordering::Relaxed);
            peer.rx_bytes
                .fetch_add(job.bytes.len() as u64, Ordering::Relaxed);
            dev.with_peer(&peer, |state, ctx, out| {
                state.consume_response(ctx, &msg, job.src, out)
            })
        }
    };
    match result {
        Ok(()) => {
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

/// Runs the gate on one handshake message. True when it may go on to the protocol step;
/// otherwise it has been answered with a (queued) cookie reply or dropped, and counted.
fn screen(dev: &Device, job: &HandshakeJob, sender: u32, scratch: &mut HandshakeScratch) -> bool {
    let verdict = {
        let mut gate = dev.gate();
        let Some(gate) = gate.as_mut() else {
            return false;
        };
        gate.admit(
            &job.bytes,
            sender,
            &job.src,
            dev.under_load(),
            dev.now(),
            &mut scratch.rng,
        )
    };
    let counter = match verdict {
        GateVerdict::Process => return true,
        GateVerdict::SendCookieReply(reply) => {
            scratch.push(dev, reply.to_bytes(), job.src);
            return false;
        }
        GateVerdict::Drop(GateDrop::InvalidMac1) => &dev.stats.handshake_invalid_mac1,
        GateVerdict::Drop(GateDrop::RateLimited) => &dev.stats.handshake_rate_limited,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    false
}

fn consume_cookie_reply(dev: &Device, job: &HandshakeJob) {
    let Ok(reply) = CookieReply::parse(&job.bytes) else {
        return;
    };
    let Some(peer) = dev.peer_by_index(reply.receiver) else {
        return;
    };
    // A cookie reply is not authenticated by a session: it never moves the endpoint.
    // It may send our initiation again at once, with the cookie (see PeerState).
    let result = dev.with_peer(&peer, |state, ctx, out| {
        state.consume_cookie_reply(ctx, &reply, out)
    });
    if let Err(e) = result {
        tracing::debug!(src = %job.src, error = %e, "cookie reply rejected");
    }
}
