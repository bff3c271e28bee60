//! The outer UDP sockets of one interface: per address family a data socket, and where
//! the kernel steers, a handshake and a proof socket on the same port.

use crate::ports::UdpPort;
use std::net::SocketAddr;
use std::sync::Arc;
use wirelane_io::poll::Waker;
use wirelane_io::udp::{ProofRule, Steering, UdpSocket};

/// Receive buffer of each handshake socket (see `Sockets::bind`). The kernel charges a
/// small datagram about 1 KiB and doubles the size asked for, so this holds about two
/// thousand messages: milliseconds of a flood for a release build.
pub const HANDSHAKE_SOCKET_BUFFER: usize = 1 << 20;

/// The bound UDP sockets and their settings.
#[derive(Default, Clone)]
pub struct Sockets {
    pub v4: Option<Arc<dyn UdpPort>>,
    pub v6: Option<Arc<dyn UdpPort>>,
    /// Handshake sockets, on the same port as `v4` and `v6`: the kernel steers every
    /// datagram but transport data and proven handshake messages to them
    /// (`UdpSocket::bind_steered`), so a handshake flood fills and overflows their
    /// buffers and never the data sockets'. None where the kernel refused; the data
    /// socket then receives everything. Replies leave by the data sockets, whose
    /// source port is the same.
    pub hs4: Option<Arc<dyn UdpPort>>,
    pub hs6: Option<Arc<dyn UdpPort>>,
    /// Proof sockets, beside the handshake sockets: initiations and responses whose
    /// mac2 is not zero, i.e. whose sender holds a cookie of ours. The resend that
    /// answers a cookie reply, and every initiation of a peer that holds a cookie, thus
    /// skip the queue a flood of cookie-less initiations builds on the handshake
    /// socket; a flood that fakes mac2 only fills this socket instead.
    pub proof4: Option<Arc<dyn UdpPort>>,
    pub proof6: Option<Arc<dyn UdpPort>>,
    pub port: u16,
    pub fwmark: u32,
    /// Fires once these sockets are replaced (a new listen port): each reader waits on
    /// it beside the sockets, and on seeing it moves the interface to the successors
    /// (`udp_readers`). It stays readable until the last reader lets go of it, so a
    /// reader that registers it after it fired still sees it.
    pub retired: Option<Arc<Waker>>,
}

/// Which of a family's sockets a UDP reader serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketRole {
    Data,
    Handshake,
    Proof,
}

impl SocketRole {
    pub const ALL: [SocketRole; 3] = [SocketRole::Data, SocketRole::Handshake, SocketRole::Proof];

    pub fn name(self) -> &'static str {
        match self {
            SocketRole::Data => "data",
            SocketRole::Handshake => "handshake",
            SocketRole::Proof => "proof",
        }
    }
}

/// WireGuard's shapes for the kernel's steering: transport data to the data socket,
/// initiations and responses with a non-zero mac2 (their last 16 bytes) to the proof
/// socket.
fn steering() -> Steering {
    use wirelane_proto::crypto::MAC_LEN;
    use wirelane_proto::messages::{
        INITIATION_LEN, RESPONSE_LEN, TYPE_INITIATION, TYPE_RESPONSE, TYPE_TRANSPORT,
    };
    let rule = |first_byte, len: usize| ProofRule {
        first_byte,
        len: len as u32,
        field: (len - MAC_LEN) as u32,
    };
    Steering {
        data_first_byte: TYPE_TRANSPORT,
        proof: vec![
            rule(TYPE_INITIATION, INITIATION_LEN),
            rule(TYPE_RESPONSE, RESPONSE_LEN),
        ],
    }
}

/// Whether a datagram to `dst` leaves by an IPv6 socket: an IPv4-mapped address goes
/// by the IPv4 one (the IPv6 sockets are IPv6-only).
fn sent_over_v6(dst: &SocketAddr) -> bool {
    matches!(dst, SocketAddr::V6(a) if a.ip().to_ipv4_mapped().is_none())
}

impl Sockets {
    pub fn for_destination(&self, dst: &SocketAddr) -> Option<&Arc<dyn UdpPort>> {
        self.for_reader(sent_over_v6(dst), SocketRole::Data)
    }

