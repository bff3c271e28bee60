//! Split and coalesce against hand-built TCP and UDP packets.

use super::*;
use std::io::IoSlice;

/// A TCP super-packet with a partial (pseudo-header) checksum, as the kernel sends.
fn super_packet(v6: bool, payload: usize, flags: u8) -> Vec<u8> {
    let ip_len = if v6 { 40 } else { 20 };
    let mut p = vec![0u8; ip_len + 20 + payload];
    let total = p.len();
    if v6 {
        p[0] = 0x60;
        p[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
        p[6] = 6;
        p[7] = 64;
        p[8..24].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p[24..40].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    } else {
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        ipv4_header_checksum(&mut p, 20);
    }
    let t = ip_len;
    p[t..t + 2].copy_from_slice(&1234u16.to_be_bytes());
    p[t + 2..t + 4].copy_from_slice(&80u16.to_be_bytes());
    p[t + 4..t + 8].copy_from_slice(&0xffff_ff00u32.to_be_bytes()); // wraps
    p[t + 12] = 5 << 4;
    p[t + 13] = flags;
    for (i, b) in p[t + 20..].iter_mut().enumerate() {
        *b = (i * 7 % 251) as u8;
    }
    p
}

fn verify_segment(s: &[u8], v6: bool) -> (u32, usize, u8) {
    let l4 = if v6 { 40 } else { 20 };
    if !v6 {
        assert_eq!(u16::from_be_bytes([s[2], s[3]]) as usize, s.len());
        assert_eq!(finish(sum(&s[..20], 0)), 0, "IPv4 header checksum");
    } else {
        assert_eq!(u16::from_be_bytes([s[4], s[5]]) as usize, s.len() - 40);
    }
    assert_eq!(
        finish(sum(&s[l4..], pseudo_sum(s, 6, s.len() - l4))),
        0,
        "TCP checksum"
    );
    let seq = u32::from_be_bytes([s[l4 + 4], s[l4 + 5], s[l4 + 6], s[l4 + 7]]);
    (seq, s.len() - l4 - 20, s[l4 + 13])
}

#[test]
fn tso_split_v4_and_v6() {
    for v6 in [false, true] {
        let flags = ACK | PSH | 0x01 | 0x80; // and FIN, CWR
        let original = super_packet(v6, 4000, flags);
        let l4 = if v6 { 40 } else { 20 };
        let segs = segments(v6, 4000, flags);
        assert_eq!(segs.len(), 3);
        let mut payload = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            let (seq, len, flags) = verify_segment(s, v6);
            assert_eq!(seq, 0xffff_ff00u32.wrapping_add((i * 1360) as u32));
            assert_eq!(len, if i < 2 { 1360 } else { 4000 - 2720 });
            assert_eq!(flags & 0x01 != 0, i == 2, "FIN only on the last");
            assert_eq!(flags & 0x08 != 0, i == 2, "PSH only on the last");
            assert_eq!(flags & 0x80 != 0, i == 0, "CWR only on the first");
            assert!(flags & 0x10 != 0, "ACK on all");
            payload.extend_from_slice(&s[l4 + 20..]);
            if !v6 {
                assert_eq!(u16::from_be_bytes([s[4], s[5]]), 0x1234 + i as u16);
            }
        }
        assert_eq!(payload, original[l4 + 20..]);
    }
}

#[test]
fn needs_csum_only_and_passthrough() {
    let mut p = super_packet(false, 100, 0x10);
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        csum_start: 20,
        csum_offset: 16,
        ..Default::default()
    };
    // Seed the field with the pseudo-header sum, as the kernel does.
    let ps = finish(pseudo_sum(&p, 6, p.len() - 20));
    p[36..38].copy_from_slice(&(!ps).to_be_bytes());
    let mut out = Vec::new();
    split(&hdr, &mut p, |h, d| out.push([h, d].concat())).unwrap();
    assert_eq!(out.len(), 1);
    verify_segment(&out[0], false);
    let mut plain = vec![0x45u8; 30];
    let mut n = 0;
    split(&VnetHdr::default(), &mut plain, |_, _| n += 1).unwrap();
    assert_eq!(n, 1);
}

