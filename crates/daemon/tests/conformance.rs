//! Where users can tell wirelane from kernel WireGuard: each test reproduces one
//! behaviour of the kernel (its selftest, `tools/testing/selftests/wireguard/netns.sh`,
//! checks most of them) with namespaces of our own.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use wirelane_lab::testbed::*;

/// A foreground wirelane for `ifname` in `ns`, as a child of the test.
fn spawn_foreground(ns: &Netns, ifname: &str) -> std::process::Child {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.name,
            env!("CARGO_BIN_EXE_wirelane"),
            "-f",
        ])
        .arg(ifname)
        .env("LOG_LEVEL", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wirelane")
}

/// Waits until the daemon serves its socket, or panics with its error output.
fn wait_serving(child: &mut std::process::Child, ifname: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if std::os::unix::net::UnixStream::connect(socket_path(ifname)).is_ok() {
            return;
        }
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("wirelane exited during start-up ({st}): {err}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("wirelane did not serve {ifname} in time");
}

/// `ip link del IF` followed at once by a new daemon for the same name: what
/// `systemctl restart` of a tunnel does. The old daemon is still exiting when the new
/// one starts; the new one must come up every time.
#[test]
fn restart_right_after_the_interface_is_deleted() {
    require_root();
    let ns = Netns::fresh();
    let ifname = unique("wr");
    let mut old = spawn_foreground(&ns, &ifname);
    wait_serving(&mut old, &ifname);
    for round in 0..20 {
        ns.run_ok(&format!("ip link del {ifname}"));
        let mut new = spawn_foreground(&ns, &ifname);
        wait_serving(&mut new, &ifname);
        let status = old.wait().unwrap();
        assert!(
            status.success(),
            "round {round}: the old daemon exited {status}"
        );
        // The new daemon owns the name: interface, socket and configuration work.
        ns.run_ok(&format!(
            "ip link show {ifname} && wg set {ifname} listen-port 0"
        ));
        old = new;
    }
    ns.run_ok(&format!("ip link del {ifname}"));
    assert!(old.wait().unwrap().success());
}

/// `wg-quick down` then `wg-quick up`, twenty times, with wirelane as the user-space
/// implementation.
#[test]
fn wg_quick_down_then_up_twenty_times() {
    require_root();
    let ns = Netns::fresh();
    let ifname = unique("wq");
    let dir = std::env::temp_dir().join(unique("wqr"));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join(format!("{ifname}.conf"));
    let keys = genkeys();
    std::fs::write(
        &conf,
        format!(
            "[Interface]\nPrivateKey = {}\nAddress = 10.79.0.1/24\nListenPort = 51820\n",
            keys.private
        ),
    )
    .unwrap();
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o600)).unwrap();
    let bin = env!("CARGO_BIN_EXE_wirelane");
    let quick = |verb: &str| {
        ns.run_ok(&format!(
            "WG_QUICK_USERSPACE_IMPLEMENTATION={bin} wg-quick {verb} {} 2>&1",
            conf.display()
        ))
    };
    quick("up");
    for _ in 0..20 {
        quick("down");
        quick("up");
        let shown = ns.run_ok(&format!("wg show {ifname} listen-port"));
        assert_eq!(shown.trim(), "51820");
    }
    quick("down");
    wait_until("the last daemon to exit", Duration::from_secs(10), || {
        sh_ok(&format!("ip netns pids {}", ns.name))
            .trim()
            .is_empty()
    });
    let _ = std::fs::remove_dir_all(dir);
}

/// The kernel stores private keys clamped (RFC 7748 §5) and reports them so: an
/// unclamped key set through the UAPI comes back clamped, as the kernel selftest checks
/// with `wg set wg0 private-key <(echo "/${key1:1}")`.
#[test]
fn private_keys_are_reported_clamped() {
    require_root();
    let ns = Netns::fresh();
    let d = Daemon::start(WIRELANE, &ns);
    let keys = genkeys();
    // genkey's output is clamped, so its first byte's low three bits are clear; '/'
    // sets the highest of them (and all above), '+' is the same with it cleared.
    let unclamped = format!("/{}", &keys.private[1..]);
    let path = std::env::temp_dir().join(format!("{}.key", d.ifname));
    std::fs::write(&path, &unclamped).unwrap();
    d.wg(&format!("set IF private-key {}", path.display()));
    let shown = d.wg("show IF private-key");
    assert_eq!(shown.trim(), format!("+{}", &keys.private[1..]));
    // The public key is the clamped key's, which is the unclamped key's too.
    let public = sh_ok(&format!("echo '{unclamped}' | wg pubkey"));
    assert_eq!(d.wg("show IF public-key").trim(), public.trim());
    // Setting the unclamped form of the current key again changes nothing.
    d.wg(&format!("set IF private-key {}", path.display()));
    assert_eq!(d.wg("show IF private-key").trim(), shown.trim());
    let _ = std::fs::remove_file(path);
}

