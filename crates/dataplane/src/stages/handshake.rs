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
use wirelane_proto::handshake::HandshakeError;
use wirelane_proto::messages::{CookieReply, Initiation, Kind, Response};

enum Message {
    Initiation(Initiation),
    Response(Response),
}

pub fn process(c: StageCtx<'_>, job: HandshakeJob) {
    let dev = c.iface;
    let Some(identity) = dev.identity() else {
        // The key was removed after the gate let the message through.
        dev.stats
            .handshake_no_identity
            .fetch_add(1, Ordering::Relaxed);
        return;
    };
    let msg = match job.kind {
        Kind::Initiation => Initiation::parse(&job.bytes).map(Message::Initiation),
        Kind::Response => Response::parse(&job.bytes).map(Message::Response),
        Kind::CookieReply => return consume_cookie_reply(c, &job),
        Kind::Transport => return,
    };
    let Ok(msg) = msg else { return };
    // Whether a response's two Diffie-Hellman operations ran (its index matched).
    let mut computed = false;
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
            // In three steps, as the kernel's `consume_response` takes them: copied out
            // under the peer's state lock, computed without it, taken under it again.
            // A forged response (it needs only our public key and the index of the
            // initiation in flight, seen on the wire) would otherwise hold the lock the
            // data path takes for every run of the peer's packets for two
            // Diffie-Hellman operations each time.
            // The guard goes with this statement: `compute` runs with the lock free.
            let work = peer.state().response_work(&msg);
            computed = work.is_ok();
            let keys = work.and_then(|w| w.compute(&identity, &msg));
            let r = keys.and_then(|keys| {
                step(c, &peer, |state, ctx, out| {
                    // The key the response was computed with is still ours.
                    if ctx.local.map(|l| l.public) != Some(identity.public) {
                        return Err(HandshakeError::NoPrivateKey);
                    }
                    state.complete_response(ctx, keys, job.src, out)
                })
            });
            (peer, r)
        }
    };
    let dh = diffie_hellmans_after_the_first(job.kind, &result, computed);
    dev.stats.handshake_dh.fetch_add(dh, Ordering::Relaxed);
    match result {
        Ok(()) => {
            // Only an authenticated message counts as received from the peer, as in
            // the kernel: a replayed initiation or a forged response adds nothing to
            // what `wg show` reports.
            peer.rx_bytes
                .fetch_add(job.bytes.len() as u64, Ordering::Relaxed);
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

/// The Diffie-Hellman operations a message reached, besides an initiation's first (es,
/// counted before the peer is known): an initiation's static-static one (ss, counted
/// though it is computed once per peer and kept), then its response's two (ee, se) once
/// the timestamp passed; a response's two once its index matched the initiation in
/// flight (`computed`), whatever came of them.
fn diffie_hellmans_after_the_first(
    kind: Kind,
    result: &Result<(), HandshakeError>,
    computed: bool,
) -> u64 {
    match (kind, result) {
        (Kind::Initiation, Err(HandshakeError::NoPrivateKey)) => 0,
        (Kind::Initiation, Ok(())) => 3,
        (Kind::Initiation, Err(_)) => 1,
        _ if computed => 2,
        _ => 0,
    }
}

fn consume_cookie_reply(c: StageCtx<'_>, job: &HandshakeJob) {
    let Ok(reply) = CookieReply::parse(&job.bytes) else {
        return;
    };
    let Some(peer) = c.iface.peer_by_index(reply.receiver) else {
        // Retired between the gate and here: refused, as a reply that does not open.
        let s = &c.iface.stats.cookie_replies_refused;
        s.fetch_add(1, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{apply, DeviceUpdate, PeerUpdate};
    use crate::interface::Interface;
    use crate::sched::Idle;
    use wirelane_proto::handshake::Handshake;
    use wirelane_proto::LocalIdentity;

    /// A replayed initiation (from any source) is refused after its first
    /// Diffie-Hellman and its timestamp, and adds nothing to what the peer is shown to
    /// have sent: only an authenticated message counts as received, as in the kernel.
    #[test]
    fn a_replayed_initiation_counts_no_bytes() {
        let iface = Interface::for_tests();
        let c = StageCtx {
            iface: &iface,
            sched: &Idle,
        };
        let (gateway, client) = (LocalIdentity::new([1; 32]), LocalIdentity::new([2; 32]));
        let update = DeviceUpdate {
            private_key: Some([1; 32]),
            peers: vec![PeerUpdate {
                endpoint: Some("127.0.0.1:9".parse().unwrap()),
                ..PeerUpdate::new(client.public)
            }],
            ..DeviceUpdate::default()
        };
        apply(c, &update).unwrap();
        let mut hs = Handshake::new(gateway.public, [0; 32]);
        let wall = std::time::Duration::from_secs(1_700_000_000);
        let (msg, _) = crate::stages::protocol::with_step_rng(|rng| {
            hs.create_initiation(&client, 7, wall, rng)
        })
        .unwrap();
        let job = || HandshakeJob {
            kind: Kind::Initiation,
            bytes: msg.to_bytes().to_vec(),
            src: "127.0.0.1:9".parse().unwrap(),
            local: None,
            queued_ns: 0,
        };
        process(c, job());
        let peer = iface.table().by_key[&client.public].clone();
        let dh = || iface.stats.total(|s| &s.handshake_dh);
        assert_eq!(peer.rx_bytes.load(Ordering::Relaxed), 148);
        assert_eq!(dh(), 4, "es, ss, ee, se");
        process(c, job());
        assert_eq!(
            peer.rx_bytes.load(Ordering::Relaxed),
            148,
            "the replay adds nothing"
        );
        assert_eq!(
            dh(),
            6,
            "es and ss (kept from the first), then the timestamp refused it"
        );
        assert_eq!(iface.stats.total(|s| &s.handshake_failed), 1);
    }
}
