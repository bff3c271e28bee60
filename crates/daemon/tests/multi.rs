//! Several tunnels in one process: verified bulk traffic through three at once, one
//! removed and one added while the others carry traffic, wg-quick bringing two tunnels
//! into one pool and out again, thread counts that show one pool, and bad requests
//! that change nothing. The peers are wireguard-go processes, one per tunnel.

use std::net::{IpAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wirelane_lab::impls::start_wirelane;
use wirelane_lab::testbed::*;

/// Every thread has its name: a thread takes it when it first runs, and until then
/// shows the process's ("wirelane"), which on a busy machine can take a while.
fn named(pid: u32) -> bool {
    thread_names(pid)
        .iter()
        .filter(|n| *n == "wirelane")
        .count()
        == 1
}

fn count(pid: u32, prefix: &str) -> usize {
    thread_names(pid)
        .iter()
        .filter(|n| n.starts_with(prefix))
        .count()
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The process that listens on `ifname`'s UAPI socket (SO_PEERCRED of a connection).
fn uapi_owner(ifname: &str) -> u32 {
    let s = UnixStream::connect(socket_path(ifname)).expect("UAPI socket answers");
    // SAFETY: getsockopt writes at most `len` bytes into the ucred it is given.
    unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        let rc = libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        );
        assert_eq!(rc, 0, "SO_PEERCRED: {}", std::io::Error::last_os_error());
        cred.pid as u32
    }
}

fn wirelane(ns: &Netns, args: &[&str]) -> std::process::Output {
    run_wirelane(env!("CARGO_BIN_EXE_wirelane"), ns, args)
}

fn list(ns: &Netns, pool: &str) -> Vec<String> {
    pool_tunnels(env!("CARGO_BIN_EXE_wirelane"), ns, pool)
}

fn sorted(names: &[&String]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

fn sent_bytes(d: &Daemon) -> u64 {
    d.dump_peers().first().map_or(0, |p| p.tx)
}

/// Verified transfers of `chunk` bytes over one tunnel, one after another, until `stop`
/// (at most `max` of them); returns how many completed. Each is checked byte for byte.
fn transfers_until(pair: &Pair, to: IpAddr, chunk: usize, max: usize, stop: &AtomicBool) -> usize {
    let mut done = 0;
    while done < max && (done == 0 || !stop.load(Ordering::Relaxed)) {
        tcp_transfer(&pair.a, &pair.b, to, chunk, Duration::from_secs(60));
        done += 1;
    }
    done
}

/// Datagrams into tunnel `to` from namespace `ns` until `stop`: bounded to 30 s and
/// 200,000 datagrams; send errors (once the tunnel is gone) are expected.
fn udp_stream(ns: String, to: IpAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        enter_ns(&ns);
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let payload = [0x5au8; 1200];
        let mut sent = 0u64;
        for n in 0..200_000u32 {
            if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                break;
            }
            if s.send_to(&payload, (to, 9)).is_ok() {
                sent += 1;
            }
            if n % 64 == 63 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        sent
    })
}

