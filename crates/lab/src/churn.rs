//! Churn scenarios: configuration changes while traffic flows, and interface up/down
//! cycles, against a wirelane pair tunnel, watching the receiving daemon's memory,
//! descriptors and threads.
//!
//! Misrouting is made observable: every decoy peer added during churn has its endpoint
//! at a sink socket in B's namespace, and decoys also take prefixes that contain the
//! real peer's address (less specific than its /32). A daemon that routed even one
//! packet to a decoy would send the sink a handshake initiation; nothing else may,
//! since decoys have no traffic and no persistent keepalive.

use crate::impls::{self, Tunnel};
use crate::peers::rss_kib;
use crate::relay::{Impairment, Rng};
use crate::topology::{Testbed, Topology};
use crate::workload::{in_ns, join, tcp};
use crate::{uapi, Result};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wirelane_proto::hex_key;

/// Decoys alive at once; churn adds and removes around this many.
const DECOYS: usize = 1_000;
const SINK_PORT: u16 = 60_999;

/// Descriptors and threads of a process.
pub fn fds_and_threads(pid: u32) -> Result<(usize, usize)> {
    Ok((
        std::fs::read_dir(format!("/proc/{pid}/fd"))?.count(),
        std::fs::read_dir(format!("/proc/{pid}/task"))?.count(),
    ))
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub at_s: f64,
    pub rss_kib: u64,
    pub fds: usize,
    pub threads: usize,
    pub peers: u64,
    pub goodput_bps: f64,
}

#[derive(Debug, Default)]
pub struct ChurnOutcome {
    pub samples: Vec<Sample>,
    pub peers_added: u64,
    pub peers_removed: u64,
    pub keys_replaced: u64,
    pub psks_changed: u64,
    pub uapi_errors: u64,
    /// Datagrams that reached the decoys' sink: each one is a misrouted packet.
    pub sink_datagrams: u64,
    pub tcp_corrupt_bytes: u64,
    pub tcp_retransmits: u64,
    /// B's descriptors and threads before the churn started and after it stopped
    /// (samples during the churn may catch a UAPI connection's socket and thread).
    pub quiet_before: (usize, usize),
    pub quiet_after: (usize, usize),
}

#[derive(Default)]
struct ChurnCounts {
    added: AtomicU64,
    removed: AtomicU64,
    keys: AtomicU64,
    psks: AtomicU64,
    errors: AtomicU64,
}

