//! Stage RX-1, udp recv. Input: one UDP socket. Output: a vector of datagrams with
//! their sources, in arrival order (recvmmsg). With UDP GRO the kernel may hand over
//! several datagrams of one flow in one buffer; they are split apart here, so later
//! stages always see single datagrams. Each keeps the kernel's arrival time (where its
//! sojourn starts), its outer ECN field, and whether more datagrams waited behind it.
//! After each receive from a data socket, the oldest datagram's wait is weighed for the
//! socket's buffer size (`follow_buffer`, `socket_buffer`).

use crate::interface::Interface;
use crate::packet::{Packet, MAX_BATCH};
use crate::ports::UdpPort;
use crate::socket_buffer::{BufferParams, SocketBuffer};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use wirelane_io::udp::{RecvBatch, SOCKET_BUFFER};

/// Receive buffers of one reader thread, allocated once.
pub struct RecvScratch {
    batch: RecvBatch,
    /// The kernel's buffers the last receive took (with GRO, each of many datagrams).
    received: usize,
    /// Of those, the ones that held less than the kernel had (see `Received::truncated`).
    truncated: usize,
    /// The packets of the last receive. Kept, emptied, from one receive to the next:
    /// allocated afresh it was a large allocation (hundreds of packets with GRO) and
    /// several regrowths per receive.
    packets: Vec<Packet>,
}

/// Buffers one receive fills with GRO on: each holds a run of up to 64 KiB that the
/// kernel coalesced, so a quarter of [`MAX_BATCH`] already carries hundreds of packets.
pub const GRO_RECV_BUFFERS: usize = MAX_BATCH / 4;

impl RecvScratch {
    pub fn new(gro: bool) -> RecvScratch {
        // A coalesced buffer can be as large as a UDP datagram; a single one as large as
        // a full-MTU transport message (larger ones are truncated and then fail
        // authentication, which is the right outcome for them).
        let size = if gro { 65536 } else { 9216 };
        let count = if gro { GRO_RECV_BUFFERS } else { MAX_BATCH };
        RecvScratch {
            batch: RecvBatch::new(count, size),
            received: 0,
            truncated: 0,
            packets: Vec::new(),
        }
    }

    /// Whether the last receive used every buffer: the socket may hold more, and the
    /// reader can receive again without first polling for it.
    pub fn filled(&self) -> bool {
        self.received == self.batch.capacity()
    }

    /// How many of the kernel's buffers the last receive took.
    pub fn received(&self) -> usize {
        self.received
    }

    /// How many of them the kernel cut short, losing datagrams.
    pub fn truncated(&self) -> usize {
        self.truncated
    }
}

/// Receives what is queued on `sock`, up to one batch of buffers, without blocking.
pub fn recv_batch<'s>(
    sock: &dyn UdpPort,
    s: &'s mut RecvScratch,
) -> io::Result<&'s mut Vec<Packet>> {
    s.received = 0;
    s.truncated = 0;
    let out = &mut s.packets;
    let truncated = &mut s.truncated;
    // What the last receive's consumer left (it drains them all).
    out.clear();
    let n = match sock.recv_each(&mut s.batch, &mut |r| {
        *truncated += usize::from(r.truncated);
        out.extend(r.datagrams().map(|d| {
            let mut p = Packet::from_datagram(d, r.src, r.local);
            p.arrival_ns = r.rx_time_ns;
            p.outer_ecn = r.ecn;
            p
        }));
    }) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e),
    };
    s.received = n;
    let filled = s.filled();
    let out = &mut s.packets;
    if let Some((last, before)) = out.split_last_mut() {
        before.iter_mut().for_each(|p| p.queued_behind = true);
        last.queued_behind = filled;
    }
    Ok(out)
}

/// The smallest receive buffer a data socket is shrunk to: a few reads' worth.
const BUFFER_FLOOR: usize = 256 << 10;

/// A controller for a data socket of `iface`, with the receive CoDel's target and
/// interval: the buffer's standing queue is one part of the sojourn that CoDel sees.
pub fn buffer_control(iface: &Interface) -> SocketBuffer {
    SocketBuffer::new(BufferParams {
        target: iface.codel.target,
        interval: iface.codel.interval,
        floor: BUFFER_FLOOR,
        ceiling: SOCKET_BUFFER,
    })
}

