//! Just enough of the inner IP header: version, addresses and total length; the flow
//! a packet belongs to; and its ECN field (RFC 3168), which the queue may mark.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What the pipeline needs from an inner packet's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InnerHeader {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Length the header claims; padding past it is stripped on receive.
    pub total_len: usize,
}

/// Parses an IPv4 or IPv6 header; `None` if `pkt` is not a well-formed one or is
/// shorter than its header claims.
pub fn parse(pkt: &[u8]) -> Option<InnerHeader> {
    match pkt.first()? >> 4 {
        4 if pkt.len() >= 20 => {
            let ihl = (pkt[0] & 0x0f) as usize * 4;
            let total = u16::from_be_bytes([pkt[2], pkt[3]]) as usize;
            if ihl < 20 || total < ihl || total > pkt.len() {
                return None;
            }
            let src: [u8; 4] = pkt[12..16].try_into().ok()?;
            let dst: [u8; 4] = pkt[16..20].try_into().ok()?;
            Some(InnerHeader {
                src: IpAddr::V4(Ipv4Addr::from(src)),
                dst: IpAddr::V4(Ipv4Addr::from(dst)),
                total_len: total,
            })
        }
        6 if pkt.len() >= 40 => {
            let total = 40 + u16::from_be_bytes([pkt[4], pkt[5]]) as usize;
            if total > pkt.len() {
                return None;
            }
            let src: [u8; 16] = pkt[8..24].try_into().ok()?;
            let dst: [u8; 16] = pkt[24..40].try_into().ok()?;
            Some(InnerHeader {
                src: IpAddr::V6(Ipv6Addr::from(src)),
                dst: IpAddr::V6(Ipv6Addr::from(dst)),
                total_len: total,
            })
        }
        _ => None,
    }
}

/// The ECN codepoints (RFC 3168 §5), the low two bits of the IPv4 TOS byte or of the
/// IPv6 traffic class.
pub const NOT_ECT: u8 = 0b00;
pub const ECT_1: u8 = 0b01;
pub const ECT_0: u8 = 0b10;
pub const CE: u8 = 0b11;

/// A hash of the packet's flow: addresses, protocol and, for TCP, UDP, UDP-Lite and
/// SCTP when the header is the first (unfragmented IPv4, IPv6 without extension
/// headers), the ports. A fragment hashes without ports, the first (MF set, offset 0)
/// as the later ones, as the kernel's flow dissector does: one datagram's fragments
/// stay in one bucket and in order. Anything unparseable hashes to 0: one bucket for
/// the oddities.
/// Unkeyed: the queue it spreads is one peer's own, so a peer that made its flows
/// collide would only slow itself.
pub fn flow_hash(pkt: &[u8]) -> u32 {
    let (addrs, proto, l4) = match pkt.first().map(|b| b >> 4) {
        Some(4) if pkt.len() >= 20 => {
            let ihl = (pkt[0] & 0x0f) as usize * 4;
            // Flags MF (0x2000) and the fragment offset (0x1fff): both clear means whole.
            let whole = u16::from_be_bytes([pkt[6], pkt[7]]) & 0x3fff == 0;
            (&pkt[12..20], pkt[9], whole.then_some(ihl))
        }
        Some(6) if pkt.len() >= 40 => (&pkt[8..40], pkt[6], Some(40)),
        _ => return 0,
    };
    let ports = match (proto, l4) {
        (6 | 17 | 132 | 136, Some(at)) => pkt.get(at..at + 4).unwrap_or(&[]),
        _ => &[],
    };
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15 ^ proto as u64;
    for chunk in addrs.chunks(8).chain(std::iter::once(ports)) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 29;
    }
    (h ^ (h >> 32)) as u32
}

/// The packet's ECN field; `NOT_ECT` for anything that is not IPv4 or IPv6.
pub fn ecn(pkt: &[u8]) -> u8 {
    match pkt.first().map(|b| b >> 4) {
        Some(4) if pkt.len() >= 20 => pkt[1] & 0b11,
        Some(6) if pkt.len() >= 40 => (pkt[1] >> 4) & 0b11,
        _ => NOT_ECT,
    }
}

/// The ECN field of the outer header that carries `pkt` (RFC 6040 §4.1, as the
/// kernel's tunnels set it): ECT(0) and ECT(1) are copied, so that routers between the
/// tunnel's ends may mark the outer header (`rx_aqm` carries a mark on to the inner
/// one); a CE packet travels as ECT(0), since its inner header already carries the mark
/// to the receiver; Not-ECT stays Not-ECT, as does anything not IP (a keepalive).
pub fn encapsulated_ecn(pkt: &[u8]) -> u8 {
    match ecn(pkt) {
        CE => ECT_0,
        other => other,
    }
}

