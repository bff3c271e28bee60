//! A pool's control requests at their edges: a tunnel deleted and added again at once
//! (`systemctl restart` of one pooled tunnel), a pool whose control places are all
//! taken (many tunnels joining at boot), and a request from another network namespace.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};
use wirelane_lab::netns::unique;
use wirelane_lab::testbed::*;

const BIN: &str = env!("CARGO_BIN_EXE_wirelane");

fn wirelane(ns: &Netns, args: &[&str]) -> std::process::Output {
    run_wirelane(BIN, ns, args)
}

fn list(ns: &Netns, pool: &str) -> Vec<String> {
    pool_tunnels(BIN, ns, pool)
}

/// An empty pool that stays, in `ns`, answering once this returns.
fn empty_pool(ns: &Netns, pool: &str) -> Reaped {
    let child = Reaped(
        Command::new("ip")
            .args(["netns", "exec", &ns.name, BIN])
            .args(["-f", "--pool", pool, "--stay"])
            .env("LOG_LEVEL", "error")
            .spawn()
            .unwrap(),
    );
    wait_until("the empty pool to answer", Duration::from_secs(10), || {
        wirelane(ns, &["--pool", pool, "--list"]).status.success()
    });
    child
}

/// The pool's control socket, as a process in `ns` finds it.
fn control_path(ns: &Netns, pool: &str) -> String {
    let ns_name = ns.name.clone();
    let ino = std::thread::spawn(move || {
        enter_ns(&ns_name);
        std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
    })
    .join()
    .unwrap();
    format!("/var/run/wireguard/wirelane-pool-{pool}-{ino}.ctl")
}

/// A tunnel whose device was just deleted can be added again at once, before the
/// pool has noticed the deletion on its own: the name is free, and the add takes it.
#[test]
fn a_deleted_tunnel_is_added_again_at_once() {
    require_root();
    let ns = Netns::fresh();
    let pool = unique("r");
    let name = unique("mr");
    let _pool = empty_pool(&ns, &pool);
    for round in 0..8 {
        // One shell, so that the add follows the deletion by an exec's time.
        let o = Command::new("ip")
            .args(["netns", "exec", &ns.name, "sh", "-c"])
            .arg(format!(
                "ip link del {name} 2> /dev/null; exec {BIN} --pool {pool} {name}"
            ))
            .env("LOG_LEVEL", "error")
            .output()
            .unwrap();
        assert!(o.status.success(), "round {round}: {o:?}");
        assert_eq!(
            list(&ns, &pool),
            std::slice::from_ref(&name),
            "round {round}"
        );
        assert!(link_exists(&ns, &name), "round {round}");
    }
}

/// With every control place held by clients that say nothing, a tunnel asked for is
/// answered "busy" and asked again until a place frees (a silent client's time runs
/// out), instead of being taken for a pool on its way out.
#[test]
fn a_busy_pool_is_asked_again() {
    require_root();
    let ns = Netns::fresh();
    let pool = unique("y");
    let name = unique("my");
    let _pool = empty_pool(&ns, &pool);
    let path = control_path(&ns, &pool);
    // The pool serves 16 control connections at once; each silent one holds its
    // place for the connection's 10 s.
    let silent: Vec<UnixStream> = (0..16)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let o = wirelane(&ns, &["--pool", &pool, &name]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(list(&ns, &pool), std::slice::from_ref(&name));
    // Not a behaviour threshold: it shows the request did wait for a place.
    eprintln!("joined after {:?}", started.elapsed());
    drop(silent);
}

/// A request from another network namespace than the pool's is refused with a
/// reason, and creates nothing in either.
#[test]
fn a_request_from_another_namespace_is_refused() {
    require_root();
    let ns = Netns::fresh();
    let pool = unique("n");
    let name = unique("mn");
    let _pool = empty_pool(&ns, &pool);
    // This process's namespace is not the pool's.
    let mut s = UnixStream::connect(control_path(&ns, &pool)).unwrap();
    writeln!(s, "add {name}").unwrap();
    let mut answer = String::new();
    BufReader::new(&s).read_line(&mut answer).unwrap();
    assert!(
        answer.starts_with("error:") && answer.contains("another network namespace"),
        "{answer}"
    );
    assert!(list(&ns, &pool).is_empty());
    assert!(!link_exists(&ns, &name));
    let here = Command::new("ip")
        .args(["link", "show", "dev", &name])
        .output()
        .unwrap();
    assert!(
        !here.status.success(),
        "a link {name} in the test's namespace"
    );
}
