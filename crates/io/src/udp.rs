//! UDP sockets for the outer path, with batched receive (`recvmmsg`) and send
//! (`sendmmsg`). Per address family, a data socket and, where the kernel allows, a
//! handshake socket on the same port with the kernel steering datagrams between them
//! by their first byte (`bind_steered`); the IPv6 sockets are V6ONLY so both families
//! can share a port.

use crate::cvt;
use std::io;
use std::mem::{size_of, size_of_val, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Socket buffer size we ask for; large buffers absorb bursts between batches.
const SOCKET_BUFFER: libc::c_int = 7 << 20;

pub struct UdpSocket {
    fd: OwnedFd,
    v6: bool,
    /// UDP_SEGMENT works on this socket (cleared at the first refusal).
    gso: std::sync::atomic::AtomicBool,
    /// UDP_GRO is on: one received buffer may hold several datagrams.
    gro: bool,
}

/// `UDP_GRO` from linux/udp.h (not exported by libc for glibc targets).
const UDP_GRO: libc::c_int = 104;
/// `SO_MEMINFO` from asm-generic/socket.h, and the length of its answer.
const SO_MEMINFO: libc::c_int = 55;
const SK_MEMINFO_VARS: usize = 9;

/// Most segments one GSO send may carry (the kernel's UDP_MAX_SEGMENTS on older kernels).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes one GSO send may carry.
pub const GSO_MAX_BYTES: usize = 65507;

/// The local end of a received datagram: the address it was sent to and the interface
/// it arrived on (`IP_PKTINFO` / `IPV6_PKTINFO`). Sending with it as the source answers
/// from the address the peer chose, as the kernel's WireGuard does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalAddr {
    pub ip: IpAddr,
    pub ifindex: u32,
}

/// Control space for one send: a `UDP_SEGMENT` and a source, each with its header.
type SendControl = [u64; 8];

/// Appends a source-address control message for `src` at `at` in `control`; returns
/// the new end. The interface is left to the route lookup (0): a source only picks the
/// address, so a route that changed still decides where the datagram leaves.
fn put_source(control: &mut SendControl, at: usize, src: &LocalAddr) -> usize {
    let buf: &mut [u8] = bytemuck_u64(control);
    let (level, kind, data): (libc::c_int, libc::c_int, Vec<u8>) = match src.ip {
        IpAddr::V4(a) => {
            // struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }
            let mut d = vec![0u8; 12];
            d[4..8].copy_from_slice(&a.octets());
            (libc::IPPROTO_IP, libc::IP_PKTINFO, d)
        }
        IpAddr::V6(a) => {
            // struct in6_pktinfo { in6_addr addr; int ifindex; }
            let mut d = vec![0u8; 20];
            d[..16].copy_from_slice(&a.octets());
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, d)
        }
    };
    put_cmsg(buf, at, level, kind, &data)
}

/// Appends one control message; returns the new end of the control data.
fn put_cmsg(
    buf: &mut [u8],
    at: usize,
    level: libc::c_int,
    kind: libc::c_int,
    data: &[u8],
) -> usize {
    let hdr = size_of::<libc::cmsghdr>();
    // SAFETY: CMSG_LEN/CMSG_SPACE are pure computations.
    let (len, space) = unsafe {
        (
            libc::CMSG_LEN(data.len() as u32) as usize,
            libc::CMSG_SPACE(data.len() as u32) as usize,
        )
    };
    let mut c: libc::cmsghdr = unsafe { zeroed() };
    c.cmsg_len = len as _;
    c.cmsg_level = level;
    c.cmsg_type = kind;
    // SAFETY: cmsghdr is plain data; its bytes are copied into the buffer, which the
    // caller sized for every message it adds (SendControl holds the largest pair).
    let raw = unsafe { std::slice::from_raw_parts(&c as *const _ as *const u8, hdr) };
    buf[at..at + hdr].copy_from_slice(raw);
    buf[at + hdr..at + hdr + data.len()].copy_from_slice(data);
    at + space
}