/// Weighs one receive of `buffers` of the kernel's buffers from `sock`, whose oldest
/// datagram the kernel stamped `oldest`, and resizes the socket's buffer when its
/// controller decides at an interval's end. Only `sock`'s reader calls this, so the
/// lock is never contended.
pub fn follow_buffer(
    iface: &Interface,
    sock: &dyn UdpPort,
    ctl: &Mutex<SocketBuffer>,
    oldest: u64,
    buffers: usize,
) {
    let now = iface.wall().as_nanos() as u64;
    let mut ctl = ctl.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if !ctl.observe(now, oldest, buffers) {
        return;
    }
    let drops = match sock.drops() {
        Ok(d) => d,
        Err(e) => return tracing::debug!(error = %e, "reading a socket's drop count failed"),
    };
    let Some(size) = ctl.decide(now, drops) else {
        return;
    };
    if let Err(e) = sock.set_receive_buffer(size) {
        return tracing::debug!(error = %e, size, "resizing a socket's receive buffer failed");
    }
    let s = &iface.stats;
    let counter = if size < SOCKET_BUFFER {
        &s.rx_buffer_shrunk
    } else {
        &s.rx_buffer_restored
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{MemoryNet, SOCKET_DATAGRAMS};
    use crate::ports::UdpPort;
    use std::sync::Arc;
    use std::time::Duration;
    use wirelane_io::udp::{Outgoing, NOT_ECT};

    /// A data socket flooded past its buffer is shrunk once an interval shows the loss
    /// and a standing wait, and given its size back after an interval without loss.
    /// (The in-memory socket drops past a fixed count and ignores the size; the kernel
    /// side of a resize is `io::udp`'s test.)
    #[test]
    fn a_flooded_socket_is_shrunk_and_given_its_size_back_when_the_flood_ends() {
        let net = Arc::new(MemoryNet::default());
        let a = net.socket("10.0.0.1:1".parse().unwrap(), None).unwrap();
        let b = net.socket("10.0.0.2:2".parse().unwrap(), None).unwrap();
        let iface = Interface::for_tests();
        let ctl = Mutex::new(buffer_control(&iface));
        let dgram = [4u8; 32];
        let flood: Vec<_> = (0..SOCKET_DATAGRAMS + 500)
            .map(|_| Outgoing {
                payload: &dgram,
                dst: b.addr(),
                src: None,
                ecn: NOT_ECT,
            })
            .collect();
        a.send_each(&flood, &mut vec![false; flood.len()]).unwrap();
        assert_eq!(b.drops().unwrap(), 500);
        // Reads whose oldest datagram waited `ms`, one interval apart (a slower
        // machine only makes the interval longer).
        let read = |ms: u64| {
            let oldest = iface.wall().as_nanos() as u64 - ms * 1_000_000;
            follow_buffer(&iface, &*b, &ctl, oldest, 10);
        };
        let total = |shrunk: bool| {
            iface.stats.total(|c| {
                if shrunk {
                    &c.rx_buffer_shrunk
                } else {
                    &c.rx_buffer_restored
                }
            })
        };
        read(14);
        std::thread::sleep(Duration::from_millis(110));
        read(14);
        assert_eq!((total(true), total(false)), (1, 0));
        assert!(ctl.lock().unwrap().size() < SOCKET_BUFFER);
        std::thread::sleep(Duration::from_millis(110));
        read(1);
        assert_eq!((total(true), total(false)), (1, 1));
        assert_eq!(ctl.lock().unwrap().size(), SOCKET_BUFFER);
    }

    #[test]
    fn each_packet_knows_whether_others_waited_behind_it() {
        let net = Arc::new(MemoryNet::default());
        let a = net.socket("10.0.0.1:1".parse().unwrap(), None).unwrap();
        let b = net.socket("10.0.0.2:2".parse().unwrap(), None).unwrap();
        let dgrams: Vec<Vec<u8>> = (0..MAX_BATCH + 3).map(|i| vec![i as u8; 32]).collect();
        let msgs: Vec<_> = dgrams
            .iter()
            .map(|d| Outgoing {
                payload: d,
                dst: b.addr(),
                src: None,
                ecn: NOT_ECT,
            })
            .collect();
        a.send_each(&msgs, &mut vec![false; msgs.len()]).unwrap();

        let mut scratch = RecvScratch::new(false);
        let behind = |packets: &mut Vec<Packet>| -> Vec<bool> {
            packets.drain(..).map(|p| p.queued_behind).collect()
        };
        // A receive that used every buffer: the socket may hold more behind each one.
        let first = behind(recv_batch(&*b, &mut scratch).unwrap());
        assert!(scratch.filled());
        assert_eq!(first, vec![true; MAX_BATCH]);
        // The rest: the last one read left the socket empty.
        let rest = behind(recv_batch(&*b, &mut scratch).unwrap());
        assert!(!scratch.filled());
        assert_eq!(rest, [true, true, false]);
    }
}
