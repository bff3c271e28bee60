//! Resource limits at configuration time: a peer count past the interface's limit is
//! refused whole with a clear error and changes nothing, and peers cost no file
//! descriptors, so the descriptor limit never bounds them. A `set` request is bounded
//! by what a configuration within those limits takes, not by a fixed size: `wg
//! setconf` sends every peer at once.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use wirelane_lab::impls::start_wirelane;
use wirelane_lab::netns::{sh, unique};
use wirelane_lab::peers::config;
use wirelane_lab::testbed::*;

/// Runs `wg ARGS` in `d`'s namespace: its output, or its error message.
fn wg(d: &Daemon, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &d.ns, "wg"])
        .args(args)
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// Writes `conf` to a file of its own and runs `wg CMD IF FILE`.
fn wg_conf(d: &Daemon, cmd: &str, conf: &str) -> Result<String, String> {
    let path = std::env::temp_dir().join(format!("{}-{cmd}.conf", d.ifname));
    std::fs::write(&path, conf).unwrap();
    let out = wg(d, &[cmd, &d.ifname, path.to_str().unwrap()]);
    let _ = std::fs::remove_file(path);
    out
}

/// `--max-peers 100`: 80 peers load; adding 30 more is refused with the kernel's
/// errno ("Cannot allocate memory" from `wg`) and leaves the 80 exactly as they were;
/// replacing them with 100 loads; a set that keeps the count (one removed, one added)
/// is allowed at the limit.
#[test]
fn a_configuration_past_the_peer_limit_is_refused_whole() {
    require_root();
    let ns = Netns::fresh();
    let d = start_wirelane(WIRELANE, &ns, &[unique("lw")], &["--max-peers", "100"])
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(0);
    let private = genkeys().private;
    wg_conf(&d, "setconf", &config(80, &private)).unwrap();
    let before = d.wg("show IF dump");
    assert_eq!(d.dump_peers().len(), 80);

    // config(110) holds the same 80 keys first, then 30 new ones.
    let refused = wg_conf(&d, "addconf", &config(110, &private)).unwrap_err();
    assert!(refused.contains("Cannot allocate memory"), "{refused}");
    assert_eq!(
        d.wg("show IF dump"),
        before,
        "a refused update changes nothing"
    );

    wg_conf(&d, "setconf", &config(100, &private)).unwrap();
    let peers = d.dump_peers();
    assert_eq!(peers.len(), 100);
    let (gone, new) = (&peers[0].public_key, genkeys().public);
    d.wg(&format!(
        "set IF peer {gone} remove peer {new} allowed-ips 10.99.0.1/32"
    ));
    let keys: Vec<String> = d.dump_peers().into_iter().map(|p| p.public_key).collect();
    assert_eq!(keys.len(), 100);
    assert!(keys.contains(&new) && !keys.contains(gone));
    // One more is one too many.
    let more = genkeys().public;
    let err = wg(&d, &["set", &d.ifname, "peer", &more]).unwrap_err();
    assert!(err.contains("Cannot allocate memory"), "{err}");
    assert_eq!(d.dump_peers().len(), 100);
}

/// `--max-allowed-ips 10`: a peer with 8 loads; another with 3 is refused with the
/// peer limit's errno and changes nothing; replacing the first one's 8 with 10 loads
/// (its own 8 no longer count); removing a peer makes room.
#[test]
fn a_configuration_past_the_allowed_ip_limit_is_refused_whole() {
    require_root();
    let ns = Netns::fresh();
    let d = start_wirelane(WIRELANE, &ns, &[unique("lw")], &["--max-allowed-ips", "10"])
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(0);
    let (a, b) = (genkeys().public, genkeys().public);
    let ips = |n: usize, third: u8| {
        (0..n)
            .map(|i| format!("10.{third}.{i}.0/24"))
            .collect::<Vec<_>>()
            .join(",")
    };
    d.wg(&format!("set IF peer {a} allowed-ips {}", ips(8, 1)));
    let before = d.wg("show IF dump");
    let err = wg(
        &d,
        &["set", &d.ifname, "peer", &b, "allowed-ips", &ips(3, 2)],
    )
    .unwrap_err();
    assert!(err.contains("Cannot allocate memory"), "{err}");
    assert_eq!(
        d.wg("show IF dump"),
        before,
        "a refused update changes nothing"
    );
    d.wg(&format!("set IF peer {a} allowed-ips {}", ips(10, 3)));
    assert_eq!(d.dump_peers()[0].allowed_ips.split(',').count(), 10);
    d.wg(&format!(
        "set IF peer {a} remove peer {b} allowed-ips {}",
        ips(3, 2)
    ));
    let peers = d.dump_peers();
    assert_eq!((peers.len(), peers[0].public_key.as_str()), (1, b.as_str()));
}