/// Two tunnels whose interfaces were created in `ns0` (where their sockets stay, on
/// loopback) and then moved into `ns1` and `ns2`: the container pattern, and the
/// topology of the kernel selftest.
struct Moved {
    ns0: Netns,
    ns1: Netns,
    ns2: Netns,
    d1: Daemon,
    d2: Daemon,
}

impl Moved {
    fn new() -> Moved {
        Moved::over("127.0.0.1")
    }

    /// Two tunnels whose outer datagrams go over ns0's loopback address `lo`
    /// (`127.0.0.1` or `[::1]`).
    fn over(lo: &str) -> Moved {
        require_root();
        let (ns0, ns1, ns2) = (Netns::fresh(), Netns::fresh(), Netns::fresh());
        let (d1, d2) = (Daemon::start(WIRELANE, &ns0), Daemon::start(WIRELANE, &ns0));
        let (k1, k2) = (genkeys(), genkeys());
        for (ns, d, own, other, n) in [(&ns1, &d1, &k1, &k2, 1), (&ns2, &d2, &k2, &k1, 2)] {
            let key = std::env::temp_dir().join(format!("{}.key", d.ifname));
            std::fs::write(&key, &own.private).unwrap();
            d.wg(&format!(
                "set IF private-key {} listen-port {n} peer {} allowed-ips 192.168.241.{}/32 \
                 endpoint {lo}:{}",
                key.display(),
                other.public,
                3 - n,
                3 - n
            ));
            let _ = std::fs::remove_file(key);
            ns0.run_ok(&format!("ip link set {} netns {}", d.ifname, ns.name));
            ns.run_ok(&format!(
                "ip addr add 192.168.241.{n}/24 dev {0} && ip link set {0} up",
                d.ifname
            ));
        }
        Moved {
            ns0,
            ns1,
            ns2,
            d1,
            d2,
        }
    }

    fn set_mtu(&self, mtu: u32) {
        self.ns1
            .run_ok(&format!("ip link set {} mtu {mtu}", self.d1.ifname));
        self.ns2
            .run_ok(&format!("ip link set {} mtu {mtu}", self.d2.ifname));
    }

    /// Replaces ns0's INPUT rules (the outer datagrams, on loopback) with `rule`.
    fn outer_rule(&self, rule: &str) {
        self.ns0.run_ok(&format!(
            "iptables -F INPUT && iptables -A INPUT {rule} -j DROP"
        ));
    }
}

/// Padding follows the MTU of an interface moved into another namespace, and of a
/// route through it that has its own (the kernel selftest's route-MTU check).
///
/// A 1269-byte ping is a 1297-byte packet, padded to a multiple of 16 (1312) unless the
/// MTU is lower: to 1300 at MTU 1300, to 1299 on a route with MTU 1299. The outer
/// datagram adds 60 bytes (IPv4, UDP, WireGuard header and tag), so an iptables rule
/// that drops one outer length catches a wrong padding.
#[test]
fn padding_follows_the_mtu_of_a_moved_interface_and_its_routes() {
    let m = Moved::new();
    m.set_mtu(1300);
    // Stale padding (MTU 1420 as created) would send 1312 + 60 bytes.
    m.outer_rule("-m length --length 1372");
    m.ns2
        .run_ok("ping -c 1 -W 5 -s 1269 192.168.241.1 >/dev/null");
    // Padding to the interface's MTU would send 1300 + 60 bytes; the route says 1299.
    m.outer_rule("-m length --length 1360");
    m.ns1.run_ok(&format!(
        "ip route add 192.168.241.2/32 dev {} mtu 1299",
        m.d1.ifname
    ));
    m.ns2.run_ok(&format!(
        "ip route add 192.168.241.1/32 dev {} mtu 1299",
        m.d2.ifname
    ));
    m.ns2
        .run_ok("ping -c 1 -W 5 -s 1269 192.168.241.1 >/dev/null");
    // And the routes going away give the interface's MTU back.
    m.ns1.run_ok(&format!(
        "ip route del 192.168.241.2/32 dev {} mtu 1299",
        m.d1.ifname
    ));
    m.ns2.run_ok(&format!(
        "ip route del 192.168.241.1/32 dev {} mtu 1299",
        m.d2.ifname
    ));
    m.outer_rule("-m length --length 1359");
    m.ns2
        .run_ok("ping -c 1 -W 5 -s 1269 192.168.241.1 >/dev/null");
    // A bulk transfer at the new MTU arrives intact. Its segments are cut by the
    // kernel's TCP for the interface's MTU and split by us at the size the kernel's
    // virtio header names, so no MTU of ours is involved; their padding is, and the
    // pings above checked it. (An outer length rule cannot check it here: netfilter
    // sees a UDP GSO send as one datagram of its whole length.)
    m.ns0.run_ok("iptables -F INPUT");
    tcp_transfer(
        &m.ns1,
        &m.ns2,
        "192.168.241.2".parse().unwrap(),
        8 << 20,
        std::time::Duration::from_secs(60),
    );
}

