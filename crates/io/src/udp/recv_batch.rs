//! The state one `recvmmsg` reuses from call to call.

use super::addr::*;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;

/// Everything one `recvmmsg` needs, allocated once per reader thread: the buffers and
/// the per-message headers, names and control space that point into them. Allocating
/// and zeroing those headers on every call cost about 3.5 KiB of calloc per receive.
///
/// Invariant: the headers hold pointers into the other vectors' heap storage, which is
/// never resized after `new`, so moving a `RecvBatch` keeps them valid.
pub struct RecvBatch {
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) iovs: Vec<libc::iovec>,
    pub(super) names: Vec<libc::sockaddr_storage>,
    pub(super) controls: Vec<RecvControl>,
    pub(super) hdrs: Vec<libc::mmsghdr>,
    pub(super) segs: Vec<usize>,
    pub(super) locals: Vec<Option<LocalAddr>>,
    pub(super) got: usize,
}

/// Control space for one received message: a `UDP_GRO` int and an `in6_pktinfo`
/// (the larger of the two source forms), each with its header.
pub(super) type RecvControl = [u64; 8];

/// One datagram of a receive, as [`RecvBatch::datagram`] reads it.
pub struct Received<'a> {
    pub data: &'a [u8],
    pub src: SocketAddr,
    /// The datagram size when the kernel coalesced several of that size into `data`
    /// (the last may be shorter), or 0.
    pub segment: usize,
    /// Where it arrived, when the kernel said.
    pub local: Option<LocalAddr>,
}

impl RecvBatch {
    /// `count` buffers of `size` bytes each.
    pub fn new(count: usize, size: usize) -> RecvBatch {
        let mut bufs: Vec<Vec<u8>> = (0..count).map(|_| vec![0u8; size]).collect();
        let iovs = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let mut batch = RecvBatch {
            bufs,
            iovs,
            // SAFETY: an all-zero sockaddr_storage / mmsghdr is a valid value.
            names: vec![unsafe { zeroed() }; count],
            controls: vec![[0; 8]; count],
            hdrs: vec![unsafe { zeroed() }; count],
            segs: vec![0; count],
            locals: vec![None; count],
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
        self.bufs.len()
    }

    /// Buffer `i` of the last receive. `None` past the count received, or for a
    /// source that is not an IP address.
    pub fn datagram(&self, i: usize) -> Option<Received<'_>> {
        if i >= self.got {
            return None;
        }
        let src = from_sockaddr(&self.names[i])?;
        let len = (self.hdrs[i].msg_len as usize).min(self.bufs[i].len());
        Some(Received {
            data: &self.bufs[i][..len],
            src,
            segment: self.segs[i],
            local: self.locals[i],
        })
    }
}