/// Peers take no descriptors (one set of sockets serves them all): with the daemon's
/// descriptor limit lowered to 64, 5,000 peers load and every one is listed, where an
/// implementation with a socket per peer fails past its limit.
#[test]
fn peers_take_no_file_descriptors() {
    require_root();
    let ns = Netns::fresh();
    let d = Daemon::start(WIRELANE, &ns);
    let pid = d.pid();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    // The UAPI socket exists before the interface is served, and serving opens the
    // readers' epoll sets and wakers: count once the last of them, the IPv6
    // cookie-proof socket's reader, runs.
    let serving = || {
        thread_names(pid)
            .iter()
            .any(|name| name.starts_with("wl-udp6-proof"))
    };
    wait_until(
        "the interface served",
        std::time::Duration::from_secs(30),
        serving,
    );
    let open = fds();
    assert!(open < 64, "{open} descriptors before any peer");
    sh(&format!("prlimit --pid {pid} --nofile=64:64")).unwrap();
    wg_conf(&d, "setconf", &config(5_000, &genkeys().private)).unwrap();
    assert_eq!(d.dump_peers().len(), 5_000);
    assert!(fds() <= open + 2, "{} descriptors with 5,000 peers", fds());
}

/// `--max-peers 200000`: `wg setconf` of 170,000 peers, each with a preshared key, a
/// keepalive and two allowed IPs, loads whole. As the daemon holds it while it reads
/// (about 75 MiB), it is larger than the fixed 64 MiB bound a `set` once had, which
/// refused it and killed `wg` with SIGPIPE before it could say why.
#[test]
fn a_setconf_as_large_as_the_peer_limit_allows_loads() {
    require_root();
    let ns = Netns::fresh();
    let d = start_wirelane(WIRELANE, &ns, &[unique("lb")], &["--max-peers", "200000"])
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(0);
    let private = genkeys().private;
    let psk = genkeys().private;
    let conf = config(170_000, &private).replace(
        "AllowedIPs",
        &format!("PresharedKey = {psk}\nPersistentKeepalive = 25\nAllowedIPs"),
    );
    wg_conf(&d, "setconf", &conf).unwrap();
    assert_eq!(d.wg("show IF peers").lines().count(), 170_000);
}

/// With limits that make the floor (64 MiB) the bound, a `set` past it is answered
/// EMSGSIZE once the whole request has been read, and changes nothing: 17,000 lines
/// of 4,000 bytes (read whole, it would be answered errno=-22 for its unknown key). A
/// client that writes everything before it reads gets the answer, not a broken pipe.
#[test]
fn a_set_past_its_bound_is_read_to_its_end_and_refused() {
    require_root();
    let ns = Netns::fresh();
    let args = ["--max-peers", "100", "--max-allowed-ips", "1000"];
    let d = start_wirelane(WIRELANE, &ns, &[unique("lc")], &args)
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(0);
    d.wg("set IF listen-port 51820");
    let before = d.wg("show IF dump");
    let mut s = UnixStream::connect(socket_path(&d.ifname)).unwrap();
    let line = format!("x={}\n", "a".repeat(4000));
    let sent = std::iter::once("set=1\n")
        .chain(std::iter::repeat_n(line.as_str(), 17_000))
        .chain(std::iter::once("\n"))
        .all(|l| s.write_all(l.as_bytes()).is_ok());
    assert!(sent, "the whole request was read");
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, "errno=-90\n\n");
    assert_eq!(d.wg("show IF dump"), before);
}
