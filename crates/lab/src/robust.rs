//! Robustness scenarios: hostile traffic against a live wirelane tunnel, with figures.
//! Each runs on its own testbed (removed on return, even on error) and reads the
//! daemon's counters through the UAPI `stats=1` operation.

use crate::flood::{self, FloodKind, FloodReport, FloodSpec};
use crate::impls::{self, Daemon, Tunnel};
use crate::peers::rss_kib;
use crate::relay::Impairment;
use crate::stats::median;
use crate::topology::{Testbed, Topology};
use crate::uapi::{counter, delta};
use crate::workload::{in_ns, join, tcp};
use crate::{uapi, Result};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where spoofed flood sources come from. Host B routes it into a sink: a veth whose
/// peer is down, so a reply to a spoofed source goes through B's whole transmit path
/// and is dropped by the driver, as a real gateway's reply leaves by its NIC.
///
/// Why not route it back to host A: on one machine, veth delivers a packet by running
/// the receiver's stack in the sender's thread, so every reply would also bill the
/// responder for host A's IP input, route lookup and ICMP error for an address that
/// exists nowhere (about three quarters of the handshake thread's time under a flood,
/// by `perf`). Nothing on a real network charges a sender for that.
pub const SPOOF_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 200, 0, 0), 16);

/// The flooded host's route for [`SPOOF_NET`] into the sink. The next hop's neighbour
/// entry is permanent, so no ARP is tried; reverse-path filtering is off, since the
/// host now reaches the spoofed sources by another interface than the one they arrive
/// on.
pub fn spoof_sink_commands() -> String {
    let (net, len) = SPOOF_NET;
    format!(
        "ip link add wlsink0 type veth peer name wlsink1 && ip link set wlsink0 up \
         && ip addr add 10.201.0.2/32 dev wlsink0 \
         && ip neigh add 10.201.0.1 lladdr 02:00:00:00:00:01 dev wlsink0 nud permanent \
         && ip route add {net}/{len} via 10.201.0.1 dev wlsink0 onlink \
         && for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 > $f; done"
    )
}

/// The interface's public key, derived from the private key its UAPI reports.
fn public_key(ifname: &str) -> Result<[u8; 32]> {
    let private = uapi::request(ifname, "get=1")?
        .into_iter()
        .find(|(k, _)| k == "private_key")
        .and_then(|(_, v)| wirelane_proto::parse_hex_key(&v))
        .ok_or("interface has no private key")?;
    Ok(wirelane_proto::LocalIdentity::new(private).public)
}

fn v4(a: IpAddr) -> Result<Ipv4Addr> {
    match a {
        IpAddr::V4(a) => Ok(a),
        _ => Err("IPv4 underlay expected".into()),
    }
}

/// A wirelane pair tunnel with B's daemon as the flood target.
struct Target {
    bed: Testbed,
    tun: Tunnel,
    spec: FloodSpec,
}

impl Target {
    fn up(rate: Option<u64>) -> Result<Target> {
        let bed = Testbed::build(Topology::Pair, Impairment::default())?;
        let tun = Tunnel::up(impls::WIRELANE, &bed)?;
        let hb = &bed.hosts[1];
        hb.ns.run(&spoof_sink_commands())?;
        let spec = FloodSpec {
            kind: FloodKind::Spoofed,
            target: SocketAddrV4::new(v4(hb.underlay)?, hb.port),
            responder_public: public_key(&tun.daemons[1].ifname)?,
            source: SPOOF_NET,
            duration: Duration::ZERO,
            rate,
        };
        Ok(Target { bed, tun, spec })
    }

    fn ns(&self, i: usize) -> String {
        self.bed.hosts[i].ns.name.clone()
    }

    fn stats(&self) -> Result<BTreeMap<String, u64>> {
        uapi::stats(&self.tun.daemons[1].ifname)
    }

    /// Starts a flood of `kind` from host A for `dur`.
    fn flood(
        &self,
        kind: FloodKind,
        dur: Duration,
    ) -> std::thread::JoinHandle<Result<FloodReport>> {
        self.flood_to(
            kind,
            dur,
            self.spec.target.port(),
            &Arc::default(),
            self.spec.rate,
        )
    }

