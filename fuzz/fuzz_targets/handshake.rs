//! Structure-aware handshake messages that carry a valid mac1, so they get past the
//! cheap check and into the Noise processing (and, under load, the cookie path).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use wirelane_proto::cookie::CookieGenerator;
use wirelane_proto::messages::{Initiation, Response};
use wirelane_proto::sim::Sim;
use wirelane_proto::InitiationReason;

#[derive(Arbitrary, Debug)]
enum Message {
    Initiation {
        sender: u32,
        ephemeral: [u8; 32],
        encrypted_static: [u8; 48],
        encrypted_timestamp: [u8; 28],
    },
    Response {
        /// When set, aimed at the initiator's pending handshake index.
        to_pending: bool,
        sender: u32,
        receiver: u32,
        ephemeral: [u8; 32],
        encrypted_nothing: [u8; 16],
    },
    /// A real message of the handshake with bytes flipped before mac1 is recomputed.
    Mutated {
        response: bool,
        flips: Vec<(u8, u8)>,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    under_load: bool,
    messages: Vec<Message>,
}

fuzz_target!(|input: Input| {
    let mut sim = Sim::new();
    sim.nodes[1].under_load = input.under_load;
    // Node 0 starts a handshake and node 1 answers, but nothing is delivered yet: the
    // real messages are kept for mutation and node 0 keeps a pending index.
    sim.drop_to = [true, true];
    sim.with_ctx(0, |p, ctx, out| {
        p.initiate(ctx, InitiationReason::NoSession, out)
    });
    let real_init = sim.nodes[0].sent_log[0].clone();
    sim.drop_to = [false, false];
    let pending = sim.nodes[0].peer.indices().first().copied().unwrap_or(0);
    let mut to_responder = CookieGenerator::new(&sim.nodes[1].local.public);
    let mut to_initiator = CookieGenerator::new(&sim.nodes[0].local.public);
    for m in input.messages.into_iter().take(8) {
        let (to, mut bytes) = match m {
            Message::Initiation {
                sender,
                ephemeral,
                encrypted_static,
                encrypted_timestamp,
            } => {
                let msg = Initiation {
                    sender,
                    ephemeral,
                    encrypted_static,
                    encrypted_timestamp,
                    mac1: [0; 16],
                    mac2: [0; 16],
                };
                (1, msg.to_bytes().to_vec())
            }
            Message::Response {
                to_pending,
                sender,
                receiver,
                ephemeral,
                encrypted_nothing,
            } => {
                let msg = Response {
                    sender,
                    receiver: if to_pending { pending } else { receiver },
                    ephemeral,
                    encrypted_nothing,
                    mac1: [0; 16],
                    mac2: [0; 16],
                };
                (0, msg.to_bytes().to_vec())
            }
            Message::Mutated { response, flips } => {
                let mut b = real_init.clone();
                if response {
                    sim.receive(1, real_init.clone());
                    match sim.nodes[1].sent_log.last() {
                        Some(r) if r.len() == 92 => b = r.clone(),
                        _ => continue,
                    }
                }
                let len = b.len() - 32;
                for (pos, x) in flips.into_iter().take(16) {
                    b[pos as usize % len] ^= x;
                }
                (usize::from(response) ^ 1, b)
            }
        };
        let stamp = if to == 1 {
            &mut to_responder
        } else {
            &mut to_initiator
        };
        stamp.stamp(&mut bytes, sim.now);
        sim.receive(to, bytes);
        sim.flush();
    }
    // Nothing forged can have created a session: only the real handshake can.
    for n in &sim.nodes {
        assert!(n.delivered.is_empty());
    }
});
