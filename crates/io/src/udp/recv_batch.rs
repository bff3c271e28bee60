//! The state one `recvmmsg` reuses from call to call.

use super::addr::*;
use crate::region::Region;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;

/// Everything one `recvmmsg` needs, allocated once per reader thread: the buffers and
/// the per-message headers, names and control space that point into them. Allocating
/// and zeroing those headers on every call cost about 3.5 KiB of calloc per receive.
///
/// The buffers are one mapped [`Region`], `count` slots of `size` bytes: a slot takes
/// resident memory only once a receive has written into it.
///
/// Invariant: the headers hold pointers into the region and the other vectors' heap
/// storage, none of which moves or is resized after `new`, so moving a `RecvBatch`
/// keeps them valid.
pub struct RecvBatch {
    pub(super) area: Region,
    /// Bytes per buffer slot.
    pub(super) size: usize,
    pub(super) count: usize,
    pub(super) iovs: Vec<libc::iovec>,
    pub(super) names: Vec<libc::sockaddr_storage>,
    pub(super) controls: Vec<RecvControl>,
    pub(super) hdrs: Vec<libc::mmsghdr>,
    pub(super) ancillary: Vec<Ancillary>,
    pub(super) got: usize,
}

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
                // A message the kernel cut short (`MSG_CTRUNC`) says so in its length:
                // nothing is read past what it holds.
                _ if !holds(c, size_of::<u8>()) => {}
                (libc::SOL_UDP, UDP_GRO) if holds(c, size_of::<libc::c_int>()) => {
                    let v = std::ptr::read_unaligned(data as *const libc::c_int);
                    a.segment = v.max(0) as usize;
                }
                (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS)
                    if holds(c, size_of::<libc::timespec>()) =>
                {
                    let t = std::ptr::read_unaligned(data as *const libc::timespec);
                    a.rx_time_ns = (t.tv_sec as u64)
                        .saturating_mul(1_000_000_000)
                        .saturating_add(t.tv_nsec as u64);
                }
                // IPv4 passes the TOS as one byte, IPv6 the traffic class as an int.
                (libc::IPPROTO_IP, libc::IP_TOS) => a.ecn = *data & 0b11,
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) if holds(c, size_of::<libc::c_int>()) => {
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
    /// The kernel had more than the buffer held (`MSG_TRUNC`): what did not fit is lost.
    /// A coalesced run keeps only its whole datagrams (GRO can exceed 64 KiB where the
    /// device's `gro_max_size` was raised for BIG TCP); a single one is cut short, and
    /// fails authentication.
    pub truncated: bool,
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
        let size = size.max(1);
        let mut area = Region::new(count * size);
        let iovs = area
            .as_mut_slice()
            .chunks_exact_mut(size)
            .take(count)
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let mut batch = RecvBatch {
            area,
            size,
            count,
            iovs,
            // SAFETY: an all-zero sockaddr_storage / mmsghdr is a valid value.
            names: vec![unsafe { zeroed() }; count],
            controls: vec![[0; 16]; count],
            hdrs: vec![unsafe { zeroed() }; count],
            ancillary: vec![Ancillary::default(); count],
            got: 0,
        };
        for i in 0..count {
            let h = &mut batch.hdrs[i].msg_hdr;
            h.msg_name = (&mut batch.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut batch.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = batch.controls[i].as_mut_ptr().cast();
        }
        batch.reset_headers();
        batch
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
        self.count
    }

    /// Buffer `i` of the last receive. `None` past the count received, or for a
    /// source that is not an IP address.
    pub fn datagram(&self, i: usize) -> Option<Received<'_>> {
        if i >= self.got {
            return None;
        }
        let src = from_sockaddr(&self.names[i])?;
        let mut len = (self.hdrs[i].msg_len as usize).min(self.size);
        let a = self.ancillary[i];
        let truncated = self.hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        if truncated && a.segment > 0 {
            len -= len % a.segment;
        }
        Some(Received {
            data: &self.area.as_slice()[i * self.size..i * self.size + len],
            src,
            segment: a.segment,
            local: a.local,
            rx_time_ns: a.rx_time_ns,
            ecn: a.ecn,
            truncated,
        })
    }
}
