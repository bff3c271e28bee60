//! Coalescing what we write to the TUN: runs of consecutive segments of one TCP or UDP
//! flow become one GSO super-packet, which the kernel takes as if its own GRO had built
//! it, so the stack above sees one packet (TCP) or one skb to segment (UDP) instead of
//! dozens of writes.

use super::*;
use std::io::IoSlice;

/// Most datagrams in one UDP super-packet: the kernel's own UDP GRO stops at 64
/// (`UDP_GRO_CNT_MAX`), so a receiver never sees a larger one from us either.
const UDP_MAX_SEGMENTS: usize = 64;

/// What coalescing needs from an IP header and the TCP or UDP header after it.
#[derive(Debug, Clone, Copy)]
struct Seg {
    v6: bool,
    ip_hlen: usize,
    proto: u8,
    /// Transport header length: the TCP data offset, or 8 for UDP.
    l4_hlen: usize,
    payload: usize,
    /// TCP only (0 for UDP).
    seq: u32,
    flags: u8,
}

fn parse_seg(p: &[u8]) -> Option<Seg> {
    let (v6, ip_hlen, proto) = match p.first()? >> 4 {
        // IPv4 without options, not a fragment.
        4 if p.len() >= 28
            && p[0] & 0x0f == 5
            && u16::from_be_bytes([p[6], p[7]]) & 0x3fff == 0 =>
        {
            (false, 20, p[9])
        }
        // IPv6 with the transport header directly after the fixed header.
        6 if p.len() >= 48 => (true, 40, p[6]),
        _ => return None,
    };
    let t = &p[ip_hlen..];
    match proto {
        PROTO_TCP if t.len() >= 20 => {
            let l4_hlen = ((t[12] >> 4) as usize) * 4;
            if l4_hlen < 20 || l4_hlen > t.len() {
                return None;
            }
            Some(Seg {
                v6,
                ip_hlen,
                proto,
                l4_hlen,
                payload: t.len() - l4_hlen,
                seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
                flags: t[13],
            })
        }
        // The UDP length must describe exactly what the IP header carries; over IPv6 a
        // zero checksum is invalid, and the kernel, not a rewritten header, drops it.
        PROTO_UDP
            if u16::from_be_bytes([t[4], t[5]]) as usize == t.len()
                && !(v6 && t[6..8] == [0, 0]) =>
        {
            Some(Seg {
                v6,
                ip_hlen,
                proto,
                l4_hlen: 8,
                payload: t.len() - 8,
                seq: 0,
                flags: 0,
            })
        }
        _ => None,
    }
}

/// Whether `b` belongs to the same flow as `a` with identical headers apart from the
/// fields that differ between segments (lengths, IDs, checksums; for TCP the sequence
/// and PSH).
fn same_headers(a: &[u8], sa: &Seg, b: &[u8], sb: &Seg) -> bool {
    if sa.v6 != sb.v6 || sa.proto != sb.proto || sa.l4_hlen != sb.l4_hlen {
        return false;
    }
    let ip_same = if sa.v6 {
        a[..4] == b[..4] && a[6..40] == b[6..40] // class, flow, next header, hop limit, addresses
    } else {
        a[1] == b[1] && a[6] & 0x40 == b[6] & 0x40 && a[8..10] == b[8..10] && a[12..20] == b[12..20]
    };
    let (ta, tb) = (&a[sa.ip_hlen..], &b[sb.ip_hlen..]);
    if !(ip_same && ta[..4] == tb[..4]) {
        return false; // another flow (addresses or ports)
    }
    sa.proto == PROTO_UDP
        || (ta[8..12] == tb[8..12] // acknowledgement number
            && ta[14..16] == tb[14..16] // window
            && ta[20..sa.l4_hlen] == tb[20..sb.l4_hlen] // options
            && sb.flags & !PSH == ACK)
}

