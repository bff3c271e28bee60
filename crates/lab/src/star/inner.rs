//! The inner packets of the star scenario: IPv4 or IPv6 UDP datagrams between a peer's
//! inner address and the gateway's sink, with correct checksums and a payload that
//! names its peer and sequence number, carries its scheduled send time, and is filled
//! with a pattern derived from both, so that the receiver detects any corruption.
//!
//! Which family a peer's packets use is the run's [`Family`]: all IPv4, all IPv6, or
//! dual stack (every peer has an address of each, and odd peers send IPv6).
//!
//! Payload layout: scheduled send time (ns after the phase start, u64 LE), then
//! `workload::udp::fill` of the tag `peer << 40 | seq`.

use crate::workload::udp::{check, fill};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use wirelane_dataplane::inner::checksum;

pub const IPV4_HEADER: usize = 20;
pub const IPV6_HEADER: usize = 40;
pub const UDP_HEADER: usize = 8;
/// Scheduled time, then the tag and at least a byte of pattern.
pub const MIN_PAYLOAD: usize = 8 + 8 + 1;
/// The UDP port the sink listens on, at the gateway's inner address and at each peer's.
pub const SINK_PORT: u16 = 9000;
const SEQ_BITS: u32 = 40;

/// The gateway's inner address: the sink's, and the source of transmit-direction data.
pub const GATEWAY_INNER: Ipv4Addr = Ipv4Addr::new(10, 63, 0, 1);
/// Every peer's inner address lies in 10.64.0.0/14 (`peer_inner`).
pub const PEERS_PREFIX: &str = "10.64.0.0/14";
/// At most this many peers fit the prefix.
pub const MAX_PEERS: usize = (1 << 18) - 2;

/// The gateway's inner IPv6 address.
pub const GATEWAY_INNER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x63, 0, 0, 0, 0, 0, 1);
/// Every peer's inner IPv6 address lies in this prefix (`peer_inner6`).
pub const PEERS6_PREFIX: &str = "fd00:64::/96";
const PEERS6_BASE: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x64, 0, 0, 0, 0, 0, 0);

/// The blackhole sink's destinations: routed to nowhere in the gateway's namespace, so
/// the kernel drops what the gateway writes right after its route lookup.
pub const BLACKHOLE_INNER: Ipv4Addr = Ipv4Addr::new(10, 63, 0, 2);
pub const BLACKHOLE_INNER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x63, 0, 0, 0, 0, 0, 2);

/// The inner address families of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    #[default]
    Ipv4,
    Ipv6,
    /// Every peer has an address of each family; even peers send IPv4, odd IPv6.
    Dual,
}

impl Family {
    /// Whether peer `i` sends and receives IPv6.
    pub fn peer_is_v6(self, i: usize) -> bool {
        match self {
            Family::Ipv4 => false,
            Family::Ipv6 => true,
            Family::Dual => i % 2 == 1,
        }
    }
    pub fn has_v4(self) -> bool {
        self != Family::Ipv6
    }
    pub fn has_v6(self) -> bool {
        self != Family::Ipv4
    }
    /// The largest IP header among the run's packets.
    pub fn max_header(self) -> usize {
        if self.has_v6() {
            IPV6_HEADER
        } else {
            IPV4_HEADER
        }
    }
    /// Peer `i`'s inner address in the family it uses.
    pub fn peer_addr(self, i: usize) -> IpAddr {
        if self.peer_is_v6(i) {
            IpAddr::V6(peer_inner6(i))
        } else {
            IpAddr::V4(peer_inner(i))
        }
    }
    /// Where peer `i`'s packets go at the gateway: the sink's address or, with a
    /// blackhole sink, the blackhole's, in the peer's family.
    pub fn gateway_addr(self, i: usize, blackhole: bool) -> IpAddr {
        match (self.peer_is_v6(i), blackhole) {
            (false, false) => IpAddr::V4(GATEWAY_INNER),
            (false, true) => IpAddr::V4(BLACKHOLE_INNER),
            (true, false) => IpAddr::V6(GATEWAY_INNER6),
            (true, true) => IpAddr::V6(BLACKHOLE_INNER6),
        }
    }
}

impl std::str::FromStr for Family {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ipv4" => Ok(Family::Ipv4),
            "ipv6" => Ok(Family::Ipv6),
            "dual" => Ok(Family::Dual),
            _ => Err(format!("inner family '{s}': ipv4, ipv6 or dual")),
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
            Family::Dual => "dual",
        })
    }
}

/// Peer `i`'s inner IPv4 address (its AllowedIPs at the gateway, as a /32).
pub fn peer_inner(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i as u32 + 1)
}

/// Peer `i`'s inner IPv6 address (its AllowedIPs at the gateway, as a /128).
pub fn peer_inner6(i: usize) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(PEERS6_BASE) + i as u128 + 1)
}