#[test]
fn malformed_super_packets_are_refused() {
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 40,
        gso_size: 1000,
        csum_start: 20,
        csum_offset: 16,
    };
    let mut short = vec![0x45u8; 30];
    assert_eq!(
        split(&hdr, &mut short, |_, _| {}),
        Err(SplitError::Malformed)
    );
    let mut p = super_packet(false, 3000, 0x10);
    let zero = VnetHdr { gso_size: 0, ..hdr };
    assert_eq!(split(&zero, &mut p, |_, _| {}), Err(SplitError::Malformed));
    // Segments far smaller than any TCP MSS: more than a read may make of one packet.
    let mut many = super_packet(false, 60_000, 0x10);
    let tiny = VnetHdr { gso_size: 8, ..hdr };
    assert_eq!(
        split(&tiny, &mut many, |_, _| {}),
        Err(SplitError::Malformed)
    );
    // At TCP's smallest MSS it still splits.
    let smallest = VnetHdr {
        gso_size: 48,
        ..hdr
    };
    let mut n = 0;
    assert_eq!(split(&smallest, &mut many, |_, _| n += 1), Ok(()));
    assert_eq!(n, 60_000usize.div_ceil(48));
    // A read the buffer truncated: the IP length no longer matches what is there.
    let mut cut = p[..p.len() - 100].to_vec();
    assert_eq!(split(&hdr, &mut cut, |_, _| {}), Err(SplitError::Malformed));
    // A UDP offload claimed for a TCP packet.
    let not_udp = VnetHdr {
        gso_type: GSO_UDP_L4,
        csum_offset: 6,
        ..hdr
    };
    assert_eq!(
        split(&not_udp, &mut p, |_, _| {}),
        Err(SplitError::Malformed)
    );
    // UFO (IP fragmentation of UDP), which no TUN we configure asks for.
    let ufo = VnetHdr { gso_type: 3, ..hdr };
    assert_eq!(
        split(&ufo, &mut p, |_, _| {}),
        Err(SplitError::Unsupported(3))
    );
    let udp_short = VnetHdr {
        gso_type: GSO_UDP_L4,
        csum_start: 25,
        csum_offset: 6,
        ..hdr
    };
    assert_eq!(
        split(&udp_short, &mut short, |_, _| {}),
        Err(SplitError::Malformed)
    );
    let bad_off = VnetHdr {
        gso_type: GSO_NONE,
        csum_start: 60000,
        ..hdr
    };
    assert_eq!(
        split(&bad_off, &mut p, |_, _| {}),
        Err(SplitError::Malformed)
    );
    let v6_claim = VnetHdr {
        gso_type: GSO_TCPV6,
        csum_start: 40,
        ..hdr
    };
    assert_eq!(
        split(&v6_claim, &mut p, |_, _| {}),
        Err(SplitError::Malformed)
    );
}

/// The packet `coalesce` emitted, its pieces laid end to end.
fn joined(pieces: &[IoSlice<'_>]) -> Vec<u8> {
    pieces.iter().flat_map(|p| p.iter().copied()).collect()
}

fn split_all(super_pkt: &[u8]) -> Vec<Vec<u8>> {
    let hdr = VnetHdr::parse(super_pkt).unwrap();
    let mut body = super_pkt[VNET_HDR_LEN..].to_vec();
    let mut out = Vec::new();
    split(&hdr, &mut body, |h, d| out.push([h, d].concat())).unwrap();
    out
}

fn segments(v6: bool, payload: usize, flags: u8) -> Vec<Vec<u8>> {
    let mut p = super_packet(v6, payload, flags);
    let l4 = if v6 { 40 } else { 20 };
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
        hdr_len: (l4 + 20) as u16,
        gso_size: 1360,
        csum_start: l4 as u16,
        csum_offset: 16,
    };
    let mut segs = Vec::new();
    split(&hdr, &mut p, |h, d| segs.push([h, d].concat())).unwrap();
    segs
}

#[test]
fn coalesce_then_split_is_identity() {
    for v6 in [false, true] {
        let segs = segments(v6, 10_000, ACK | PSH);
        assert_eq!(segs.len(), 8);
        let refs: Vec<&[u8]> = segs.iter().map(Vec::as_slice).collect();
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        coalesce(&refs, &mut scratch, false, |b, _| out.push(joined(b)));
        assert_eq!(out.len(), 1, "one super-packet");
        let hdr = VnetHdr::parse(&out[0]).unwrap();
        assert_eq!(hdr.gso_size, 1360);
        assert_eq!(split_all(&out[0]), segs);
    }
}

