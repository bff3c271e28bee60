//! Sans-IO WireGuard: everything the protocol decides, nothing it does.
//!
//! No sockets, threads or clock reads live here. Time (monotonic and wall-clock) and
//! randomness are passed in, so every behaviour is testable with a simulated clock.

pub mod allowedips;
pub mod cookie;
pub mod crypto;
pub mod handshake;
pub mod keypair;
pub mod messages;
pub mod peer;
pub mod ratelimiter;
pub mod replay;
pub mod timers;

#[cfg(any(test, feature = "sim"))]
pub mod sim;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod vector_tests;

pub use allowedips::{AllowedIps, Prefix};
pub use handshake::LocalIdentity;
pub use keypair::{Keypair, Opener, Sealer};
pub use peer::{Ctx, IndexTable, Output, PeerState};
pub use timers::InitiationReason;

/// Parses a 32-byte key written as 64 hex digits (the UAPI form).
pub fn parse_hex_key(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

/// Writes a 32-byte key as 64 lowercase hex digits.
pub fn hex_key(k: &[u8; 32]) -> String {
    // Two table lookups a byte: `wg show dump` of 100,000 peers writes 200,000 keys,
    // and a `format!` per byte made that 12.8 million allocations.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for &b in k {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 15)]));
    }
    s
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Writes a 32-byte key as `wg` prints it: 44 characters of standard base64.
pub fn base64_key(k: &[u8; 32]) -> String {
    let mut s = String::with_capacity(44);
    for c in k.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            s.push(if i <= c.len() {
                BASE64[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    s
}

/// Parses a key as `wg` prints it (44 base64 characters, surrounding space ignored).
pub fn parse_base64_key(s: &str) -> Option<[u8; 32]> {
    let b = s.trim().as_bytes();
    if b.len() != 44 || b[43] != b'=' {
        return None;
    }
    let (mut bits, mut n) = (0u32, 0);
    let mut out = Vec::with_capacity(33);
    for &c in &b[..43] {
        bits = bits << 6 | BASE64.iter().position(|&t| t == c)? as u32;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    out.try_into().ok()
}

#[cfg(test)]
mod key_text_tests {
    use super::*;

    /// RFC 7748 §6.1's Alice private key, as `wg` prints it.
    #[test]
    fn hex_and_base64_keys_roundtrip() {
        let k = parse_hex_key("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
            .unwrap();
        let hex = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a";
        assert_eq!(hex_key(&k), hex);
        let text = base64_key(&k);
        assert_eq!(text, "dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=");
        assert_eq!(parse_base64_key(&text), Some(k));
        for bad in [
            "",
            "dwdt",
            "dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo",
            "!wdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=",
        ] {
            assert_eq!(parse_base64_key(bad), None, "{bad:?}");
        }
    }
}
