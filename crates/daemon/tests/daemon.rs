//! The daemon as an operator meets it: wg-quick up/down, background start, clean
//! shutdown, 10,000 peers through `wg setconf`, and bad input of every kind.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};
use wirelane_lab::testbed::*;

#[test]
fn wg_quick_up_and_down() {
    require_root();
    let pair = Pair::new(false);
    let peer = Daemon::start(Impl::WireguardGo, &pair.b);
    let (ka, kb) = (genkeys(), genkeys());
    let ifname = unique("wq");
    let dir = std::env::temp_dir().join(unique("wq"));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join(format!("{ifname}.conf"));
    std::fs::write(
        &conf,
        format!(
            "[Interface]\nPrivateKey = {}\nAddress = 10.78.0.1/24\nListenPort = 51820\n\n\
             [Peer]\nPublicKey = {}\nAllowedIPs = 10.78.0.2/32\nEndpoint = 192.168.77.2:51821\n",
            ka.private, kb.public
        ),
    )
    .unwrap();
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o600)).unwrap();
    let pconf = dir.join("peer.conf");
    std::fs::write(
        &pconf,
        format!(
            "[Interface]\nPrivateKey = {}\nListenPort = 51821\n\n[Peer]\nPublicKey = {}\nAllowedIPs = 10.78.0.1/32\n",
            kb.private, ka.public
        ),
    )
    .unwrap();
    peer.wg(&format!("setconf IF {}", pconf.display()));
    pair.b.run_ok(&format!(
        "ip addr add 10.78.0.2/24 dev {0} && ip link set {0} up",
        peer.ifname
    ));

    let bin = env!("CARGO_BIN_EXE_wirelane");
    pair.a.run_ok(&format!(
        "WG_QUICK_USERSPACE_IMPLEMENTATION={bin} wg-quick up {}",
        conf.display()
    ));
    assert!(link_exists(&pair.a, &ifname));
    assert!(socket_path(&ifname).exists());
    tcp_transfer(
        &pair.a,
        &pair.b,
        "10.78.0.2".parse().unwrap(),
        4 << 20,
        Duration::from_secs(30),
    );
    let shown = pair.a.run_ok(&format!("wg show {ifname}"));
    assert!(shown.contains("latest handshake"), "{shown}");

    pair.a.run_ok(&format!("wg-quick down {}", conf.display()));
    // wg-quick deletes the interface; the daemon notices and removes its socket.
    wait_until(
        "daemon to exit after wg-quick down",
        Duration::from_secs(10),
        || !socket_path(&ifname).exists(),
    );
    assert!(!link_exists(&pair.a, &ifname));
    // No process is left running in the namespace: the daemon itself exits (it
    // removes its socket first, then joins its threads, so allow it a moment).
    wait_until(
        "the daemon process to exit",
        Duration::from_secs(10),
        || {
            sh_ok(&format!("ip netns pids {}", pair.a.name))
                .trim()
                .is_empty()
        },
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn background_start_and_socket_removal_stops_it() {
    require_root();
    let ns = Netns::fresh();
    let ifname = unique("wb");
    let bin = env!("CARGO_BIN_EXE_wirelane");
    ns.run_ok(&format!("{bin} {ifname}"));
    // When the launcher returns, interface and socket already exist.
    assert!(link_exists(&ns, &ifname));
    let sock = socket_path(&ifname);
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "UAPI socket must be private");
    std::fs::remove_file(&sock).unwrap();
    wait_until(
        "interface removal after socket deletion",
        Duration::from_secs(10),
        || !link_exists(&ns, &ifname),
    );
}

#[test]
fn sigterm_removes_socket_and_interface() {
    require_root();
    let ns = Netns::fresh();
    let mut d = Daemon::start(WIRELANE, &ns);
    d.wg("set IF listen-port 51820");
    let status = d
        .terminate(Duration::from_secs(10))
        .expect("daemon exits on SIGTERM");
    assert!(status.success(), "{status}");
    assert!(!socket_path(&d.ifname).exists());
    assert!(!link_exists(&ns, &d.ifname));
}

