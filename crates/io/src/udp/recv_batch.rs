//! The state one `recvmmsg` reuses from call to call.

use super::addr::*;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;

/// Everything one `recvmmsg` needs, allocated once per reader thread: the buffers and
/// the per-message headers, names and control space that point into them. Allocating
/// and zeroing those headers on every call cost about 3.5 KiB of calloc per receive.
///
/// **Slots.** A batch made by [`RecvBatch::slotted`] gives each message a row of
/// packet-sized buffers (slots) before its large buffer, as one scatter list. The
/// kernel fills a scatter list in order, so when the segment size of a coalesced (GRO)
/// message equals the slots' length, each datagram lands alone at the start of a slot,
/// and [`RecvBatch::take_datagrams`] hands that slot over instead of its bytes: the
/// reader's copy of every datagram into a buffer of its own goes away. The slots'
/// length follows the segment size last seen; a message it does not fit is handed
/// over by copy, as from an unslotted batch.
///
/// Invariant: the headers hold pointers into the other vectors' heap storage, which is
/// never resized after construction, so moving a `RecvBatch` keeps them valid; a slot
/// handed over is replaced in the same step as its scatter entry.
pub struct RecvBatch {
    /// The large buffer of each message: the whole message, or what its slots missed.
    pub(super) bufs: Vec<Vec<u8>>,
    /// `per_msg` slots per message, message by message.
    slots: Vec<Vec<u8>>,
    per_msg: usize,
    /// The length the slots' scatter entries offer, at most `slot_max`.
    slot_len: usize,
    slot_max: usize,
    /// Where replacement slots come from (a packet pool).
    refill: fn() -> Vec<u8>,
    /// A message its slots did not fit, laid end to end for copying out.
    gather: Vec<u8>,
    /// `per_msg + 1` scatter entries per message: its slots, then its large buffer.
    pub(super) iovs: Vec<libc::iovec>,
    pub(super) names: Vec<libc::sockaddr_storage>,
    pub(super) controls: Vec<RecvControl>,
    pub(super) hdrs: Vec<libc::mmsghdr>,
    pub(super) ancillary: Vec<Ancillary>,
    pub(super) got: usize,
}

/// One datagram of a receive, handed over by [`RecvBatch::take_datagrams`].
pub enum Datagram<'a> {
    /// It arrived alone at the start of a slot, which is now the caller's: the buffer
    /// and the datagram's length.
    Owned(Vec<u8>, usize),
    /// Its bytes, in the batch's own storage, to copy.
    Borrowed(&'a [u8]),
}

/// Where a received message came from and what the kernel said of it.
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    pub src: SocketAddr,
    /// Where it arrived, when the kernel said.
    pub local: Option<LocalAddr>,
    /// When the kernel received it (`SO_TIMESTAMPNS`, CLOCK_REALTIME ns), or 0 when it
    /// did not say: the start of its sojourn in the socket and the pipeline behind it.
    pub rx_time_ns: u64,
    /// The outer header's ECN bits (RFC 6040's decapsulation needs them). Coalesced
    /// datagrams share them: GRO merges only packets of equal TOS.
    pub ecn: u8,
}

/// Shortest slot a batch scatters into: shorter segments are copied out. With
/// [`SLOTS_PER_MESSAGE`] slots it bounds the large buffer a slotted message needs.
pub const MIN_SLOT: usize = 1024;
/// Slots per message of a slotted batch: a full 64 KiB GRO message of 1,420-byte-MTU
/// transport datagrams (1,456 bytes each) takes 45.
pub const SLOTS_PER_MESSAGE: usize = 48;
/// Largest UDP payload: what any message of a receive may hold.
const MAX_MESSAGE: usize = 65536;

/// Control space for one received message, each item with its header: a `UDP_GRO`
/// int (24 bytes), an `in6_pktinfo` (40, the larger of the two source forms), a
/// receive timestamp (32) and the outer TOS or traffic class (24); 8 bytes to spare.
pub(super) type RecvControl = [u64; 16];

/// What the kernel said about one received message besides its bytes.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Ancillary {
    segment: usize,
    local: Option<LocalAddr>,
    rx_time_ns: u64,
    ecn: u8,
}

/// `UDP_GRO` from linux/udp.h (not exported by libc for glibc targets).
pub(super) const UDP_GRO: libc::c_int = 104;

