//! Just enough of the inner IP header: version, addresses and total length.

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
