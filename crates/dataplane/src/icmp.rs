//! ICMP and ICMPv6 "destination unreachable" for packets no peer routes, as kernel
//! WireGuard answers them (`icmp_ndo_send`, `icmpv6_ndo_send`): `ping` prints
//! "Destination Host Unreachable" and a TCP connect fails at once instead of timing
//! out. The error is written back into the TUN, so the host's stack delivers it.
//!
//! Its source is the unreachable address itself. The kernel sends from one of the
//! host's addresses, on its output path; an error written into a TUN arrives on the
//! input path instead, where a packet from one of the host's own addresses is a
//! martian and dropped (unless the interface has `accept_local`). So `ping` says
//! "From 10.0.0.99" where, with the kernel, it says "From 10.0.0.1".
//!
//! What is never answered, as RFC 1122 §3.2.2 and RFC 4443 §2.4 say: an ICMP error
//! (no error about an error), a fragment other than the first, and anything from or to
//! an address that is not a single host's (unspecified, multicast, broadcast).
//!
//! Rate: a token bucket per interface, as the kernel's per-namespace limit
//! (`icmp_msgs_per_sec` 1,000 with a burst of 50), and one per destination, as its
//! per-host limit (one a second, a burst of six), which the kernel skips for a host's
//! own addresses: the usual case, a local application's packet.

use crate::inner::checksum;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::Duration;

/// Most of the original packet an ICMPv4 error carries: the whole error then fits in
/// 576 bytes (RFC 1812 §4.3.2.3).
const V4_MAX_ERROR: usize = 576;
/// The same for ICMPv6, within the minimum IPv6 MTU (RFC 4443 §2.4 (c)).
const V6_MAX_ERROR: usize = 1280;

/// Builds the error for `original` (a whole inner packet). None when the packet must
/// not be answered.
pub fn unreachable(original: &[u8]) -> Option<Vec<u8>> {
    match original.first()? >> 4 {
        4 if original.len() >= 20 => {
            let dst = <[u8; 4]>::try_from(&original[16..20]).ok()?;
            unreachable_v4(original, Ipv4Addr::from(dst))
        }
        6 if original.len() >= 40 => {
            let dst = <[u8; 16]>::try_from(&original[24..40]).ok()?;
            unreachable_v6(original, Ipv6Addr::from(dst))
        }
        _ => None,
    }
}

fn single_host_v4(a: Ipv4Addr) -> bool {
    !(a.is_unspecified() || a.is_multicast() || a.is_broadcast())
}

fn unreachable_v4(orig: &[u8], src: Ipv4Addr) -> Option<Vec<u8>> {
    if orig.len() < 20 {
        return None;
    }
    let ihl = usize::from(orig[0] & 0x0f) * 4;
    let fragment_offset = u16::from_be_bytes([orig[6], orig[7]]) & 0x1fff;
    let proto = orig[9];
    let (o_src, o_dst) = (
        Ipv4Addr::new(orig[12], orig[13], orig[14], orig[15]),
        Ipv4Addr::new(orig[16], orig[17], orig[18], orig[19]),
    );
    if ihl < 20 || orig.len() < ihl || fragment_offset != 0 {
        return None;
    }
    if !single_host_v4(o_src) || !single_host_v4(o_dst) || !single_host_v4(src) {
        return None;
    }
    // An ICMP error, or a message whose type cannot be read, gets no error.
    if proto == 1 {
        let kind = *orig.get(ihl)?;
        if !matches!(kind, 0 | 8 | 13 | 14 | 15 | 16 | 17 | 18) {
            return None;
        }
    }
    let quoted = &orig[..orig.len().min(V4_MAX_ERROR - 28)];
    let total = 28 + quoted.len();
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0xc0]); // internetwork control, as the kernel sends
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 64, 1, 0, 0]); // id, flags, TTL 64, ICMP
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&o_src.octets());
    let ip_sum = checksum(&[&p[..20]]);
    p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    // Type 3 (destination unreachable), code 1 (host unreachable).
    p.extend_from_slice(&[3, 1, 0, 0, 0, 0, 0, 0]);
    p.extend_from_slice(quoted);
    let icmp_sum = checksum(&[&p[20..]]);
    p[22..24].copy_from_slice(&icmp_sum.to_be_bytes());
    Some(p)
}