/// Which peer an inner address (of either family, or IPv4 mapped into IPv6 as a
/// dual-stack socket reports it) belongs to, if any.
pub fn peer_of(addr: IpAddr) -> Option<usize> {
    let off = match addr {
        IpAddr::V4(a) => u128::from(u32::from(a).checked_sub(u32::from(peer_inner(0)) - 1)?),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(a) => return peer_of(IpAddr::V4(a)),
            None => u128::from(a).checked_sub(u128::from(PEERS6_BASE))?,
        },
    };
    (1..=MAX_PEERS as u128)
        .contains(&off)
        .then(|| off as usize - 1)
}

/// What a received payload says, when its pattern is intact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub peer: u32,
    pub seq: u64,
    pub scheduled_ns: u64,
}

/// Writes the payload of packet `seq` of `peer`, scheduled `scheduled_ns` after the
/// phase start.
pub fn write_payload(buf: &mut [u8], peer: u32, seq: u64, scheduled_ns: u64) {
    buf[..8].copy_from_slice(&scheduled_ns.to_le_bytes());
    fill(&mut buf[8..], (u64::from(peer) << SEQ_BITS) | seq);
}

/// Reads a payload `write_payload` wrote; `None` if it is damaged.
pub fn read_payload(buf: &[u8]) -> Option<Stamp> {
    if buf.len() < MIN_PAYLOAD {
        return None;
    }
    let tag = check(&buf[8..])?;
    Some(Stamp {
        peer: (tag >> SEQ_BITS) as u32,
        seq: tag & ((1 << SEQ_BITS) - 1),
        scheduled_ns: u64::from_le_bytes(buf[..8].try_into().ok()?),
    })
}

/// Writes a whole UDP packet of `total` bytes from `src` to `dst` (both on
/// [`SINK_PORT`]) into `buf[..total]`, with the payload above: IPv4 when both addresses
/// are, else IPv6 (an IPv4 address among them as IPv4-mapped).
pub fn write_packet(buf: &mut [u8], total: usize, src: IpAddr, dst: IpAddr, stamp: Stamp) {
    let header = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = &mut buf[..IPV4_HEADER];
            ip.fill(0);
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            ip[6] = 0x40; // don't fragment
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let sum = checksum(&[ip]);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            IPV4_HEADER
        }
        _ => {
            let ip = &mut buf[..IPV6_HEADER];
            ip.fill(0);
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&((total - IPV6_HEADER) as u16).to_be_bytes());
            ip[6] = 17;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&v6_octets(src));
            ip[24..40].copy_from_slice(&v6_octets(dst));
            IPV6_HEADER
        }
    };
    let udp_len = total - header;
    let udp = &mut buf[header..total];
    udp[..2].copy_from_slice(&SINK_PORT.to_be_bytes());
    udp[2..4].copy_from_slice(&SINK_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    udp[6..8].fill(0);
    write_payload(
        &mut udp[UDP_HEADER..],
        stamp.peer,
        stamp.seq,
        stamp.scheduled_ns,
    );
    let (pseudo, pseudo_len) = pseudo_header(src, dst, udp_len);
    let sum = match checksum(&[&pseudo[..pseudo_len], udp]) {
        // 0 means "no checksum" over IPv4 and is not allowed over IPv6 (RFC 768,
        // RFC 8200 §8.1): either way a computed 0 is sent as its other form.
        0 => 0xffff,
        s => s,
    };
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
}

/// The pseudo-header that UDP's checksum covers: the addresses, the protocol and the
/// UDP length, laid out per family (RFC 768; RFC 8200 §8.1). The sum does not depend
/// on the order of these 16-bit words, only on their values.
/// Returns the buffer and how much of it is the pseudo-header.
fn pseudo_header(src: IpAddr, dst: IpAddr, udp_len: usize) -> ([u8; 40], usize) {
    let mut p = [0u8; 40];
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p[..4].copy_from_slice(&s.octets());
            p[4..8].copy_from_slice(&d.octets());
            p[9] = 17;
            p[10..12].copy_from_slice(&(udp_len as u16).to_be_bytes());
            (p, 12)
        }
        _ => {
            p[..16].copy_from_slice(&v6_octets(src));
            p[16..32].copy_from_slice(&v6_octets(dst));
            p[32..36].copy_from_slice(&(udp_len as u32).to_be_bytes());
            p[39] = 17;
            (p, 40)
        }
    }
}

fn v6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
    }
}

/// Reads a packet [`write_packet`] wrote: its destination and stamp, if its header
/// is one of ours and its payload is intact.
pub fn read_packet(ip: &[u8]) -> Option<(IpAddr, Stamp)> {
    let (header, total, dst) = match ip.first()? >> 4 {
        4 if ip.len() >= IPV4_HEADER && ip[0] == 0x45 => {
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let d: [u8; 4] = ip[16..20].try_into().ok()?;
            (IPV4_HEADER, total, IpAddr::from(d))
        }
        6 if ip.len() >= IPV6_HEADER && ip[6] == 17 => {
            let total = IPV6_HEADER + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let d: [u8; 16] = ip[24..40].try_into().ok()?;
            (IPV6_HEADER, total, IpAddr::from(d))
        }
        _ => return None,
    };
    let stamp = read_payload(ip.get(header + UDP_HEADER..total.min(ip.len()))?)?;
    Some((dst, stamp))
}

