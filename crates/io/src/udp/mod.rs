//! UDP sockets for the outer path, with batched receive (`recvmmsg`) and send
//! (`sendmmsg`). Per address family, a data socket and, where the kernel allows, a
//! handshake socket on the same port with the kernel steering datagrams between them
//! by their first byte (`bind_steered`); the IPv6 sockets are V6ONLY so both families
//! can share a port.
//!
//! The parts: `addr` (local addresses, control messages and socket addresses),
//! `steering` (the classic BPF program that splits one port's datagrams between
//! sockets) and `recv_batch` (the reusable `recvmmsg` state).

mod addr;
mod recv_batch;
mod steering;
#[cfg(test)]
mod tests;

use addr::*;
pub use addr::{LocalAddr, NOT_ECT};
use recv_batch::{Ancillary, UDP_GRO};
pub use recv_batch::{Received, RecvBatch};
use steering::*;
pub use steering::{ProofRule, Steering};

use crate::cvt;
use std::io;
use std::mem::{size_of, size_of_val, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Socket buffer size we ask for; large buffers absorb bursts between batches. A data
/// socket's receive buffer may later be resized (the dataplane's `socket_buffer`).
pub const SOCKET_BUFFER: usize = 7 << 20;

/// One datagram to send, with everything its outer header needs: where to, from
/// which local address (None: the route's choice) and the ECN field.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub payload: &'a [u8],
    pub dst: SocketAddr,
    pub src: Option<LocalAddr>,
    pub ecn: u8,
}

pub struct UdpSocket {
    fd: OwnedFd,
    v6: bool,
    /// UDP_SEGMENT works on this socket (cleared at the first refusal).
    gso: std::sync::atomic::AtomicBool,
    /// UDP_GRO is on: one received buffer may hold several datagrams.
    gro: bool,
}

/// `SO_MEMINFO` from asm-generic/socket.h, and the length of its answer.
const SO_MEMINFO: libc::c_int = 55;
const SK_MEMINFO_VARS: usize = 9;

/// Most segments one GSO send may carry (the kernel's UDP_MAX_SEGMENTS on older kernels).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes one GSO send may carry.
pub const GSO_MAX_BYTES: usize = 65507;

/// Sets a socket's receive and send buffers to `bytes`: forced past the system's
/// maximum where allowed (CAP_NET_ADMIN), else as far as the maximum lets them go.
pub fn force_buffers(fd: RawFd, bytes: usize) {
    let size = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if setsockopt_int(fd, libc::SOL_SOCKET, force, size).is_err() {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, plain, size);
        }
    }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int with its exact size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as _,
        )
    })
    .map(|_| ())
}

/// Datagrams the kernel dropped on socket `fd` since it was created (`SO_MEMINFO`),
/// almost all for a full receive buffer. Any socket will do: the lab asks it of its
/// own receivers.
pub fn socket_drops(fd: RawFd) -> io::Result<u32> {
    let mut info = [0u32; SK_MEMINFO_VARS];
    let mut len = size_of_val(&info) as libc::socklen_t;
    // SAFETY: info is live, writable storage of len bytes.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    })?;
    Ok(info[libc::SK_MEMINFO_DROPS as usize])
}

fn wildcard(v6: bool, port: u16) -> SocketAddr {
    if v6 {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
    } else {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
    }
}

impl UdpSocket {
    /// Binds a non-blocking UDP socket on the wildcard address of one family.
    pub fn bind(v6: bool, port: u16) -> io::Result<UdpSocket> {
        Self::open(wildcard(v6, port), false)
    }

    /// Binds a non-blocking UDP socket on one address and port (a load generator's
    /// emulated host; with an AnyIP route the address need not be on an interface).
    pub fn bind_addr(addr: SocketAddr) -> io::Result<UdpSocket> {
        Self::open(addr, false)
    }

    /// Binds the three sockets of one family on `port` (0: any): data, handshake and
    /// proof. The kernel steers each datagram by [`Steering`]: the data socket gets
    /// the data, the proof socket the handshake messages that carry a proof (for
    /// WireGuard, a non-zero mac2: the sender holds a cookie of ours), and the
    /// handshake socket everything else. A flood of cookie-less messages then fills and
    /// overflows only the handshake socket's buffer, and a flood that fakes the proof
    /// only the proof socket's. Where the kernel refuses the steering, the second
    /// value is the error and the data socket receives everything.
    ///
    /// All three sit in one SO_REUSEPORT group, which another socket could join only
    /// with SO_REUSEPORT set and the same user id. The port is first claimed by a plain
    /// bind, closed again just before the group binds, so a port another socket already
    /// holds fails here as it would without the group, rather than being shared.
    pub fn bind_steered(
        v6: bool,
        port: u16,
        steering: &Steering,
    ) -> io::Result<(UdpSocket, io::Result<(UdpSocket, UdpSocket)>)> {
        let port = Self::open(wildcard(v6, port), false)?.local_port()?;
        let data = Self::open(wildcard(v6, port), true)?;
        let others = Self::open(wildcard(v6, port), true).and_then(|handshake| {
            let proof = Self::open(wildcard(v6, port), true)?;
            attach_steering(data.fd(), steering)?;
            Ok((handshake, proof))
        });
        Ok((data, others))
    }