#[test]
fn coalesce_keeps_what_cannot_merge_apart() {
    let mut segs = segments(false, 4000, ACK);
    // A gap in the sequence: the third segment cannot follow the first.
    segs.remove(1);
    // A different flow in between, and a non-TCP packet.
    let mut other = segs[0].clone();
    other[20] ^= 1; // source port
    let udp = {
        let mut u = vec![0u8; 48];
        u[0] = 0x45;
        u[2..4].copy_from_slice(&48u16.to_be_bytes());
        u[9] = 17;
        u
    };
    let refs: Vec<&[u8]> = vec![&segs[0], &other, &udp, &segs[1]];
    let mut out = Vec::new();
    coalesce(&refs, &mut Vec::new(), false, |b, _| out.push(joined(b)));
    assert_eq!(out.len(), 4);
    for (o, s) in out.iter().zip(&refs) {
        assert_eq!(&o[..VNET_HDR_LEN], &[0u8; VNET_HDR_LEN]);
        assert_eq!(&o[VNET_HDR_LEN..], *s);
    }
    // Two consecutive segments then a gap: two merge, the rest stands alone.
    let all = segments(true, 5440, ACK);
    let refs: Vec<&[u8]> = vec![&all[0], &all[1], &all[3]];
    let mut out = Vec::new();
    coalesce(&refs, &mut Vec::new(), false, |b, _| out.push(joined(b)));
    assert_eq!(out.len(), 2);
    assert_eq!(split_all(&out[0]), all[..2].to_vec());
}

/// A UDP super-packet with a partial checksum, as an application's `UDP_SEGMENT` send
/// reaches the TUN: one IP and UDP header, then `payload` bytes.
fn udp_super_packet(v6: bool, payload: usize) -> Vec<u8> {
    let mut p = super_packet(v6, payload, 0);
    let l4 = if v6 { 40 } else { 20 };
    p.drain(l4 + 8..l4 + 20); // a TCP header is 12 bytes longer
    let total = p.len();
    if v6 {
        p[6] = PROTO_UDP;
    } else {
        p[9] = PROTO_UDP;
    }
    set_ip_length(&mut p, l4, total);
    p[l4 + 4..l4 + 6].copy_from_slice(&((total - l4) as u16).to_be_bytes());
    let ps = finish(pseudo_sum(&p, PROTO_UDP, total - l4));
    p[l4 + 6..l4 + 8].copy_from_slice(&(!ps).to_be_bytes());
    p
}

fn udp_segments(v6: bool, payload: usize, size: u16) -> Vec<Vec<u8>> {
    let mut p = udp_super_packet(v6, payload);
    let l4 = if v6 { 40 } else { 20 };
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_UDP_L4,
        hdr_len: (l4 + 8) as u16,
        gso_size: size,
        csum_start: l4 as u16,
        csum_offset: 6,
    };
    let mut segs = Vec::new();
    split(&hdr, &mut p, |h, d| segs.push([h, d].concat())).unwrap();
    segs
}

/// Checks one datagram's lengths and checksums; returns its payload.
fn verify_datagram(s: &[u8], v6: bool) -> &[u8] {
    let l4 = if v6 { 40 } else { 20 };
    if v6 {
        assert_eq!(u16::from_be_bytes([s[4], s[5]]) as usize, s.len() - 40);
    } else {
        assert_eq!(u16::from_be_bytes([s[2], s[3]]) as usize, s.len());
        assert_eq!(finish(sum(&s[..20], 0)), 0, "IPv4 header checksum");
    }
    assert_eq!(
        u16::from_be_bytes([s[l4 + 4], s[l4 + 5]]) as usize,
        s.len() - l4
    );
    assert_ne!(
        &s[l4 + 6..l4 + 8],
        &[0, 0],
        "a computed checksum is never 0"
    );
    assert_eq!(
        finish(sum(&s[l4..], pseudo_sum(s, PROTO_UDP, s.len() - l4))),
        0,
        "UDP checksum"
    );
    &s[l4 + 8..]
}

