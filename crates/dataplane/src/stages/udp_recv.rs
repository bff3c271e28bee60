//! Stage RX-1, udp recv. Input: one UDP socket. Output: a vector of datagrams with
//! their sources, in arrival order (recvmmsg).

use crate::device::Device;
use crate::packet::{Packet, HEADROOM, MAX_BATCH, TAILROOM};
use std::io;
use wirelane_io::udp::UdpSocket;

/// Receives what is queued on `sock`, up to one batch, without blocking.
pub fn recv_batch(dev: &Device, sock: &UdpSocket) -> io::Result<Vec<Packet>> {
    // Big enough for a full-MTU transport message; larger datagrams are truncated by the
    // kernel and then fail authentication, which is the right outcome for them.
    let size = dev.mtu().max(1280) + HEADROOM + TAILROOM;
    let mut bufs: Vec<Vec<u8>> = (0..MAX_BATCH).map(|_| vec![0u8; size]).collect();
    let mut lens = [0usize; MAX_BATCH];
    let mut srcs = [None; MAX_BATCH];
    let n = match sock.recv_batch(&mut bufs, &mut lens, &mut srcs) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e),
    };
    Ok(bufs
        .into_iter()
        .zip(lens)
        .zip(srcs)
        .take(n)
        .map(|((buf, len), src)| Packet {
            buf,
            len,
            counter: 0,
            src,
            ok: false,
        })
        .collect())
}
