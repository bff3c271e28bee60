//! The outer path, as the kernel selftest checks it
//! (`tools/testing/selftests/wireguard/netns.sh`), reproduced with namespaces of our
//! own. Source addresses (its "saddr" block): replies leave from the address the
//! peer's packets arrived at (reply to sender), that address is sticky, but not past
//! its removal or past a newer route taking over. And a routing loop, the tunnel's
//! outer traffic routed into itself, stays bounded; and a link set down sends nothing.
//!
//! Topology: two namespaces, each with a wirelane tunnel (192.168.241.1 and .2) and
//! one end of a veth pair whose addresses each test sets.

use wirelane_lab::testbed::*;

struct Rig {
    ns1: Netns,
    ns2: Netns,
    d1: Daemon,
    d2: Daemon,
    k1: Keys,
    k2: Keys,
    veth1: String,
    veth2: String,
}

impl Rig {
    fn new() -> Rig {
        require_root();
        let (ns1, ns2) = (Netns::fresh(), Netns::fresh());
        let (d1, d2) = (Daemon::start(WIRELANE, &ns1), Daemon::start(WIRELANE, &ns2));
        let (k1, k2) = (genkeys(), genkeys());
        let (veth1, veth2) = (unique("vs"), unique("vs"));
        sh_ok(&format!(
            "ip link add {veth1} netns {} type veth peer name {veth2} netns {}",
            ns1.name, ns2.name
        ));
        for (ns, d, own, other, addr, port) in
            [(&ns1, &d1, &k1, &k2, 1, 1), (&ns2, &d2, &k2, &k1, 2, 2)]
        {
            let key = std::env::temp_dir().join(format!("{}.key", d.ifname));
            std::fs::write(&key, &own.private).unwrap();
            d.wg(&format!(
                "set IF private-key {} listen-port {port} peer {} allowed-ips 192.168.241.{}/32",
                key.display(),
                other.public,
                3 - addr
            ));
            let _ = std::fs::remove_file(key);
            ns.run_ok(&format!(
                "ip addr add 192.168.241.{addr}/24 dev {0} && ip link set {0} up && \
                 sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0",
                d.ifname
            ));
        }
        ns1.run_ok(&format!(
            "sysctl -qw net.ipv4.conf.{veth1}.promote_secondaries=1 \
             net.ipv6.conf.{veth1}.accept_dad=0"
        ));
        ns2.run_ok(&format!("sysctl -qw net.ipv6.conf.{veth2}.accept_dad=0"));
        Rig {
            ns1,
            ns2,
            d1,
            d2,
            k1,
            k2,
            veth1,
            veth2,
        }
    }

    /// One ping through the tunnel; the first also runs the handshake.
    fn ping(ns: &Netns, to: &str) {
        ns.run_ok(&format!("ping -W 5 -c 1 {to} >/dev/null"));
    }

    /// `wg show IF endpoints` of the daemon, as "KEY\tENDPOINT".
    fn endpoint(d: &Daemon) -> String {
        d.wg("show IF endpoints").trim().to_string()
    }

    /// Pings from `ns` until `d` reports `want` as its endpoint, at most three times.
    /// A change of address or route reaches the daemon as an rtnetlink notification,
    /// which it handles on another thread than the one sending; a ping that races it
    /// leaves by the old source, and the next one by the new.
    fn ping_until_endpoint(ns: &Netns, to: &str, d: &Daemon, want: &str) {
        let mut seen = String::new();
        for _ in 0..3 {
            Rig::ping(ns, to);
            seen = Rig::endpoint(d);
            if seen.ends_with(&format!("\t{want}")) {
                return;
            }
        }
        panic!("endpoint {seen:?}, expected {want}");
    }

    /// A second veth pair between the two namespaces, down and without addresses:
    /// (ns1's end, ns2's end).
    fn second_link(&self) -> (String, String) {
        let (veth3, veth4) = (unique("vs"), unique("vs"));
        sh_ok(&format!(
            "ip link add {veth3} netns {} type veth peer name {veth4} netns {}",
            self.ns1.name, self.ns2.name
        ));
        (veth3, veth4)
    }

    fn veth_up(&self, addrs1: &[&str], addrs2: &[&str]) {
        for (ns, dev, addrs) in [
            (&self.ns1, &self.veth1, addrs1),
            (&self.ns2, &self.veth2, addrs2),
        ] {
            for a in addrs {
                ns.run_ok(&format!("ip addr add {a} dev {dev} nodad"));
            }
            ns.run_ok(&format!("ip link set {dev} up"));
        }
    }
}