/// The outer header carries the inner packet's ECN field as RFC 6040 asks of a
/// tunnel's ingress and as the kernel's WireGuard sets it: ECT(0) and ECT(1) copied, CE
/// sent as ECT(0), Not-ECT kept, and the DSCP never copied. Routers between the ends
/// can then mark congestion on the outer header, which the receiving end carries on to
/// the inner one (decapsulation, `rx_aqm`). Both outer families.
#[test]
fn the_outer_header_carries_the_inner_ecn_field() {
    for (lo, iptables) in [("127.0.0.1", "iptables"), ("[::1]", "ip6tables")] {
        let m = Moved::over(lo);
        // The handshake first: its messages are Not-ECT and not counted below.
        m.ns1.run_ok("ping -c 1 -W 5 192.168.241.2 >/dev/null");
        // d1's data datagrams (to port 2, longer than a keepalive), one counter per
        // outer ECN field, each with DSCP 0.
        m.ns0.run_ok(&format!(
            "for e in 0 1 2 3; do {iptables} -A INPUT -p udp --dport 2 \
             -m length --length 100:65535 -m dscp --dscp 0 -m ecn --ecn-ip-ect $e; done"
        ));
        for (inner, outer) in [(0, 0), (1, 1), (2, 2), (3, 2)] {
            m.ns0.run_ok(&format!("{iptables} -Z INPUT"));
            // DSCP EF (0xb8) with the ECN field under test.
            m.ns1.run_ok(&format!(
                "ping -c 3 -i 0.2 -W 5 -Q {} 192.168.241.2 >/dev/null",
                0xb8 | inner
            ));
            let out = m.ns0.run_ok(&format!("{iptables} -L INPUT -v -n -x"));
            let counts: Vec<u64> = out
                .lines()
                .filter(|l| l.contains("ECN match"))
                .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
                .collect();
            let mut want = [0u64; 4];
            want[outer] = 3;
            assert_eq!(counts, want, "{lo}: inner ECN {inner:#b}\n{out}");
        }
    }
}

/// A packet no peer routes, or whose peer has no endpoint, is answered with an ICMP
/// (ICMPv6) destination-unreachable error, as the kernel answers it: `ping` reports it,
/// and a TCP connect fails with EHOSTUNREACH at once rather than timing out.
#[test]
fn unroutable_packets_get_destination_unreachable() {
    require_root();
    let ns = Netns::fresh();
    let d = Daemon::start(WIRELANE, &ns);
    let (own, peer) = (genkeys(), genkeys());
    let key = std::env::temp_dir().join(format!("{}.key", d.ifname));
    std::fs::write(&key, &own.private).unwrap();
    d.wg(&format!(
        "set IF private-key {} peer {} allowed-ips 10.77.0.2/32,fd77::2/128",
        key.display(),
        peer.public
    ));
    let _ = std::fs::remove_file(key);
    ns.run_ok(&format!(
        "ip addr add 10.77.0.1/24 dev {0} && ip addr add fd77::1/64 dev {0} nodad && \
         ip link set {0} up",
        d.ifname
    ));
    let v4 = ns.try_run_ok("ping -c 3 -i 0.2 -W 5 10.77.0.99");
    let out = String::from_utf8_lossy(&v4.stdout);
    assert!(
        out.contains("From 10.77.0.99 icmp_seq=1 Destination Host Unreachable"),
        "{out}"
    );
    let v6 = ns.try_run_ok("ping -6 -c 3 -i 0.2 -W 5 fd77::99");
    let out = String::from_utf8_lossy(&v6.stdout);
    assert!(
        out.contains("From fd77::99 icmp_seq=1 Destination unreachable: Address unreachable"),
        "{out}"
    );
    // The peer that routes 10.77.0.2 has no endpoint: as in the kernel, its packets
    // are answered the same way, not staged for a handshake that cannot be sent.
    let no_endpoint = ns.try_run_ok("ping -c 3 -i 0.2 -W 5 10.77.0.2");
    let out = String::from_utf8_lossy(&no_endpoint.stdout);
    assert!(
        out.contains("From 10.77.0.2 icmp_seq=1 Destination Host Unreachable"),
        "{out}"
    );
    let name = ns.name.clone();
    let kinds = std::thread::spawn(move || {
        enter_ns(&name);
        ["10.77.0.99:9", "[fd77::99]:9", "10.77.0.2:9"].map(|a| {
            let addr: std::net::SocketAddr = a.parse().unwrap();
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(20))
                .map(drop)
                .map_err(|e| e.kind())
        })
    })
    .join()
    .unwrap();
    for k in kinds {
        assert_eq!(k, Err(std::io::ErrorKind::HostUnreachable));
    }
    let dump = uapi_stats(&d.ifname);
    assert!(dump.contains("tx_icmp_unreachable="), "{dump}");
    let stat = |name: &str| -> u64 {
        let line = dump
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")));
        line.and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name}: {dump}"))
    };
    assert!(stat("tx_no_endpoint") >= 3);
    assert_eq!(stat("staged_max"), 0, "nothing waits for a handshake");
}

/// The daemon's `stats=1` counters, as the UAPI reports them.
fn uapi_stats(ifname: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket_path(ifname)).unwrap();
    s.write_all(b"stats=1\n\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}
