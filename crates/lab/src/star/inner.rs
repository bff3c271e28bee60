//! The inner packets of the star scenario: IPv4 UDP datagrams between a peer's inner
//! address and the gateway's sink, with correct header checksums and a payload that
//! names its peer and sequence number, carries its scheduled send time, and is filled
//! with a pattern derived from both, so that the receiver detects any corruption.
//!
//! Payload layout: scheduled send time (ns after the phase start, u64 LE), then
//! `workload::udp::fill` of the tag `peer << 40 | seq`.

use crate::workload::udp::{check, fill};
use std::net::Ipv4Addr;
use wirelane_dataplane::inner::checksum;

pub const IPV4_HEADER: usize = 20;
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

/// Peer `i`'s inner address (its AllowedIPs at the gateway, as a /32).
pub fn peer_inner(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i as u32 + 1)
}

/// Which peer an inner address belongs to, if any.
pub fn peer_of(addr: Ipv4Addr) -> Option<usize> {
    let off = u32::from(addr).checked_sub(u32::from(Ipv4Addr::new(10, 64, 0, 0)))?;
    (1..=MAX_PEERS as u32)
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

/// Writes a whole IPv4 UDP packet of `total` bytes from `src` to `dst` (both on
/// [`SINK_PORT`]) into `buf[..total]`, with the payload above.
pub fn write_packet(buf: &mut [u8], total: usize, src: Ipv4Addr, dst: Ipv4Addr, stamp: Stamp) {
    let udp_len = total - IPV4_HEADER;
    let ip = &mut buf[..IPV4_HEADER];
    ip.fill(0);
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let sum = checksum(&[ip]);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());

    let udp = &mut buf[IPV4_HEADER..total];
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
    // The pseudo-header: addresses, protocol and UDP length.
    let mut pseudo = [0u8; 12];
    pseudo[..4].copy_from_slice(&src.octets());
    pseudo[4..8].copy_from_slice(&dst.octets());
    pseudo[9] = 17;
    pseudo[10..12].copy_from_slice(&(udp_len as u16).to_be_bytes());
    let sum = match checksum(&[&pseudo, udp]) {
        0 => 0xffff, // 0 means "no checksum" in UDP over IPv4
        s => s,
    };
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
}

/// The padded length WireGuard encrypts for a `len`-byte packet under `mtu`: a multiple
/// of 16, but never past the MTU (whitepaper §5.4.6).
pub fn padded(len: usize, mtu: usize) -> usize {
    len.div_ceil(16).saturating_mul(16).min(mtu.max(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_carry_valid_checksums_and_their_stamp() {
        let mut buf = vec![0u8; 1420];
        let stamp = Stamp {
            peer: 999,
            seq: 123_456,
            scheduled_ns: 42,
        };
        write_packet(&mut buf, 1420, peer_inner(999), GATEWAY_INNER, stamp);
        // A valid header sums to zero with its checksum in place.
        assert_eq!(checksum(&[&buf[..IPV4_HEADER]]), 0);
        let mut pseudo = [0u8; 12];
        pseudo[..4].copy_from_slice(&buf[12..16]);
        pseudo[4..8].copy_from_slice(&buf[16..20]);
        pseudo[9] = 17;
        pseudo[10..12].copy_from_slice(&(1400u16).to_be_bytes());
        assert_eq!(checksum(&[&pseudo, &buf[IPV4_HEADER..]]), 0);
        assert_eq!(read_payload(&buf[IPV4_HEADER + UDP_HEADER..]), Some(stamp));
        // Any flipped payload bit is caught.
        buf[700] ^= 4;
        assert_eq!(read_payload(&buf[IPV4_HEADER + UDP_HEADER..]), None);
    }

    #[test]
    fn peer_addresses_map_back() {
        for i in [0, 1, 255, 65_535, MAX_PEERS - 1] {
            assert_eq!(peer_of(peer_inner(i)), Some(i));
        }
        assert_eq!(peer_of(Ipv4Addr::new(10, 64, 0, 0)), None);
        assert_eq!(peer_of(GATEWAY_INNER), None);
    }

    #[test]
    fn padding_follows_the_whitepaper() {
        assert_eq!(padded(1, 1420), 16);
        assert_eq!(padded(1400, 1420), 1408);
        assert_eq!(padded(1420, 1420), 1420);
        assert_eq!(padded(1419, 1420), 1420);
    }
}
