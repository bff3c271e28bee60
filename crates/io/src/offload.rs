//! TUN offloads (`IFF_VNET_HDR`): every packet read from or written to the TUN carries a
//! `virtio_net_hdr` in front. With TSO enabled the kernel hands us TCP super-packets of
//! up to 64 KiB with a partial checksum; [`split`] cuts them into MTU-sized segments
//! with correct IP and TCP headers and full checksums. Packets that only need their
//! checksum completed (`NEEDS_CSUM`) get it here too.

use std::io::IoSlice;

/// Size of `struct virtio_net_hdr` as the TUN uses it by default.
pub const VNET_HDR_LEN: usize = 10;

const F_NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;
const GSO_ECN: u8 = 0x80;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn parse(b: &[u8]) -> Option<VnetHdr> {
        if b.len() < VNET_HDR_LEN {
            return None;
        }
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }
}

/// Why a packet from the TUN could not be turned into segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitError {
    Malformed,
    Unsupported(u8),
}

/// Ones-complement sum of `data` added to `acc` (not folded).
pub fn sum(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        acc += u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as u64;
    }
    let rest = chunks.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    acc + u32::from_be_bytes(tail) as u64
}

/// Folds a sum to 16 bits and inverts it: the value that goes into a checksum field.
pub fn finish(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// Sum of the TCP/UDP pseudo-header for `ip` (the packet's IP header) and a transport
/// length of `len` with protocol `proto`.
fn pseudo_sum(ip: &[u8], proto: u8, len: usize) -> u64 {
    let addrs = if ip[0] >> 4 == 4 {
        &ip[12..20]
    } else {
        &ip[8..40]
    };
    sum(addrs, 0) + proto as u64 + len as u64
}

/// Completes a partial checksum in place: the field at `start + offset` holds the
/// pseudo-header sum; the checksum covers everything from `start` to the end.
fn complete_checksum(pkt: &mut [u8], start: usize, offset: usize) -> Result<(), SplitError> {
    let field = start + offset;
    if field + 2 > pkt.len() {
        return Err(SplitError::Malformed);
    }
    let mut c = finish(sum(&pkt[start..], 0));
    // UDP transmits an all-zero result as 0xffff (zero means "no checksum").
    if c == 0 && offset == 6 {
        c = 0xffff;
    }
    pkt[field..field + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

fn ipv4_header_checksum(ip: &mut [u8], ihl: usize) {
    ip[10..12].copy_from_slice(&[0, 0]);
    let c = finish(sum(&ip[..ihl], 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Turns one packet read from the TUN (vnet header stripped into `hdr`) into one or
/// more ready-to-send IP packets, handed to `emit` in order as a header and a payload
/// (to be laid end to end). The payload is a slice of `pkt`, so the caller copies each
/// byte once, straight into the buffer it will encrypt in.
pub fn split(
    hdr: &VnetHdr,
    pkt: &mut [u8],
    mut emit: impl FnMut(&[u8], &[u8]),
) -> Result<(), SplitError> {
    let gso = hdr.gso_type & !GSO_ECN;
    if gso == GSO_NONE {
        if hdr.flags & F_NEEDS_CSUM != 0 {
            complete_checksum(pkt, hdr.csum_start as usize, hdr.csum_offset as usize)?;
        }
        emit(pkt, &[]);
        return Ok(());
    }
    if gso != GSO_TCPV4 && gso != GSO_TCPV6 {
        return Err(SplitError::Unsupported(gso));
    }
    let v4 = gso == GSO_TCPV4;
    let l4 = hdr.csum_start as usize;
    if pkt.len() < l4 + 20
        || (v4 && (l4 < 20 || pkt[0] >> 4 != 4))
        || (!v4 && (l4 < 40 || pkt[0] >> 4 != 6))
    {
        return Err(SplitError::Malformed);
    }
    let tcp_len = ((pkt[l4 + 12] >> 4) as usize) * 4;
    let hlen = l4 + tcp_len;
    let mss = hdr.gso_size as usize;
    if tcp_len < 20 || hlen > pkt.len() || mss == 0 {
        return Err(SplitError::Malformed);
    }
    let (head, payload) = pkt.split_at(hlen);
    let seq0 = u32::from_be_bytes([head[l4 + 4], head[l4 + 5], head[l4 + 6], head[l4 + 7]]);
    let id0 = u16::from_be_bytes([head[4], head[5]]);
    let flags0 = head[l4 + 13];
    let nseg = payload.len().div_ceil(mss).max(1);
    let mut h = head.to_vec();
    for i in 0..nseg {
        let off = i * mss;
        let data = &payload[off..off + mss.min(payload.len() - off)];
        let total = hlen + data.len();
        if v4 {
            h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            h[4..6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
            ipv4_header_checksum(&mut h, l4);
        } else {
            h[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
        }
        h[l4 + 4..l4 + 8].copy_from_slice(&seq0.wrapping_add(off as u32).to_be_bytes());
        // FIN and PSH belong to the last segment only, CWR to the first only.
        let mut flags = flags0;
        if i + 1 < nseg {
            flags &= !(0x01 | 0x08);
        }
        if i > 0 {
            flags &= !0x80;
        }
        h[l4 + 13] = flags;
        h[l4 + 16..l4 + 18].copy_from_slice(&[0, 0]);
        // The TCP header is a whole number of 32-bit words, so the payload's sum
        // continues the header's without realignment.
        let acc = sum(&h[l4..], pseudo_sum(&h, 6, total - l4));
        let c = finish(sum(data, acc));
        h[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        emit(&h, data);
    }
    Ok(())
}

/// What coalescing needs from an IP+TCP header.
#[derive(Debug, Clone, Copy)]
struct TcpSeg {
    v6: bool,
    ip_hlen: usize,
    tcp_hlen: usize,
    payload: usize,
    seq: u32,
    flags: u8,
}

const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

fn tcp_seg(p: &[u8]) -> Option<TcpSeg> {
    let (v6, ip_hlen) = match p.first()? >> 4 {
        // IPv4 without options, not a fragment, carrying TCP.
        4 if p.len() >= 40
            && p[0] & 0x0f == 5
            && p[9] == 6
            && u16::from_be_bytes([p[6], p[7]]) & 0x3fff == 0 =>
        {
            (false, 20)
        }
        // IPv6 with TCP directly after the fixed header.
        6 if p.len() >= 60 && p[6] == 6 => (true, 40),
        _ => return None,
    };
    let tcp_hlen = ((p[ip_hlen + 12] >> 4) as usize) * 4;
    if tcp_hlen < 20 || ip_hlen + tcp_hlen > p.len() {
        return None;
    }
    Some(TcpSeg {
        v6,
        ip_hlen,
        tcp_hlen,
        payload: p.len() - ip_hlen - tcp_hlen,
        seq: u32::from_be_bytes([
            p[ip_hlen + 4],
            p[ip_hlen + 5],
            p[ip_hlen + 6],
            p[ip_hlen + 7],
        ]),
        flags: p[ip_hlen + 13],
    })
}

/// Whether `b` belongs to the same flow as `a` with identical headers apart from the
/// fields that differ between segments (lengths, IDs, checksums, sequence, PSH).
fn same_headers(a: &[u8], sa: &TcpSeg, b: &[u8], sb: &TcpSeg) -> bool {
    if sa.v6 != sb.v6 || sa.tcp_hlen != sb.tcp_hlen {
        return false;
    }
    let ip_same = if sa.v6 {
        a[..4] == b[..4] && a[6..40] == b[6..40] // class, flow, next header, hop limit, addresses
    } else {
        a[1] == b[1] && a[6] & 0x40 == b[6] & 0x40 && a[8..10] == b[8..10] && a[12..20] == b[12..20]
    };
    let (ta, tb) = (&a[sa.ip_hlen..], &b[sb.ip_hlen..]);
    ip_same
        && ta[..4] == tb[..4] // ports
        && ta[8..12] == tb[8..12] // acknowledgement number
        && ta[14..16] == tb[14..16] // window
        && ta[20..sa.tcp_hlen] == tb[20..sb.tcp_hlen] // options
        && sb.flags & !PSH == ACK
}

/// Writes `segs` (complete IP packets, in order) to `emit` with a vnet header in
/// front, merging runs of consecutive TCP segments of one flow into a single GSO
/// super-packet the kernel accepts as if its own GRO had built it. Anything else goes
/// out one by one with an empty header. Each packet is emitted as pieces to be written
/// end to end (one `writev`): `scratch` (reused between calls) holds the vnet header and
/// the rebuilt IP/TCP header, the payloads are slices of `segs`, never copied.
pub fn coalesce(segs: &[&[u8]], scratch: &mut Vec<u8>, mut emit: impl FnMut(&[IoSlice<'_>])) {
    let mut i = 0;
    while i < segs.len() {
        let first = segs[i];
        let mut j = i + 1;
        let head = tcp_seg(first).filter(|f| f.payload > 0 && f.flags == ACK);
        if let Some(f) = head {
            let (mut total, mut next_seq) = (first.len(), f.seq.wrapping_add(f.payload as u32));
            while j < segs.len() {
                let Some(n) = tcp_seg(segs[j]) else { break };
                let fits = total + n.payload <= 65535;
                if !(fits
                    && n.seq == next_seq
                    && n.payload > 0
                    && n.payload <= f.payload
                    && same_headers(first, &f, segs[j], &n))
                {
                    break;
                }
                total += n.payload;
                next_seq = next_seq.wrapping_add(n.payload as u32);
                j += 1;
                // A short or pushed segment ends a super-packet, as in the kernel's GRO.
                if n.payload < f.payload || n.flags & PSH != 0 {
                    break;
                }
            }
            if j - i > 1 {
                build_super(&segs[i..j], &f, total, scratch);
                let mut pieces = Vec::with_capacity(j - i + 1);
                pieces.push(IoSlice::new(scratch));
                pieces.extend(
                    segs[i..j]
                        .iter()
                        .map(|s| IoSlice::new(&s[f.ip_hlen + f.tcp_hlen..])),
                );
                emit(&pieces);
                i = j;
                continue;
            }
        }
        emit(&[IoSlice::new(&[0u8; VNET_HDR_LEN]), IoSlice::new(first)]);
        i += 1;
    }
}

fn build_super(run: &[&[u8]], f: &TcpSeg, total: usize, out: &mut Vec<u8>) {
    let hlen = f.ip_hlen + f.tcp_hlen;
    out.clear();
    out.push(F_NEEDS_CSUM);
    out.push(if f.v6 { GSO_TCPV6 } else { GSO_TCPV4 });
    for v in [hlen, f.payload, f.ip_hlen, 16] {
        out.extend_from_slice(&(v as u16).to_le_bytes());
    }
    out.extend_from_slice(&run[0][..hlen]);
    let last_flags = run[run.len() - 1][f.ip_hlen + 13];
    let p = &mut out[VNET_HDR_LEN..];
    if f.v6 {
        p[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
    } else {
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ipv4_header_checksum(p, 20);
    }
    p[f.ip_hlen + 13] |= last_flags & PSH;
    // The checksum field holds the pseudo-header sum, as for CHECKSUM_PARTIAL.
    let pseudo = !finish(pseudo_sum(p, 6, total - f.ip_hlen));
    p[f.ip_hlen + 16..f.ip_hlen + 18].copy_from_slice(&pseudo.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let udp = VnetHdr { gso_type: 5, ..hdr };
        assert_eq!(
            split(&udp, &mut p, |_, _| {}),
            Err(SplitError::Unsupported(5))
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
            coalesce(&refs, &mut scratch, |b| out.push(joined(b)));
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
        coalesce(&refs, &mut Vec::new(), |b| out.push(joined(b)));
        assert_eq!(out.len(), 4);
        for (o, s) in out.iter().zip(&refs) {
            assert_eq!(&o[..VNET_HDR_LEN], &[0u8; VNET_HDR_LEN]);
            assert_eq!(&o[VNET_HDR_LEN..], *s);
        }
        // Two consecutive segments then a gap: two merge, the rest stands alone.
        let all = segments(true, 5440, ACK);
        let refs: Vec<&[u8]> = vec![&all[0], &all[1], &all[3]];
        let mut out = Vec::new();
        coalesce(&refs, &mut Vec::new(), |b| out.push(joined(b)));
        assert_eq!(out.len(), 2);
        assert_eq!(split_all(&out[0]), all[..2].to_vec());
    }
}