#[test]
fn start_failures_are_reported() {
    require_root();
    let bin = env!("CARGO_BIN_EXE_wirelane");
    for (args, needle) in [
        (vec![""], "not a valid interface name"),
        (vec!["a/b"], "not a valid interface name"),
        (vec!["wg%d"], "not a valid interface name"),
        (vec!["sixteen-chars-xx"], "not a valid interface name"),
        (vec!["--workers", "0", "x"], "--workers"),
        (vec!["--workers", "1025", "x"], "--workers"),
        (vec!["--workers", "many", "x"], "--workers"),
        (vec!["--tun-queues", "0", "x"], "--tun-queues"),
        (vec!["--tun-queues", "17", "x"], "--tun-queues"),
        (vec!["--model", "nope", "x"], "unknown execution model"),
        (vec!["--bogus", "x"], "--bogus"),
        (vec![], "IFNAME"),
    ] {
        let o = Command::new(bin).args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // Environment that is set but unusable is refused the same way, not ignored.
    for (var, value) in [
        ("WIRELANE_LOG", "wirelane_dataplane=verbose"),
        ("WIRELANE_METRICS", "nope"),
        ("WIRELANE_POOL", "a/b"),
    ] {
        let o = Command::new(bin).arg("x").env(var, value).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{var}={value}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(var), "{var}={value}: {err}");
    }
    // A second daemon for a served interface fails with a clear message, in both modes.
    let ns = Netns::fresh();
    let d = Daemon::start(WIRELANE, &ns);
    let o = Command::new("ip")
        .args(["netns", "exec", &ns.name, bin, &d.ifname])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("already served"),
        "{o:?}"
    );
    // The first daemon is unaffected.
    d.wg("show IF");
}

/// Sends one raw UAPI request and returns the reply up to the blank line.
fn uapi(ifname: &str, request: &str) -> String {
    let mut s = UnixStream::connect(socket_path(ifname)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let mut out = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 || line == "\n" {
            return out;
        }
        out.push_str(&line);
    }
}