    fn open(addr: SocketAddr, reuse_port: bool) -> io::Result<UdpSocket> {
        let v6 = addr.is_ipv6();
        let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        // SAFETY: plain socket creation; result checked.
        let fd = cvt(unsafe {
            libc::socket(
                family,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        })?;
        // SAFETY: fresh descriptor, exclusively ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        if v6 {
            setsockopt_int(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
            setsockopt_int(raw, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
            setsockopt_int(raw, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)?;
        } else {
            setsockopt_int(raw, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?;
            setsockopt_int(raw, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)?;
            // No Don't Fragment bit, as the kernel's WireGuard sends (`ignore_df`):
            // a router on a narrower path fragments the datagram instead of dropping
            // it, which is all that works where ICMP "too big" is filtered. The path
            // MTU the kernel learned still sizes segmented sends (`send_segmented`).
            setsockopt_int(
                raw,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DONT,
            )?;
        }
        // Each datagram's arrival time: where its sojourn starts (the receive side's
        // queue controller measures it from here, see the dataplane's `codel`).
        setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)?;
        force_buffers(raw, SOCKET_BUFFER);
        if reuse_port {
            setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
        }
        let (ss, len) = to_sockaddr(&addr);
        // SAFETY: ss holds a valid sockaddr of length len.
        cvt(unsafe { libc::bind(raw, &ss as *const _ as *const libc::sockaddr, len) })?;
        // Receive coalescing is optional: without it every datagram arrives alone.
        let gro = setsockopt_int(raw, libc::SOL_UDP, UDP_GRO, 1).is_ok();
        Ok(UdpSocket {
            fd,
            v6,
            gso: std::sync::atomic::AtomicBool::new(true),
            gro,
        })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn is_v6(&self) -> bool {
        self.v6
    }

    pub fn local_port(&self) -> io::Result<u16> {
        // SAFETY: zeroed storage is valid; getsockname fills at most len bytes.
        let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: pointers to live storage and its length.
        cvt(unsafe {
            libc::getsockname(
                self.fd(),
                &mut ss as *mut _ as *mut libc::sockaddr,
                &mut len,
            )
        })?;
        from_sockaddr(&ss)
            .map(|a| a.port())
            .ok_or_else(|| io::Error::other("unexpected socket family"))
    }

    /// Sets the receive buffer's size (the kernel doubles it for its bookkeeping), with
    /// SO_RCVBUFFORCE where allowed.
    pub fn set_receive_buffer(&self, bytes: usize) -> io::Result<()> {
        let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        setsockopt_int(self.fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, bytes)
            .or_else(|_| setsockopt_int(self.fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, bytes))
    }

    /// Sets SO_MARK (the fwmark) on outgoing packets; 0 clears it.
    pub fn set_mark(&self, mark: u32) -> io::Result<()> {
        setsockopt_int(
            self.fd(),
            libc::SOL_SOCKET,
            libc::SO_MARK,
            mark as libc::c_int,
        )
    }

    /// Datagrams the kernel dropped on this socket since it was bound, almost all for a
    /// full receive buffer.
    pub fn drops(&self) -> io::Result<u32> {
        socket_drops(self.fd())
    }

    /// Whether received buffers may hold several coalesced datagrams.
    pub fn gro_enabled(&self) -> bool {
        self.gro
    }

    /// Receives into `batch`'s buffers and returns the count; `WouldBlock` when nothing
    /// is queued. [`RecvBatch::datagram`] then reads each one.
    pub fn recv_batch(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        batch.got = 0;
        batch.reset_headers();
        let n = batch.hdrs.len();
        // SAFETY: every header points at live buffers owned by `batch` (see RecvBatch),
        // which outlives the call.
        let got = cvt(unsafe {
            libc::recvmmsg(
                self.fd(),
                batch.hdrs.as_mut_ptr(),
                n as _,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        })? as usize;
        for i in 0..got {
            // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG macros walk
            // only within that buffer.
            batch.ancillary[i] = unsafe { Ancillary::read(&batch.hdrs[i].msg_hdr) };
        }
        batch.got = got;
        Ok(got)
    }

    /// Sends each `(payload, destination)` from `src` (None: the route's choice), with
    /// `ecn` in the outer header's ECN field; returns how many the kernel took. A full
    /// send buffer is waited out (backpressure for the data path); an unreachable
    /// destination fails only its own datagram. Stops at the first other failure.
    pub fn send_batch(
        &self,
        msgs: &[(&[u8], SocketAddr)],
        src: Option<LocalAddr>,
        ecn: u8,
    ) -> io::Result<usize> {
        let msgs: Vec<_> = msgs
            .iter()
            .map(|&(payload, dst)| Outgoing {
                payload,
                dst,
                src,
                ecn,
            })
            .collect();
        self.send_mmsg(&msgs, true, None)
    }

    /// Sends each of `msgs`, every one with its own destination, source and ECN field,
    /// in as few system calls as the kernel allows, waiting out a full send buffer as
    /// [`send_batch`](Self::send_batch) does. `sent[i]` (as long as `msgs`) tells whether
    /// the kernel took `msgs[i]`: an unreachable destination fails only its own
    /// datagram, so the caller can count each destination's sends apart.
    pub fn send_each(&self, msgs: &[Outgoing<'_>], sent: &mut [bool]) -> io::Result<usize> {
        self.send_mmsg(msgs, true, Some(sent))
    }

    /// Sends each `(payload, destination, source)`, never waiting: what does not fit in
    /// the send buffer is dropped. For answers that are worthless late (cookie
    /// replies), each from the address its question arrived at.
    pub fn try_send_replies(
        &self,
        msgs: &[(&[u8], SocketAddr, Option<LocalAddr>)],
    ) -> io::Result<usize> {
        let msgs: Vec<_> = msgs
            .iter()
            .map(|&(payload, dst, src)| Outgoing {
                payload,
                dst,
                src,
                ecn: NOT_ECT,
            })
            .collect();
        self.send_mmsg(&msgs, false, None)
    }

    fn send_mmsg(
        &self,
        msgs: &[Outgoing<'_>],
        wait_for_room: bool,
        mut sent: Option<&mut [bool]>,
    ) -> io::Result<usize> {
        // `next` is the first datagram not yet handed to the kernel; `accepted` counts
        // only those the kernel took, not those skipped after a failure of their own.
        let (mut next, mut accepted) = (0, 0);
        if let Some(s) = sent.as_deref_mut() {
            s[..msgs.len()].fill(false);
        }
        let mut names: Vec<_> = msgs
            .iter()
            .map(|m| to_sockaddr(&self.map_destination(&m.dst)))
            .collect();
        let mut controls: Vec<SendControl> = vec![SendControl::default(); msgs.len()];
        // SAFETY: zeroed iovec/mmsghdr are valid initial values.
        let mut iovs: Vec<libc::iovec> = vec![unsafe { zeroed() }; msgs.len()];
        let mut hdrs: Vec<libc::mmsghdr> = vec![unsafe { zeroed() }; msgs.len()];
        // The control data each datagram keeps when its source is refused: the ECN.
        let mut keep = vec![0; msgs.len()];
        for (i, m) in msgs.iter().enumerate() {
            iovs[i] = libc::iovec {
                iov_base: m.payload.as_ptr() as *mut _,
                iov_len: m.payload.len(),
            };
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut names[i].0 as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = names[i].1;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            keep[i] = put_outer(h, &mut controls[i], 0, self.v6, m.ecn, m.src);
        }
        let flags = if wait_for_room { 0 } else { libc::MSG_DONTWAIT };
        while next < msgs.len() {
            // SAFETY: headers point at live buffers for the duration of the call.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd(),
                    hdrs[next..].as_mut_ptr(),
                    (msgs.len() - next) as _,
                    flags,
                )
            };
            match cvt(r) {
                Ok(k) => {
                    if let Some(s) = sent.as_deref_mut() {
                        s[next..next + k as usize].fill(true);
                    }
                    next += k as usize;
                    accepted += k as usize;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !wait_for_room => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait_writable(),
                // The source address is no longer ours (it was just removed): send it
                // from the route's choice instead. The owner of the source learns of the
                // removal from rtnetlink and stops asking for it.
                Err(e)
                    if source_refused(&e) && drop_source(&mut hdrs[next].msg_hdr, keep[next]) => {}
                // An unreachable destination fails only its own datagram: skip it.
                Err(_) if next + 1 < msgs.len() => next += 1,
                Err(e) => return if accepted > 0 { Ok(accepted) } else { Err(e) },
            }
        }
        Ok(accepted)
    }

    /// Waits (briefly) for room in the send buffer.
    fn wait_writable(&self) {
        let mut p = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 100) };
    }

    /// An IPv4 destination on an IPv6 socket is not possible (V6ONLY); callers pick the
    /// socket by family, so this only normalises mapped addresses.
    fn map_destination(&self, dst: &SocketAddr) -> SocketAddr {
        match dst {
            SocketAddr::V6(a) if !self.v6 => match a.ip().to_ipv4_mapped() {
                Some(v4) => SocketAddr::from((v4, a.port())),
                None => *dst,
            },
            _ => *dst,
        }
    }

    /// Whether segmentation offload is (still) believed to work on this socket.
    pub fn gso_enabled(&self) -> bool {
        self.gso.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends `dgrams` laid end to end, cut by the kernel into datagrams of `segment`
    /// bytes each (the last may be shorter), with one system call, using UDP_SEGMENT,
    /// from `src` (None: the route's choice), every segment with `ecn` in the outer
    /// header's ECN field. The pieces are gathered straight from the
    /// caller's buffers (no copy here); they need not be datagram-aligned. At most
    /// [`GSO_MAX_SEGMENTS`] pieces and [`GSO_MAX_BYTES`] in all. Returns false, having
    /// sent nothing, if the kernel refuses this send as one; the caller then sends the
    /// datagrams singly. Where the refusal says the offload is missing (no checksum
    /// offload on the path, a kernel without it), the socket stops trying it; where it
    /// says only that a segment exceeds the destination's path MTU (EMSGSIZE since
    /// Linux 6.14, EINVAL before), other destinations keep it: singly, the kernel
    /// fragments what the path cannot carry whole.
    pub fn send_segmented(
        &self,
        dgrams: &[&[u8]],
        segment: u16,
        dst: &SocketAddr,
        src: Option<LocalAddr>,
        ecn: u8,
    ) -> io::Result<bool> {
        if dgrams.len() > GSO_MAX_SEGMENTS
            || dgrams.iter().map(|d| d.len()).sum::<usize>() > GSO_MAX_BYTES
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too much for one segmented send",
            ));
        }
        let (ss, len) = to_sockaddr(&self.map_destination(dst));
        let mut control = SendControl::default();
        let mut iovs = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; GSO_MAX_SEGMENTS];
        for (iov, d) in iovs.iter_mut().zip(dgrams) {
            iov.iov_base = d.as_ptr() as *mut _;
            iov.iov_len = d.len();
        }
        let segment = put_cmsg(
            bytemuck_u64(&mut control),
            0,
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            &segment.to_ne_bytes(),
        );
        // SAFETY: zeroed msghdr is valid; every pointer set below refers to live locals.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = &ss as *const _ as *mut _;
        msg.msg_namelen = len;
        msg.msg_iov = iovs.as_mut_ptr();
        msg.msg_iovlen = dgrams.len() as _;
        let keep = put_outer(&mut msg, &mut control, segment, self.v6, ecn, src);
        loop {
            // SAFETY: msg and everything it points to are valid for the call.
            let r = unsafe { libc::sendmsg(self.fd(), &msg, 0) };
            if r >= 0 {
                return Ok(true);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => self.wait_writable(),
                // With a source, EINVAL first means the source is no longer ours (see
                // send_mmsg): try again from the route's choice before blaming GSO.
                _ if source_refused(&e) && drop_source(&mut msg, keep) => {}
                // No offload on this path or kernel: remember and let the caller fall back.
                Some(libc::EIO) | Some(libc::ENOPROTOOPT) | Some(libc::EOPNOTSUPP) => {
                    self.gso.store(false, std::sync::atomic::Ordering::Relaxed);
                    return Ok(false);
                }
                // A segment longer than this destination's path MTU allows (the route's,
                // or one an ICMP message lowered): this send only.
                Some(libc::EMSGSIZE) | Some(libc::EINVAL) => return Ok(false),
                _ => return Err(e),
            }
        }
    }