fn single_host_v6(a: &Ipv6Addr) -> bool {
    !(a.is_unspecified() || a.is_multicast())
}

fn unreachable_v6(orig: &[u8], src: Ipv6Addr) -> Option<Vec<u8>> {
    if orig.len() < 40 {
        return None;
    }
    let o_src = Ipv6Addr::from(<[u8; 16]>::try_from(&orig[8..24]).ok()?);
    let o_dst = Ipv6Addr::from(<[u8; 16]>::try_from(&orig[24..40]).ok()?);
    if !single_host_v6(&o_src) || !single_host_v6(&o_dst) || !single_host_v6(&src) {
        return None;
    }
    let answerable = match orig[6] {
        // ICMPv6 directly after the header: errors (types below 128) get no error.
        58 => *orig.get(40)? >= 128,
        // A fragment header: only the first fragment (offset 0) is answered.
        44 => {
            let frag = orig.get(40..48)?;
            u16::from_be_bytes([frag[2], frag[3]]) >> 3 == 0
        }
        _ => true,
    };
    if !answerable {
        return None;
    }
    let quoted = &orig[..orig.len().min(V6_MAX_ERROR - 48)];
    let payload_len = 8 + quoted.len();
    let mut p = Vec::with_capacity(40 + payload_len);
    p.extend_from_slice(&[0x60, 0, 0, 0]);
    p.extend_from_slice(&(payload_len as u16).to_be_bytes());
    p.extend_from_slice(&[58, 64]); // ICMPv6, hop limit 64
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&o_src.octets());
    // Type 1 (destination unreachable), code 3 (address unreachable).
    p.extend_from_slice(&[1, 3, 0, 0, 0, 0, 0, 0]);
    p.extend_from_slice(quoted);
    // The checksum covers a pseudo-header: addresses, length, next header.
    let pseudo_len = (payload_len as u32).to_be_bytes();
    let sum = checksum(&[&p[8..40], &pseudo_len, &[0, 0, 0, 58], &p[40..]]);
    p[42..44].copy_from_slice(&sum.to_be_bytes());
    Some(p)
}

/// A token bucket: `rate` tokens a second, at most `burst` saved.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Duration,
}

impl Bucket {
    fn full(burst: f64, now: Duration) -> Bucket {
        Bucket {
            tokens: burst,
            at: now,
        }
    }

