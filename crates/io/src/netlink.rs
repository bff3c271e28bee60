//! Route netlink (rtnetlink), for the few questions a tunnel asks the kernel about the
//! hosts' network rather than about its own packets:
//!
//! - where its TUN device lives and what its MTU is, after `ip link set wg0 netns X`
//!   moved it away from the sockets (links are queried in any namespace with
//!   `IFLA_TARGET_NETNSID`);
//! - the device's addresses (the source of ICMP errors it writes back);
//! - the routes through it that carry their own MTU (padding follows them);
//! - which device a route from a given source takes (a sticky source is dropped when
//!   another route takes over, as the kernel's `src_if4` check does);
//! - and, through a [`Monitor`], when any of that may have changed.
//!
//! Messages are built and parsed by hand: a handful of fixed headers and attributes,
//! not worth a dependency. Every reply is bounds-checked; a malformed one is an error.

use crate::cvt;
use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

const NLMSG_HDR: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_NEWRULE: u16 = 32;
const RTM_DELRULE: u16 = 33;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNSID: u16 = 88;
const RTM_GETNSID: u16 = 90;

const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_TARGET_NETNSID: u16 = 46;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_TARGET_NETNSID: u16 = 10;
const RTA_DST: u16 = 1;
const RTA_SRC: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_METRICS: u16 = 8;
const RTA_TABLE: u16 = 15;
const RTA_MARK: u16 = 16;
const RTA_IP_PROTO: u16 = 27;
const RTA_SPORT: u16 = 28;
const RTA_DPORT: u16 = 29;
const RTAX_MTU: u16 = 2;
const RTM_F_LOOKUP_TABLE: u32 = 0x1000;
const NETNSA_NSID: u16 = 1;
const NETNSA_FD: u16 = 3;
const NETNSA_NSID_NOT_ASSIGNED: i32 = -1;

const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV4_ROUTE: u32 = 0x40;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;
const RTMGRP_IPV6_ROUTE: u32 = 0x400;
/// Policy rules' groups (RTNLGRP_IPV4_RULE 8, RTNLGRP_IPV6_RULE 19).
const RTMGRP_IPV4_RULE: u32 = 1 << (8 - 1);
const RTMGRP_IPV6_RULE: u32 = 1 << (19 - 1);
const SOL_NETLINK: libc::c_int = 270;
const NETLINK_LISTEN_ALL_NSID: libc::c_int = 8;
const NETLINK_GET_STRICT_CHK: libc::c_int = 12;

/// Sizes of the fixed headers after `nlmsghdr`.
const IFINFOMSG: usize = 16;
const IFADDRMSG: usize = 8;
const RTMSG: usize = 12;
const RTGENMSG: usize = 4;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn malformed() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "malformed netlink reply")
}

/// A request under construction: header, fixed part, attributes.
struct Request(Vec<u8>);

impl Request {
    fn new(kind: u16, flags: u16, fixed: &[u8]) -> Request {
        let mut b = vec![0u8; NLMSG_HDR];
        b[4..6].copy_from_slice(&kind.to_ne_bytes());
        b[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        b.extend_from_slice(fixed);
        b.resize(align4(b.len()), 0);
        Request(b)
    }

    fn attr(mut self, kind: u16, data: &[u8]) -> Request {
        let len = 4 + data.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(data);
        self.0.resize(align4(self.0.len()), 0);
        self
    }

    fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[0..4].copy_from_slice(&len.to_ne_bytes());
        self.0[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.0
    }
}

/// The attributes of one message (or of a nested attribute), in order.
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff; // without NLA_F_ flags
        if len < 4 || len > b.len() {
            return None;
        }
        let data = &b[4..len];
        b = &b[align4(len).min(b.len())..];
        Some((kind, data))
    })
}

fn u32_of(d: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(d.get(..4)?.try_into().ok()?))
}

fn ip_of(d: &[u8]) -> Option<IpAddr> {
    match d.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(d).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(d).ok()?))),
        _ => None,
    }
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn family(ip: &IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

/// One message of a received buffer.
struct Message<'a> {
    kind: u16,
    seq: u32,
    body: &'a [u8],
}