    /// Sends one datagram, from the route's choice of source.
    pub fn send_to(&self, payload: &[u8], dst: &SocketAddr) -> io::Result<usize> {
        self.send_from(payload, dst, None, NOT_ECT)
    }

    /// Sends one datagram from `src` (None: the route's choice), with `ecn` in the
    /// outer header's ECN field, without waiting for room in the send buffer.
    pub fn send_from(
        &self,
        payload: &[u8],
        dst: &SocketAddr,
        src: Option<LocalAddr>,
        ecn: u8,
    ) -> io::Result<usize> {
        let (ss, len) = to_sockaddr(&self.map_destination(dst));
        let mut control = SendControl::default();
        let mut iov = libc::iovec {
            iov_base: payload.as_ptr() as *mut _,
            iov_len: payload.len(),
        };
        // SAFETY: zeroed msghdr is valid; every pointer set below refers to live locals.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = &ss as *const _ as *mut _;
        msg.msg_namelen = len;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let keep = put_outer(&mut msg, &mut control, 0, self.v6, ecn, src);
        loop {
            // SAFETY: msg and everything it points to are valid for the call.
            let r = unsafe { libc::sendmsg(self.fd(), &msg, 0) };
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // The source is no longer ours (see send_mmsg).
                _ if source_refused(&e) && drop_source(&mut msg, keep) => {}
                _ => return Err(e),
            }
        }
    }
}