/// One round of changes on `ifname`: add 64 decoys (two of them taking prefixes that
/// contain the tunnel's addresses), replace the key of 8, change the preshared key of
/// 8, and remove the oldest beyond `DECOYS`.
fn churn_round(
    ifname: &str,
    rng: &mut Rng,
    decoys: &mut VecDeque<([u8; 32], String)>,
    sink: SocketAddr,
    round: u64,
    c: &ChurnCounts,
) {
    let key = |rng: &mut Rng| {
        let mut k = [0u8; 32];
        rng.fill(&mut k);
        k
    };
    let mut set = String::from("set=1");
    for i in 0..64u64 {
        let k = key(rng);
        let n = round * 64 + i;
        let allowed = match i {
            0 => "10.81.0.0/16".to_string(),
            1 => "0.0.0.0/0".to_string(),
            _ => format!(
                "10.{}.{}.{}/32",
                64 + (n >> 16) % 64,
                (n >> 8) % 256,
                n % 256
            ),
        };
        let _ = write!(
            set,
            "\npublic_key={}\npreshared_key={}\nendpoint={sink}\nallowed_ip={allowed}",
            hex_key(&k),
            hex_key(&key(rng))
        );
        decoys.push_back((k, allowed));
    }
    c.added.fetch_add(64, Ordering::Relaxed);
    for _ in 0..8 {
        let i = (rng.next() as usize) % decoys.len();
        let new = key(rng);
        let (old, allowed) = decoys[i].clone();
        let _ = write!(
            set,
            "\npublic_key={}\nremove=true\npublic_key={}\nendpoint={sink}\nallowed_ip={allowed}",
            hex_key(&old),
            hex_key(&new)
        );
        decoys[i].0 = new;
        let j = (rng.next() as usize) % decoys.len();
        let _ = write!(
            set,
            "\npublic_key={}\npreshared_key={}",
            hex_key(&decoys[j].0),
            hex_key(&key(rng))
        );
    }
    c.keys.fetch_add(8, Ordering::Relaxed);
    c.psks.fetch_add(8, Ordering::Relaxed);
    while decoys.len() > DECOYS {
        let (old, _) = decoys.pop_front().expect("non-empty");
        let _ = write!(set, "\npublic_key={}\nremove=true", hex_key(&old));
        c.removed.fetch_add(1, Ordering::Relaxed);
    }
    if uapi::request(ifname, &set).is_err() {
        c.errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Bulk TCP from A to B in runs of `chunk` for `total`, while B's configuration churns
/// continuously; B's daemon is sampled after every run.
pub fn churn_scenario(total: Duration, chunk: Duration) -> Result<ChurnOutcome> {
    let bed = Testbed::build(Topology::Pair, Impairment::default())?;
    let tun = Tunnel::up(impls::WIRELANE, &bed)?;
    let (a, b) = (bed.hosts[0].ns.name.clone(), bed.hosts[1].ns.name.clone());
    let b_if = tun.daemons[1].ifname.clone();
    let pid = tun.daemons[1].pid.ok_or("daemon has no pid")?;
    let sink_addr = SocketAddr::new(bed.hosts[1].underlay, SINK_PORT);
    let stop = Arc::new(AtomicBool::new(false));
    let sink = {
        let stop = stop.clone();
        in_ns(&b, move || -> Result<u64> {
            let s = UdpSocket::bind(sink_addr)?;
            s.set_read_timeout(Some(Duration::from_millis(100)))?;
            let (mut n, mut buf) = (0, [0u8; 2048]);
            while !stop.load(Ordering::Relaxed) {
                if s.recv(&mut buf).is_ok() {
                    n += 1;
                }
            }
            Ok(n)
        })
    };
    tcp::bulk(&a, &b, tun.addr_b, 1, Duration::from_millis(300))?; // handshake
    let mut o = ChurnOutcome {
        quiet_before: fds_and_threads(pid)?,
        ..Default::default()
    };
    let counts = Arc::new(ChurnCounts::default());
    let churner = {
        let (stop, counts, ifname) = (stop.clone(), counts.clone(), b_if.clone());
        std::thread::spawn(move || {
            let (mut rng, mut decoys, mut round) = (Rng(0x5eed_cafe_f00d), VecDeque::new(), 0);
            while !stop.load(Ordering::Relaxed) {
                churn_round(&ifname, &mut rng, &mut decoys, sink_addr, round, &counts);
                round += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let start = Instant::now();
    let result = (|| -> Result<()> {
        while start.elapsed() < total {
            crate::interrupt::check()?;
            let t = tcp::bulk(&a, &b, tun.addr_b, 1, chunk)?;
            o.tcp_corrupt_bytes += t.corrupt_bytes;
            o.tcp_retransmits += t.retransmits;
            let (fds, threads) = fds_and_threads(pid)?;
            o.samples.push(Sample {
                at_s: start.elapsed().as_secs_f64(),
                rss_kib: rss_kib(pid)?,
                fds,
                threads,
                peers: uapi::stats(&b_if)?.get("peers").copied().unwrap_or(0),
                goodput_bps: t.goodput_bps,
            });
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    let _ = churner.join();
    o.sink_datagrams = join(sink)?;
    result?;
    // The last UAPI connection's thread and socket take a moment to go.
    let settle_by = Instant::now() + Duration::from_secs(5);
    loop {
        o.quiet_after = fds_and_threads(pid)?;
        if o.quiet_after == o.quiet_before || Instant::now() > settle_by {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    o.peers_added = g(&counts.added);
    o.peers_removed = g(&counts.removed);
    o.keys_replaced = g(&counts.keys);
    o.psks_changed = g(&counts.psks);
    o.uapi_errors = g(&counts.errors);
    Ok(o)
}

pub fn print_churn(o: &ChurnOutcome) {
    println!("| at | B's RSS | fds | threads | peers | TCP goodput |\n|---|---|---|---|---|---|");
    for s in &o.samples {
        println!(
            "| {:.0} s | {} KiB | {} | {} | {} | {:.2} Gbit/s |",
            s.at_s,
            s.rss_kib,
            s.fds,
            s.threads,
            s.peers,
            s.goodput_bps / 1e9
        );
    }
    println!(
        "\npeers added {}, removed {}, keys replaced {}, preshared keys changed {}, UAPI errors {}",
        o.peers_added, o.peers_removed, o.keys_replaced, o.psks_changed, o.uapi_errors
    );
    println!(
        "misrouted (datagrams at the decoys' sink): {}; TCP corrupt bytes: {}; TCP retransmits: {}",
        o.sink_datagrams, o.tcp_corrupt_bytes, o.tcp_retransmits
    );
    println!(
        "descriptors / threads with no UAPI client: {} / {} before the churn, {} / {} after",
        o.quiet_before.0, o.quiet_before.1, o.quiet_after.0, o.quiet_after.1
    );
}

#[derive(Debug, Default)]
pub struct UpDownOutcome {
    pub cycles: usize,
    pub before: (usize, usize),
    pub after: (usize, usize),
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    /// Whether the tunnel carried traffic after the cycles.
    pub works_after: bool,
}

/// Takes B's interface down and up `cycles` times, with a TCP run before and after,
/// and compares B's descriptors, threads and memory.
pub fn updown_scenario(cycles: usize) -> Result<UpDownOutcome> {
    let bed = Testbed::build(Topology::Pair, Impairment::default())?;
    let tun = Tunnel::up(impls::WIRELANE, &bed)?;
    let (a, b) = (bed.hosts[0].ns.name.clone(), bed.hosts[1].ns.name.clone());
    let b_if = &tun.daemons[1].ifname;
    let pid = tun.daemons[1].pid.ok_or("daemon has no pid")?;
    tcp::bulk(&a, &b, tun.addr_b, 1, Duration::from_millis(500))?;
    let mut o = UpDownOutcome {
        cycles,
        before: fds_and_threads(pid)?,
        rss_before_kib: rss_kib(pid)?,
        ..Default::default()
    };
    for _ in 0..cycles {
        crate::interrupt::check()?;
        bed.hosts[1]
            .ns
            .run(&format!("ip link set {b_if} down && ip link set {b_if} up"))?;
    }
    // Routes of the interface's address return with it; traffic must flow again. Set
    // down, b forgot its sessions (as the kernel's `wg_stop` does), while a still holds
    // its own: a's packets are refused until a handshake, which b's first packet
    // begins (a would begin one itself only after 15 s of unanswered data).
    bed.hosts[1]
        .ns
        .run(&format!("ping -c 1 -W 5 {}", tun.addr_a))?;
    let t = tcp::bulk(&a, &b, tun.addr_b, 1, Duration::from_millis(500))?;
    o.works_after = t.bytes > 0 && t.corrupt_bytes == 0;
    o.after = fds_and_threads(pid)?;
    o.rss_after_kib = rss_kib(pid)?;
    Ok(o)
}

pub fn print_updown(o: &UpDownOutcome) {
    println!(
        "| figure | before | after {} up/down cycles |\n|---|---|---|",
        o.cycles
    );
    println!("| file descriptors | {} | {} |", o.before.0, o.after.0);
    println!("| threads | {} | {} |", o.before.1, o.after.1);
    println!(
        "| RSS | {} KiB | {} KiB |",
        o.rss_before_kib, o.rss_after_kib
    );
    println!(
        "| tunnel carries TCP | yes | {} |",
        if o.works_after { "yes" } else { "no" }
    );
}