/// How the kernel refuses a source address that is not (or no longer) local: IPv4's
/// route lookup answers ENETUNREACH, IPv6's control-message check EINVAL. A datagram
/// refused so is sent again without its source; one that truly has no route fails
/// again then.
fn source_refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENETUNREACH))
}

/// The bytes of a u64-aligned control buffer.
fn bytemuck_u64(c: &mut SendControl) -> &mut [u8] {
    // SAFETY: any bytes are valid u64s and vice versa; the length is the array's.
    unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr().cast(), size_of::<SendControl>()) }
}

/// Reads the local end out of a received message's control data.
///
/// # Safety
/// `hdr` must describe a control buffer the kernel filled.
unsafe fn local_of(hdr: &libc::msghdr) -> Option<LocalAddr> {
    let mut c = libc::CMSG_FIRSTHDR(hdr);
    while !c.is_null() {
        let data = libc::CMSG_DATA(c);
        match ((*c).cmsg_level, (*c).cmsg_type) {
            (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                let p = std::ptr::read_unaligned(data as *const libc::in_pktinfo);
                return Some(LocalAddr {
                    ip: IpAddr::V4(Ipv4Addr::from(p.ipi_addr.s_addr.to_ne_bytes())),
                    ifindex: p.ipi_ifindex as u32,
                });
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                let p = std::ptr::read_unaligned(data as *const libc::in6_pktinfo);
                return Some(LocalAddr {
                    ip: IpAddr::V6(Ipv6Addr::from(p.ipi6_addr.s6_addr)),
                    ifindex: p.ipi6_ifindex,
                });
            }
            _ => {}
        }
        c = libc::CMSG_NXTHDR(hdr, c);
    }
    None
}

fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            // Report v4-mapped sources as plain IPv4 so endpoints compare equal.
            if let Some(v4) = ip.to_ipv4_mapped() {
                return Some(SocketAddr::V4(SocketAddrV4::new(
                    v4,
                    u16::from_be(sin6.sin6_port),
                )));
            }
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
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

/// How the kernel steers the datagrams arriving on one port between the three sockets
/// of its SO_REUSEPORT group (see [`UdpSocket::bind_steered`]).
#[derive(Debug, Clone)]
pub struct Steering {
    /// First byte of the datagrams for the data socket.
    pub data_first_byte: u8,
    /// Datagrams for the proof socket: each rule names a first byte, an exact length,
    /// and the offset of a 16-byte field that must not be all zeros. Everything else
    /// goes to the handshake socket.
    pub proof: Vec<ProofRule>,
}

#[derive(Debug, Clone, Copy)]
pub struct ProofRule {
    pub first_byte: u8,
    pub len: u32,
    pub field: u32,
}

/// Where a steering instruction jumps.
#[derive(Clone, Copy, PartialEq)]
enum To {
    Next,
    Data,
    Handshake,
    Proof,
    Rule(usize),
}

/// Socket indices in the group, in the order the sockets joined it.
const DATA: u32 = 0;
const HANDSHAKE: u32 = 1;
const PROOF: u32 = 2;