/// Not overly sticky: when the address the peer's packets arrived at is removed, the
/// tunnel falls over to the one that replaced it, for IPv4 and IPv6.
#[test]
fn falls_over_to_new_source_addresses() {
    let r = Rig::new();
    r.veth_up(
        &["10.0.0.1/24", "fd00:aa::1/96"],
        &["10.0.0.2/24", "fd00:aa::2/96"],
    );
    for (endpoint, old, new) in [
        ("10.0.0.2:2", "10.0.0.1/24", "10.0.0.10/24"),
        ("[fd00:aa::2]:2", "fd00:aa::1/96", "fd00:aa::10/96"),
    ] {
        r.d1.wg(&format!("set IF peer {} endpoint {endpoint}", r.k2.public));
        Rig::ping(&r.ns1, "192.168.241.2");
        r.ns1.run_ok(&format!(
            "ip addr add {new} dev {0} nodad && ip addr del {old} dev {0}",
            r.veth1
        ));
        let host = new.split('/').next().unwrap();
        let want = match endpoint.starts_with('[') {
            true => format!("[{host}]:1"),
            false => format!("{host}:1"),
        };
        Rig::ping_until_endpoint(&r.ns1, "192.168.241.2", &r.d2, &want);
    }
}

/// Reply to sender: with two addresses on one interface, each is answered from itself,
/// for IPv4 and IPv6, whichever the kernel would prefer.
#[test]
fn replies_leave_from_the_address_the_peer_chose() {
    let r = Rig::new();
    r.veth_up(
        &[
            "10.0.0.1/24",
            "10.0.0.2/24",
            "fd00:aa::1/96",
            "fd00:aa::2/96",
        ],
        &["10.0.0.3/24", "fd00:aa::3/96"],
    );
    for endpoint in [
        "10.0.0.1:1",
        "[fd00:aa::1]:1",
        "10.0.0.2:1",
        "[fd00:aa::2]:1",
    ] {
        r.d2.wg(&format!("set IF peer {} endpoint {endpoint}", r.k1.public));
        Rig::ping(&r.ns2, "192.168.241.1");
        assert_eq!(
            Rig::endpoint(&r.d2),
            format!("{}\t{endpoint}", r.k1.public),
            "the answer to {endpoint} came from elsewhere"
        );
    }
}

/// The address asked for may belong to another interface than the one the packet came
/// in by (here a dummy); the answer still leaves from it.
#[test]
fn inbound_destination_on_another_interface() {
    let r = Rig::new();
    r.veth_up(&["10.0.0.1/24"], &["10.0.0.3/24"]);
    // A veth pair inside ns1 stands in for a dummy interface (no module here).
    let (other, other_peer) = (unique("vo"), unique("vo"));
    r.ns1.run_ok(&format!(
        "ip link add {other} type veth peer name {other_peer} && \
         ip addr add 10.50.0.1/24 dev {other} && ip link set {other} up"
    ));
    r.ns2
        .run_ok(&format!("ip route add 10.50.0.0/24 dev {}", r.veth2));
    r.d2.wg(&format!("set IF peer {} endpoint 10.50.0.1:1", r.k1.public));
    Rig::ping(&r.ns2, "192.168.241.1");
    assert_eq!(
        Rig::endpoint(&r.d2),
        format!("{}\t10.50.0.1:1", r.k1.public)
    );
}

/// A newer, preferred route through another interface takes over from the one the
/// sticky source came by: the source follows the route (the kernel's `src_if4` check).
#[test]
fn a_new_preferred_route_takes_over() {
    let r = Rig::new();
    let (veth3, veth4) = r.second_link();
    r.veth_up(&["10.0.0.1/24"], &["10.0.0.2/24"]);
    r.ns1.run_ok(&format!(
        "ip addr add 10.0.0.3/24 dev {veth3} && ip link set {veth3} up"
    ));
    r.ns2.run_ok(&format!("ip link set {veth4} up"));
    r.ns1.run_ok(&format!(
        "ip route flush dev {0} && ip route flush dev {veth3} && \
         ip route add 10.0.0.0/24 dev {0} src 10.0.0.1 metric 2",
        r.veth1
    ));
    r.d1.wg(&format!("set IF peer {} endpoint 10.0.0.2:2", r.k2.public));
    Rig::ping(&r.ns1, "192.168.241.2");
    assert_eq!(Rig::endpoint(&r.d2), format!("{}\t10.0.0.1:1", r.k1.public));
    r.ns1.run_ok(&format!(
        "ip route add 10.0.0.0/24 dev {veth3} src 10.0.0.3 metric 1 && \
         sysctl -qw net.ipv4.conf.{0}.rp_filter=0 net.ipv4.conf.all.rp_filter=0",
        r.veth1
    ));
    r.ns2.run_ok(&format!(
        "sysctl -qw net.ipv4.conf.{veth4}.rp_filter=0 net.ipv4.conf.all.rp_filter=0"
    ));
    Rig::ping_until_endpoint(&r.ns1, "192.168.241.2", &r.d2, "10.0.0.3:1");
}