    fn take(&mut self, now: Duration, rate: f64, burst: f64) -> bool {
        let elapsed = now.saturating_sub(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

const GLOBAL_RATE: f64 = 1000.0;
const GLOBAL_BURST: f64 = 50.0;
const HOST_RATE: f64 = 1.0;
const HOST_BURST: f64 = 6.0;
/// Destinations tracked at most; beyond it the table starts over (a flood of
/// sources cannot grow it, and the global bucket still bounds the rate).
const HOSTS_TRACKED: usize = 4096;

/// The limits an interface's errors pass (see the module comment).
pub struct RateLimit {
    state: Mutex<(Option<Bucket>, HashMap<IpAddr, Bucket>)>,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            state: Mutex::new((None, HashMap::new())),
        }
    }
}

impl RateLimit {
    /// Whether an error to `dst` may be sent at `now`; `local` when `dst` is one of
    /// the host's own addresses (no per-host limit then).
    pub fn allow(&self, dst: IpAddr, local: bool, now: Duration) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (global, hosts) = &mut *st;
        let g = global.get_or_insert(Bucket::full(GLOBAL_BURST, now));
        if !g.take(now, GLOBAL_RATE, GLOBAL_BURST) {
            return false;
        }
        if local {
            return true;
        }
        if hosts.len() >= HOSTS_TRACKED && !hosts.contains_key(&dst) {
            hosts.clear();
        }
        hosts
            .entry(dst)
            .or_insert(Bucket::full(HOST_BURST, now))
            .take(now, HOST_RATE, HOST_BURST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4_packet(proto: u8, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, proto, 0, 0];
        p.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 99]);
        p.extend_from_slice(payload);
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        p
    }

    #[test]
    fn ipv4_error_is_well_formed_and_quotes_the_packet() {
        let orig = v4_packet(6, &[0xab; 40]);
        let e = unreachable(&orig).unwrap();
        assert_eq!(e.len(), 28 + orig.len());
        assert_eq!(checksum(&[&e[..20]]), 0, "IP checksum");
        assert_eq!(checksum(&[&e[20..]]), 0, "ICMP checksum");
        assert_eq!((e[9], e[20], e[21]), (1, 3, 1));
        assert_eq!(&e[12..16], &[10, 0, 0, 99], "from the unreachable address");
        assert_eq!(&e[16..20], &[10, 0, 0, 1], "back to the packet's source");
        assert_eq!(&e[28..], &orig[..]);
        // A long packet is quoted up to 576 bytes of error.
        let long = v4_packet(17, &[0; 2000]);
        assert_eq!(unreachable(&long).unwrap().len(), 576);
    }

    #[test]
    fn ipv6_error_is_well_formed() {
        let mut orig = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        let a: Ipv6Addr = "fd00::1".parse().unwrap();
        let b: Ipv6Addr = "fd00::99".parse().unwrap();
        orig.extend_from_slice(&a.octets());
        orig.extend_from_slice(&b.octets());
        orig.extend_from_slice(&[0; 8]);
        let e = unreachable(&orig).unwrap();
        assert_eq!(e.len(), 48 + orig.len());
        let len = ((e.len() - 40) as u32).to_be_bytes();
        assert_eq!(checksum(&[&e[8..40], &len, &[0, 0, 0, 58], &e[40..]]), 0);
        assert_eq!((e[6], e[40], e[41]), (58, 1, 3));
        assert_eq!(&e[8..24], &b.octets());
        assert_eq!(&e[24..40], &a.octets());
    }

    #[test]
    fn errors_fragments_and_group_addresses_get_no_error() {
        // An ICMP error (type 3) about something; an echo request is answered.
        assert!(unreachable(&v4_packet(1, &[3, 0, 0, 0, 0, 0, 0, 0])).is_none());
        assert!(unreachable(&v4_packet(1, &[8, 0, 0, 0, 0, 0, 0, 0])).is_some());
        let mut frag = v4_packet(17, &[0; 16]);
        frag[6..8].copy_from_slice(&0x0010u16.to_be_bytes());
        assert!(unreachable(&frag).is_none(), "a later fragment");
        let mut mcast = v4_packet(17, &[0; 16]);
        mcast[16..20].copy_from_slice(&[224, 0, 0, 1]);
        assert!(unreachable(&mcast).is_none());
        let mut bcast = v4_packet(17, &[0; 16]);
        bcast[16..20].copy_from_slice(&[255, 255, 255, 255]);
        assert!(unreachable(&bcast).is_none());
        assert!(unreachable(&[0x45; 12]).is_none());
        assert!(unreachable(&[]).is_none());
    }

    #[test]
    fn rate_limit_on_a_simulated_clock() {
        let rl = RateLimit::default();
        let local: IpAddr = "10.0.0.1".parse().unwrap();
        let remote: IpAddr = "192.168.1.5".parse().unwrap();
        let t0 = Duration::from_secs(100);
        // A local destination: the global burst of 50, then one per millisecond.
        let sent = (0..100).filter(|_| rl.allow(local, true, t0)).count();
        assert_eq!(sent, 50);
        assert!(!rl.allow(local, true, t0));
        assert!(rl.allow(local, true, t0 + Duration::from_millis(1)));
        // A remote one, a second later: six at once, then one a second.
        let t1 = t0 + Duration::from_secs(1);
        let sent = (0..20).filter(|_| rl.allow(remote, false, t1)).count();
        assert_eq!(sent, 6);
        assert!(!rl.allow(remote, false, t1 + Duration::from_millis(500)));
        assert!(rl.allow(remote, false, t1 + Duration::from_secs(1)));
    }
}
