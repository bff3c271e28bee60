//! The local end of a datagram, the control messages that carry it, and socket
//! addresses in the kernel's form.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// The local end of a received datagram: the address it was sent to and the interface
/// it arrived on (`IP_PKTINFO` / `IPV6_PKTINFO`). Sending with it as the source answers
/// from the address the peer chose, as the kernel's WireGuard does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalAddr {
    pub ip: IpAddr,
    pub ifindex: u32,
}

/// Control space for one send: a `UDP_SEGMENT`, an outer ECN field and a source, each
/// with its header (24 + 24 + 40 bytes at most).
pub(super) type SendControl = [u64; 12];

/// The ECN field of a datagram sent with no ECN control message: Not-ECT.
pub const NOT_ECT: u8 = 0;

/// Appends the outer header's ECN field (`IP_TOS` / `IPV6_TCLASS`, the DSCP left 0) at
/// `at` in `control` unless it is Not-ECT, the socket's default; returns the new end.
/// Put before the source: a send that drops a refused source keeps it.
fn put_ecn(control: &mut SendControl, at: usize, v6: bool, ecn: u8) -> usize {
    if ecn & 0b11 == NOT_ECT {
        return at;
    }
    let (level, kind) = match v6 {
        true => (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
        false => (libc::IPPROTO_IP, libc::IP_TOS),
    };
    let value = libc::c_int::from(ecn & 0b11);
    put_cmsg(bytemuck_u64(control), at, level, kind, &value.to_ne_bytes())
}

/// Appends the outer ECN field and then the source (when it is of the socket's family)
/// at `at` in `control`, and points `h` at the control data if there is any. Returns
/// where the source begins: the length that stays when it is dropped
/// ([`drop_source`]).
pub(super) fn put_outer(
    h: &mut libc::msghdr,
    control: &mut SendControl,
    at: usize,
    v6: bool,
    ecn: u8,
    src: Option<LocalAddr>,
) -> usize {
    let keep = put_ecn(control, at, v6, ecn);
    let end = match src.filter(|s| s.ip.is_ipv6() == v6) {
        Some(src) => put_source(control, keep, &src),
        None => keep,
    };
    if end > 0 {
        h.msg_control = control.as_mut_ptr().cast();
        h.msg_controllen = end as _;
    }
    keep
}

/// Drops the source from `h`'s control data, keeping the first `keep` bytes (see
/// [`put_outer`]); false if it had none to drop.
pub(super) fn drop_source(h: &mut libc::msghdr, keep: usize) -> bool {
    if h.msg_controllen <= keep as _ {
        return false;
    }
    h.msg_controllen = keep as _;
    if keep == 0 {
        h.msg_control = std::ptr::null_mut();
    }
    true
}

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
pub(super) fn put_cmsg(
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
pub(super) fn source_refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENETUNREACH))
}

/// The bytes of a u64-aligned control buffer.
pub(super) fn bytemuck_u64(c: &mut SendControl) -> &mut [u8] {
    // SAFETY: any bytes are valid u64s and vice versa; the length is the array's.
    unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr().cast(), size_of::<SendControl>()) }
}

/// Whether control message `c` carries at least `len` bytes of data.
///
/// # Safety
/// `c` must point at a control message header the kernel filled.
pub(super) unsafe fn holds(c: *const libc::cmsghdr, len: usize) -> bool {
    (*c).cmsg_len >= libc::CMSG_LEN(len as u32) as usize
}

/// The local end, if `c` is a packet-info control message.
///
/// # Safety
/// `c` must point at a control message header the kernel filled, followed by its data.
pub(super) unsafe fn local_of(c: *const libc::cmsghdr) -> Option<LocalAddr> {
    let data = libc::CMSG_DATA(c);
    match ((*c).cmsg_level, (*c).cmsg_type) {
        (libc::IPPROTO_IP, libc::IP_PKTINFO) if holds(c, size_of::<libc::in_pktinfo>()) => {
            let p = std::ptr::read_unaligned(data as *const libc::in_pktinfo);
            Some(LocalAddr {
                ip: IpAddr::V4(Ipv4Addr::from(p.ipi_addr.s_addr.to_ne_bytes())),
                ifindex: p.ipi_ifindex as u32,
            })
        }
        (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if holds(c, size_of::<libc::in6_pktinfo>()) => {
            let p = std::ptr::read_unaligned(data as *const libc::in6_pktinfo);
            Some(LocalAddr {
                ip: IpAddr::V6(Ipv6Addr::from(p.ipi6_addr.s6_addr)),
                ifindex: p.ipi6_ifindex,
            })
        }
        _ => None,
    }
}

pub(super) fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
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

pub(super) fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
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
