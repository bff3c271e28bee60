//! The cookie reply: arbitrary replies to an initiator that is waiting for one, plus
//! real replies (from a responder under load) with bytes flipped. A reply must never
//! move the endpoint, and only an authentic one may change what the initiator stamps.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::net::SocketAddr;
use wirelane_proto::messages::CookieReply;
use wirelane_proto::sim::Sim;
use wirelane_proto::InitiationReason;

#[derive(Arbitrary, Debug)]
enum Reply {
    Forged {
        to_pending: bool,
        receiver: u32,
        nonce: [u8; 24],
        encrypted_cookie: [u8; 32],
    },
    Raw(Vec<u8>),
    Mutated {
        flips: Vec<(u8, u8)>,
    },
}

fuzz_target!(|replies: Vec<Reply>| {
    let mut sim = Sim::new();
    sim.nodes[1].under_load = true;
    let endpoint: Option<SocketAddr> = sim.nodes[0].peer.endpoint();
    // Node 0 initiates; node 1, under load, answers with a real cookie reply, which is
    // kept back so the fuzzer's replies race it.
    sim.with_ctx(0, |p, ctx, out| {
        p.initiate(ctx, InitiationReason::NoSession, out)
    });
    let Some((_, init)) = sim.net.pop_front() else {
        return;
    };
    sim.receive(1, init);
    let real = sim.net.pop_front().map(|(_, b)| b);
    let pending = sim.nodes[0].peer.indices().first().copied().unwrap_or(0);
    for r in replies.into_iter().take(8) {
        let bytes = match r {
            Reply::Forged {
                to_pending,
                receiver,
                nonce,
                encrypted_cookie,
            } => CookieReply {
                receiver: if to_pending { pending } else { receiver },
                nonce,
                encrypted_cookie,
            }
            .to_bytes()
            .to_vec(),
            Reply::Raw(b) => b,
            Reply::Mutated { flips } => {
                let Some(mut b) = real.clone() else { continue };
                for (pos, x) in flips.into_iter().take(8) {
                    let at = pos as usize % b.len();
                    b[at] ^= x;
                }
                b
            }
        };
        sim.receive(0, bytes);
        assert_eq!(
            sim.nodes[0].peer.endpoint(),
            endpoint,
            "a cookie reply moved the endpoint"
        );
    }
    // Whatever was accepted, the handshake can still complete once load is gone.
    sim.nodes[1].under_load = false;
    sim.advance(
        std::time::Duration::from_secs(6),
        std::time::Duration::from_secs(1),
    );
    sim.app_send(0, b"after");
    // Delivered payloads carry the zero padding of the transport message.
    assert!(sim.nodes[1]
        .delivered
        .iter()
        .any(|p| p.starts_with(b"after")));
});