    /// As `flood` but at full rate (without competing traffic a paced flood may not
    /// keep the responder under load), ending early once `stop` is set.
    fn flood_until(
        &self,
        kind: FloodKind,
        dur: Duration,
        stop: &Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<Result<FloodReport>> {
        self.flood_to(kind, dur, self.spec.target.port(), stop, None)
    }

    /// As `flood`, aimed at `port` (a closed one measures the generator's own cost).
    fn flood_to(
        &self,
        kind: FloodKind,
        dur: Duration,
        port: u16,
        stop: &Arc<AtomicBool>,
        rate: Option<u64>,
    ) -> std::thread::JoinHandle<Result<FloodReport>> {
        let stop = stop.clone();
        let mut spec = self.spec;
        spec.rate = rate;
        spec.target.set_port(port);
        spec.kind = kind;
        spec.duration = dur;
        if kind == FloodKind::Cookie {
            spec.source = (
                v4(self.bed.hosts[0].underlay).unwrap_or(Ipv4Addr::UNSPECIFIED),
                32,
            );
        }
        in_ns(&self.ns(0), move || flood::run(&spec, &stop))
    }

    fn tcp(&self, dur: Duration) -> Result<f64> {
        Ok(tcp::bulk(&self.ns(0), &self.ns(1), self.tun.addr_b, 1, dur)?.goodput_bps)
    }
}

#[derive(Debug, Default)]
pub struct FloodOutcome {
    pub baseline_bps: Vec<f64>,
    /// The same flood aimed at a closed port: the generator's own cost.
    pub control_bps: Vec<f64>,
    pub flooded_bps: Vec<f64>,
    /// Initiations sent per second by the spoofed flood, per flooded run.
    pub spoofed_pps: Vec<f64>,
    pub under_load_seen: bool,
    pub cookie_replies_sent: u64,
    /// Cookie replies dropped unsent, and spoofed initiations sent at wirelane, over the
    /// same runs: together with `cookie_replies_sent`, the share of the flood answered.
    pub cookie_replies_unsent: u64,
    pub spoofed_sent_at_wirelane: u64,
    /// Datagrams the kernel dropped at B's data sockets and at its handshake sockets
    /// over the TCP runs (the flood's overflow lands on the latter).
    pub data_socket_drops: u64,
    pub handshake_socket_drops: u64,
    pub proof_socket_drops: u64,
    pub rate_limited: u64,
    /// Handshake messages from the one cookie-answering source that got past the rate
    /// limit while under load, and the seconds they were counted over.
    pub admitted_with_cookie: u64,
    pub admitted_window_s: f64,
    pub cookie_source_got_cookie: bool,
    pub ratelimiter_sources_max: u64,
    pub junk_sent: u64,
    pub junk_invalid_mac1: u64,
    pub junk_dropped_at_queue: u64,
    /// Junk the kernel dropped at the full handshake socket before we read it.
    pub junk_dropped_by_kernel: u64,
    pub junk_dh: u64,
    pub under_load_cleared_s: f64,
    pub new_peer_handshake_s: Option<f64>,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
}

impl FloodOutcome {
    /// Goodput under the flood against goodput without one.
    pub fn throughput_ratio(&self) -> f64 {
        median(&self.flooded_bps).unwrap_or(0.0) / median(&self.baseline_bps).unwrap_or(1.0)
    }

    /// Goodput under the flood against goodput with the generator running at a closed
    /// port: the part of the loss that is wirelane's.
    pub fn ratio_to_control(&self) -> f64 {
        median(&self.flooded_bps).unwrap_or(0.0) / median(&self.control_bps).unwrap_or(1.0)
    }
}

/// Brings a second wirelane up in host A with a fresh key, known to B, and measures the
/// seconds until a ping through it is answered (the handshake, through the cookie
/// round trip while B is under load).
fn new_peer_handshake(t: &Target) -> Result<Option<f64>> {
    let (a, b) = (&t.bed.hosts[0], &t.bed.hosts[1]);
    let d: Daemon = impls::start(impls::WIRELANE, &a.ns)?;
    let private = crate::netns::sh("wg genkey")?.trim().to_string();
    let public = crate::netns::sh(&format!("echo {private} | wg pubkey"))?
        .trim()
        .to_string();
    let keyfile = std::env::temp_dir().join(format!("{}.key", d.ifname));
    std::fs::write(&keyfile, format!("{private}\n"))?;
    let b_if = &t.tun.daemons[1].ifname;
    let setup = a.ns.run(&format!(
        "wg set {if_} private-key {kf} peer {pk} endpoint {ep}:{port} allowed-ips 10.82.0.2/32 \
         && ip addr add 10.82.0.3/32 dev {if_} && ip link set {if_} up \
         && ip route add 10.82.0.2/32 dev {if_}",
        if_ = d.ifname,
        kf = keyfile.display(),
        pk = wirelane_proto::base64_key(&t.spec.responder_public),
        ep = b.underlay,
        port = b.port,
    ));
    let _ = std::fs::remove_file(&keyfile);
    setup?;
    b.ns.run(&format!(
        "wg set {b_if} peer {public} allowed-ips 10.82.0.3/32 && ip addr add 10.82.0.2/32 dev {b_if} \
         && ip route add 10.82.0.3/32 dev {b_if}"
    ))?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if a.ns.run("ping -c 1 -W 1 -I 10.82.0.3 10.82.0.2").is_ok() {
            return Ok(Some(start.elapsed().as_secs_f64()));
        }
    }
    Ok(None)
}