impl Ancillary {
    /// Reads a received message's control data.
    ///
    /// # Safety
    /// `hdr` must describe a control buffer the kernel filled.
    pub(super) unsafe fn read(hdr: &libc::msghdr) -> Ancillary {
        let mut a = Ancillary::default();
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_UDP, UDP_GRO) => {
                    let v = std::ptr::read_unaligned(data as *const libc::c_int);
                    a.segment = v.max(0) as usize;
                }
                (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                    let t = std::ptr::read_unaligned(data as *const libc::timespec);
                    a.rx_time_ns = (t.tv_sec as u64)
                        .saturating_mul(1_000_000_000)
                        .saturating_add(t.tv_nsec as u64);
                }
                // IPv4 passes the TOS as one byte, IPv6 the traffic class as an int.
                (libc::IPPROTO_IP, libc::IP_TOS) => a.ecn = *data & 0b11,
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                    let v = std::ptr::read_unaligned(data as *const libc::c_int);
                    a.ecn = (v & 0b11) as u8;
                }
                _ => {
                    if let Some(local) = local_of(c) {
                        a.local = Some(local);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
        a
    }
}

/// One datagram of a receive, as [`RecvBatch::datagram`] reads it.
pub struct Received<'a> {
    pub data: &'a [u8],
    pub src: SocketAddr,
    /// The datagram size when the kernel coalesced several of that size into `data`
    /// (the last may be shorter), or 0.
    pub segment: usize,
    /// Where it arrived, when the kernel said.
    pub local: Option<LocalAddr>,
    /// When the kernel received it (`SO_TIMESTAMPNS`, CLOCK_REALTIME ns), or 0 when it
    /// did not say: the start of its sojourn in the socket and the pipeline behind it.
    pub rx_time_ns: u64,
    /// The outer header's ECN bits (RFC 6040's decapsulation needs them). Coalesced
    /// datagrams share them: GRO merges only packets of equal TOS.
    pub ecn: u8,
}

impl<'a> Received<'a> {
    /// The datagrams in `data`, one by one: several when the kernel coalesced them
    /// (GRO), else the one.
    pub fn datagrams(&self) -> std::slice::Chunks<'a, u8> {
        let step = if self.segment > 0 {
            self.segment
        } else {
            self.data.len().max(1)
        };
        self.data.chunks(step)
    }
}

impl RecvBatch {
    /// `count` buffers of `size` bytes each.
    pub fn new(count: usize, size: usize) -> RecvBatch {
        fn none() -> Vec<u8> {
            Vec::new()
        }
        RecvBatch::build(count, size, 0, 0, none)
    }

    /// `count` messages of up to 64 KiB, each first scattered over
    /// [`SLOTS_PER_MESSAGE`] slots of up to `slot_max` bytes taken from `refill`
    /// (which must return buffers at least that long).
    pub fn slotted(count: usize, slot_max: usize, refill: fn() -> Vec<u8>) -> RecvBatch {
        let slot_max = slot_max.max(MIN_SLOT);
        let rest = MAX_MESSAGE - SLOTS_PER_MESSAGE * MIN_SLOT;
        RecvBatch::build(count, rest, SLOTS_PER_MESSAGE, slot_max, refill)
    }

    fn build(
        count: usize,
        size: usize,
        per_msg: usize,
        slot_max: usize,
        refill: fn() -> Vec<u8>,
    ) -> RecvBatch {
        let slots: Vec<Vec<u8>> = (0..count * per_msg).map(|_| refill()).collect();
        assert!(slots.iter().all(|s| s.len() >= slot_max), "short slot");
        let mut batch = RecvBatch {
            bufs: (0..count).map(|_| vec![0u8; size]).collect(),
            slots,
            per_msg,
            slot_len: slot_max,
            slot_max,
            refill,
            gather: Vec::new(),
            iovs: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                count * (per_msg + 1)
            ],
            // SAFETY: an all-zero sockaddr_storage / mmsghdr is a valid value.
            names: vec![unsafe { zeroed() }; count],
            controls: vec![[0; 16]; count],
            hdrs: vec![unsafe { zeroed() }; count],
            ancillary: vec![Ancillary::default(); count],
            got: 0,
        };
        for i in 0..count {
            for k in 0..per_msg {
                batch.point_slot(i, k);
            }
            let big = &mut batch.bufs[i];
            batch.iovs[i * (per_msg + 1) + per_msg] = libc::iovec {
                iov_base: big.as_mut_ptr().cast(),
                iov_len: big.len(),
            };
            let h = &mut batch.hdrs[i].msg_hdr;
            h.msg_name = (&mut batch.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut batch.iovs[i * (per_msg + 1)];
            h.msg_iovlen = per_msg + 1;
            h.msg_control = batch.controls[i].as_mut_ptr().cast();
        }
        batch.reset_headers();
        batch
    }