    /// The socket a handshake message to `dst` leaves by: the family's handshake
    /// socket where there is one, else the data socket. The handshake socket's send
    /// buffer is its own, so a bulk transfer that fills the data socket's (its sends
    /// wait for room) never makes an initiation or a response fail with EAGAIN, where
    /// the kernel's WireGuard, with an unbounded send buffer, would have sent it.
    pub fn for_handshake_to(&self, dst: &SocketAddr) -> Option<&Arc<dyn UdpPort>> {
        let own = self.for_reader(sent_over_v6(dst), SocketRole::Handshake);
        own.or_else(|| self.for_destination(dst))
    }

    /// The socket one UDP reader serves.
    pub fn for_reader(&self, v6: bool, role: SocketRole) -> Option<&Arc<dyn UdpPort>> {
        match (v6, role) {
            (false, SocketRole::Data) => self.v4.as_ref(),
            (true, SocketRole::Data) => self.v6.as_ref(),
            (false, SocketRole::Handshake) => self.hs4.as_ref(),
            (true, SocketRole::Handshake) => self.hs6.as_ref(),
            (false, SocketRole::Proof) => self.proof4.as_ref(),
            (true, SocketRole::Proof) => self.proof6.as_ref(),
        }
    }

    /// Binds both families on `port` (0: any). IPv6 may be unavailable; IPv4 may not.
    ///
    /// With port 0 the kernel picks IPv4's port, which an IPv6-only socket may hold: the
    /// pick is tried again, up to 100 times, as the kernel's WireGuard and wireguard-go
    /// do, rather than failing the start on a port the user never asked for.
    pub fn bind(port: u16, fwmark: u32) -> std::io::Result<Sockets> {
        let mut tries = 1;
        loop {
            match Self::bind_once(port, fwmark) {
                Err(e)
                    if port == 0 && e.raw_os_error() == Some(libc::EADDRINUSE) && tries < 100 =>
                {
                    tries += 1;
                }
                done => return done,
            }
        }
    }

    fn bind_once(port: u16, fwmark: u32) -> std::io::Result<Sockets> {
        let steering = steering();
        let (v4, steered4) = UdpSocket::bind_steered(false, port, &steering)?;
        let port = v4.local_port()?;
        let (v6, steered6) = match UdpSocket::bind_steered(true, port, &steering) {
            Ok((s, steered)) => (Some(s), steered.ok()),
            Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => (None, None),
            Err(e) => return Err(e),
        };
        if let Err(e) = &steered4 {
            tracing::info!(error = %e, "no steered handshake sockets: floods share the data socket");
        }
        let (hs4, proof4) = steered4.ok().unzip();
        let (hs6, proof6) = steered6.unzip();
        // A handshake socket's backlog is all flood when it fills: kept shallow, it
        // holds a legitimate initiation behind milliseconds of it, not a second, and
        // drains soon after a flood ends. So is a proof socket's under a forged flood.
        for s in [&hs4, &hs6, &proof4, &proof6].into_iter().flatten() {
            s.set_receive_buffer(HANDSHAKE_SOCKET_BUFFER)?;
        }
        let port_of = |s: UdpSocket| -> Arc<dyn UdpPort> { Arc::new(s) };
        let s = Sockets {
            v4: Some(port_of(v4)),
            v6: v6.map(port_of),
            hs4: hs4.map(port_of),
            hs6: hs6.map(port_of),
            proof4: proof4.map(port_of),
            proof6: proof6.map(port_of),
            port,
            fwmark,
            retired: Some(Arc::new(Waker::new()?)),
        };
        // Fresh sockets carry no mark. Setting 0 anyway would need CAP_NET_ADMIN (or
        // CAP_NET_RAW) for nothing, and fail every rebind of a daemon without it.
        if fwmark != 0 {
            s.apply_fwmark(fwmark)?;
        }
        Ok(s)
    }

    /// Datagrams the kernel dropped on this role's sockets since they were bound.
    pub fn kernel_drops(&self, role: SocketRole) -> u64 {
        [false, true]
            .into_iter()
            .filter_map(|v6| self.for_reader(v6, role))
            .map(|s| u64::from(s.drops().unwrap_or(0)))
            .sum()
    }