/// Splits a receive buffer into its messages.
fn messages(mut b: &[u8]) -> impl Iterator<Item = io::Result<Message<'_>>> {
    std::iter::from_fn(move || {
        if b.len() < NLMSG_HDR {
            return None;
        }
        let len = u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize;
        if len < NLMSG_HDR || len > b.len() {
            b = &[];
            return Some(Err(malformed()));
        }
        let m = Message {
            kind: u16::from_ne_bytes([b[4], b[5]]),
            seq: u32::from_ne_bytes(b[8..12].try_into().unwrap()),
            body: &b[NLMSG_HDR..len],
        };
        b = &b[align4(len).min(b.len())..];
        Some(Ok(m))
    })
}

fn socket(groups: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; result checked.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    })?;
    // SAFETY: fresh descriptor, exclusively ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain data; zero is valid.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    sa.nl_groups = groups;
    // SAFETY: sa is a valid sockaddr_nl of the given length.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sa as *const _ as *const libc::sockaddr,
            size_of::<libc::sockaddr_nl>() as _,
        )
    })?;
    Ok(fd)
}

fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    loop {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One link as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub ifindex: u32,
    pub mtu: u32,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
}

/// A route, as much of it as a tunnel asks about: where to, by which device, in which
/// table, and its own MTU if it has one (`ip route add … mtu N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub dst: IpAddr,
    pub prefix_len: u8,
    pub table: u32,
    pub oif: u32,
    pub mtu: Option<u32>,
}

/// A request socket: one question at a time, answered synchronously.
pub struct Rtnl {
    fd: OwnedFd,
    seq: AtomicU32,
}

