//! Stage RX-1, udp recv. Input: one UDP socket. Output: a vector of datagrams with
//! their sources, in arrival order (recvmmsg). With UDP GRO the kernel may hand over
//! several datagrams of one flow in one buffer; they are split apart here, so later
//! stages always see single datagrams. Each keeps the kernel's arrival time (where its
//! sojourn starts) and its outer ECN field.

use crate::packet::{Packet, MAX_BATCH};
use crate::ports::UdpPort;
use std::io;
use wirelane_io::udp::RecvBatch;

/// Receive buffers of one reader thread, allocated once.
pub struct RecvScratch {
    batch: RecvBatch,
    /// The last receive used every buffer, so more may be queued already.
    filled: bool,
}

impl RecvScratch {
    pub fn new(gro: bool) -> RecvScratch {
        // A coalesced buffer can be as large as a UDP datagram; a single one as large as
        // a full-MTU transport message (larger ones are truncated and then fail
        // authentication, which is the right outcome for them).
        let size = if gro { 65536 } else { 9216 };
        let count = if gro { MAX_BATCH / 4 } else { MAX_BATCH };
        RecvScratch {
            batch: RecvBatch::new(count, size),
            filled: false,
        }
    }

    /// Whether the last receive used every buffer: the socket may hold more, and the
    /// reader can receive again without first polling for it.
    pub fn filled(&self) -> bool {
        self.filled
    }
}

/// Receives what is queued on `sock`, up to one batch of buffers, without blocking.
pub fn recv_batch(sock: &dyn UdpPort, s: &mut RecvScratch) -> io::Result<Vec<Packet>> {
    s.filled = false;
    let mut out = Vec::new();
    let n = match sock.recv_each(&mut s.batch, &mut |r| {
        let step = if r.segment > 0 {
            r.segment
        } else {
            r.data.len().max(1)
        };
        out.extend(r.data.chunks(step).map(|d| {
            let mut p = Packet::from_datagram(d, r.src, r.local);
            p.rx_time_ns = r.rx_time_ns;
            p.outer_ecn = r.ecn;
            p
        }));
    }) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e),
    };
    s.filled = n == s.batch.capacity();
    Ok(out)
}