    /// Points slot `k` of message `i`'s scatter entry at its buffer.
    fn point_slot(&mut self, i: usize, k: usize) {
        let slot = &mut self.slots[i * self.per_msg + k];
        self.iovs[i * (self.per_msg + 1) + k] = libc::iovec {
            iov_base: slot.as_mut_ptr().cast(),
            iov_len: self.slot_len,
        };
    }

    /// Restores the lengths the kernel overwrites on each receive.
    pub(super) fn reset_headers(&mut self) {
        for h in &mut self.hdrs {
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as _;
            h.msg_hdr.msg_controllen = size_of::<RecvControl>() as _;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
    }

    /// How many buffers one receive can fill.
    pub fn capacity(&self) -> usize {
        self.bufs.len()
    }

    /// Buffer `i` of the last receive. `None` past the count received, for a source
    /// that is not an IP address, or in a slotted batch (see `take_datagrams`).
    pub fn datagram(&self, i: usize) -> Option<Received<'_>> {
        if self.per_msg > 0 {
            return None;
        }
        let o = self.origin(i)?;
        let len = (self.hdrs[i].msg_len as usize).min(self.bufs[i].len());
        Some(Received {
            data: &self.bufs[i][..len],
            src: o.src,
            segment: self.ancillary[i].segment,
            local: o.local,
            rx_time_ns: o.rx_time_ns,
            ecn: o.ecn,
        })
    }

    /// Where message `i` of the last receive came from; `None` past the count
    /// received, or for a source that is not an IP address.
    pub fn origin(&self, i: usize) -> Option<Origin> {
        if i >= self.got {
            return None;
        }
        let a = self.ancillary[i];
        Some(Origin {
            src: from_sockaddr(&self.names[i])?,
            local: a.local,
            rx_time_ns: a.rx_time_ns,
            ecn: a.ecn,
        })
    }

    /// Hands over the datagrams of message `i` of the last receive, in order: a slot
    /// of its own for each that arrived alone at a slot's start, else its bytes. Call
    /// at most once per message and receive.
    pub fn take_datagrams(&mut self, i: usize, each: &mut dyn FnMut(Datagram<'_>)) {
        if i >= self.got {
            return;
        }
        let per = self.per_msg;
        let capacity = per * self.slot_len + self.bufs[i].len();
        let len = (self.hdrs[i].msg_len as usize).min(capacity);
        let segment = self.ancillary[i].segment;
        let step = if segment > 0 { segment } else { len.max(1) };
        // Each datagram starts a slot when the segment is the slots' length, or when
        // the message is one datagram that fits the first slot.
        let aligned = per > 0 && (step == self.slot_len || (segment == 0 && len <= self.slot_len));
        if per == 0 || aligned {
            let mut at = 0;
            for k in 0.. {
                if at >= len {
                    break;
                }
                let n = step.min(len - at);
                if k < per {
                    let fresh = (self.refill)();
                    let buf = std::mem::replace(&mut self.slots[i * per + k], fresh);
                    self.point_slot(i, k);
                    each(Datagram::Owned(buf, n));
                } else {
                    let from = at - per * self.slot_len;
                    each(Datagram::Borrowed(&self.bufs[i][from..from + n]));
                }
                at += n;
            }
        } else {
            // Laid across slots: gathered, then copied out datagram by datagram.
            self.gather.clear();
            let mut left = len;
            for slot in &self.slots[i * per..(i + 1) * per] {
                let n = left.min(self.slot_len);
                self.gather.extend_from_slice(&slot[..n]);
                left -= n;
            }
            self.gather.extend_from_slice(&self.bufs[i][..left]);
            for d in self.gather.chunks(step) {
                each(Datagram::Borrowed(d));
            }
        }
        // Taken: a second call finds nothing rather than the fresh slots' stale bytes.
        self.hdrs[i].msg_len = 0;
        self.follow_segment(segment, len);
    }

    /// Sets the slots' length to the segment size just seen (or a lone datagram's
    /// length, when longer than the slots), so that the next message of this flow
    /// lands one datagram per slot.
    fn follow_segment(&mut self, segment: usize, len: usize) {
        let want = match segment {
            0 if len > self.slot_len => len,
            0 => return,
            s => s,
        };
        if self.per_msg == 0 || want == self.slot_len || want > self.slot_max {
            return;
        }
        // Below MIN_SLOT the slots stay at MIN_SLOT, so that slots and large buffer
        // together still hold any message; such segments are copied out.
        self.slot_len = want.max(MIN_SLOT);
        let per = self.per_msg;
        for (n, iov) in self.iovs.iter_mut().enumerate() {
            if n % (per + 1) != per {
                iov.iov_len = self.slot_len;
            }
        }
    }
}