#[test]
fn tunnels_come_and_go_under_traffic_in_one_pool() {
    require_root();
    let pair = Pair::new(false);
    // One wirelane serving a single tunnel, for the thread count of one pool.
    let single = Daemon::start(WIRELANE, &pair.a);
    wait_until(
        "a settled single-tunnel process",
        Duration::from_secs(10),
        || named(single.pid()) && count(single.pid(), "wl-tun") >= 1,
    );
    // A tunnel adds no thread: its TUN queues and UDP sockets join the runtime's
    // readers (one per TUN queue index, one per kind of socket and family).
    let base = thread_names(single.pid()).len();
    let tun_readers = count(single.pid(), "wl-tun");
    let workers = count(single.pid(), "wl-worker-");
    assert!(workers >= 1, "{:?}", thread_names(single.pid()));
    drop(single);

    let pool = unique("p");
    let names: Vec<String> = (0..3).map(|_| unique("mt")).collect();
    let a = start_wirelane(WIRELANE, &pair.a, &names, &["--pool", &pool])
        .unwrap_or_else(|e| panic!("{e}"));
    let pid = a[0].pid();
    let b: Vec<Daemon> = (0..4)
        .map(|_| Daemon::start(Impl::WireguardGo, &pair.b))
        .collect();
    let inner: Vec<IpAddr> = (0..3)
        .map(|i| configure_tunnel(&pair, &a[i], &b[i], i as u8 + 1))
        .collect();

    // One pool: three tunnels have the threads of one.
    wait_until("three tunnels' threads", Duration::from_secs(10), || {
        named(pid) && thread_names(pid).len() == base
    });
    assert_eq!(count(pid, "wl-worker-"), workers, "{:?}", thread_names(pid));
    assert_eq!(count(pid, "wl-tun"), tun_readers, "{:?}", thread_names(pid));
    for reader in ["wl-udp4-read", "wl-udp6-hs", "wl-udp4-proof"] {
        assert_eq!(count(pid, reader), 1, "{:?}", thread_names(pid));
    }

    // Three tunnels carry verified bulk traffic at once.
    std::thread::scope(|s| {
        for to in &inner {
            let pair = &pair;
            s.spawn(move || tcp_transfer(&pair.a, &pair.b, *to, 8 << 20, Duration::from_secs(90)));
        }
    });

    // During traffic on tunnels 1 and 2: tunnel 3 goes, tunnel 4 comes and carries
    // traffic; every transfer on 1 and 2 arrives intact.
    let stop = Arc::new(AtomicBool::new(false));
    let udp = udp_stream(pair.a.name.clone(), inner[2], stop.clone());
    std::thread::scope(|s| {
        let busy: Vec<_> = inner[..2]
            .iter()
            .map(|to| {
                let (pair, stop) = (&pair, &*stop);
                s.spawn(move || transfers_until(pair, *to, 2 << 20, 40, stop))
            })
            .collect();
        let tx0 = sent_bytes(&a[0]);
        wait_until("traffic on tunnel 1", Duration::from_secs(30), || {
            sent_bytes(&a[0]) > tx0 + (256 << 10)
        });
        // An idle UAPI connection must not keep the removed tunnel's interface alive.
        let idle = UnixStream::connect(socket_path(&names[2])).unwrap();
        let o = wirelane(&pair.a, &["--pool", &pool, "--remove", &names[2]]);
        assert!(o.status.success(), "{o:?}");
        wait_until(
            "the removed interface to go",
            Duration::from_secs(10),
            || !link_exists(&pair.a, &names[2]),
        );
        drop(idle);
        assert!(!socket_path(&names[2]).exists());

        let added = unique("mt");
        let o = wirelane(&pair.a, &["--pool", &pool, &added]);
        assert!(o.status.success(), "{o:?}");
        assert_eq!(uapi_owner(&added), pid, "the new tunnel joined the pool");
        let fourth = a[0].sharing(&added);
        let to = configure_tunnel(&pair, &fourth, &b[3], 4);
        tcp_transfer(&pair.a, &pair.b, to, 4 << 20, Duration::from_secs(60));
        stop.store(true, Ordering::Relaxed);
        for h in busy {
            assert!(h.join().unwrap() >= 1);
        }
        assert_eq!(
            list(&pair.a, &pool),
            sorted(&[&names[0], &names[1], &added])
        );
    });
    stop.store(true, Ordering::Relaxed);
    udp.join().unwrap();

    // Still one pool, with the threads of one tunnel.
    wait_until("the pool's threads", Duration::from_secs(10), || {
        named(pid) && thread_names(pid).len() == base
    });
    assert_eq!(count(pid, "wl-worker-"), workers, "{:?}", thread_names(pid));
    // The tunnels that stayed kept their sessions.
    for (d, to) in a[..2].iter().zip(&inner) {
        assert!(d.dump_peers()[0].latest_handshake > 0);
        tcp_transfer(&pair.a, &pair.b, *to, 1 << 20, Duration::from_secs(30));
    }
}

/// Kills a detached pool on drop, so a failed test leaves no daemon behind.
struct Detached(Option<u32>);

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(pid) = self.0.filter(|p| alive(*p)) {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
}