/// Sets Congestion Experienced on an ECN-capable packet (ECT(0), ECT(1) or already
/// CE), updating the IPv4 header checksum incrementally (RFC 1624); false, and the
/// packet unchanged, if it is not ECN-capable.
pub fn set_ce(pkt: &mut [u8]) -> bool {
    if ecn(pkt) == NOT_ECT {
        return false;
    }
    rewrite_ecn(pkt, CE);
    true
}

/// RFC 6040 §4.2's one rewrite besides CE: an ECT(0) packet that arrived under an
/// ECT(1) outer header leaves as ECT(1) (the kernel's `INET_ECN_decapsulate` does the
/// same), so an L4S marking on the path between the tunnel's ends reaches the inner
/// flow. Anything else is left as it is.
pub fn set_ect1_under_outer_ect1(pkt: &mut [u8]) {
    if ecn(pkt) == ECT_0 {
        rewrite_ecn(pkt, ECT_1);
    }
}

/// Writes `field` as the ECN bits of an IPv4 or IPv6 header the caller has checked,
/// keeping the IPv4 header checksum valid.
fn rewrite_ecn(pkt: &mut [u8], field: u8) {
    if pkt[0] >> 4 == 4 {
        let old = u16::from_be_bytes([pkt[0], pkt[1]]);
        pkt[1] = (pkt[1] & !CE) | field;
        let new = u16::from_be_bytes([pkt[0], pkt[1]]);
        // HC' = ~(~HC + ~m + m')
        let hc = u16::from_be_bytes([pkt[10], pkt[11]]);
        let mut sum = (!hc) as u32 + (!old) as u32 + new as u32;
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        pkt[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    } else {
        pkt[1] = (pkt[1] & !(CE << 4)) | (field << 4);
    }
}

/// The Internet checksum (RFC 1071): the ones' complement of the ones' complement sum
/// of `parts` laid end to end as 16-bit big-endian words (a part may end mid-word).
pub fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    let mut odd: Option<u8> = None;
    for part in parts {
        for &b in *part {
            match odd.take() {
                Some(hi) => sum += u32::from(u16::from_be_bytes([hi, b])),
                None => odd = Some(b),
            }
        }
    }
    if let Some(hi) = odd {
        sum += u32::from(u16::from_be_bytes([hi, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_and_ipv6() {
        let mut v4 = [0u8; 28];
        v4[0] = 0x45;
        v4[2..4].copy_from_slice(&24u16.to_be_bytes());
        v4[12..16].copy_from_slice(&[10, 0, 0, 1]);
        v4[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let h = parse(&v4).unwrap();
        assert_eq!(h.src, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(h.dst, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(h.total_len, 24);
        let mut v6 = [0u8; 48];
        v6[0] = 0x60;
        v6[4..6].copy_from_slice(&8u16.to_be_bytes());
        v6[23] = 1;
        v6[39] = 2;
        let h = parse(&v6).unwrap();
        assert_eq!(h.src, "::1".parse::<IpAddr>().unwrap());
        assert_eq!(h.total_len, 48);
    }

    /// RFC 6040 §4.1 as the kernel's tunnels do it: ECT copied, CE sent as ECT(0),
    /// in both families; anything not IP (a keepalive's empty payload) is Not-ECT.
    #[test]
    fn the_outer_ecn_field_follows_the_inner_one() {
        let mut v4 = [0u8; 20];
        v4[0] = 0x45;
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        for (inner, outer) in [
            (NOT_ECT, NOT_ECT),
            (ECT_1, ECT_1),
            (ECT_0, ECT_0),
            (CE, ECT_0),
        ] {
            v4[1] = 0xb8 | inner; // DSCP EF: never copied.
            assert_eq!(encapsulated_ecn(&v4), outer, "v4 {inner:#b}");
            v6[0] = 0x6b; // Traffic class 0xb_ with the ECN bits in the next nibble.
            v6[1] = 0x80 | (inner << 4);
            assert_eq!(encapsulated_ecn(&v6), outer, "v6 {inner:#b}");
        }
        assert_eq!(encapsulated_ecn(&[]), NOT_ECT);
    }

    fn v4_checksum_ok(h: &[u8]) -> bool {
        let mut sum: u32 = h[..20]
            .chunks(2)
            .map(|w| u16::from_be_bytes([w[0], w[1]]) as u32)
            .sum();
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum == 0xffff
    }

    #[test]
    fn ce_marks_only_ecn_capable_packets_and_keeps_the_checksum_valid() {
        let mut v4 = [0u8; 20];
        v4[0] = 0x45;
        v4[2..4].copy_from_slice(&20u16.to_be_bytes());
        v4[8] = 64;
        v4[9] = 6;
        v4[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        for (tos, capable) in [
            (0x00u8, false),
            (0x02, true),
            (0x01, true),
            (0xb8, false),
            (0xba, true),
        ] {
            let mut p = v4;
            p[1] = tos;
            let mut sum: u32 = p
                .chunks(2)
                .map(|w| u16::from_be_bytes([w[0], w[1]]) as u32)
                .sum();
            sum = (sum & 0xffff) + (sum >> 16);
            p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
            assert!(v4_checksum_ok(&p));
            assert_eq!(set_ce(&mut p), capable, "tos {tos:#x}");
            assert_eq!(ecn(&p) == CE, capable);
            assert_eq!(p[1] & !CE, tos & !CE, "DSCP kept");
            assert!(v4_checksum_ok(&p), "tos {tos:#x}");
        }
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        assert!(!set_ce(&mut v6));
        assert_eq!(v6[1], 0);
        v6[1] = 0x20; // ECT(0)
        assert!(set_ce(&mut v6));
        assert_eq!(ecn(&v6), CE);
        assert_eq!(v6[0], 0x60);
        assert!(!set_ce(&mut [0x45u8; 4]), "too short to be IPv4");
    }

    /// RFC 6040 §4.2: under an outer ECT(1), only an inner ECT(0) changes (to ECT(1)).
    #[test]
    fn an_outer_ect1_turns_only_an_inner_ect0_into_ect1() {
        let mut v4 = [0u8; 20];
        v4[0] = 0x45;
        v4[2..4].copy_from_slice(&20u16.to_be_bytes());
        v4[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        for (inner, after) in [(NOT_ECT, NOT_ECT), (ECT_0, ECT_1), (ECT_1, ECT_1), (CE, CE)] {
            let mut p = v4;
            p[1] = 0xb8 | inner;
            let sum = checksum(&[&p]);
            p[10..12].copy_from_slice(&sum.to_be_bytes());
            set_ect1_under_outer_ect1(&mut p);
            assert_eq!(ecn(&p), after, "v4 {inner:#b}");
            assert_eq!(p[1] & !CE, 0xb8, "DSCP kept");
            assert!(v4_checksum_ok(&p), "v4 {inner:#b}");
            let mut v6 = [0u8; 40];
            v6[0] = 0x6b;
            v6[1] = 0x80 | (inner << 4);
            set_ect1_under_outer_ect1(&mut v6);
            assert_eq!(ecn(&v6), after, "v6 {inner:#b}");
            assert_eq!((v6[0], v6[1] & 0xcf), (0x6b, 0x80), "traffic class kept");
        }
    }

    #[test]
    fn flows_hash_by_addresses_protocol_and_ports() {
        let mut a = [0u8; 40];
        a[0] = 0x45;
        a[9] = 6;
        a[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        a[20..24].copy_from_slice(&[0x1f, 0x90, 0xc0, 0x00]);
        let mut b = a;
        b[23] = 1; // another source port
        let mut c = a;
        c[1] = 0xb8; // DSCP is no part of the flow
        c[4] = 7; // nor the IP ID
        assert_ne!(flow_hash(&a), flow_hash(&b));
        assert_eq!(flow_hash(&a), flow_hash(&c));
        // A later fragment has no ports: it hashes by addresses and protocol only.
        let mut frag = a;
        frag[7] = 1;
        let mut frag2 = b;
        frag2[7] = 1;
        assert_eq!(flow_hash(&frag), flow_hash(&frag2));
        // The first fragment (MF set, offset 0) has them, but hashes as its later
        // fragments do, or one datagram's pieces would land in two buckets.
        let mut first = a;
        first[6] = 0x20;
        assert_eq!(flow_hash(&first), flow_hash(&frag));
        assert_eq!(flow_hash(&[]), 0);
        assert_eq!(flow_hash(&[0x45; 10]), 0);
    }

    #[test]
    fn malformed() {
        assert_eq!(parse(&[]), None);
        assert_eq!(parse(&[0x45; 10]), None);
        let mut v4 = [0u8; 20];
        v4[0] = 0x45;
        v4[2..4].copy_from_slice(&60u16.to_be_bytes());
        assert_eq!(parse(&v4), None, "claims more than it has");
        v4[0] = 0x44;
        v4[2..4].copy_from_slice(&20u16.to_be_bytes());
        assert_eq!(parse(&v4), None, "header length below 20");
        assert_eq!(parse(&[0x70; 60]), None, "unknown version");
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[4..6].copy_from_slice(&1u16.to_be_bytes());
        assert_eq!(parse(&v6), None);
    }
}