/// Writes `segs` (complete IP packets, in order) to `emit` with a vnet header in
/// front, merging runs of consecutive TCP segments of one flow, and with `udp` runs of
/// one UDP flow's datagrams (only where the TUN accepted USO, which kernels before 6.2
/// lack), into single GSO super-packets. Anything else goes out one by one with an
/// empty header. Each packet is emitted as pieces to be written end to end (one
/// `writev`): `scratch` (reused between calls) holds the vnet header and the rebuilt
/// IP and transport header, the payloads are slices of `segs`, never copied. With the
/// pieces, `emit` gets the packets they carry, to write one by one should the kernel
/// refuse the super-packet.
///
/// Checksums are not verified: the super-packet's is left to the kernel
/// (`NEEDS_CSUM`), and the payloads were authenticated end to end by the tunnel. So a
/// segment whose sender wrote a wrong TCP or UDP checksum is delivered with a right
/// one, where the kernel's own GRO would have dropped it; that costs nobody but the
/// authenticated peer that sent it.
pub fn coalesce<'a>(
    segs: &[&'a [u8]],
    scratch: &mut Vec<u8>,
    udp: bool,
    mut emit: impl FnMut(&[IoSlice<'_>], &[&'a [u8]]),
) {
    let mut i = 0;
    while i < segs.len() {
        let first = segs[i];
        let mut j = i + 1;
        let head = parse_seg(first).filter(|f| {
            f.payload > 0
                && match f.proto {
                    PROTO_TCP => f.flags == ACK,
                    _ => udp,
                }
        });
        if let Some(f) = head {
            let tcp = f.proto == PROTO_TCP;
            let (mut total, mut next_seq) = (first.len(), f.seq.wrapping_add(f.payload as u32));
            while j < segs.len() && (tcp || j - i < UDP_MAX_SEGMENTS) {
                let Some(n) = parse_seg(segs[j]) else { break };
                let fits = total + n.payload <= 65535;
                if !(fits
                    && (!tcp || n.seq == next_seq)
                    && n.payload > 0
                    && n.payload <= f.payload
                    && same_headers(first, &f, segs[j], &n))
                {
                    break;
                }
                total += n.payload;
                next_seq = next_seq.wrapping_add(n.payload as u32);
                j += 1;
                // A short or pushed segment ends a super-packet, as in the kernel's GRO
                // (for UDP a short datagram can only be the last of a GSO run).
                if n.payload < f.payload || n.flags & PSH != 0 {
                    break;
                }
            }
            if j - i > 1 {
                build_super(&segs[i..j], &f, total, scratch);
                let hlen = f.ip_hlen + f.l4_hlen;
                let mut pieces = Vec::with_capacity(j - i + 1);
                pieces.push(IoSlice::new(scratch));
                pieces.extend(segs[i..j].iter().map(|s| IoSlice::new(&s[hlen..])));
                emit(&pieces, &segs[i..j]);
                i = j;
                continue;
            }
        }
        emit(
            &[IoSlice::new(&[0u8; VNET_HDR_LEN]), IoSlice::new(first)],
            &segs[i..=i],
        );
        i += 1;
    }
}

/// The vnet header and the rebuilt IP and transport header of a super-packet carrying
/// `run`, `total` bytes long, into `out`.
fn build_super(run: &[&[u8]], f: &Seg, total: usize, out: &mut Vec<u8>) {
    let hlen = f.ip_hlen + f.l4_hlen;
    let tcp = f.proto == PROTO_TCP;
    let (gso_type, csum_offset) = match (tcp, f.v6) {
        (true, false) => (GSO_TCPV4, TCP_CSUM_OFFSET),
        (true, true) => (GSO_TCPV6, TCP_CSUM_OFFSET),
        (false, _) => (GSO_UDP_L4, UDP_CSUM_OFFSET),
    };
    out.clear();
    out.push(F_NEEDS_CSUM);
    out.push(gso_type);
    for v in [hlen, f.payload, f.ip_hlen, csum_offset] {
        out.extend_from_slice(&(v as u16).to_le_bytes());
    }
    out.extend_from_slice(&run[0][..hlen]);
    let p = &mut out[VNET_HDR_LEN..];
    set_ip_length(p, f.ip_hlen, total);
    let l4_len = total - f.ip_hlen;
    if tcp {
        let last_flags = run[run.len() - 1][f.ip_hlen + 13];
        p[f.ip_hlen + 13] |= last_flags & PSH;
    } else {
        p[f.ip_hlen + 4..f.ip_hlen + 6].copy_from_slice(&(l4_len as u16).to_be_bytes());
    }
    // The checksum field holds the pseudo-header sum, as for CHECKSUM_PARTIAL; the
    // kernel's segmentation adjusts it for each segment's length.
    let pseudo = !finish(pseudo_sum(p, f.proto, l4_len));
    let field = f.ip_hlen + csum_offset;
    p[field..field + 2].copy_from_slice(&pseudo.to_be_bytes());
}