#[test]
fn bad_uapi_input_changes_nothing() {
    require_root();
    let ns = Netns::fresh();
    let d = Daemon::start(WIRELANE, &ns);
    let peer = genkeys();
    d.wg(&format!(
        "set IF listen-port 51820 peer {} allowed-ips 10.1.0.0/16",
        peer.public
    ));
    let before = uapi(&d.ifname, "get=1\n\n");
    assert!(before.ends_with("errno=0\n"), "{before}");
    let pk = "a".repeat(64);
    let bad = [
        "set=1\nlisten_port=99999\n\n".to_string(),
        "set=1\nlisten_port=51821\nbogus_key=1\n\n".to_string(),
        format!("set=1\nlisten_port=51822\npublic_key={pk}\nallowed_ip=10.0.0.0/40\n\n"),
        format!("set=1\nreplace_peers=true\npublic_key={pk}\nendpoint=localhost:1\n\n"),
        format!("set=1\npublic_key={pk}\nprotocol_version=7\n\n"),
        "set=1\nprivate_key=xyz\n\n".to_string(),
        "set=1\nfwmark=12a\n\n".to_string(),
        "set=1\npublic_key=tooshort\n\n".to_string(),
        format!("set=1\npublic_key={pk}\npersistent_keepalive_interval=-5\n\n"),
    ];
    for req in &bad {
        let reply = uapi(&d.ifname, req);
        assert_eq!(reply, "errno=-22\n", "request {req:?}");
        assert_eq!(
            uapi(&d.ifname, "get=1\n\n"),
            before,
            "state changed by {req:?}"
        );
    }
    // Unknown operations and over-long lines are refused without harm.
    assert_eq!(uapi(&d.ifname, "frobnicate=1\n\n"), "errno=-22\n");
    let long = format!("set=1\nprivate_key={}\n\n", "0".repeat(100_000));
    if let Ok(mut s) = UnixStream::connect(socket_path(&d.ifname)) {
        // The daemon reads the rest of the request, answers the over-long line EMSGSIZE
        // and hangs up.
        let _ = s.write_all(long.as_bytes());
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        assert_eq!(reply, "errno=-90\n\n");
    }
    // A set past what the daemon holds while it reads: `limits.rs`.
    // A client that ends its side mid-request is told EPROTO, and nothing is applied;
    // one that disconnects, likewise.
    for cut in ["set=1\nreplace_peers=true\n", "set=1\nreplace_peers=tr"] {
        let mut s = UnixStream::connect(socket_path(&d.ifname)).unwrap();
        s.write_all(cut.as_bytes()).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert_eq!(reply, "errno=-71\n\n", "{cut:?}");
    }
    {
        let mut s = UnixStream::connect(socket_path(&d.ifname)).unwrap();
        s.write_all(b"set=1\nreplace_peers=true\n").unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(uapi(&d.ifname, "get=1\n\n"), before);
    // A port already taken is reported as EADDRINUSE, and nothing else changes.
    let blocker = Daemon::start(WIRELANE, &ns);
    blocker.wg("set IF listen-port 51830");
    let reply = uapi(
        &d.ifname,
        &format!("set=1\nlisten_port=51830\npublic_key={pk}\n\n"),
    );
    assert_eq!(reply, "errno=-98\n");
    assert_eq!(uapi(&d.ifname, "get=1\n\n"), before);
    // And wg reports errors for bad config files without touching the device.
    let path = std::env::temp_dir().join(format!("{}-bad.conf", d.ifname));
    std::fs::write(&path, "[Interface]\nListenPort = nope\n").unwrap();
    let o = ns.try_run_ok(&format!("wg setconf {} {}", d.ifname, path.display()));
    assert!(!o.status.success());
    assert_eq!(uapi(&d.ifname, "get=1\n\n"), before);
    // Still fully alive.
    d.wg("show IF");
}

/// Cookie replies for a receiver index the daemon never gave out are dropped and
/// counted on the reader: queued, a spoofed flood of them filled the handshake lane
/// that cookie-bearing initiations need under load.
#[test]
fn unsolicited_cookie_replies_are_counted_and_dropped() {
    require_root();
    let ns = Netns::fresh();
    ns.run_ok("ip link set lo up");
    let d = Daemon::start(WIRELANE, &ns);
    d.wg("set IF listen-port 51841");
    let unknown = || wirelane_lab::uapi::stats(&d.ifname).unwrap()["rx_unknown_index"];
    let before = unknown();
    let sender = wirelane_lab::workload::in_ns(&ns.name, || {
        let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
        let mut reply = [0u8; 64];
        reply[0] = 3;
        reply[4..8].copy_from_slice(&0x5eed_f00du32.to_le_bytes());
        for _ in 0..40 {
            s.send_to(&reply, "127.0.0.1:51841")?;
        }
        Ok(())
    });
    wirelane_lab::workload::join(sender).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while unknown() < before + 40 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(unknown(), before + 40);
    d.wg("show IF");
}

/// Cookie replies for an index the daemon did give out (its initiation in flight), as
/// anyone who saw the initiation could forge them: the peer's cookie slot lets at most
/// one at a time reach the handshake thread, each is refused (on the reader, or when
/// it fails to open), and the genuine reply that follows is still taken: the daemon
/// sends its initiation again at once, with a valid mac2.
#[test]
fn forged_cookie_replies_for_a_live_index_are_refused() {
    use wirelane_proto::cookie::{CookieChecker, MacVerdict};
    require_root();
    let ns = Netns::fresh();
    ns.run_ok("ip link set lo up");
    let d = Daemon::start(WIRELANE, &ns);
    let (ours, theirs) = (genkeys(), genkeys());
    let key_file = std::env::temp_dir().join(unique("cookie-key"));
    std::fs::write(&key_file, &ours.private).unwrap();
    d.wg(&format!(
        "set IF listen-port 51843 private-key {}",
        key_file.display()
    ));
    std::fs::remove_file(&key_file).unwrap();
    // The peer's end: a plain socket in the namespace that never answers a handshake.
    let s = wirelane_lab::workload::join(wirelane_lab::workload::in_ns(&ns.name, || {
        Ok(std::net::UdpSocket::bind("127.0.0.1:0")?)
    }))
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let refused = || wirelane_lab::uapi::stats(&d.ifname).unwrap()["cookie_replies_refused"];
    let before = refused();
    // A keepalive interval makes the daemon send its initiation now.
    d.wg(&format!(
        "set IF peer {} endpoint {} allowed-ips 10.9.0.2/32 persistent-keepalive 25",
        theirs.public,
        s.local_addr().unwrap()
    ));
    let mut msg = [0u8; 256];
    let initiation = |msg: &mut [u8; 256]| {
        let (n, from) = s.recv_from(msg).expect("an initiation from the daemon");
        assert_eq!((n, msg[0]), (148, 1), "a handshake initiation");
        from
    };
    let daemon = initiation(&mut msg);
    let mut forged = [0u8; 64];
    forged[0] = 3;
    forged[4..8].copy_from_slice(&msg[4..8]);
    for i in 0..40 {
        forged[8] = i;
        s.send_to(&forged, daemon).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while refused() < before + 40 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(refused(), before + 40);

    // The genuine reply, as the daemon's peer under load would make it. A retry that
    // crossed it (REKEY_TIMEOUT on a slow machine) is answered the same way.
    let their_public = wirelane_proto::parse_base64_key(&theirs.public).unwrap();
    let mut checker = CookieChecker::new(&their_public);
    let mut rng = wirelane_proto::crypto::KeystreamRng::from_seed([9; 32]);
    let now = Duration::from_secs(1);
    let me = s.local_addr().unwrap();
    for _ in 0..5 {
        let mac2_zero = msg[132..148].iter().all(|&b| b == 0);
        if !mac2_zero {
            assert_eq!(
                checker.verify(&msg[..148], &me, now, &mut rng),
                MacVerdict::Mac2Valid
            );
            d.wg("show IF");
            return;
        }
        let sender = u32::from_le_bytes(msg[4..8].try_into().unwrap());
        let reply = checker.create_reply(&msg[..148], sender, &me, now, &mut rng);
        s.send_to(&reply.to_bytes(), daemon).unwrap();
        initiation(&mut msg);
    }
    panic!("the daemon never took the genuine cookie reply");
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn sixty_five_thousand_peers_setconf() {
    require_root();
    let ns = Netns::fresh();
    let d = Daemon::start(WIRELANE, &ns);
    let n = 65_536;
    let path = std::env::temp_dir().join(format!("{}-64k.conf", d.ifname));
    std::fs::write(&path, wirelane_lab::peers::config(n, &genkeys().private)).unwrap();
    let rss_before = rss_kib(d.pid());
    let t = Instant::now();
    d.wg(&format!("setconf IF {}", path.display()));
    let took = t.elapsed();
    let rss_after = rss_kib(d.pid());
    let per_peer = (rss_after.saturating_sub(rss_before) * 1024) as f64 / n as f64;
    eprintln!(
        "{n}-peer setconf: {took:?}, RSS {rss_before} KiB -> {rss_after} KiB, {per_peer:.0} B/peer"
    );
    let dump = d.wg("show IF dump");
    assert_eq!(dump.lines().count(), n + 1);
    let allowed: Vec<&str> = dump
        .lines()
        .skip(1)
        .map(|l| l.split('\t').nth(3).unwrap())
        .collect();
    assert!(
        allowed
            .iter()
            .all(|a| a.contains("/32,") && a.ends_with("/128")),
        "{:?}",
        &allowed[..3]
    );
    assert!(per_peer < 4096.0, "idle peer costs {per_peer:.0} bytes");
    // A second identical setconf replaces everything and leaves the same state.
    d.wg(&format!("setconf IF {}", path.display()));
    assert_eq!(d.wg("show IF dump"), dump);
    let _ = std::fs::remove_file(path);
}

/// Applies setconf, a no-op syncconf and a changing syncconf to `d`, returning
/// `wg showconf` after each step. One endpoint is link-local, scoped by interface name
/// as `wg showconf` writes it back.
fn config_roundtrips(d: &Daemon, keys: &[Keys; 3], psk: &str) -> Vec<String> {
    let [me, p1, p2] = keys;
    let dir = std::env::temp_dir();
    let mut shown = Vec::new();
    let first = dir.join(format!("{}-1.conf", d.ifname));
    std::fs::write(
        &first,
        format!(
            "[Interface]\nPrivateKey = {}\nListenPort = 51844\nFwMark = 0x2a\n\n\
             [Peer]\nPublicKey = {}\nPresharedKey = {psk}\nEndpoint = [fd00::9]:4000\n\
             PersistentKeepalive = 25\nAllowedIPs = 10.5.0.0/16, fd05::/64\n\n\
             [Peer]\nPublicKey = {}\nEndpoint = [fe80::7%lo]:5000\nAllowedIPs = 10.6.0.1/32\n",
            me.private, p1.public, p2.public
        ),
    )
    .unwrap();
    d.wg(&format!("setconf IF {}", first.display()));
    shown.push(d.wg("showconf IF"));
    // showconf output is itself a valid config: syncconf with it changes nothing.
    let again = dir.join(format!("{}-2.conf", d.ifname));
    std::fs::write(&again, &shown[0]).unwrap();
    d.wg(&format!("syncconf IF {}", again.display()));
    shown.push(d.wg("showconf IF"));
    // syncconf to a config without the second peer and with the first one changed.
    let third = dir.join(format!("{}-3.conf", d.ifname));
    std::fs::write(
        &third,
        format!(
            "[Interface]\nPrivateKey = {}\nListenPort = 51844\n\n[Peer]\nPublicKey = {}\nAllowedIPs = 10.5.1.0/24\n",
            me.private, p1.public
        ),
    )
    .unwrap();
    d.wg(&format!("syncconf IF {}", third.display()));
    shown.push(d.wg("showconf IF"));
    for f in [first, again, third] {
        let _ = std::fs::remove_file(f);
    }
    shown
}

/// Lines of a showconf, sorted, so peer order (unordered in wireguard-go) is ignored.
fn normalised(conf: &str) -> Vec<String> {
    let mut v: Vec<String> = conf
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    v.sort();
    v
}

#[test]
fn showconf_syncconf_and_every_setting_match_wireguard_go() {
    require_root();
    let ns = Netns::fresh();
    let ours = Daemon::start(WIRELANE, &ns);
    let keys = [genkeys(), genkeys(), genkeys()];
    let psk = sh_ok("wg genpsk").trim().to_string();
    let shown = config_roundtrips(&ours, &keys, &psk);
    for needle in [
        "ListenPort = 51844",
        "FwMark = 0x2a",
        &format!("PublicKey = {}", keys[1].public),
        &format!("PresharedKey = {psk}"),
        "Endpoint = [fd00::9]:4000",
        "PersistentKeepalive = 25",
        "AllowedIPs = 10.5.0.0/16, fd05::/64",
        "Endpoint = [fe80::7%lo]:5000",
    ] {
        assert!(
            shown[0].contains(needle),
            "missing {needle:?} in:\n{}",
            shown[0]
        );
    }
    assert_eq!(
        shown[1], shown[0],
        "syncconf with the same config changed something"
    );
    let peers = ours.dump_peers();
    assert_eq!(peers.len(), 1);
    assert_eq!(peers[0].allowed_ips, "10.5.1.0/24");
    // The reference implementation, driven the same way, ends in the same state.
    let ns2 = Netns::fresh();
    let reference = Daemon::start(Impl::WireguardGo, &ns2);
    let expected = config_roundtrips(&reference, &keys, &psk);
    for (got, want) in shown.iter().zip(&expected) {
        assert_eq!(normalised(got), normalised(want));
    }
    // Removing a peer through wg set.
    ours.wg(&format!("set IF peer {} remove", keys[1].public));
    assert!(ours.dump_peers().is_empty());
}

/// Reads one capability line of a /proc status file as a mask.
fn cap_field(status: &str, field: &str) -> u64 {
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} missing from status"));
    u64::from_str_radix(line[field.len()..].trim(), 16).unwrap()
}

#[test]
fn keeps_only_the_capabilities_it_needs() {
    require_root();
    let ns = Netns::fresh();
    let d = Daemon::start(WIRELANE, &ns);
    // What the kept capabilities are for still works after the drop: a fwmark needs
    // CAP_NET_ADMIN, a port below 1024 CAP_NET_BIND_SERVICE.
    d.wg("set IF fwmark 0x51 listen-port 853");
    assert!(d.wg("show IF").contains("listening port: 853"));
    assert!(d.wg("show IF fwmark").contains("0x51"));
    let kept = (1u64 << 12) | (1 << 10);
    let tasks = std::fs::read_dir(format!("/proc/{}/task", d.pid())).unwrap();
    let mut threads = 0;
    for t in tasks {
        // A UAPI connection's thread may end between the listing and the read.
        let Ok(status) = std::fs::read_to_string(t.unwrap().path().join("status")) else {
            continue;
        };
        for field in ["CapEff:", "CapPrm:", "CapBnd:"] {
            assert_eq!(cap_field(&status, field), kept, "{field} in\n{status}");
        }
        assert_eq!(cap_field(&status, "CapInh:"), 0);
        assert_eq!(cap_field(&status, "CapAmb:"), 0);
        assert!(status.contains("NoNewPrivs:\t1"), "{status}");
        threads += 1;
    }
    assert!(threads > 1, "the workers are threads of the daemon");
}