/// The classic BPF program for `steering`. The kernel runs it with the UDP payload at
/// offset 0 and the payload's length as the packet length; a load past the end would
/// end the program with 0, the data socket, which is why a rule checks the length
/// before it loads its field. Layout: dispatch on the first byte, then one block per
/// rule, then the three returns.
fn steering_program(steering: &Steering) -> Vec<libc::sock_filter> {
    use libc::{BPF_ABS, BPF_B, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_LEN, BPF_RET, BPF_W};
    let jeq = BPF_JMP | BPF_JEQ | BPF_K;
    let mut code: Vec<(u32, u32, To, To)> = vec![
        (BPF_LD | BPF_B | BPF_ABS, 0, To::Next, To::Next),
        (jeq, steering.data_first_byte.into(), To::Data, To::Next),
    ];
    for (i, r) in steering.proof.iter().enumerate() {
        code.push((jeq, r.first_byte.into(), To::Rule(i), To::Next));
    }
    code.push((BPF_RET | BPF_K, HANDSHAKE, To::Next, To::Next));
    let mut starts = Vec::new();
    for r in &steering.proof {
        starts.push(code.len());
        code.push((BPF_LD | BPF_W | BPF_LEN, 0, To::Next, To::Next));
        code.push((jeq, r.len, To::Next, To::Handshake));
        for word in 0..4 {
            code.push((
                BPF_LD | BPF_W | BPF_ABS,
                r.field + 4 * word,
                To::Next,
                To::Next,
            ));
            code.push((jeq, 0, To::Next, To::Proof));
        }
        code.push((BPF_RET | BPF_K, HANDSHAKE, To::Next, To::Next));
    }
    let returns = code.len();
    for index in [DATA, HANDSHAKE, PROOF] {
        code.push((BPF_RET | BPF_K, index, To::Next, To::Next));
    }
    let target = |to: To, at: usize| -> u8 {
        let abs = match to {
            To::Next => at + 1,
            To::Data => returns,
            To::Handshake => returns + 1,
            To::Proof => returns + 2,
            To::Rule(i) => starts[i],
        };
        // Jumps are forward and relative to the next instruction; the program is a few
        // dozen instructions, well within a jump's 8 bits.
        (abs - at - 1) as u8
    };
    code.iter()
        .enumerate()
        .map(|(at, &(c, k, jt, jf))| libc::sock_filter {
            code: c as u16,
            jt: target(jt, at),
            jf: target(jf, at),
            k,
        })
        .collect()
}