impl Rtnl {
    pub fn open() -> io::Result<Rtnl> {
        let fd = socket(0)?;
        // Dump filters (an RTA_OIF in a route dump) are honoured only with strict
        // checking; without it (kernels before 4.20) dumps are filtered here instead.
        let one: libc::c_int = 1;
        // SAFETY: a c_int option of its exact size.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                SOL_NETLINK,
                NETLINK_GET_STRICT_CHK,
                &one as *const _ as *const libc::c_void,
                size_of::<libc::c_int>() as _,
            )
        };
        Ok(Rtnl {
            fd,
            seq: AtomicU32::new(1),
        })
    }

    /// Sends one request and collects the bodies of its answers (every part of a dump)
    /// with their types. A netlink error becomes the matching `io::Error`.
    fn ask(&self, req: Request) -> io::Result<Vec<(u16, Vec<u8>)>> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let msg = req.finish(seq);
        // SAFETY: msg is valid for reads of its length; the kernel is the destination
        // (a zero sockaddr_nl, the default of an unconnected netlink socket's send).
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut buf, 0)?;
            let mut finished = false;
            for m in messages(&buf[..n]) {
                let m = m?;
                // Left over from an earlier question that ended in an error.
                if m.seq != seq {
                    continue;
                }
                let body = m.body;
                match m.kind {
                    NLMSG_DONE => finished = true,
                    NLMSG_ERROR => {
                        let code = body.get(..4).ok_or_else(malformed)?;
                        let code = i32::from_ne_bytes(code.try_into().unwrap());
                        if code != 0 {
                            return Err(io::Error::from_raw_os_error(-code));
                        }
                        finished = true; // an ACK
                    }
                    kind => out.push((kind, body.to_vec())),
                }
            }
            // A dump ends with DONE; a single answer is one datagram.
            if finished || !out.is_empty() && !is_multipart(&buf[..n]) {
                return Ok(out);
            }
        }
    }

    /// The link named `name`, in this namespace (`target` None) or in the one with
    /// that namespace id.
    pub fn link(&self, target: Option<i32>, name: &str) -> io::Result<Link> {
        let mut name_z = name.as_bytes().to_vec();
        name_z.push(0);
        let mut req = Request::new(RTM_GETLINK, 0, &[0u8; IFINFOMSG]).attr(IFLA_IFNAME, &name_z);
        if let Some(id) = target {
            req = req.attr(IFLA_TARGET_NETNSID, &id.to_ne_bytes());
        }
        let answers = self.ask(req)?;
        let (_, body) = answers
            .iter()
            .find(|(k, _)| *k == RTM_NEWLINK)
            .ok_or_else(malformed)?;
        parse_link(body).ok_or_else(malformed)
    }

    /// The addresses of interface `ifindex` (None: of every interface), in this
    /// namespace or `target`'s.
    pub fn addresses(&self, target: Option<i32>, ifindex: Option<u32>) -> io::Result<Vec<IpAddr>> {
        let mut req = Request::new(RTM_GETADDR, NLM_F_DUMP, &[0u8; IFADDRMSG]);
        if let Some(id) = target {
            req = req.attr(IFA_TARGET_NETNSID, &id.to_ne_bytes());
        }
        let mut out = Vec::new();
        for (kind, body) in self.ask(req)? {
            if kind != RTM_NEWADDR || body.len() < IFADDRMSG {
                continue;
            }
            if ifindex.is_some_and(|i| u32_of(&body[4..8]) != Some(i)) {
                continue;
            }
            // IFA_LOCAL is the address itself on point-to-point links, where
            // IFA_ADDRESS is the far end; elsewhere only IFA_ADDRESS is present.
            let mut local = None;
            let mut address = None;
            for (k, d) in attrs(&body[IFADDRMSG..]) {
                match k {
                    IFA_LOCAL => local = ip_of(d),
                    IFA_ADDRESS => address = ip_of(d),
                    _ => {}
                }
            }
            out.extend(local.or(address));
        }
        Ok(out)
    }

    /// The routes of this namespace through `ifindex` that carry an MTU metric. The
    /// kernel filters the dump by device (strict checking), so a host with a full
    /// routing table answers with a few routes, not all of them.
    pub fn mtu_routes(&self, ifindex: u32) -> io::Result<Vec<Route>> {
        let mut out = Vec::new();
        for fam in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            let mut fixed = [0u8; RTMSG];
            fixed[0] = fam;
            let req = Request::new(RTM_GETROUTE, NLM_F_DUMP, &fixed)
                .attr(RTA_OIF, &ifindex.to_ne_bytes());
            for (kind, body) in self.ask(req)? {
                if kind != RTM_NEWROUTE {
                    continue;
                }
                out.extend(parse_route(&body).filter(|r| r.oif == ifindex && r.mtu.is_some()));
            }
        }
        Ok(out)
    }

    /// The output device of the route for a UDP datagram from `src`, port `sport`, to
    /// `dst`, port `dport`, under `mark`, as the kernel would choose it for a socket
    /// sending with that source. The protocol and ports are part of the question
    /// (Linux 4.17+), so policy rules that select on them (`ip rule ... ipproto udp
    /// sport 51820`, a common multi-WAN recipe) are followed as the send will follow
    /// them. An error (EINVAL for a source no longer local, ENETUNREACH) means the
    /// source cannot be used.
    pub fn route_oif(
        &self,
        dst: IpAddr,
        src: IpAddr,
        (sport, dport): (u16, u16),
        mark: u32,
    ) -> io::Result<u32> {
        let mut fixed = [0u8; RTMSG];
        fixed[0] = family(&dst);
        fixed[1] = if dst.is_ipv4() { 32 } else { 128 };
        fixed[2] = fixed[1];
        fixed[8..12].copy_from_slice(&RTM_F_LOOKUP_TABLE.to_ne_bytes());
        let mut req = Request::new(RTM_GETROUTE, 0, &fixed)
            .attr(RTA_DST, &ip_bytes(&dst))
            .attr(RTA_SRC, &ip_bytes(&src))
            .attr(RTA_IP_PROTO, &[libc::IPPROTO_UDP as u8])
            .attr(RTA_SPORT, &sport.to_be_bytes())
            .attr(RTA_DPORT, &dport.to_be_bytes());
        if mark != 0 {
            req = req.attr(RTA_MARK, &mark.to_ne_bytes());
        }
        let answers = self.ask(req)?;
        let (_, body) = answers
            .iter()
            .find(|(k, _)| *k == RTM_NEWROUTE)
            .ok_or_else(malformed)?;
        let oif = attrs(body.get(RTMSG..).ok_or_else(malformed)?)
            .find(|(k, _)| *k == RTA_OIF)
            .and_then(|(_, d)| u32_of(d));
        oif.ok_or_else(malformed)
    }

    /// The id this namespace gives the namespace `netns`, assigning one if it has
    /// none yet (needs CAP_NET_ADMIN). Events from a namespace reach a
    /// [`Monitor`] only once it has an id here.
    pub fn namespace_id(&self, netns: BorrowedFd<'_>) -> io::Result<i32> {
        let fd = netns.as_raw_fd() as u32;
        let get = || -> io::Result<i32> {
            let req =
                Request::new(RTM_GETNSID, 0, &[0u8; RTGENMSG]).attr(NETNSA_FD, &fd.to_ne_bytes());
            for (kind, body) in self.ask(req)? {
                if kind != RTM_NEWNSID {
                    continue;
                }
                let id = attrs(body.get(RTGENMSG..).ok_or_else(malformed)?)
                    .find(|(k, _)| *k == NETNSA_NSID)
                    .and_then(|(_, d)| u32_of(d))
                    .ok_or_else(malformed)?;
                return Ok(id as i32);
            }
            Err(malformed())
        };
        let id = get()?;
        if id != NETNSA_NSID_NOT_ASSIGNED {
            return Ok(id);
        }
        let req = Request::new(RTM_NEWNSID, NLM_F_ACK, &[0u8; RTGENMSG])
            .attr(NETNSA_FD, &fd.to_ne_bytes())
            .attr(NETNSA_NSID, &NETNSA_NSID_NOT_ASSIGNED.to_ne_bytes());
        match self.ask(req) {
            // Another process may have assigned one meanwhile.
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e),
        }
        match get()? {
            NETNSA_NSID_NOT_ASSIGNED => Err(io::Error::other("no namespace id was assigned")),
            id => Ok(id),
        }
    }
}

