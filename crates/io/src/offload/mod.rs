//! TUN offloads (`IFF_VNET_HDR`): every packet read from or written to the TUN carries a
//! `virtio_net_hdr` in front.
//!
//! - Reads ([`split`]): with TSO and USO enabled the kernel hands us TCP and UDP
//!   super-packets of up to 64 KiB with a partial checksum; they are cut into
//!   MTU-sized segments with correct IP and TCP/UDP headers and full checksums.
//!   Packets that only need their checksum completed (`NEEDS_CSUM`) get it there too.
//! - Writes ([`coalesce`]): runs of consecutive segments of one TCP or UDP flow become a
//!   single GSO super-packet, as the kernel's own GRO would have built it.

mod coalesce;
mod split;

pub use coalesce::coalesce;
pub use split::{split, SplitError};

/// Size of `struct virtio_net_hdr` as the TUN uses it by default.
pub const VNET_HDR_LEN: usize = 10;

const F_NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_UDP_L4`: UDP segmentation (USO), either family.
const GSO_UDP_L4: u8 = 5;
const GSO_ECN: u8 = 0x80;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
/// Offset of the checksum field in a TCP and in a UDP header.
const TCP_CSUM_OFFSET: usize = 16;
const UDP_CSUM_OFFSET: usize = 6;
/// TCP flags that coalescing looks at.
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

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

fn ipv4_header_checksum(ip: &mut [u8], ihl: usize) {
    ip[10..12].copy_from_slice(&[0, 0]);
    let c = finish(sum(&ip[..ihl], 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Sets the length field of the IP header at the start of `h` (`ip_hlen` bytes; and the
/// IPv4 header checksum) for a packet of `total` bytes.
fn set_ip_length(h: &mut [u8], ip_hlen: usize, total: usize) {
    if h[0] >> 4 == 4 {
        h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ipv4_header_checksum(h, ip_hlen);
    } else {
        h[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
    }
}

#[cfg(test)]
mod tests;