/// Installs the steering program on the SO_REUSEPORT group `fd` belongs to.
fn attach_steering(fd: RawFd, steering: &Steering) -> io::Result<()> {
    let program = steering_program(steering);
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: fprog points at `program`, which outlives the call; the kernel copies it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const _ as *const libc::c_void,
            size_of::<libc::sock_fprog>() as _,
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

impl UdpSocket {
    /// Binds a non-blocking UDP socket on the wildcard address of one family.
    pub fn bind(v6: bool, port: u16) -> io::Result<UdpSocket> {
        Self::open(v6, port, false)
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
        let port = Self::open(v6, port, false)?.local_port()?;
        let data = Self::open(v6, port, true)?;
        let others = Self::open(v6, port, true).and_then(|handshake| {
            let proof = Self::open(v6, port, true)?;
            attach_steering(data.fd(), steering)?;
            Ok((handshake, proof))
        });
        Ok((data, others))
    }

    fn open(v6: bool, port: u16, reuse_port: bool) -> io::Result<UdpSocket> {
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
        } else {
            setsockopt_int(raw, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?;
        }
        // Forced sizes need CAP_NET_ADMIN; fall back to the capped ones without it.
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if setsockopt_int(raw, libc::SOL_SOCKET, force, SOCKET_BUFFER).is_err() {
                let _ = setsockopt_int(raw, libc::SOL_SOCKET, plain, SOCKET_BUFFER);
            }
        }
        let addr = if v6 {
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
        } else {
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
        };
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
            let hdr = &batch.hdrs[i];
            batch.segs[i] = 0;
            // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG macros walk
            // only within that buffer.
            batch.locals[i] = unsafe { local_of(&hdr.msg_hdr) };
            // SAFETY: as above.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&hdr.msg_hdr);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                        let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                        batch.segs[i] = v.max(0) as usize;
                    }
                    c = libc::CMSG_NXTHDR(&hdr.msg_hdr, c);
                }
            }
        }
        batch.got = got;
        Ok(got)
    }

    /// Sends each `(payload, destination)` from `src` (None: the route's choice);
    /// returns how many the kernel took. A full send buffer is waited out
    /// (backpressure for the data path); an unreachable destination fails only its own
    /// datagram. Stops at the first other failure.
    pub fn send_batch(
        &self,
        msgs: &[(&[u8], SocketAddr)],
        src: Option<LocalAddr>,
    ) -> io::Result<usize> {
        let msgs: Vec<_> = msgs.iter().map(|(p, d)| (*p, *d, src)).collect();
        self.send_mmsg(&msgs, true)
    }

    /// Sends each `(payload, destination, source)`, never waiting: what does not fit in
    /// the send buffer is dropped. For answers that are worthless late (cookie
    /// replies), each from the address its question arrived at.
    pub fn try_send_replies(
        &self,
        msgs: &[(&[u8], SocketAddr, Option<LocalAddr>)],
    ) -> io::Result<usize> {
        self.send_mmsg(msgs, false)
    }

    fn send_mmsg(
        &self,
        msgs: &[(&[u8], SocketAddr, Option<LocalAddr>)],
        wait_for_room: bool,
    ) -> io::Result<usize> {
        // `next` is the first datagram not yet handed to the kernel; `accepted` counts
        // only those the kernel took, not those skipped after a failure of their own.
        let (mut next, mut accepted) = (0, 0);
        let mut names: Vec<_> = msgs
            .iter()
            .map(|(_, dst, _)| to_sockaddr(&self.map_destination(dst)))
            .collect();
        let mut controls: Vec<SendControl> = vec![[0; 8]; msgs.len()];
        // SAFETY: zeroed iovec/mmsghdr are valid initial values.
        let mut iovs: Vec<libc::iovec> = vec![unsafe { zeroed() }; msgs.len()];
        let mut hdrs: Vec<libc::mmsghdr> = vec![unsafe { zeroed() }; msgs.len()];
        for (i, (payload, _, src)) in msgs.iter().enumerate() {
            iovs[i] = libc::iovec {
                iov_base: payload.as_ptr() as *mut _,
                iov_len: payload.len(),
            };
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut names[i].0 as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = names[i].1;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            if let Some(src) = src.filter(|s| s.ip.is_ipv6() == self.v6) {
                h.msg_controllen = put_source(&mut controls[i], 0, &src) as _;
                h.msg_control = controls[i].as_mut_ptr().cast();
            }
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
                    next += k as usize;
                    accepted += k as usize;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !wait_for_room => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait_writable(),
                // The source address is no longer ours (it was just removed): send it
                // from the route's choice instead. The owner of the source learns of the
                // removal from rtnetlink and stops asking for it.
                Err(e) if source_refused(&e) && !hdrs[next].msg_hdr.msg_control.is_null() => {
                    hdrs[next].msg_hdr.msg_control = std::ptr::null_mut();
                    hdrs[next].msg_hdr.msg_controllen = 0;
                }
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
    /// from `src` (None: the route's choice). The pieces are gathered straight from the
    /// caller's buffers (no copy here); they need not be datagram-aligned. At most
    /// [`GSO_MAX_SEGMENTS`] pieces and [`GSO_MAX_BYTES`] in all. Returns false, having
    /// sent nothing, if the kernel refuses segmentation offload; the socket then stops
    /// trying it.
    pub fn send_segmented(
        &self,
        dgrams: &[&[u8]],
        segment: u16,
        dst: &SocketAddr,
        src: Option<LocalAddr>,
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
        let mut control: SendControl = [0; 8];
        let mut iovs = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; GSO_MAX_SEGMENTS];
        for (iov, d) in iovs.iter_mut().zip(dgrams) {
            iov.iov_base = d.as_ptr() as *mut _;
            iov.iov_len = d.len();
        }
        let segment_only = put_cmsg(
            bytemuck_u64(&mut control),
            0,
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            &segment.to_ne_bytes(),
        );
        let mut with_source = segment_only;
        if let Some(src) = src.filter(|s| s.ip.is_ipv6() == self.v6) {
            with_source = put_source(&mut control, segment_only, &src);
        }
        // SAFETY: zeroed msghdr is valid; every pointer set below refers to live locals.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = &ss as *const _ as *mut _;
        msg.msg_namelen = len;
        msg.msg_iov = iovs.as_mut_ptr();
        msg.msg_iovlen = dgrams.len() as _;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = with_source as _;
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
                _ if source_refused(&e) && msg.msg_controllen as usize > segment_only => {
                    msg.msg_controllen = segment_only as _;
                }
                // No offload on this path or kernel: remember and let the caller fall back.
                Some(libc::EIO)
                | Some(libc::EINVAL)
                | Some(libc::ENOPROTOOPT)
                | Some(libc::EOPNOTSUPP) => {
                    self.gso.store(false, std::sync::atomic::Ordering::Relaxed);
                    return Ok(false);
                }
                _ => return Err(e),
            }
        }
    }

    /// Sends one datagram, from the route's choice of source.
    pub fn send_to(&self, payload: &[u8], dst: &SocketAddr) -> io::Result<usize> {
        self.send_from(payload, dst, None)
    }

    /// Sends one datagram from `src` (None: the route's choice), without waiting for
    /// room in the send buffer.
    pub fn send_from(
        &self,
        payload: &[u8],
        dst: &SocketAddr,
        src: Option<LocalAddr>,
    ) -> io::Result<usize> {
        let (ss, len) = to_sockaddr(&self.map_destination(dst));
        let mut control: SendControl = [0; 8];
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
        if let Some(src) = src.filter(|s| s.ip.is_ipv6() == self.v6) {
            msg.msg_controllen = put_source(&mut control, 0, &src) as _;
            msg.msg_control = control.as_mut_ptr().cast();
        }
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
                _ if source_refused(&e) && !msg.msg_control.is_null() => {
                    msg.msg_control = std::ptr::null_mut();
                    msg.msg_controllen = 0;
                }
                _ => return Err(e),
            }
        }
    }
}

