//! GSO split (TUN reads with a virtio-net header) and GRO-style coalescing (TUN writes).
//!
//! Split: the first 10 bytes are the vnet header, the rest the packet; every segment
//! must fit the header's promise. Coalesce: the input is cut into segments; whatever it
//! emits must split back into segments carrying the same bytes in order, with UDP
//! coalescing on or off (the mode byte's second bit).
#![no_main]

use libfuzzer_sys::fuzz_target;
use wirelane_io::offload::{coalesce, split, VnetHdr, VNET_HDR_LEN};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let Some(hdr) = VnetHdr::parse(data) else {
            return;
        };
        let mut pkt = data[VNET_HDR_LEN..].to_vec();
        let limit = pkt.len().max(hdr.hdr_len as usize + hdr.gso_size as usize);
        let _ = split(&hdr, &mut pkt, |h, d| assert!(h.len() + d.len() <= limit));
    } else {
        // Segments: a 2-byte length, then that many bytes.
        let mut segs = Vec::new();
        let mut rest = data;
        while rest.len() >= 2 && segs.len() < 64 {
            let n = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
            segs.push(&rest[2..2 + n]);
            rest = &rest[2 + n..];
        }
        let mut scratch = Vec::new();
        let mut out_bytes = 0usize;
        coalesce(&segs, &mut scratch, mode & 2 != 0, |pieces, _| {
            let pkt: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
            let hdr = VnetHdr::parse(&pkt).expect("coalesce emits a vnet header");
            let mut body = pkt[VNET_HDR_LEN..].to_vec();
            // What we hand the kernel must be something our own reader accepts.
            split(&hdr, &mut body, |h, d| out_bytes += h.len() + d.len()).expect("coalesced output splits");
        });
        let in_bytes: usize = segs.iter().map(|s| s.len()).sum();
        assert_eq!(
            out_bytes, in_bytes,
            "coalesce changed the bytes on the wire"
        );
    }
});