#[test]
fn uso_split_v4_and_v6() {
    for v6 in [false, true] {
        let l4 = if v6 { 40 } else { 20 };
        let original = udp_super_packet(v6, 4000);
        let segs = udp_segments(v6, 4000, 1380);
        assert_eq!(segs.len(), 3);
        let mut payload = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            let data = verify_datagram(s, v6);
            assert_eq!(data.len(), if i < 2 { 1380 } else { 4000 - 2760 });
            payload.extend_from_slice(data);
            if !v6 {
                assert_eq!(u16::from_be_bytes([s[4], s[5]]), 0x1234 + i as u16);
            }
        }
        assert_eq!(payload, original[l4 + 8..]);
    }
    // An empty payload is one empty datagram, not none.
    let empty = udp_segments(false, 0, 1380);
    assert_eq!(empty.len(), 1);
    assert!(verify_datagram(&empty[0], false).is_empty());
}

#[test]
fn udp_coalesce_then_split_is_identity() {
    for v6 in [false, true] {
        let segs = udp_segments(v6, 10_000, 1380);
        assert_eq!(segs.len(), 8);
        let refs: Vec<&[u8]> = segs.iter().map(Vec::as_slice).collect();
        let mut out = Vec::new();
        let mut carried = Vec::new();
        coalesce(&refs, &mut Vec::new(), true, |b, run| {
            out.push(joined(b));
            carried.extend(run.iter().map(|p| p.to_vec()));
        });
        assert_eq!(out.len(), 1, "one super-packet");
        assert_eq!(carried, segs, "emit names the packets it carries");
        let hdr = VnetHdr::parse(&out[0]).unwrap();
        assert_eq!((hdr.gso_type, hdr.gso_size), (GSO_UDP_L4, 1380));
        assert_eq!(split_all(&out[0]), segs);
        // Where the TUN has no USO, every datagram goes alone, unchanged.
        let mut alone = Vec::new();
        coalesce(&refs, &mut Vec::new(), false, |b, _| alone.push(joined(b)));
        assert_eq!(alone.len(), 8);
        for (o, s) in alone.iter().zip(&segs) {
            assert_eq!(&o[VNET_HDR_LEN..], s.as_slice());
        }
    }
}

#[test]
fn udp_coalesce_respects_flows_sizes_and_the_segment_limit() {
    // 100 small datagrams of one flow: 64, the kernel's GRO limit, then 36.
    let segs = udp_segments(false, 100 * 100, 100);
    let refs: Vec<&[u8]> = segs.iter().map(Vec::as_slice).collect();
    let mut out = Vec::new();
    coalesce(&refs, &mut Vec::new(), true, |b, _| out.push(joined(b)));
    assert_eq!(out.len(), 2);
    assert_eq!(split_all(&out[0]), segs[..64].to_vec());
    assert_eq!(split_all(&out[1]), segs[64..].to_vec());

    // Over IPv6 a zero UDP checksum is invalid: such datagrams are written as they
    // are, for the kernel to drop, not rewritten into a super-packet.
    let mut zero: Vec<Vec<u8>> = udp_segments(true, 3000, 1000);
    for d in &mut zero {
        d[46..48].copy_from_slice(&[0, 0]);
    }
    let refs: Vec<&[u8]> = zero.iter().map(Vec::as_slice).collect();
    let mut out = Vec::new();
    coalesce(&refs, &mut Vec::new(), true, |b, _| out.push(joined(b)));
    assert_eq!(out.len(), 3);

    // Another port in between, a larger datagram after a smaller one (only the last of
    // a run may be short), and a TCP segment: none of them joins the run before it.
    let segs = udp_segments(false, 4000, 1380);
    let mut other = segs[1].clone();
    other[22] ^= 1; // destination port
    let big = udp_segments(false, 2000, 1500);
    let tcp = segments(false, 1360, ACK);
    let refs: Vec<&[u8]> = vec![&segs[0], &other, &segs[2], &big[0], &segs[1], &tcp[0]];
    let mut out = Vec::new();
    coalesce(&refs, &mut Vec::new(), true, |b, _| out.push(joined(b)));
    assert_eq!(out.len(), 5);
    assert_eq!(split_all(&out[3]), vec![big[0].clone(), segs[1].clone()]);
    for (o, s) in [(0, 0), (1, 1), (2, 2), (4, 5)] {
        assert_eq!(&out[o][..VNET_HDR_LEN], &[0u8; VNET_HDR_LEN]);
        assert_eq!(&out[o][VNET_HDR_LEN..], refs[s]);
    }
}