/// Everything one `recvmmsg` needs, allocated once per reader thread: the buffers and
/// the per-message headers, names and control space that point into them. Allocating
/// and zeroing those headers on every call cost about 3.5 KiB of calloc per receive.
///
/// Invariant: the headers hold pointers into the other vectors' heap storage, which is
/// never resized after `new`, so moving a `RecvBatch` keeps them valid.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    controls: Vec<RecvControl>,
    hdrs: Vec<libc::mmsghdr>,
    segs: Vec<usize>,
    locals: Vec<Option<LocalAddr>>,
    got: usize,
}

/// Control space for one received message: a `UDP_GRO` int and an `in6_pktinfo`
/// (the larger of the two source forms), each with its header.
type RecvControl = [u64; 8];

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
    fn reset_headers(&mut self) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_roundtrip_on_loopback() {
        let a = UdpSocket::bind(false, 0).unwrap();
        let b = UdpSocket::bind(false, 0).unwrap();
        let dst = SocketAddr::from(([127, 0, 0, 1], b.local_port().unwrap()));
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + i as usize]).collect();
        let msgs: Vec<(&[u8], SocketAddr)> = payloads.iter().map(|p| (p.as_slice(), dst)).collect();
        assert_eq!(a.send_batch(&msgs, None).unwrap(), 10);
        let mut batch = RecvBatch::new(4, 2048);
        let mut got: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        // Four buffers for ten datagrams: the headers are reused across receives.
        while got.len() < 10 && std::time::Instant::now() < deadline {
            match b.recv_batch(&mut batch) {
                Ok(n) => got.extend((0..n).map(|i| {
                    let r = batch.datagram(i).unwrap();
                    (r.data.to_vec(), r.src)
                })),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got.len(), 10);
        for (i, (d, src)) in got.iter().enumerate() {
            assert_eq!(d, &payloads[i]);
            assert_eq!(src.port(), a.local_port().unwrap());
        }
    }

    /// Replies leave from the address the question arrived at (any 127/8 address is
    /// local on lo); a source that is not local falls back to the route's choice.
    #[test]
    fn replies_leave_from_the_address_asked() {
        let a = UdpSocket::bind(false, 0).unwrap();
        let b = UdpSocket::bind(false, 0).unwrap();
        let asked = Ipv4Addr::new(127, 0, 0, 2);
        let to_b = SocketAddr::from((asked, b.local_port().unwrap()));
        a.send_to(b"question", &to_b).unwrap();
        let mut batch = RecvBatch::new(4, 2048);
        let recv_one = |sock: &UdpSocket, batch: &mut RecvBatch| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while std::time::Instant::now() < deadline {
                if let Ok(1) = sock.recv_batch(batch) {
                    let r = batch.datagram(0).unwrap();
                    return (r.src, r.local);
                }
                std::thread::yield_now();
            }
            panic!("nothing received");
        };
        let (from_a, local) = recv_one(&b, &mut batch);
        let local = local.expect("IP_PKTINFO reports the local end");
        assert_eq!(local.ip, IpAddr::V4(asked));
        assert!(local.ifindex > 0);
        b.send_from(b"answer", &from_a, Some(local)).unwrap();
        assert_eq!(recv_one(&a, &mut batch).0, to_b);
        // The same through the batched and segmented paths.
        b.send_batch(&[(b"answer", from_a)], Some(local)).unwrap();
        assert_eq!(recv_one(&a, &mut batch).0, to_b);
        if b.send_segmented(&[b"ab", b"cd"], 2, &from_a, Some(local))
            .unwrap()
        {
            assert_eq!(recv_one(&a, &mut batch).0, to_b);
            while a.recv_batch(&mut batch).is_ok_and(|n| n > 0) {}
        }
        // A source that is not ours is refused by the kernel; the datagram still goes.
        let gone = LocalAddr {
            ip: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 99)),
            ifindex: 0,
        };
        b.send_from(b"answer", &from_a, Some(gone)).unwrap();
        assert_eq!(
            recv_one(&a, &mut batch).0.ip(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        b.send_batch(&[(b"answer", from_a)], Some(gone)).unwrap();
        assert_eq!(
            recv_one(&a, &mut batch).0.ip(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert!(
            b.send_segmented(&[b"ab", b"cd"], 2, &from_a, Some(gone))
                .unwrap()
                || !b.gso_enabled()
        );
    }

    #[test]
    fn segmented_send_arrives_as_separate_datagrams() {
        let a = UdpSocket::bind(false, 0).unwrap();
        let b = UdpSocket::bind(false, 0).unwrap();
        let dst = SocketAddr::from(([127, 0, 0, 1], b.local_port().unwrap()));
        let pieces: Vec<Vec<u8>> = (0..5u8)
            .map(|i| vec![i; if i == 4 { 300 } else { 1000 }])
            .collect();
        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        if !a.send_segmented(&refs, 1000, &dst, None).unwrap() {
            assert!(!a.gso_enabled());
            return; // Kernel without UDP GSO: the fallback path is what callers use.
        }
        let mut batch = RecvBatch::new(8, 65536);
        // With UDP_GRO the five may arrive as one coalesced buffer; split them back.
        let mut dgrams: Vec<Vec<u8>> = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while dgrams.len() < 5 && std::time::Instant::now() < deadline {
            if let Ok(n) = b.recv_batch(&mut batch) {
                for i in 0..n {
                    let r = batch.datagram(i).unwrap();
                    let step = if r.segment > 0 {
                        r.segment
                    } else {
                        r.data.len().max(1)
                    };
                    dgrams.extend(r.data.chunks(step).map(<[u8]>::to_vec));
                }
            }
        }
        assert_eq!(dgrams.len(), 5);
        for (i, d) in dgrams.iter().enumerate() {
            assert_eq!(d.len(), if i == 4 { 300 } else { 1000 });
            assert!(d.iter().all(|x| *x == i as u8));
        }
    }

    /// Receives until `want` datagrams came or 2 s passed.
    fn receive(sock: &UdpSocket, want: usize) -> Vec<Vec<u8>> {
        let mut batch = RecvBatch::new(8, 2048);
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while got.len() < want && std::time::Instant::now() < deadline {
            match sock.recv_batch(&mut batch) {
                Ok(n) => got.extend((0..n).map(|i| batch.datagram(i).unwrap().data.to_vec())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        got
    }

    #[test]
    fn steered_group_splits_data_handshakes_and_proofs_and_keeps_its_port() {
        // WireGuard's shapes: data is type 4; a type 1 of 148 bytes or a type 2 of 92
        // bytes carries its proof (mac2) in its last 16 bytes.
        let steering = Steering {
            data_first_byte: 4,
            proof: vec![
                ProofRule {
                    first_byte: 1,
                    len: 148,
                    field: 132,
                },
                ProofRule {
                    first_byte: 2,
                    len: 92,
                    field: 76,
                },
            ],
        };
        let (data, others) = UdpSocket::bind_steered(false, 0, &steering).unwrap();
        let (handshake, proof) = others.expect("this kernel steers SO_REUSEPORT groups");
        let port = data.local_port().unwrap();
        assert_eq!(handshake.local_port().unwrap(), port);
        assert_eq!(proof.local_port().unwrap(), port);
        // The port is taken for anyone else, steered or not.
        let in_use = |r: io::Result<()>| r.unwrap_err().raw_os_error() == Some(libc::EADDRINUSE);
        assert!(in_use(UdpSocket::bind(false, port).map(drop)));
        assert!(in_use(
            UdpSocket::bind_steered(false, port, &steering).map(drop)
        ));

        let client = UdpSocket::bind(false, 0).unwrap();
        let dst = SocketAddr::from(([127, 0, 0, 1], port));
        let message = |kind: u8, len: usize, proof_byte: Option<usize>| {
            let mut m = vec![0u8; len];
            m[0] = kind;
            m[1] = 0xaa; // nonzero outside the proof field
            if let Some(at) = proof_byte {
                m[at] = 1;
            }
            m
        };
        let msgs: Vec<Vec<u8>> = vec![
            vec![4, 0, 0, 0, 1],        // 0 data
            message(1, 148, None),      // 1 initiation without a proof
            message(1, 148, Some(147)), // 2 initiation, proof in its last byte
            vec![4, 0, 0, 0, 3],        // 3 data
            message(2, 92, Some(76)),   // 4 response, proof in its first byte
            message(2, 92, None),       // 5 response without a proof
            message(1, 147, Some(140)), // 6 a type 1 of the wrong length
            message(1, 148, Some(131)), // 7 nonzero just before the proof field
            message(3, 64, Some(63)),   // 8 cookie reply
            vec![],                     // 9 empty
            vec![9],                    // 10 unknown type
        ];
        let batch: Vec<(&[u8], SocketAddr)> = msgs.iter().map(|m| (&m[..], dst)).collect();
        assert_eq!(client.send_batch(&batch, None).unwrap(), msgs.len());
        let pick = |idx: &[usize]| idx.iter().map(|&i| msgs[i].clone()).collect::<Vec<_>>();
        // Type 4 and the empty datagram to the data socket, in order; the rest aside.
        assert_eq!(receive(&data, 3), pick(&[0, 3, 9]));
        assert_eq!(receive(&proof, 2), pick(&[2, 4]));
        assert_eq!(receive(&handshake, 6), pick(&[1, 5, 6, 7, 8, 10]));
        let drops = [&data, &handshake, &proof].map(|s| s.drops().unwrap());
        assert_eq!(drops, [0, 0, 0]);
    }
}
