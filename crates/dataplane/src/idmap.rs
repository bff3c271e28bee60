//! Maps keyed by a peer id or a receiver index, looked up for every packet routed
//! (`PeerTable::route`) and every run of packets received (`Interface::peer_by_index`).
//!
//! Why not the standard hasher: SipHash resists keys chosen to collide, which costs
//! tens of nanoseconds per lookup, and neither key is chosen by anyone who could
//! attack it: peer ids count up from zero, and receiver indices are drawn at random by
//! this process (`IndexTable`). A multiplicative hash spreads both over the table's
//! buckets and the high bits its control bytes use.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from a peer id or receiver index to `V`.
pub type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of one `u32`: a multiply by 2^64 / φ, whose high bits depend on
/// every bit of the key.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only `u32` keys are hashed here; anything else is folded in a byte at a time.
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sequential ids land in distinct high bits (hashbrown's control bytes) and low
    /// bits (its bucket index) often enough that probing stays short.
    #[test]
    fn sequential_ids_spread() {
        let hash = |n: u32| {
            let mut h = IdHasher::default();
            h.write_u32(n);
            h.finish()
        };
        let top: std::collections::HashSet<u64> = (0..1024).map(|n| hash(n) >> 57).collect();
        let low: std::collections::HashSet<u64> = (0..1024).map(|n| hash(n) & 1023).collect();
        assert_eq!(top.len(), 128, "all 7-bit tags used");
        assert!(low.len() > 600, "{} of 1024 buckets used", low.len());
        let mut m = IdMap::default();
        for n in 0..10_000u32 {
            m.insert(n, n);
        }
        assert!((0..10_000u32).all(|n| m[&n] == n));
    }
}
