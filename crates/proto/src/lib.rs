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
pub use keypair::Keypair;
pub use peer::{Ctx, IndexTable, Output, PeerState};

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
    let mut s = String::with_capacity(64);
    for b in k {
        s.push_str(&format!("{b:02x}"));
    }
    s
}