/// Counters sampled every 100 ms for `dur` on another thread.
fn sample_stats(
    ifname: String,
    dur: Duration,
    stop: &Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(Instant, BTreeMap<String, u64>)>> {
    let stop = stop.clone();
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        let end = Instant::now() + dur;
        while Instant::now() < end && !stop.load(Ordering::Relaxed) {
            if let Ok(s) = uapi::stats(&ifname) {
                samples.push((Instant::now(), s));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        samples
    })
}

/// The handshake flood scenario. `repeats` interleaved triples of TCP runs of `secs`:
/// no flood; a spoofed mac1-valid flood at a closed port of host B (the control: what
/// the generator itself takes from a 2-core machine); the same flood at wirelane.
/// Spoofed floods go at `rate` initiations per second, or as fast as one thread can.
/// Then one cookie-answering source beside the spoofed flood (the rate limit), a junk
/// flood (no Diffie-Hellman), and a new peer joining during a flood.
pub fn flood_scenario(secs: f64, repeats: usize, rate: Option<u64>) -> Result<FloodOutcome> {
    let t = Target::up(rate)?;
    let dur = Duration::from_secs_f64(secs);
    let ifname = t.tun.daemons[1].ifname.clone();
    let pid = t.tun.daemons[1].pid.ok_or("daemon has no pid")?;
    let closed_port = t.spec.target.port() + 1000;
    let mut o = FloodOutcome {
        rss_before_kib: rss_kib(pid)?,
        ..Default::default()
    };
    let settle = Duration::from_millis(300);
    t.tcp(Duration::from_millis(500))?; // handshake and warm-up
    for _ in 0..repeats {
        o.baseline_bps.push(t.tcp(dur)?);
        let control = t.flood_to(
            FloodKind::Spoofed,
            dur + settle,
            closed_port,
            &Arc::default(),
            t.spec.rate,
        );
        std::thread::sleep(settle);
        o.control_bps.push(t.tcp(dur)?);
        join(control)?;
        let spoofed = t.flood(FloodKind::Spoofed, dur + settle);
        std::thread::sleep(settle);
        let sampler = sample_stats(ifname.clone(), dur, &Arc::default());
        o.flooded_bps.push(t.tcp(dur)?);
        let samples = sampler.join().map_err(|_| "sampler panicked")?;
        let s = join(spoofed)?;
        o.spoofed_pps.push(s.sent as f64 / s.seconds.max(1e-9));
        o.spoofed_sent_at_wirelane += s.sent;
        for (_, st) in &samples {
            o.under_load_seen |= counter(st, "under_load") == 1;
        }
        // Under load must clear about a second after the flood stops.
        let stopped = Instant::now();
        while t.stats().map(|s| counter(&s, "under_load")).unwrap_or(1) == 1
            && stopped.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        o.under_load_cleared_s = o.under_load_cleared_s.max(stopped.elapsed().as_secs_f64());
    }
    let st = t.stats()?;
    o.cookie_replies_sent = counter(&st, "cookie_replies_sent");
    o.cookie_replies_unsent = counter(&st, "cookie_replies_unsent");
    o.data_socket_drops = counter(&st, "data_socket_drops");
    o.handshake_socket_drops = counter(&st, "handshake_socket_drops");
    o.proof_socket_drops = counter(&st, "proof_socket_drops");

    // One source that answers cookies, beside the spoofed flood: while under load only
    // it can pass the gate, and each of its initiations then fails after one DH, so
    // handshake_failed counts what the rate limiter let through.
    let stop = Arc::new(AtomicBool::new(false));
    let spoofed = t.flood_until(
        FloodKind::Spoofed,
        flood::COOKIE_PROBE_LIMIT + dur * 2,
        &stop,
    );
    std::thread::sleep(settle);
    let cookie = t.flood(FloodKind::Cookie, dur);
    let sampler = sample_stats(ifname.clone(), flood::COOKIE_PROBE_LIMIT + dur * 2, &stop);
    let c = join(cookie);
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().map_err(|_| "sampler panicked")?;
    join(spoofed)?;
    let c = c?;
    o.cookie_source_got_cookie = c.cookie_at.is_some();
    // Only samples from when the source held its cookie count.
    let blast_start = c.cookie_at.unwrap_or_else(Instant::now);
    let samples: Vec<_> = samples
        .into_iter()
        .filter(|(at, _)| *at >= blast_start)
        .collect();
    for (_, st) in &samples {
        o.ratelimiter_sources_max = o
            .ratelimiter_sources_max
            .max(counter(st, "ratelimiter_sources"));
    }
    let loaded: Vec<_> = samples
        .iter()
        .filter(|(_, st)| counter(st, "under_load") == 1)
        .collect();
    if let (Some(first), Some(last)) = (loaded.first(), loaded.last()) {
        o.admitted_with_cookie = delta(&first.1, &last.1, "handshake_failed");
        o.rate_limited = delta(&first.1, &last.1, "handshake_rate_limited");
        o.admitted_window_s = (last.0 - first.0).as_secs_f64();
    }
    std::thread::sleep(Duration::from_millis(1500));

    // Junk alone: every message fails mac1 and no Diffie-Hellman is spent.
    let before = t.stats()?;
    let junk = join(t.flood(FloodKind::Junk, Duration::from_secs(2)))?;
    std::thread::sleep(settle);
    let after = t.stats()?;
    o.junk_sent = junk.sent;
    o.junk_invalid_mac1 = delta(&before, &after, "handshake_invalid_mac1");
    o.junk_dropped_at_queue = delta(&before, &after, "handshake_queue_full");
    o.junk_dropped_by_kernel = delta(&before, &after, "handshake_socket_drops");
    o.junk_dh = delta(&before, &after, "handshake_dh");

    // A new peer joins while a spoofed flood runs.
    let spoofed = t.flood(FloodKind::Spoofed, Duration::from_secs(15));
    std::thread::sleep(Duration::from_millis(500));
    o.new_peer_handshake_s = new_peer_handshake(&t)?;
    join(spoofed)?;
    o.rss_after_kib = rss_kib(pid)?;
    drop(t);
    Ok(o)
}

pub fn print_flood(o: &FloodOutcome) {
    let gbit = |v: &[f64]| {
        let runs: Vec<String> = v.iter().map(|b| format!("{:.2}", b / 1e9)).collect();
        format!(
            "{:.2} Gbit/s (runs {})",
            median(v).unwrap_or(0.0) / 1e9,
            runs.join(", ")
        )
    };
    let rows = [
        ("TCP goodput, no flood", gbit(&o.baseline_bps)),
        ("TCP goodput, flood at a closed port", gbit(&o.control_bps)),
        ("TCP goodput, flood at wirelane", gbit(&o.flooded_bps)),
        (
            "ratio flooded / no flood",
            format!("{:.2}", o.throughput_ratio()),
        ),
        (
            "ratio flooded / closed-port control",
            format!("{:.2}", o.ratio_to_control()),
        ),
        (
            "spoofed initiations per second",
            format!("{:.0}", median(&o.spoofed_pps).unwrap_or(0.0)),
        ),
        ("under load engaged", o.under_load_seen.to_string()),
        (
            "cookie replies sent / unsent / spoofed initiations sent",
            format!(
                "{} / {} / {} ({:.1}% answered)",
                o.cookie_replies_sent,
                o.cookie_replies_unsent,
                o.spoofed_sent_at_wirelane,
                100.0 * o.cookie_replies_sent as f64 / o.spoofed_sent_at_wirelane.max(1) as f64
            ),
        ),
        (
            "kernel drops at the data / handshake / proof sockets",
            format!(
                "{} / {} / {}",
                o.data_socket_drops, o.handshake_socket_drops, o.proof_socket_drops
            ),
        ),
        (
            "cookie-answering source got its cookie",
            o.cookie_source_got_cookie.to_string(),
        ),
        (
            "its initiations admitted under load",
            format!(
                "{} in {:.1} s (limit: burst 5 + 20/s)",
                o.admitted_with_cookie, o.admitted_window_s
            ),
        ),
        ("rate-limited drops", o.rate_limited.to_string()),
        (
            "rate limiter sources (max)",
            o.ratelimiter_sources_max.to_string(),
        ),
        (
            "junk sent / invalid mac1 / dropped at queue / by the kernel / DH",
            format!(
                "{} / {} / {} / {} / {}",
                o.junk_sent,
                o.junk_invalid_mac1,
                o.junk_dropped_at_queue,
                o.junk_dropped_by_kernel,
                o.junk_dh
            ),
        ),
        (
            "under load cleared after flood",
            format!("{:.2} s", o.under_load_cleared_s),
        ),
        (
            "new peer's handshake during a flood",
            o.new_peer_handshake_s
                .map_or("failed".into(), |s| format!("{s:.2} s")),
        ),
        (
            "daemon RSS before / after",
            format!("{} / {} KiB", o.rss_before_kib, o.rss_after_kib),
        ),
    ];
    println!("| figure | value |\n|---|---|");
    for (k, v) in rows {
        println!("| {k} | {v} |");
    }
}

/// The spoofed flood alone at full rate, without TCP: how much of it B answers, where
/// the rest is dropped, and which of B's threads did the work.
#[derive(Debug, Default)]
pub struct FloodAloneOutcome {
    pub sent: u64,
    pub seconds: f64,
    pub cookie_replies: u64,
    pub cookie_replies_unsent: u64,
    pub data_socket_drops: u64,
    pub handshake_socket_drops: u64,
    pub proof_socket_drops: u64,
    /// B's threads by CPU seconds over the flood, busiest first.
    pub threads: Vec<crate::cpu::ThreadCpu>,
}

pub fn flood_alone_scenario(secs: f64) -> Result<FloodAloneOutcome> {
    let t = Target::up(None)?;
    let pid = t.tun.daemons[1].pid.ok_or("daemon has no pid")?;
    let before = t.stats()?;
    let threads_before = crate::cpu::read_threads_and_ended(pid);
    let flood = join(t.flood(FloodKind::Spoofed, Duration::from_secs_f64(secs)))?;
    let threads_after = crate::cpu::read_threads_and_ended(pid);
    // Counters only: what B still holds in its socket is answered or dropped after.
    std::thread::sleep(Duration::from_millis(300));
    let after = t.stats()?;
    Ok(FloodAloneOutcome {
        sent: flood.sent,
        seconds: flood.seconds,
        cookie_replies: delta(&before, &after, "cookie_replies_sent"),
        cookie_replies_unsent: delta(&before, &after, "cookie_replies_unsent"),
        data_socket_drops: delta(&before, &after, "data_socket_drops"),
        handshake_socket_drops: delta(&before, &after, "handshake_socket_drops"),
        proof_socket_drops: delta(&before, &after, "proof_socket_drops"),
        threads: crate::cpu::thread_deltas("wirelane", &threads_before, &threads_after),
    })
}

pub fn print_flood_alone(o: &FloodAloneOutcome) {
    let per_s = |n: u64| n as f64 / o.seconds.max(1e-9);
    println!("| figure | value |\n|---|---|");
    println!(
        "| spoofed initiations sent | {} in {:.1} s ({:.0}/s) |",
        o.sent,
        o.seconds,
        per_s(o.sent)
    );
    println!(
        "| cookie replies sent / unsent | {} ({:.0}/s, {:.1}% of the flood) / {} |",
        o.cookie_replies,
        per_s(o.cookie_replies),
        100.0 * o.cookie_replies as f64 / o.sent.max(1) as f64,
        o.cookie_replies_unsent
    );
    println!(
        "| kernel drops at the data / handshake / proof sockets | {} / {} / {} |",
        o.data_socket_drops, o.handshake_socket_drops, o.proof_socket_drops
    );
    for t in o.threads.iter().filter(|t| t.cpu_s >= 0.01 * o.seconds) {
        println!(
            "| B's {} | {:.2} cores |",
            t.thread,
            t.cpu_s / o.seconds.max(1e-9)
        );
    }
}

#[derive(Debug, Default)]
pub struct ReplayOutcome {
    pub times: usize,
    pub transport_injected: usize,
    pub initiation_injected: usize,
    pub rx_replayed: u64,
    pub handshake_rejected: u64,
    pub handshake_queue_full: u64,
    /// Replayed initiations answered with a cookie reply (the replays put B under load).
    pub cookie_replies: u64,
    /// Cookie replies made but dropped unsent (no room in B's socket buffer).
    pub cookie_replies_unsent: u64,
    /// Replayed initiations the kernel dropped at B's full handshake socket.
    pub handshake_socket_drops: u64,
    pub latest_handshake_before: String,
    pub latest_handshake_after: String,
}

/// Replays a captured transport-data message and a captured initiation `times` times
/// each into host B, from the relay's on-path position, and counts what B refused.
pub fn replay_scenario(times: usize) -> Result<ReplayOutcome> {
    let bed = Testbed::build(Topology::PairRouter, Impairment::default())?;
    let relay = bed.relay.as_ref().ok_or("pair-router has a relay")?;
    relay.record(200);
    let tun = Tunnel::up(impls::WIRELANE, &bed)?;
    let (a, b) = (bed.hosts[0].ns.name.clone(), bed.hosts[1].ns.name.clone());
    tcp::bulk(&a, &b, tun.addr_b, 1, Duration::from_millis(300))?;
    let (transport, initiation) = (relay.recorded_to_b(4, 64)?, relay.recorded_to_b(1, 148)?);
    let b_if = tun.daemons[1].ifname.clone();
    let latest = || {
        bed.hosts[1]
            .ns
            .run(&format!("wg show {b_if} latest-handshakes"))
    };
    let before = uapi::stats(&b_if)?;
    let mut o = ReplayOutcome {
        times,
        latest_handshake_before: latest()?.trim().to_string(),
        ..Default::default()
    };
    // Paced in chunks so the receiver sees them rather than its socket buffer dropping.
    for _ in 0..times / 100 {
        crate::interrupt::check()?;
        o.transport_injected += relay.inject(true, &transport, 100);
        o.initiation_injected += relay.inject(true, &initiation, 100);
        std::thread::sleep(Duration::from_millis(2));
    }
    // Settle: the handshake queue empty and the refusal counters still (the niced
    // handshake thread may lag behind on a busy machine).
    let settle_by = Instant::now() + Duration::from_secs(10);
    let mut after = uapi::stats(&b_if)?;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = uapi::stats(&b_if)?;
        let refused = |s: &BTreeMap<String, u64>| {
            [
                "rx_replayed",
                "handshake_failed",
                "handshake_queue_full",
                "cookie_replies_sent",
                "cookie_replies_unsent",
                "handshake_socket_drops",
            ]
            .map(|k| counter(s, k))
        };
        let still = refused(&now) == refused(&after) && counter(&now, "handshake_queue") == 0;
        after = now;
        if still || Instant::now() > settle_by {
            break;
        }
    }
    o.rx_replayed = delta(&before, &after, "rx_replayed");
    o.handshake_rejected = delta(&before, &after, "handshake_failed");
    o.handshake_queue_full = delta(&before, &after, "handshake_queue_full");
    o.cookie_replies = delta(&before, &after, "cookie_replies_sent");
    o.cookie_replies_unsent = delta(&before, &after, "cookie_replies_unsent");
    o.handshake_socket_drops = delta(&before, &after, "handshake_socket_drops");
    o.latest_handshake_after = latest()?.trim().to_string();
    Ok(o)
}

pub fn print_replay(o: &ReplayOutcome) {
    println!("| figure | value |\n|---|---|");
    println!(
        "| transport data replayed | {} of {} sent |",
        o.transport_injected, o.times
    );
    println!("| refused by the replay window | {} |", o.rx_replayed);
    println!(
        "| initiations replayed | {} of {} sent |",
        o.initiation_injected, o.times
    );
    println!(
        "| refused after DH (TAI64N replay) / cookie reply instead (under load; unsent) / dropped at a full queue / dropped by the kernel at the full handshake socket | {} / {} ({}) / {} / {} |",
        o.handshake_rejected,
        o.cookie_replies,
        o.cookie_replies_unsent,
        o.handshake_queue_full,
        o.handshake_socket_drops
    );
    println!(
        "| latest handshake before / after | {} / {} |",
        o.latest_handshake_before, o.latest_handshake_after
    );
}