    pub fn apply_fwmark(&self, mark: u32) -> std::io::Result<()> {
        let all = [
            &self.v4,
            &self.v6,
            &self.hs4,
            &self.hs6,
            &self.proof4,
            &self.proof6,
        ];
        for s in all.into_iter().flatten() {
            s.set_mark(mark)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fq_codel::QueuePolicy;
    use crate::interface::Interface;
    use crate::memory::MemoryTun;
    use wirelane_io::poll::{wait_readable_any, Ready};

    fn fired(w: &Waker) -> bool {
        wait_readable_any(-1, &[w], 0).unwrap() == Ready::Woken
    }

    /// Port 0 in a namespace with two ephemeral ports, one held by an IPv6-only
    /// socket: whenever IPv4 picks that one, the pick is tried again, so every bind
    /// succeeds (about half failed before).
    #[test]
    fn port_zero_tries_again_when_ipv6_has_the_port() {
        // SAFETY: moves only this thread into a new network namespace.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        std::fs::write("/proc/sys/net/ipv4/ip_local_port_range", "40000 40001").unwrap();
        // IPv6-only, so IPv4's 40000 stays free for the kernel to pick.
        // SAFETY: plain socket calls on a descriptor this test owns; each checked.
        let held = unsafe {
            let fd = libc::socket(libc::AF_INET6, libc::SOCK_DGRAM, 0);
            assert!(fd >= 0);
            let one: libc::c_int = 1;
            let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            let opt = (&one as *const libc::c_int).cast();
            assert_eq!(
                libc::setsockopt(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, opt, len),
                0
            );
            let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
            sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sa.sin6_port = 40000u16.to_be();
            let sa_len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            assert_eq!(
                libc::bind(fd, (&sa as *const libc::sockaddr_in6).cast(), sa_len),
                0
            );
            fd
        };
        for _ in 0..20 {
            let s = Sockets::bind(0, 0).unwrap();
            assert_eq!(s.port, 40001);
        }
        // SAFETY: held is this test's descriptor.
        unsafe { libc::close(held) };
    }

    #[test]
    fn handshake_messages_leave_by_the_handshake_socket() {
        let s = Sockets::bind(0, 0).unwrap();
        let to: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let chosen = s.for_handshake_to(&to).unwrap();
        match &s.hs4 {
            Some(hs) => assert!(Arc::ptr_eq(chosen, hs)),
            None => assert!(Arc::ptr_eq(chosen, s.v4.as_ref().unwrap())),
        }
        assert!(!Arc::ptr_eq(chosen, s.for_destination(&to).unwrap()) || s.hs4.is_none());
    }

    /// Drops the kernel counted at sockets that a new port replaced stay counted, so
    /// the counter never goes down.
    #[test]
    fn kernel_drops_survive_a_rebind() {
        let iface = Interface::for_tests();
        let to = SocketAddr::from(([127, 0, 0, 1], iface.sockets().port));
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // Data messages (type 4) nobody reads, until the receive buffer overflows.
        let mut message = [0u8; 1400];
        message[0] = 4;
        for _ in 0..100_000 {
            let _ = sender.send_to(&message, to);
            if iface.kernel_drops(SocketRole::Data) > 0 {
                break;
            }
        }
        let before = iface.kernel_drops(SocketRole::Data);
        assert!(before > 0, "the kernel dropped nothing");
        iface.replace_sockets(Sockets::bind(0, 0).unwrap());
        assert!(iface.kernel_drops(SocketRole::Data) >= before);
    }

    #[test]
    fn replaced_sockets_wake_their_readers() {
        let tun = MemoryTun::new("wl-test", |_| {}, None).unwrap();
        let first = Sockets::bind(0, 0).unwrap();
        let first_retired = first.retired.clone().unwrap();
        let iface = Interface::new(Box::new(tun), first, QueuePolicy::default()).unwrap();
        assert!(!fired(&first_retired), "in use: quiet");

        iface.replace_sockets(Sockets::bind(0, 0).unwrap());
        assert!(fired(&first_retired), "replaced: its readers wake");
        let second_retired = iface.sockets().retired.clone().unwrap();
        assert!(!fired(&second_retired), "the successor's waker stays quiet");
    }
}