#[test]
fn wg_quick_brings_two_tunnels_into_one_pool() {
    require_root();
    let pair = Pair::new(false);
    let pool = unique("q");
    let peers: Vec<Daemon> = (0..2)
        .map(|_| Daemon::start(Impl::WireguardGo, &pair.b))
        .collect();
    let dir = std::env::temp_dir().join(unique("mq"));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = env!("CARGO_BIN_EXE_wirelane");
    let mut confs = Vec::new();
    let mut names = Vec::new();
    let mut guard = Detached(None);
    for (i, peer) in peers.iter().enumerate() {
        let (ka, kb) = (genkeys(), genkeys());
        let ifname = unique("mq");
        let (pa, pb) = (52200 + i as u16, 52300 + i as u16);
        let conf = dir.join(format!("{ifname}.conf"));
        std::fs::write(
            &conf,
            format!(
                "[Interface]\nPrivateKey = {}\nAddress = 10.81.{i}.1/24\nListenPort = {pa}\n\n\
                 [Peer]\nPublicKey = {}\nAllowedIPs = 10.81.{i}.2/32\nEndpoint = {}:{pb}\n",
                ka.private, kb.public, pair.addr_b
            ),
        )
        .unwrap();
        std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o600)).unwrap();
        let pconf = dir.join(format!("peer{i}.conf"));
        std::fs::write(
            &pconf,
            format!(
                "[Interface]\nPrivateKey = {}\nListenPort = {pb}\n\n[Peer]\nPublicKey = {}\nAllowedIPs = 10.81.{i}.1/32\n",
                kb.private, ka.public
            ),
        )
        .unwrap();
        peer.wg(&format!("setconf IF {}", pconf.display()));
        pair.b.run_ok(&format!(
            "ip addr add 10.81.{i}.2/24 dev {0} && ip link set {0} up",
            peer.ifname
        ));
        pair.a.run_ok(&format!(
            "WIRELANE_POOL={pool} WG_QUICK_USERSPACE_IMPLEMENTATION={bin} wg-quick up {}",
            conf.display()
        ));
        guard.0.get_or_insert(uapi_owner(&ifname));
        confs.push(conf);
        names.push(ifname);
    }
    let pid = guard.0.unwrap();
    assert_eq!(uapi_owner(&names[1]), pid, "both tunnels in one process");
    assert_eq!(list(&pair.a, &pool), sorted(&[&names[0], &names[1]]));
    std::thread::scope(|s| {
        for i in 0..2 {
            let pair = &pair;
            s.spawn(move || {
                let to = format!("10.81.{i}.2").parse().unwrap();
                tcp_transfer(&pair.a, &pair.b, to, 4 << 20, Duration::from_secs(60))
            });
        }
    });

    // Down removes only that tunnel; the pool and the other tunnel carry on.
    pair.a
        .run_ok(&format!("wg-quick down {}", confs[0].display()));
    wait_until(
        "the first tunnel to leave the pool",
        Duration::from_secs(10),
        || list(&pair.a, &pool) == [names[1].clone()],
    );
    assert!(alive(pid));
    assert!(!socket_path(&names[0]).exists());
    tcp_transfer(
        &pair.a,
        &pair.b,
        "10.81.1.2".parse().unwrap(),
        1 << 20,
        Duration::from_secs(30),
    );
    // The last one down ends the process, and its pool with it; up again at once
    // finds that pool on its way out and starts a new one.
    let up_again = format!(
        "wg-quick down {c} && WIRELANE_POOL={pool} WG_QUICK_USERSPACE_IMPLEMENTATION={bin} \
         wg-quick up {c}",
        c = confs[1].display()
    );
    pair.a.run_ok(&up_again);
    wait_until("the old pool to exit", Duration::from_secs(10), || {
        !alive(pid)
    });
    let second = uapi_owner(&names[1]);
    guard.0 = Some(second);
    assert_eq!(list(&pair.a, &pool), [names[1].clone()]);
    tcp_transfer(
        &pair.a,
        &pair.b,
        "10.81.1.2".parse().unwrap(),
        1 << 20,
        Duration::from_secs(30),
    );
    pair.a
        .run_ok(&format!("wg-quick down {}", confs[1].display()));
    wait_until("the pool to exit", Duration::from_secs(10), || {
        !alive(second)
    });
    assert!(!socket_path(&names[1]).exists());
    let o = wirelane(&pair.a, &["--pool", &pool, "--list"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no pool"),
        "{o:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A pool started empty (as a service unit would start it) stays up with no tunnel,
/// takes tunnels that join and gives them back, and refuses a second empty start.
#[test]
fn an_empty_pool_stays_for_tunnels_to_join() {
    require_root();
    let ns = Netns::fresh();
    let pool = unique("e");
    let name = unique("me");
    let mut child = Reaped(
        Command::new("ip")
            .args(["netns", "exec", &ns.name, env!("CARGO_BIN_EXE_wirelane")])
            .args(["-f", "--pool", &pool, "--stay"])
            .env("LOG_LEVEL", "error")
            .spawn()
            .unwrap(),
    );
    wait_until("the empty pool to answer", Duration::from_secs(10), || {
        wirelane(&ns, &["--pool", &pool, "--list"]).status.success()
    });
    assert!(list(&ns, &pool).is_empty());

    let o = wirelane(&ns, &["--pool", &pool, "-f", "--stay"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("already running"),
        "{o:?}"
    );
    let o = wirelane(&ns, &["--pool", &pool]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "no interface and no --stay: {o:?}"
    );

    let o = wirelane(&ns, &["--pool", &pool, &name]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(list(&ns, &pool), std::slice::from_ref(&name));
    assert_eq!(uapi_owner(&name), child.0.id());
    let o = wirelane(&ns, &["--pool", &pool, "--remove", &name]);
    assert!(o.status.success(), "{o:?}");
    wait_until(
        "the removed interface to go",
        Duration::from_secs(10),
        || !link_exists(&ns, &name),
    );
    assert!(list(&ns, &pool).is_empty());
    assert!(child.0.try_wait().unwrap().is_none(), "the pool stays");

    // SIGTERM ends it cleanly, control socket and all.
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!wirelane(&ns, &["--pool", &pool, "--list"]).status.success());
    let prefix = format!("wirelane-pool-{pool}-");
    let left: Vec<_> = std::fs::read_dir("/var/run/wireguard")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "the pool left {left:?}");
}

#[test]
fn bad_tunnel_requests_change_nothing() {
    require_root();
    let ns = Netns::fresh();
    let pool = unique("b");
    let name = unique("mb");
    let a = start_wirelane(
        WIRELANE,
        &ns,
        std::slice::from_ref(&name),
        &["--pool", &pool],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let pid = a[0].pid();
    a[0].wg("set IF listen-port 52400");
    let other = Daemon::start(WIRELANE, &ns);
    let fresh = unique("mb");
    let unchanged = |what: &str| {
        assert_eq!(
            list(&ns, &pool),
            std::slice::from_ref(&name),
            "after {what}"
        );
        assert!(!link_exists(&ns, &fresh), "after {what}");
        assert!(!socket_path(&fresh).exists(), "after {what}");
        assert_eq!(uapi_owner(&name), pid, "after {what}");
        assert!(
            a[0].wg("show IF listen-port").contains("52400"),
            "after {what}"
        );
        assert_eq!(uapi_owner(&other.ifname), other.pid(), "after {what}");
    };

    // A request that fails with `code`, says why (`needle`), and changes nothing.
    let refused = |args: &[&str], code: i32, needle: &str| {
        let o = wirelane(&ns, args);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(needle),
            "{args:?}: {o:?}"
        );
        unchanged(&format!("{args:?}"));
    };
    // Refused before anything is asked of anyone: exit code 2, as for any bad argument.
    for (args, needle) in [
        (vec!["--pool", &pool, &fresh, &fresh], "named twice"),
        (
            vec!["--pool", &pool, "sixteen-chars-xx"],
            "not a valid interface name",
        ),
        (vec!["--pool", "no/slash", &fresh], "not a valid pool name"),
        (vec!["--remove", &name], "need a pool"),
        (
            vec!["--pool", &pool, "--remove", "bad/name"],
            "not a valid interface name",
        ),
    ] {
        refused(&args, 2, needle);
    }
    // Refused by the pool or the kernel: exit code 1 and the reason.
    for (args, needle) in [
        (vec!["--pool", &pool, &name], "already served"),
        (vec!["--pool", &pool, &other.ifname], "already served"),
        (
            vec!["--pool", &pool, &fresh, &other.ifname],
            "already served",
        ),
        (
            vec!["--pool", &pool, "--remove", "nosuchtunnel"],
            "no tunnel nosuchtunnel",
        ),
        (
            vec!["--pool", &pool, "--remove", &other.ifname],
            "no tunnel",
        ),
        (vec!["-f", &fresh, &other.ifname], "already served"),
    ] {
        refused(&args, 1, needle);
    }
    // Garbage on the control socket gets an error line and nothing else.
    let ctl = std::fs::read_dir("/var/run/wireguard")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name().is_some_and(|f| {
                let f = f.to_string_lossy();
                f.starts_with(&format!("wirelane-pool-{pool}-")) && f.ends_with(".ctl")
            })
        })
        .expect("the pool's control socket");
    assert_eq!(
        std::fs::metadata(&ctl).unwrap().permissions().mode() & 0o777,
        0o600
    );
    for request in [
        "frobnicate\n".to_string(),
        "add\n".into(),
        "add \n".into(),
        format!("add {}\n", "x".repeat(400)),
        "remove\n".into(),
        "list".into(),
        "\u{0}\u{1}\n".into(),
    ] {
        use std::io::{Read, Write};
        let mut s = UnixStream::connect(&ctl).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("error: "), "{request:?}: {answer:?}");
        unchanged(&format!("{request:?}"));
    }
    assert!(alive(pid));
}
