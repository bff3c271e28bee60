//! A raw UDP datagram into the receive path, interleaved with real traffic.
//!
//! Two simulated endpoints (the protocol tests' harness) run a real handshake first.
//! The input is then a script of operations, each an op byte (bit 0: which endpoint,
//! bits 1-2: what) and its arguments: raw datagrams delivered to either endpoint, replays of
//! previously sent datagrams (optionally with one byte flipped), clock steps and
//! application sends. Every payload that reaches an endpoint must be one its peer sent,
//! and its inner IP header is parsed the way the data plane parses it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::time::Duration;
use wirelane_dataplane::inner;
use wirelane_proto::messages::padded_len;
use wirelane_proto::sim::Sim;

fuzz_target!(|data: &[u8]| {
    let mut sim = Sim::new();
    sim.app_send(0, &[0x45; 40]);
    let mut sent_payloads = vec![vec![0x45; 40]];
    let mut ops = data;
    while let Some((&op, rest)) = ops.split_first() {
        let to = (op & 1) as usize;
        match (op >> 1) & 3 {
            0 => {
                // Raw datagram: a 2-byte little-endian length, then that many bytes.
                let [lo, hi, ref rest @ ..] = *rest else {
                    break;
                };
                let n = (u16::from_le_bytes([lo, hi]) as usize).min(rest.len());
                sim.receive(to, rest[..n].to_vec());
                sim.flush();
                ops = &rest[n..];
            }
            1 => {
                // Replay what the other endpoint sent, with an optional bit flip.
                let [pick, pos, flip, ..] = *rest else { break };
                let log = &sim.nodes[1 - to].sent_log;
                if !log.is_empty() {
                    let mut d = log[pick as usize % log.len()].clone();
                    let at = pos as usize % d.len();
                    d[at] ^= flip;
                    sim.receive(to, d);
                    sim.flush();
                }
                ops = &rest[3..];
            }
            2 => {
                let Some((&secs, rest)) = rest.split_first() else {
                    break;
                };
                sim.advance(
                    Duration::from_millis(secs as u64 * 500),
                    Duration::from_secs(1),
                );
                ops = rest;
            }
            _ => {
                let Some((&len, rest)) = rest.split_first() else {
                    break;
                };
                let n = (len as usize).min(rest.len());
                sim.app_send(to, &rest[..n]);
                sent_payloads.push(rest[..n].to_vec());
                ops = &rest[n..];
            }
        }
    }
    for node in &sim.nodes {
        for p in &node.delivered {
            // Delivered payloads carry the zero padding of the transport message.
            let sent = sent_payloads.iter().any(|s| {
                p.len() == padded_len(s.len(), 1420)
                    && p.starts_with(s)
                    && p[s.len()..].iter().all(|&b| b == 0)
            });
            assert!(sent, "delivered a payload nobody sent");
            let _ = inner::parse(p);
        }
    }
});
