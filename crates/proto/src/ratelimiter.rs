//! Per-source rate limit for handshake messages while under load (the kernel's
//! ratelimiter.c semantics): a token bucket of 20 packets per second with a burst of 5,
//! keyed by IPv4 address or IPv6 /64.
//!
//! Memory is bounded: at most `capacity` sources are tracked; while the table is full,
//! new sources are refused (they can retry once stale entries age out after a second).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

pub const PACKETS_PER_SECOND: u64 = 20;
pub const PACKETS_BURSTABLE: u64 = 5;
const PACKET_COST_NS: u64 = 1_000_000_000 / PACKETS_PER_SECOND;
const TOKEN_MAX_NS: u64 = PACKET_COST_NS * PACKETS_BURSTABLE;
const ENTRY_TTL: Duration = Duration::from_secs(1);

struct Bucket {
    tokens_ns: u64,
    last: Duration,
}

pub struct RateLimiter {
    table: HashMap<u128, Bucket>,
    capacity: usize,
    last_gc: Duration,
}

fn key(ip: IpAddr) -> u128 {
    // An IPv4 source seen as IPv4-mapped IPv6 is keyed as the IPv4 address it is, not
    // with every other IPv4 source in the one `::ffff:0:0/64` bucket.
    match ip.to_canonical() {
        IpAddr::V4(a) => u32::from(a) as u128,
        // One bucket per /64: an attacker usually controls a whole /64.
        IpAddr::V6(a) => (u128::from(a) >> 64) | (1 << 127),
    }
}

impl RateLimiter {
    pub fn new(capacity: usize) -> Self {
        RateLimiter {
            table: HashMap::new(),
            capacity,
            last_gc: Duration::ZERO,
        }
    }

    /// True if a packet from `ip` may be processed now.
    pub fn allow(&mut self, ip: IpAddr, now: Duration) -> bool {
        if now.saturating_sub(self.last_gc) >= ENTRY_TTL {
            self.table
                .retain(|_, b| now.saturating_sub(b.last) < ENTRY_TTL);
            self.last_gc = now;
        }
        let k = key(ip);
        if let Some(b) = self.table.get_mut(&k) {
            let elapsed = now
                .saturating_sub(b.last)
                .as_nanos()
                .min(TOKEN_MAX_NS as u128) as u64;
            b.tokens_ns = (b.tokens_ns + elapsed).min(TOKEN_MAX_NS);
            b.last = now;
            if b.tokens_ns >= PACKET_COST_NS {
                b.tokens_ns -= PACKET_COST_NS;
                return true;
            }
            return false;
        }
        if self.table.len() >= self.capacity {
            return false;
        }
        self.table.insert(
            k,
            Bucket {
                tokens_ns: TOKEN_MAX_NS - PACKET_COST_NS,
                last: now,
            },
        );
        true
    }

    pub fn tracked(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_steady_rate() {
        let mut r = RateLimiter::new(100);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Duration::from_secs(10);
        let allowed = (0..20).filter(|_| r.allow(ip, t0)).count();
        assert_eq!(allowed, PACKETS_BURSTABLE as usize);
        // One second later, at most the burst again (tokens cap at the burst).
        let t1 = t0 + Duration::from_secs(1);
        let allowed = (0..20).filter(|_| r.allow(ip, t1)).count();
        assert_eq!(allowed, PACKETS_BURSTABLE as usize);
        // Over a second of evenly spaced attempts, about 20 pass.
        let mut passed = 0;
        for i in 0..1000u64 {
            if r.allow(ip, t1 + Duration::from_secs(5) + Duration::from_millis(i)) {
                passed += 1;
            }
        }
        assert!((20..=26).contains(&passed), "{passed}");
    }

    #[test]
    fn sources_are_independent_and_v6_groups_by_64() {
        let mut r = RateLimiter::new(100);
        let t = Duration::from_secs(1);
        for _ in 0..5 {
            assert!(r.allow("2001:db8::1".parse().unwrap(), t));
        }
        assert!(!r.allow("2001:db8::2".parse().unwrap(), t));
        assert!(r.allow("2001:db8:0:1::1".parse().unwrap(), t));
        assert!(r.allow("192.0.2.9".parse().unwrap(), t));
        // IPv4 sources seen as IPv4-mapped IPv6 are as independent as IPv4 ones, and
        // share the bucket of the same address seen as IPv4.
        for _ in 0..4 {
            assert!(r.allow("::ffff:198.51.100.1".parse().unwrap(), t));
        }
        assert!(r.allow("::ffff:198.51.100.2".parse().unwrap(), t));
        assert!(r.allow("198.51.100.1".parse().unwrap(), t));
        assert!(!r.allow("::ffff:198.51.100.1".parse().unwrap(), t));
    }

    #[test]
    fn table_is_bounded() {
        let mut r = RateLimiter::new(64);
        let t = Duration::from_secs(1);
        for i in 0..10_000u32 {
            r.allow(IpAddr::V4(i.into()), t);
        }
        assert_eq!(r.tracked(), 64);
        // After entries age out, new sources get in again.
        assert!(r.allow(IpAddr::V4(99_999u32.into()), t + Duration::from_secs(2)));
        assert_eq!(r.tracked(), 1);
    }
}