/// The padded length WireGuard encrypts for a `len`-byte packet under `mtu`: a multiple
/// of 16, but never past the MTU (whitepaper §5.4.6).
pub fn padded(len: usize, mtu: usize) -> usize {
    len.div_ceil(16).saturating_mul(16).min(mtu.max(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid UDP checksum sums to zero over the pseudo-header and the datagram.
    fn udp_checksum_holds(buf: &[u8], header: usize, src: IpAddr, dst: IpAddr) -> bool {
        let udp = &buf[header..];
        let (pseudo, len) = pseudo_header(src, dst, udp.len());
        checksum(&[&pseudo[..len], udp]) == 0
    }

    #[test]
    fn ipv4_packets_carry_valid_checksums_and_their_stamp() {
        let mut buf = vec![0u8; 1420];
        let stamp = Stamp {
            peer: 999,
            seq: 123_456,
            scheduled_ns: 42,
        };
        let (src, dst) = (IpAddr::V4(peer_inner(999)), IpAddr::V4(GATEWAY_INNER));
        write_packet(&mut buf, 1420, src, dst, stamp);
        // A valid header sums to zero with its checksum in place.
        assert_eq!(checksum(&[&buf[..IPV4_HEADER]]), 0);
        assert!(udp_checksum_holds(&buf, IPV4_HEADER, src, dst));
        assert_eq!(read_packet(&buf), Some((dst, stamp)));
        // Any flipped payload bit is caught.
        buf[700] ^= 4;
        assert_eq!(read_payload(&buf[IPV4_HEADER + UDP_HEADER..]), None);
        assert_eq!(read_packet(&buf), None);
    }

    #[test]
    fn ipv6_packets_carry_a_valid_checksum_and_their_stamp() {
        let mut buf = vec![0u8; 1420];
        let stamp = Stamp {
            peer: 7,
            seq: 1,
            scheduled_ns: 0,
        };
        let (src, dst) = (IpAddr::V6(peer_inner6(7)), IpAddr::V6(GATEWAY_INNER6));
        write_packet(&mut buf, 1420, src, dst, stamp);
        assert_eq!(buf[0] >> 4, 6);
        assert_eq!(u16::from_be_bytes([buf[4], buf[5]]), 1420 - 40);
        assert!(udp_checksum_holds(&buf, IPV6_HEADER, src, dst));
        assert_ne!(&buf[46..48], &[0, 0], "IPv6 requires a UDP checksum");
        assert_eq!(read_packet(&buf), Some((dst, stamp)));
        buf[1000] ^= 1;
        assert_eq!(read_packet(&buf), None);
    }

    #[test]
    fn peer_addresses_map_back() {
        for i in [0, 1, 255, 65_535, MAX_PEERS - 1] {
            assert_eq!(peer_of(IpAddr::V4(peer_inner(i))), Some(i));
            assert_eq!(peer_of(IpAddr::V6(peer_inner6(i))), Some(i));
            // As a dual-stack socket reports an IPv4 source.
            assert_eq!(peer_of(IpAddr::V6(peer_inner(i).to_ipv6_mapped())), Some(i));
        }
        assert_eq!(peer_of(IpAddr::V4(Ipv4Addr::new(10, 64, 0, 0))), None);
        assert_eq!(peer_of(IpAddr::V4(GATEWAY_INNER)), None);
        assert_eq!(peer_of(IpAddr::V6(GATEWAY_INNER6)), None);
        assert_eq!(peer_of(IpAddr::V6(PEERS6_BASE)), None);
    }

    #[test]
    fn dual_stack_runs_alternate_families_over_the_peers() {
        let f = Family::Dual;
        assert_eq!(f.peer_addr(0), IpAddr::V4(peer_inner(0)));
        assert_eq!(f.peer_addr(1), IpAddr::V6(peer_inner6(1)));
        assert_eq!(f.gateway_addr(1, true), IpAddr::V6(BLACKHOLE_INNER6));
        assert_eq!(Family::Ipv4.max_header(), IPV4_HEADER);
        assert_eq!(f.max_header(), IPV6_HEADER);
        for name in ["ipv4", "ipv6", "dual"] {
            assert_eq!(name.parse::<Family>().unwrap().to_string(), name);
        }
        assert!("ipv5".parse::<Family>().is_err());
    }

    #[test]
    fn padding_follows_the_whitepaper() {
        assert_eq!(padded(1, 1420), 16);
        assert_eq!(padded(1400, 1420), 1408);
        assert_eq!(padded(1420, 1420), 1420);
        assert_eq!(padded(1419, 1420), 1420);
    }
}
