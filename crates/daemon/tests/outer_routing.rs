//! The outer path, as the kernel selftest checks it
//! (`tools/testing/selftests/wireguard/netns.sh`), reproduced with namespaces of our
//! own. Source addresses (its "saddr" block): replies leave from the address the
//! peer's packets arrived at (reply to sender), that address is sticky, but not past
//! its removal or past a newer route taking over. And a routing loop, the tunnel's
//! outer traffic routed into itself, stays bounded.
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
    let (veth3, veth4) = (unique("vs"), unique("vs"));
    sh_ok(&format!(
        "ip link add {veth3} netns {} type veth peer name {veth4} netns {}",
        r.ns1.name, r.ns2.name
    ));
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