/// Whether any message in a received buffer is part of a multipart (dump) answer.
fn is_multipart(b: &[u8]) -> bool {
    b.len() >= NLMSG_HDR && u16::from_ne_bytes([b[6], b[7]]) & 2 != 0
}

fn parse_link(body: &[u8]) -> Option<Link> {
    // struct ifinfomsg: family, pad, type (2), index (4), flags (4), change (4).
    let ifindex = u32_of(body.get(4..8)?)?;
    let flags = u32_of(body.get(8..12)?)?;
    let mtu = attrs(body.get(IFINFOMSG..)?)
        .find(|(k, _)| *k == IFLA_MTU)
        .and_then(|(_, d)| u32_of(d))?;
    Some(Link {
        ifindex,
        mtu,
        up: flags & libc::IFF_UP as u32 != 0,
    })
}

/// Reads a route message. Routes of every kind are read; the caller keeps those it
/// cares about.
fn parse_route(body: &[u8]) -> Option<Route> {
    let fixed = body.get(..RTMSG)?;
    let mut route = Route {
        dst: if fixed[0] == libc::AF_INET as u8 {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        },
        prefix_len: fixed[1],
        table: u32::from(fixed[4]),
        oif: 0,
        mtu: None,
    };
    for (k, d) in attrs(body.get(RTMSG..)?) {
        match k {
            RTA_DST => route.dst = ip_of(d)?,
            RTA_OIF => route.oif = u32_of(d)?,
            RTA_TABLE => route.table = u32_of(d)?,
            RTA_METRICS => {
                route.mtu = attrs(d)
                    .find(|(m, _)| *m == RTAX_MTU)
                    .and_then(|(_, v)| u32_of(v))
                    .filter(|m| *m > 0)
            }
            _ => {}
        }
    }
    Some(route)
}

/// What a change notification was about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Link,
    Address,
    Route,
    /// A policy rule (`ip rule`) was added or removed.
    Rule,
    /// Notifications were lost (the socket's buffer overflowed): anything may have
    /// changed.
    Unknown,
}

/// One change notification: what changed, and in which namespace (None: the
/// monitor's own; otherwise the id the monitor's namespace gives it). Route changes
/// carry the route, and whether it went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub change: Change,
    pub nsid: Option<i32>,
    pub route: Option<(Route, bool)>,
}

/// A socket subscribed to link, address and route changes; where allowed, of every
/// namespace that has an id in ours (`NETLINK_LISTEN_ALL_NSID`), so a TUN device moved
/// to another namespace stays in view.
pub struct Monitor {
    fd: OwnedFd,
    all_namespaces: bool,
}

