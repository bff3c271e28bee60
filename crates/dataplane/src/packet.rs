//! Packet buffers and batches.
//!
//! A [`Packet`] reserves headroom for the 16-byte transport header and tailroom for the
//! padding and the 16-byte tag, so encryption and decryption happen in place without a
//! copy. Its buffer comes from the [`pool`] and returns there when the packet drops.
//! A [`Batch`] is a vector of one peer's packets under one keypair: the unit the
//! pipeline moves between stages, and the unit of per-peer ordering.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use wirelane_io::udp::LocalAddr;
use wirelane_proto::messages::TRANSPORT_HEADER_LEN;
use wirelane_proto::Keypair;

use crate::pool;
use crate::queue::Ordered;

/// Room before the payload: the transport header.
pub const HEADROOM: usize = TRANSPORT_HEADER_LEN;
/// Room after the payload: up to 15 bytes of padding plus the tag.
pub const TAILROOM: usize = 16 + 16;
/// Most packets a batch carries on transmit, and a non-coalescing read on receive;
/// bounds the work one item represents.
pub const MAX_BATCH: usize = 64;
/// Most packets a receive batch carries. A coalescing read holds up to 720 datagrams,
/// most often all from one peer; as one batch they went to one worker while the other
/// waited for the next read, and a read larger than the room in the queues could never
/// be admitted. Cut at this bound, one read gives every worker a share. At one peer
/// and 8 Gbit/s offered that took the loss from 8.9% to 0.2% and the p99 delay from
/// 24 to 12 ms; 64 was no better than 256 in delivery and cost up to 7% more CPU per
/// byte (BENCHMARKS.md, "Receive batches cut at 256 packets").
pub const RX_BATCH_MAX: usize = 4 * MAX_BATCH;

/// One packet in a buffer of its own. Plaintext lives at `buf[HEADROOM..HEADROOM+len]`;
/// a datagram (either direction) lives at `buf[..len]` with `at_header` set.
pub struct Packet {
    pub buf: Vec<u8>,
    pub len: usize,
    /// Transport counter (TX: assigned; RX: from the header).
    pub counter: u64,
    /// RX: the datagram's source. TX: unused.
    pub src: Option<SocketAddr>,
    /// RX: the local address and interface it arrived at, where the kernel said.
    pub local: Option<LocalAddr>,
    /// TX: the MTU of a route with its own that the packet follows, which its padding
    /// respects; 0 for the device's.
    pub route_mtu: u32,
    /// When it reached this interface (CLOCK_REALTIME ns), 0 if unknown: RX the
    /// kernel's receive stamp of its datagram, TX its read from the TUN.
    pub arrival_ns: u64,
    /// The outer header's ECN field: RX as it arrived, TX as it will be sent (chosen
    /// at encryption).
    pub outer_ecn: u8,
    /// RX: when it was read, more datagrams waited behind it (later in the same
    /// receive, or a receive that used every buffer). A packet alone in the socket
    /// is no standing queue, however long it waited (CoDel's maxpacket rule).
    pub queued_behind: bool,
    /// TX: the last (or only) segment of what the TUN handed over as one packet. A
    /// flow's DRR turn (`fq_codel`) ends only after such a segment, so the segments of
    /// one super-packet leave together and the receiver can write them to its TUN as
    /// one again.
    pub ends_run: bool,
    /// Set by the crypt stage: the packet authenticated (RX) or was sealed (TX).
    pub ok: bool,
}

impl Packet {
    /// A buffer able to hold `payload` bytes of plaintext plus header and tag room.
    pub fn with_capacity(payload: usize) -> Packet {
        let need = HEADROOM + payload + TAILROOM;
        Packet {
            buf: if need <= pool::BUF_LEN {
                pool::take()
            } else {
                vec![0; need]
            },
            len: 0,
            counter: 0,
            src: None,
            local: None,
            route_mtu: 0,
            arrival_ns: 0,
            outer_ecn: 0,
            queued_behind: false,
            ends_run: true,
            ok: false,
        }
    }

    /// A plaintext packet made of `parts` laid end to end (a header and a payload, when
    /// a super-packet is split).
    pub fn from_plaintext(parts: &[&[u8]]) -> Packet {
        let len = parts.iter().map(|p| p.len()).sum();
        let mut p = Packet::with_capacity(len);
        let mut at = HEADROOM;
        for part in parts {
            p.buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        p.len = len;
        p
    }

    /// A received datagram from `src` to `local`, kept at the start of the buffer.
    pub fn from_datagram(dgram: &[u8], src: SocketAddr, local: Option<LocalAddr>) -> Packet {
        // Room for a plaintext of the datagram's length less header and tag is room for
        // the datagram itself.
        let mut p = Packet::with_capacity(dgram.len().saturating_sub(HEADROOM + TAILROOM));
        p.buf[..dgram.len()].copy_from_slice(dgram);
        p.len = dgram.len();
        p.src = Some(src);
        p.local = local;
        p
    }

    pub fn plaintext(&self) -> &[u8] {
        &self.buf[HEADROOM..HEADROOM + self.len]
    }

    /// A datagram (received, or sealed for sending) at the start of the buffer.
    pub fn datagram(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A TX packet in its peer's flow queue: plaintext, before its nonce.
impl crate::fq_codel::Queued for Packet {
    fn bytes(&self) -> usize {
        self.len
    }

    fn mark_ce(&mut self) -> bool {
        let len = self.len;
        crate::inner::set_ce(&mut self.buf[HEADROOM..HEADROOM + len])
    }

    fn ends_run(&self) -> bool {
        self.ends_run
    }
}

impl Drop for Packet {
    fn drop(&mut self) {
        pool::give(std::mem::take(&mut self.buf));
    }
}

/// Direction-specific contents of a batch.
pub struct BatchBody {
    pub packets: Vec<Packet>,
}

/// A unit of crypt work, also an element of its peer's ordered queue. The peer it
/// belongs to travels beside it, in the work item (`sched::CryptWork`).
///
/// Ordering contract: the crypt worker that owns the body sets `done` with `SeqCst`
/// after its last write; the peer's serial stage reads the body only after it has
/// seen `done` (also `SeqCst`). The body's mutex is therefore never contended; it exists
/// so that handing the body from worker to serial stage needs no unsafe code.
pub struct Batch {
    pub keypair: Arc<Keypair>,
    done: AtomicBool,
    /// Its packets, and their lengths, when it was made: what it counts in its
    /// ordered queue, unchanged by sealing or opening (or by a panic that dropped
    /// them, `stages::run_crypt`).
    count: usize,
    bytes: usize,
    body: Mutex<BatchBody>,
}

impl Batch {
    pub fn new(keypair: Arc<Keypair>, packets: Vec<Packet>) -> Arc<Batch> {
        Arc::new(Batch {
            keypair,
            done: AtomicBool::new(false),
            count: packets.len(),
            bytes: packets.iter().map(|p| p.len).sum(),
            body: Mutex::new(BatchBody { packets }),
        })
    }

    pub fn body(&self) -> MutexGuard<'_, BatchBody> {
        self.body.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn mark_done(&self) {
        self.done.store(true, Ordering::SeqCst);
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    pub fn len(&self) -> usize {
        self.body().packets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Ordered for Batch {
    fn is_done(&self) -> bool {
        Batch::is_done(self)
    }
    fn packets(&self) -> usize {
        self.count
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}
