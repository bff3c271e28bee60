//! Splitting what the TUN hands us: TCP (TSO) and UDP (USO) super-packets become
//! MTU-sized segments, each with its own IP and transport header and a full checksum.

use super::*;

/// Why a packet from the TUN could not be turned into segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitError {
    Malformed,
    Unsupported(u8),
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
    if c == 0 && offset == UDP_CSUM_OFFSET {
        c = 0xffff;
    }
    pkt[field..field + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Most segments one super-packet may split into. The kernel's own never come near:
/// USO sends at most 128, and TSO at TCP's smallest MSS (48 bytes) about 1,370 from
/// 64 KiB. A crafted one (a raw socket's virtio header with a `gso_size` of 1) would
/// take 65,000 packet buffers, 128 MiB, from one read.
pub const MAX_SPLIT_SEGMENTS: usize = 2048;

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
    let v4 = match gso {
        GSO_NONE => {
            if hdr.flags & F_NEEDS_CSUM != 0 {
                complete_checksum(pkt, hdr.csum_start as usize, hdr.csum_offset as usize)?;
            }
            emit(pkt, &[]);
            return Ok(());
        }
        GSO_TCPV4 => true,
        GSO_TCPV6 => false,
        // USO does not name the family; the packet's version does.
        GSO_UDP_L4 => pkt.first().is_some_and(|b| b >> 4 == 4),
        other => return Err(SplitError::Unsupported(other)),
    };
    let l4 = hdr.csum_start as usize;
    let proto = if gso == GSO_UDP_L4 {
        PROTO_UDP
    } else {
        PROTO_TCP
    };
    if pkt.len() < l4 + 8
        || (v4 && (l4 < 20 || pkt[0] >> 4 != 4))
        || (!v4 && (l4 < 40 || pkt[0] >> 4 != 6))
        || hdr.gso_size == 0
        || (pkt.len() - l4).div_ceil(hdr.gso_size as usize) > MAX_SPLIT_SEGMENTS
        || !headers_agree(pkt, v4, l4, proto)
    {
        return Err(SplitError::Malformed);
    }
    if gso == GSO_UDP_L4 {
        split_udp(l4, hdr.gso_size as usize, pkt, emit);
        Ok(())
    } else {
        split_tcp(l4, hdr.gso_size as usize, pkt, emit)
    }
}

/// Whether the IP header of a super-packet (at least `l4` bytes, checked) agrees with
/// the vnet header and with what was read: the transport starts at `l4` and is `proto`
/// (IPv6 extension headers are let through unchecked), and the IP length is the
/// packet's. The length check is what catches a read the buffer truncated: splitting
/// that would send a short last segment with a freshly computed, valid checksum.
fn headers_agree(pkt: &[u8], v4: bool, l4: usize, proto: u8) -> bool {
    if v4 {
        l4 == ((pkt[0] & 0x0f) as usize) * 4
            && pkt[9] == proto
            && u16::from_be_bytes([pkt[2], pkt[3]]) as usize == pkt.len()
    } else {
        (l4 > 40 || pkt[6] == proto)
            && u16::from_be_bytes([pkt[4], pkt[5]]) as usize + 40 == pkt.len()
    }
}

/// `payload` cut into `size`-byte segments, the last possibly shorter, each with its
/// index, its offset and whether it is the last. An empty payload is one empty segment,
/// so a super-packet never vanishes. `size` is not 0 (checked by `split`).
fn segments(payload: &[u8], size: usize) -> impl Iterator<Item = (usize, usize, &[u8], bool)> {
    let n = payload.len().div_ceil(size).max(1);
    (0..n).map(move |i| {
        let off = i * size;
        let data = &payload[off..off + size.min(payload.len() - off)];
        (i, off, data, i + 1 == n)
    })
}

/// The IP header of `head` (`l4` bytes) readied for segment `i` of `total` bytes.
fn segment_ip_header(h: &mut [u8], l4: usize, id0: u16, i: usize, total: usize) {
    if h[0] >> 4 == 4 {
        // Each segment gets its own IPv4 ID, as the kernel's segmentation gives it.
        h[4..6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
    }
    set_ip_length(h, l4, total);
}

fn split_tcp(
    l4: usize,
    mss: usize,
    pkt: &[u8],
    mut emit: impl FnMut(&[u8], &[u8]),
) -> Result<(), SplitError> {
    if pkt.len() < l4 + 20 {
        return Err(SplitError::Malformed);
    }
    let tcp_len = ((pkt[l4 + 12] >> 4) as usize) * 4;
    let hlen = l4 + tcp_len;
    if tcp_len < 20 || hlen > pkt.len() {
        return Err(SplitError::Malformed);
    }
    let (head, payload) = pkt.split_at(hlen);
    let seq0 = u32::from_be_bytes([head[l4 + 4], head[l4 + 5], head[l4 + 6], head[l4 + 7]]);
    let id0 = u16::from_be_bytes([head[4], head[5]]);
    let flags0 = head[l4 + 13];
    let mut h = head.to_vec();
    for (i, off, data, last) in segments(payload, mss) {
        let total = hlen + data.len();
        segment_ip_header(&mut h, l4, id0, i, total);
        h[l4 + 4..l4 + 8].copy_from_slice(&seq0.wrapping_add(off as u32).to_be_bytes());
        // FIN and PSH belong to the last segment only, CWR to the first only.
        let mut flags = flags0;
        if !last {
            flags &= !(0x01 | 0x08);
        }
        if i > 0 {
            flags &= !0x80;
        }
        h[l4 + 13] = flags;
        h[l4 + 16..l4 + 18].copy_from_slice(&[0, 0]);
        // The TCP header is a whole number of 32-bit words, so the payload's sum
        // continues the header's without realignment.
        let acc = sum(&h[l4..], pseudo_sum(&h, PROTO_TCP, total - l4));
        let c = finish(sum(data, acc));
        h[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        emit(&h, data);
    }
    Ok(())
}

/// A UDP super-packet (an application's `UDP_SEGMENT` send) becomes one datagram per
/// `size` bytes of payload, each with its own UDP length and checksum; the caller has
/// checked that the 8-byte UDP header is there.
fn split_udp(l4: usize, size: usize, pkt: &[u8], mut emit: impl FnMut(&[u8], &[u8])) {
    let hlen = l4 + 8;
    let (head, payload) = pkt.split_at(hlen);
    let id0 = u16::from_be_bytes([head[4], head[5]]);
    let mut h = head.to_vec();
    for (i, _, data, _) in segments(payload, size) {
        let total = hlen + data.len();
        segment_ip_header(&mut h, l4, id0, i, total);
        let udp_len = (8 + data.len()) as u16;
        h[l4 + 4..l4 + 6].copy_from_slice(&udp_len.to_be_bytes());
        h[l4 + 6..l4 + 8].copy_from_slice(&[0, 0]);
        // The 8-byte header keeps the payload's sum aligned, as for TCP.
        let acc = sum(&h[l4..], pseudo_sum(&h, PROTO_UDP, udp_len as usize));
        let c = match finish(sum(data, acc)) {
            0 => 0xffff,
            c => c,
        };
        h[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
        emit(&h, data);
    }
}