impl Monitor {
    /// Opens the monitor. Listening to other namespaces needs CAP_NET_BROADCAST at this
    /// moment only; without it the monitor sees its own namespace.
    pub fn open() -> io::Result<Monitor> {
        // Rules too: `ip rule` changes which route a datagram takes as surely as a
        // route does (the kernel flushes its route cache on either), and with it which
        // sticky source is still usable.
        let groups = RTMGRP_LINK
            | RTMGRP_IPV4_IFADDR
            | RTMGRP_IPV6_IFADDR
            | RTMGRP_IPV4_ROUTE
            | RTMGRP_IPV6_ROUTE
            | RTMGRP_IPV4_RULE
            | RTMGRP_IPV6_RULE;
        let fd = socket(groups)?;
        let one: libc::c_int = 1;
        // SAFETY: a c_int option of its exact size.
        let all_namespaces = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                SOL_NETLINK,
                NETLINK_LISTEN_ALL_NSID,
                &one as *const _ as *const libc::c_void,
                size_of::<libc::c_int>() as _,
            )
        } == 0;
        // SAFETY: reads the status flags of our own descriptor.
        let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
        // SAFETY: sets O_NONBLOCK on our own descriptor.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
        Ok(Monitor { fd, all_namespaces })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether notifications from other namespaces arrive too.
    pub fn all_namespaces(&self) -> bool {
        self.all_namespaces
    }

    /// Reads every pending notification without blocking.
    pub fn drain(&self) -> Vec<Event> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut control = [0u64; 8];
        loop {
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            // SAFETY: zeroed msghdr is valid; its pointers refer to live locals.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control);
            // SAFETY: msg describes valid buffers for the call.
            let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
            if n < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ENOBUFS) => {
                        out.push(Event {
                            change: Change::Unknown,
                            nsid: None,
                            route: None,
                        });
                        continue;
                    }
                    _ => return out, // EAGAIN: drained
                }
            }
            let nsid = nsid_of(&msg);
            for m in messages(&buf[..n as usize]) {
                let Ok(m) = m else { break };
                let change = match m.kind {
                    RTM_NEWLINK | RTM_DELLINK => Change::Link,
                    RTM_NEWADDR | RTM_DELADDR => Change::Address,
                    RTM_NEWROUTE | RTM_DELROUTE => Change::Route,
                    RTM_NEWRULE | RTM_DELRULE => Change::Rule,
                    _ => continue,
                };
                let route = (change == Change::Route)
                    .then(|| parse_route(m.body))
                    .flatten()
                    .map(|r| (r, m.kind == RTM_DELROUTE));
                out.push(Event {
                    change,
                    nsid,
                    route,
                });
            }
        }
    }
}

/// The namespace id carried in a notification's control message, if any.
fn nsid_of(msg: &libc::msghdr) -> Option<i32> {
    // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG macros walk only
    // within that buffer.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_NETLINK && (*c).cmsg_type == NETLINK_LISTEN_ALL_NSID {
                return Some(std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const i32));
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_parse_and_stop_at_a_bad_length() {
        let req = Request::new(RTM_GETLINK, 0, &[0u8; IFINFOMSG])
            .attr(IFLA_MTU, &1420u32.to_ne_bytes())
            .attr(IFLA_IFNAME, b"wg0\0");
        let msg = req.finish(7);
        let m = messages(&msg).next().unwrap().unwrap();
        assert_eq!((m.kind, m.seq), (RTM_GETLINK, 7));
        let body = m.body;
        let found: Vec<_> = attrs(&body[IFINFOMSG..]).collect();
        assert_eq!(
            found,
            [
                (IFLA_MTU, &1420u32.to_ne_bytes()[..]),
                (IFLA_IFNAME, &b"wg0\0"[..])
            ]
        );
        // An attribute claiming more bytes than there are ends the walk.
        let mut bad = body[IFINFOMSG..].to_vec();
        bad[0] = 200;
        assert_eq!(attrs(&bad).count(), 0);
        // A message header claiming more bytes than were received is an error.
        let mut short = msg.clone();
        short[0] = 255;
        assert!(messages(&short).next().unwrap().is_err());
    }

    #[test]
    fn loopback_is_found_and_routes_are_answered() {
        let nl = Rtnl::open().unwrap();
        let lo = nl.link(None, "lo").unwrap();
        assert!(lo.ifindex > 0 && lo.mtu > 0);
        let addrs = nl.addresses(None, Some(lo.ifindex)).unwrap();
        assert!(nl.addresses(None, None).unwrap().len() >= addrs.len());
        // lo carries no route with an MTU of its own here.
        assert!(nl.mtu_routes(lo.ifindex).is_ok());
        let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
        // A test namespace may have lo down without addresses; when it has them, the
        // route from 127.0.0.1 to itself leaves by lo.
        if addrs.contains(&local) {
            assert_eq!(nl.route_oif(local, local, (1, 2), 0).unwrap(), lo.ifindex);
        }
        assert!(nl.link(None, "no-such-link").is_err());
        let _ = Monitor::open().unwrap().drain();
    }
}