/// A policy rule that selects by the tunnel's port (`ip rule ... ipproto udp sport`, a
/// multi-WAN recipe) sends the replies through its own table: the sticky source is
/// checked against the route the datagram will really take, ports included, so the
/// address the peer chose (10.0.0.3) stays the source, not the rule's table's own
/// (10.0.0.4).
#[test]
fn a_rule_on_the_tunnels_port_keeps_the_chosen_source() {
    let r = Rig::new();
    let (veth3, veth4) = r.second_link();
    r.veth_up(&["10.0.0.1/24"], &["10.0.0.2/24"]);
    r.ns1.run_ok(&format!(
        "ip addr add 10.0.0.3/24 dev {veth3} nodad && ip addr add 10.0.0.4/24 dev {veth3} nodad && \
         ip link set {veth3} up && ip route del 10.0.0.0/24 dev {veth3} && \
         ip route add 10.0.0.0/24 dev {veth3} src 10.0.0.4 table 100 && \
         ip rule add ipproto udp sport 1 lookup 100 && \
         sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.{veth3}.rp_filter=0"
    ));
    r.ns2.run_ok(&format!(
        "ip link set {veth4} up && ip route add 10.0.0.3/32 dev {veth4} src 10.0.0.2 && \
         sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.{veth4}.rp_filter=0"
    ));
    r.d2.wg(&format!("set IF peer {} endpoint 10.0.0.3:1", r.k1.public));
    Rig::ping(&r.ns2, "192.168.241.1");
    Rig::ping(&r.ns2, "192.168.241.1");
    assert_eq!(Rig::endpoint(&r.d2), format!("{}\t10.0.0.3:1", r.k1.public));
}

/// A policy rule added after the sticky source was learnt sends the replies another
/// way: the source is checked again and follows the route, as after a route change
/// (the kernel flushes its route cache on a rule change too).
#[test]
fn a_new_rule_takes_over_as_a_new_route_does() {
    let r = Rig::new();
    let (veth3, veth4) = r.second_link();
    r.veth_up(&["10.0.0.1/24"], &["10.0.0.2/24"]);
    r.ns1.run_ok(&format!(
        "ip addr add 10.0.0.3/24 dev {veth3} nodad && ip link set {veth3} up && \
         ip route del 10.0.0.0/24 dev {veth3} && \
         ip route add 10.0.0.0/24 dev {veth3} src 10.0.0.3 table 100 && \
         sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.{0}.rp_filter=0",
        r.veth1
    ));
    r.ns2.run_ok(&format!(
        "ip link set {veth4} up && \
         sysctl -qw net.ipv4.conf.{veth4}.rp_filter=0 net.ipv4.conf.all.rp_filter=0"
    ));
    r.d1.wg(&format!("set IF peer {} endpoint 10.0.0.2:2", r.k2.public));
    Rig::ping(&r.ns1, "192.168.241.2");
    assert_eq!(Rig::endpoint(&r.d2), format!("{}\t10.0.0.1:1", r.k1.public));
    r.ns1.run_ok("ip rule add to 10.0.0.2 lookup 100");
    Rig::ping_until_endpoint(&r.ns1, "192.168.241.2", &r.d2, "10.0.0.3:1");
}

