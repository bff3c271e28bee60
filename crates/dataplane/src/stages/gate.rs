//! Stage RX-2h, handshake gate. Runs on the UDP reader, called by classify for each
//! initiation and response. Input: the message and its source. Output, one of:
//! - admitted: copied onto the handshake queue for its Diffie-Hellman step;
//! - under load and without a valid mac2: a cookie reply, held and sent with the rest
//!   of this receive batch's replies in one `sendmmsg` ([`flush_replies`]);
//! - dropped and counted: invalid mac1 (junk), or over the per-source rate limit.
//!
//! Why on the reader and not on the handshake thread: a cookie reply is cheap (two
//! BLAKE2s, a 16-byte XChaCha20-Poly1305 seal, a share of one `sendmmsg`), but queueing
//! its message first is not: a copy, a channel send and the wake-up of another thread,
//! which under a flood was most of the cost. With the queue full most of a flood was
//! dropped unanswered, and a new peer's first initiation with it. Here every message the
//! reader receives is answered, and the handshake thread keeps only the DH steps.
//!
//! Under load: begins when the handshake queue, which now holds admitted messages only,
//! reaches its threshold (DH work arriving faster than it is done). The gate then keeps
//! the flood off the queue, so the flood's own rate of cookie replies keeps the mode on
//! (`underload::ReplyRate`).

use super::StageCtx;
use crate::interface::Interface;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use wirelane_io::udp::LocalAddr;
use wirelane_proto::cookie::{GateDrop, GateVerdict};
use wirelane_proto::messages::{handshake_sender, CookieReply, Kind, COOKIE_REPLY_LEN};

/// Most cookie replies held before they are sent, so a huge receive batch (GRO) does
/// not hold the first reply back for long.
pub const COOKIE_REPLY_BATCH: usize = 64;

/// A cookie reply, its destination, and the local address its question arrived at
/// (the reply leaves from there).
type Reply = ([u8; COOKIE_REPLY_LEN], SocketAddr, Option<LocalAddr>);

/// One UDP reader's cookie replies not sent yet: empty between receive batches. The
/// reader owns it (and its allocation) and passes it through `classify`.
#[derive(Default)]
pub struct Replies(Vec<Reply>);

/// Screens one handshake message (see the module comment). A cookie reply goes to the
/// queue only if its receiver index is one of ours, and that peer's cookie slot takes
/// it: it carries no mac to check, and spoofed ones, queued, filled the lane that
/// cookie-bearing initiations need under load and counted toward the load themselves.
/// Others are dropped as `rx_unknown_index`, or as `cookie_replies_refused` if the
/// peer awaits no reply or has one queued (`cookie_slot`).
pub fn admit(
    c: StageCtx<'_>,
    kind: Kind,
    bytes: &[u8],
    src: SocketAddr,
    local: Option<LocalAddr>,
    replies: &mut Replies,
) {
    let dev = c.iface;
    // Set down, the interface answers nothing (`config::link_changed`).
    if dev.netwatch.is_down() {
        dev.stats
            .handshake_while_down
            .fetch_add(1, Ordering::Relaxed);
        return;
    }
    let queue = |kind| {
        if dev.queue_handshake(kind, bytes, src, local) {
            c.sched.submit_handshake(dev);
        }
    };
    let Some(sender) = handshake_sender(bytes) else {
        if kind == Kind::CookieReply {
            admit_cookie_reply(c, bytes, src, local);
        }
        return;
    };
    let under_load = dev.under_load();
    let verdict = {
        let mut gate = dev.gate();
        // No private key yet: nothing could answer the message.
        let Some(gate) = gate.as_mut() else {
            let s = &dev.stats.handshake_no_identity;
            s.fetch_add(1, Ordering::Relaxed);
            return;
        };
        super::protocol::with_step_rng(|rng| {
            gate.admit(bytes, sender, &src, under_load, dev.now(), rng)
        })
    };
    let counter = match verdict {
        GateVerdict::Process => return queue(kind),
        GateVerdict::SendCookieReply(reply) => {
            if dev.cookie_reply_rate.note(dev.now().as_nanos() as u64) {
                dev.renew_under_load();
            }
            replies.0.push((reply.to_bytes(), src, local));
            if replies.0.len() >= COOKIE_REPLY_BATCH {
                flush_replies(c, replies);
            }
            return;
        }
        GateVerdict::Drop(GateDrop::InvalidMac1) => &dev.stats.handshake_invalid_mac1,
        GateVerdict::Drop(GateDrop::RateLimited) => &dev.stats.handshake_rate_limited,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Queues a cookie reply if its receiver index is one of ours and the peer's slot
/// takes it (see [`admit`]).
fn admit_cookie_reply(c: StageCtx<'_>, bytes: &[u8], src: SocketAddr, local: Option<LocalAddr>) {
    let dev = c.iface;
    let Some(peer) = CookieReply::parse(bytes)
        .ok()
        .and_then(|r| dev.peer_by_index(r.receiver))
    else {
        dev.stats.rx_unknown_index.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let now = dev.now().as_nanos() as u64;
    if !peer.cookie_reply.claim(now) {
        dev.stats
            .cookie_replies_refused
            .fetch_add(1, Ordering::Relaxed);
    } else if dev.queue_handshake(Kind::CookieReply, bytes, src, local) {
        c.sched.submit_handshake(dev);
    } else {
        peer.cookie_reply.unclaim(now);
    }
}

/// Sends the reader's pending cookie replies, one batch per socket. Never waits for
/// room: a reply that does not fit is dropped (the initiator retries), and the socket
/// table lock is not held while sending, so a UAPI rebind never waits behind a flood.
pub fn flush_replies(c: StageCtx<'_>, pending: &mut Replies) {
    if pending.0.is_empty() {
        return;
    }
    send_replies(c.iface, &pending.0);
    pending.0.clear();
}

fn send_replies(dev: &Interface, replies: &[Reply]) {
    // A copy of the socket handles, so the table lock is released before sending.
    let sockets = dev.sockets().clone();
    let mut sent = 0;
    for sock in [&sockets.v4, &sockets.v6].into_iter().flatten() {
        let batch: Vec<(&[u8], SocketAddr, Option<LocalAddr>)> = replies
            .iter()
            .filter(|(_, dst, _)| {
                sockets
                    .for_destination(dst)
                    .is_some_and(|s| Arc::ptr_eq(s, sock))
            })
            .map(|(b, dst, local)| (&b[..], *dst, *local))
            .collect();
        if !batch.is_empty() {
            sent += sock.try_send_replies(&batch).unwrap_or(0);
        }
    }
    let stats = &dev.stats;
    stats
        .cookie_replies_sent
        .fetch_add(sent as u64, Ordering::Relaxed);
    stats
        .cookie_replies_unsent
        .fetch_add((replies.len() - sent) as u64, Ordering::Relaxed);
}