/// A peer's endpoint routed through the tunnel itself: every outer datagram comes back
/// into the TUN. Encapsulated again, it would loop for ever; it is dropped instead, so
/// a flood of ten pings sends a bounded number of bytes (the kernel selftest allows
/// 70,000).
#[test]
fn a_routing_loop_through_the_tunnel_stays_bounded() {
    let r = Rig::new();
    r.veth_up(&["10.0.0.1/24"], &["10.0.0.2/24"]);
    r.d1.wg(&format!("set IF peer {} endpoint 10.0.0.2:2", r.k2.public));
    Rig::ping(&r.ns1, "192.168.241.2");
    // 192.168.241.2 is the peer's tunnel address, reached through the tunnel.
    r.d1.wg(&format!(
        "set IF peer {} endpoint 192.168.241.2:7",
        r.k2.public
    ));
    let tx = |d: &Daemon| -> u64 {
        let t = d.wg("show IF transfer");
        t.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    let before = tx(&r.d1);
    let o = r.ns1.try_run_ok("ping -W 1 -c 10 -f 192.168.241.2");
    assert!(!o.status.success(), "the peer cannot be reached any more");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let sent = tx(&r.d1) - before;
    assert!(sent < 70_000, "{sent} bytes sent for ten pings");
    let stats = r.d1.wg("show IF dump"); // still answering
    assert!(!stats.is_empty());
    let looped: u64 = uapi_stat(&r.d1.ifname, "tx_routing_loop");
    assert!(looped >= 10, "{looped} looped datagrams dropped");
}

/// Sends one UDP datagram from `from` (an address of the calling thread's namespace)
/// to `to`, from the socket group of a port the daemon listens on too: as a packet
/// masqueraded into the tunnel, whose source becomes the tunnel's own address while its
/// source port stays what the LAN host chose.
fn send_from_shared_port(from: std::net::SocketAddrV4, to: std::net::SocketAddrV4) {
    let sa = |a: std::net::SocketAddrV4| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns; each checked.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0);
        let one: libc::c_int = 1;
        let opt = (&one as *const libc::c_int).cast();
        let optlen = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        assert_eq!(
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, opt, optlen),
            0
        );
        let (src, dst) = (sa(from), sa(to));
        assert_eq!(
            libc::bind(fd, (&src as *const libc::sockaddr_in).cast(), len),
            0,
            "bind"
        );
        let sent = libc::sendto(
            fd,
            b"lan".as_ptr().cast(),
            3,
            0,
            (&dst as *const libc::sockaddr_in).cast(),
            len,
        );
        assert_eq!(sent, 3);
        libc::close(fd);
    }
}

/// Traffic masqueraded into the tunnel from the port the tunnel listens on (a LAN
/// host's own WireGuard on 51820 behind a router that shares its tunnel) has the
/// tunnel's address as its source, like the tunnel's own outer datagrams; it goes to a
/// host behind the tunnel, not to a peer's endpoint, so it is carried, not dropped as a
/// routing loop.
#[test]
fn traffic_from_the_listen_port_to_a_host_behind_the_tunnel_is_carried() {
    use wirelane_lab::workload::{in_ns, join};
    let r = Rig::new();
    r.veth_up(&["10.0.0.1/24"], &["10.0.0.2/24"]);
    r.d1.wg(&format!("set IF peer {} endpoint 10.0.0.2:2", r.k2.public));
    Rig::ping(&r.ns1, "192.168.241.2");
    let (ready, bound) = std::sync::mpsc::channel();
    let receiver = in_ns(&r.ns2.name, move || {
        let s = std::net::UdpSocket::bind("192.168.241.2:9999")?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
        ready.send(()).unwrap();
        let mut buf = [0u8; 16];
        let (n, from) = s.recv_from(&mut buf)?;
        Ok((buf[..n].to_vec(), from))
    });
    bound.recv().unwrap();
    join(in_ns(&r.ns1.name, || {
        send_from_shared_port("192.168.241.1:1".parse()?, "192.168.241.2:9999".parse()?);
        Ok(())
    }))
    .unwrap();
    let (got, from) = join(receiver).expect("the datagram arrived");
    assert_eq!(got, b"lan");
    assert_eq!(from, "192.168.241.1:1".parse().unwrap());
    assert_eq!(uapi_stat(&r.d1.ifname, "tx_routing_loop"), 0);
}

/// `ip link set down` stops the tunnel as the kernel's `wg_stop` does: its sessions go
/// and nothing leaves while it is down, a persistent keepalive's included; set up
/// again, the keepalive begins a new handshake and traffic flows.
#[test]
fn a_link_set_down_sends_nothing_and_up_starts_again() {
    let r = Rig::new();
    r.veth_up(&["10.0.0.1/24"], &["10.0.0.2/24"]);
    r.d1.wg(&format!(
        "set IF peer {} endpoint 10.0.0.2:2 persistent-keepalive 1",
        r.k2.public
    ));
    Rig::ping(&r.ns1, "192.168.241.2");
    let peer = |d: &Daemon| d.dump_peers().remove(0);
    r.ns1.run_ok(&format!("ip link set {} down", r.d1.ifname));
    // The daemon hears of it from rtnetlink, on another thread: a moment.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let before = peer(&r.d1);
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(peer(&r.d1).tx, before.tx, "keepalives left while down");
    r.ns1.run_ok(&format!("ip link set {} up", r.d1.ifname));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while peer(&r.d1).latest_handshake <= before.latest_handshake {
        assert!(
            std::time::Instant::now() < deadline,
            "no new handshake after up"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Rig::ping(&r.ns1, "192.168.241.2");
}

/// One counter of the daemon's `stats=1` answer.
fn uapi_stat(ifname: &str, name: &str) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket_path(ifname)).unwrap();
    s.write_all(b"stats=1\n\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {out}"))
}
