//! `star:N`: one gateway under test serving N peers that the lab emulates on `proto`
//! (seed 000's many-client scenario, on a machine too small to run N real clients).
//!
//! Flow of one run: two namespaces joined by a veth (the gateway's, the generator's)
//! → the gateway daemon starts and gets N peers by `wg setconf`, each with its own /32
//! → every emulated peer completes a handshake (`generator::handshake`) → receive
//! direction: the peers' traffic is sealed before the timed phase, then sent with UDP
//! GSO while the sink checks every packet the gateway delivers; transmit direction: a
//! sender beside the gateway sends to every peer's inner address while the generator
//! counts what reaches each peer and opens a sample → the gateway's counters, CPU and
//! memory over the phase, and where each lost packet was lost. With `storm_peers`, that
//! many more peers storm the gateway with handshakes during the phase (`storm`).

pub mod emulated;
pub mod gateway;
pub mod generator;
pub mod inner;
pub mod readiness;
pub mod report;
pub mod send_floor;
pub mod send_log;
pub mod sink;
pub mod spec;
pub mod storm;
pub mod table;

use crate::cpu;
use crate::impls::{start_tunnels, Impl};
use crate::netns::{unique, Netns};
use crate::Result;
use emulated::EmulatedPeer;
use gateway::{configure_gateway, GatewayCounters};
use generator::{Generator, HandshakeReport, SealPlan};
use send_log::SendLog;
use serde::{Deserialize, Serialize};
pub use spec::{Shape, StarSpec, Way, DEFAULT_SEALED_MAX_MIB, MAX_PHASE_S};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};
use wirelane_proto::keypair::REJECT_AFTER_TIME;

const GATEWAY_OUTER: Ipv4Addr = Ipv4Addr::new(192, 168, 90, 1);
const GENERATOR_OUTER: &str = "192.168.90.2/24";
const GATEWAY_PORT: u16 = 51820;

/// Peer `i`'s endpoint, as the generators send to it: the gateway's outer address, at
/// the port of the peer's tunnel (i mod `tunnels`; tunnel t listens on
/// `GATEWAY_PORT + t`).
fn endpoint(i: usize, tunnels: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(GATEWAY_OUTER),
        GATEWAY_PORT + (i % tunnels.max(1)) as u16,
    )
}
/// The peers' own outer addresses: routed to the generator, which takes the whole
/// prefix as local (an AnyIP route) so each peer's socket can bind its own.
const PEER_SOURCES: &str = "172.16.0.0/16";

/// Peer `i`'s outer address when each has its own.
fn peer_source(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 0)) + i as u32 + 1)
}

/// Everything one star run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StarRecord {
    pub implementation: String,
    pub spec: Option<StarSpec>,
    pub repeat: usize,
    pub error: Option<String>,
    pub handshake: HandshakeReport,
    /// Timed phase: from the first send until the last delivery, s.
    pub seconds: f64,
    pub sent: u64,
    /// Packets delivered once, intact: at the sink (rx) or at the peers (tx).
    pub delivered: u64,
    pub goodput_bps: f64,
    /// Where the rest went. Rx: never sent (the generator ran out of time); lost at
    /// the gateway, between its socket and its TUN write (`lost_in_gateway`, packets),
    /// of which the kernel counted `gateway_socket_drops` drop events at the socket (a
    /// socket that takes GSO bursts whole counts a dropped burst once); lost between
    /// the TUN write and the sink (`lost_after_gateway`, packets), of which the sink's
    /// socket counted `sink_socket_drops` drop events (a coalesced super-packet, as
    /// wirelane writes them, counts once). Tx:
    /// `gateway_socket_drops` are the TUN queue's drops (the sender outran the
    /// gateway), `lost_in_gateway` what left the TUN queue but reached no peer.
    pub unsent: u64,
    pub gateway_socket_drops: u64,
    pub lost_in_gateway: u64,
    pub lost_after_gateway: u64,
    pub sink_socket_drops: u64,
    /// Tx: drop events at the emulated peers' own sockets, within `lost_in_gateway`
    /// (the generator's loss, not the gateway's, when it was starved of the CPU).
    #[serde(default)]
    pub generator_socket_drops: u64,
    pub reordered: u64,
    pub duplicates: u64,
    pub corrupted: u64,
    pub misdelivered: u64,
    /// Packets delivered per tunnel, with several (peer i's on tunnel i mod T); empty
    /// with one tunnel or the blackhole sink, which counts no peer.
    #[serde(default)]
    pub tunnel_delivered: Vec<u64>,
    /// Threads of the daemon's processes at the phase's end (one process for
    /// wirelane, one per tunnel for the others).
    #[serde(default)]
    pub daemon_threads: Option<usize>,
    /// Transmit: messages opened, and those that did not hold their peer's packet.
    pub sampled: u64,
    pub sample_bad: u64,
    /// Distinct (peer, sequence number) pairs among the good samples.
    #[serde(default)]
    pub sample_unique: u64,
    /// One-way delay quantiles from the scheduled send time, µs (paced receive runs).
    pub delay_p50_us: Option<f64>,
    pub delay_p99_us: Option<f64>,
    pub delay_p999_us: Option<f64>,
    /// One-way delay quantiles from when each packet's burst really left, µs: the
    /// gateway's share of the delay above, without the generator's lateness
    /// (`send_log`).
    #[serde(default)]
    pub gateway_delay_p50_us: Option<f64>,
    #[serde(default)]
    pub gateway_delay_p99_us: Option<f64>,
    #[serde(default)]
    pub gateway_delay_p999_us: Option<f64>,
    /// How late the generator sent, p99 µs (paced), and its CPU over the phase, cores.
    pub generator_late_p99_us: Option<f64>,
    pub generator_cores: f64,
    pub daemon_cpu_s: f64,
    pub cpu_s_per_gb: Option<f64>,
    /// The AEAD's open-only cost on one core, s per GB, measured in the same run.
    pub aead_floor_s_per_gb: f64,
    /// Each core's busy share over the phase.
    pub core_busy: Vec<f64>,
    pub peak_rss_kib: Option<u64>,
    /// The daemon's resident set once a second over the phase, KiB.
    #[serde(default)]
    pub rss_kib_each_s: Vec<u64>,
    /// Transmit: new sessions the emulated peers made by rekeying during the phase.
    #[serde(default)]
    pub rekeys: u64,
    /// Transmit: sessions the gateway began during the phase, which the peers answered
    /// and the gateway then used.
    #[serde(default)]
    pub answered: u64,
    /// wirelane's execution-order signatures and queue figures over the phase.
    #[serde(default)]
    pub signatures: Option<crate::signatures::Signatures>,
    /// The storm during the phase, if the spec asked for one.
    #[serde(default)]
    pub storm_during: Option<HandshakeReport>,
    /// The light peers, if the spec has any; the delay quantiles above are then the
    /// heavy peers'.
    #[serde(default)]
    pub light: Option<LightReport>,
}

/// What the light peers of a receive run (`StarSpec::light_peers`) sent and got.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LightReport {
    pub sent: u64,
    /// Delivered once, intact.
    pub delivered: u64,
    /// One-way delay quantiles from the scheduled send time, µs.
    pub delay_p50_us: Option<f64>,
    pub delay_p99_us: Option<f64>,
    pub delay_p999_us: Option<f64>,
    /// How late their sender sent, p99 µs.
    pub late_p99_us: Option<f64>,
    /// One-way delay p99 from when each packet really left, µs (`send_log`).
    #[serde(default)]
    pub gateway_delay_p99_us: Option<f64>,
}

/// p50, p99 and p99.9 of `h` in µs, if it holds anything.
fn quantiles_us(h: &crate::hist::Histogram) -> [Option<f64>; 3] {
    [0.5, 0.99, 0.999].map(|p| (h.count() > 0).then(|| h.quantile(p) as f64 / 1e3))
}

/// The AEAD's open-only cost on this thread, seconds per GB of `size`-byte packets:
/// the floor under any implementation's receive cost per byte.
pub fn aead_floor(size: usize) -> f64 {
    use wirelane_proto::handshake::SessionKeys;
    use wirelane_proto::Keypair;
    let keys = |send, recv| SessionKeys {
        send,
        recv,
        local_index: 1,
        remote_index: 2,
        is_initiator: true,
    };
    let sealer = Keypair::new(&keys([7; 32], [9; 32]), Duration::ZERO).sealer();
    let opener = Keypair::new(&keys([9; 32], [7; 32]), Duration::ZERO).opener();
    let len = generator::message_len(size);
    const MESSAGES: usize = 256;
    let mut sealed = vec![0u8; MESSAGES * len];
    for (c, m) in sealed.chunks_exact_mut(len).enumerate() {
        sealer.seal(c as u64, m);
    }
    let mut work = vec![0u8; len];
    let rounds = (512 << 20) / (MESSAGES * size);
    // Each open works in place, so every round copies the sealed message in first;
    // the same loop with the copy alone is timed too and taken off, so the floor is
    // the AEAD's and nothing else's.
    let mut timed = |open: bool| {
        let cpu0 = generator::thread_cpu_s();
        for _ in 0..rounds {
            for (c, m) in sealed.chunks_exact(len).enumerate() {
                work.copy_from_slice(m);
                if open {
                    std::hint::black_box(opener.open(c as u64, &mut work).is_ok());
                } else {
                    std::hint::black_box(&mut work);
                }
            }
        }
        generator::thread_cpu_s() - cpu0
    };
    let with_copy = timed(true);
    let copy = timed(false);
    // The copy is a few percent of the open; a host hiccup in its timing must not
    // take the floor near zero.
    let cpu = (with_copy - copy).max(with_copy * 0.5);
    cpu / ((rounds * MESSAGES * size) as f64 / 1e9)
}

/// One run of `spec` against `which`. Failures land in the record's `error`.
pub fn run_one(which: Impl, spec: &StarSpec, repeat: usize, floor: f64) -> StarRecord {
    let mut rec = StarRecord {
        implementation: which.name(),
        spec: Some(spec.clone()),
        repeat,
        aead_floor_s_per_gb: floor,
        ..StarRecord::default()
    };
    if let Err(e) = measure(which, spec, &mut rec) {
        rec.error = Some(e.to_string());
    }
    rec
}

fn measure(which: Impl, spec: &StarSpec, rec: &mut StarRecord) -> Result<()> {
    spec.validate()?;
    which.available()?;
    let (per_peer, light_per_peer) = if spec.way == Way::Rx {
        spec.per_peer()?
    } else {
        (0, 0)
    };
    let gw = Netns::new("lsg")?;
    let gen = Netns::new("lsp")?;
    let (gv, pv) = (unique("lsv"), unique("lsv"));
    crate::netns::sh(&format!(
        "ip link add {gv} netns {} type veth peer name {pv} netns {}",
        gw.name, gen.name
    ))?;
    // No IPv6 on the veth: its neighbour discovery would blur the packet counts that
    // place losses.
    gw.run(&format!(
        "sysctl -qw net.ipv6.conf.{gv}.disable_ipv6=1 \
         && ip addr add {GATEWAY_OUTER}/24 dev {gv} && ip link set {gv} up"
    ))?;
    gen.run(&format!(
        "sysctl -qw net.ipv6.conf.{pv}.disable_ipv6=1 \
         && ip addr add {GENERATOR_OUTER} dev {pv} && ip link set {pv} up \
         && ip route add local {PEER_SOURCES} dev lo"
    ))?;
    gw.run(&format!(
        "ip route add {PEER_SOURCES} via {}",
        GENERATOR_OUTER.split('/').next().unwrap_or_default()
    ))?;

    let tunnels = spec.tunnels;
    let daemons = start_tunnels(which, &gw, tunnels)?;
    let tuns: Vec<String> = daemons.iter().map(|d| d.ifname.clone()).collect();
    let mut pids: Vec<u32> = daemons.iter().filter_map(|d| d.pid).collect();
    pids.dedup();
    // Each tunnel its own key, as a concentrator's interfaces have.
    let privates: Vec<[u8; 32]> = (0..tunnels)
        .map(|_| {
            let mut private = [0u8; 32];
            rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut private);
            private
        })
        .collect();
    let publics: Vec<[u8; 32]> = privates
        .iter()
        .map(|p| wirelane_proto::LocalIdentity::new(*p).public)
        .collect();
    let mut peers: Vec<EmulatedPeer> = (0..spec.peers + spec.storm_peers)
        .map(|i| EmulatedPeer::new(i, &publics[i % tunnels]))
        .collect();
    let blackhole = spec.sink == sink::SinkKind::Blackhole;
    configure_gateway(&gw, &tuns, &privates, &peers, spec.family, blackhole)?;
    // Both generators' sockets, before either binds any.
    generator::ensure_descriptors(spec.peers + spec.storm_peers)?;
    let storm = (spec.storm_peers > 0).then(|| {
        let storm_peers = peers.split_off(spec.peers);
        let limit =
            Duration::from_secs(30) + Duration::from_secs_f64(spec.storm_peers as f64 / 500.0);
        storm::spawn(&gen.name, spec.peers, tunnels, storm_peers, limit)
    });

    // The sink (receive) listens before any traffic.
    let t0: Arc<OnceLock<Instant>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    // Whatever way this run ends, its sink, storm and samplers are told to stop: an
    // error that returned early left them running into the next run.
    let _stop_on_return = StopOnDrop(stop.clone());
    let limit = Duration::from_secs_f64(spec.seconds) + Duration::from_secs(30);
    let send_logs = Arc::new(send_log::SendLogs::default());
    let sink = (spec.way == Way::Rx).then(|| {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (t0, stop, n, paced, family, tuns, logs) = (
            t0.clone(),
            stop.clone(),
            spec.peers,
            spec.offered_pps.is_some(),
            spec.family,
            tuns.clone(),
            send_logs.clone(),
        );
        let quiet = Duration::from_millis(300);
        let light_from = spec.heavy_peers();
        let h = crate::workload::in_ns(&gw.name, move || match blackhole {
            true => sink::count_blackholed(&tuns, stop, quiet, limit, ready_tx),
            false => sink::sink(
                n, light_from, family, paced, t0, logs, stop, quiet, limit, ready_tx,
            ),
        });
        (h, ready_rx)
    });
    if let Some((_, ready)) = &sink {
        ready
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "the sink did not start")?;
    }

    // The generator: handshakes and sealing in its namespace, then a go.
    let (ready_tx, ready_rx) = mpsc::channel::<HandshakeReport>();
    // The phase start, or None: the run is off (not every peer got a session).
    let (go_tx, go_rx) = mpsc::channel::<Option<Instant>>();
    let gen_spec = spec.clone();
    let gen_stop = stop.clone();
    let logs = send_logs.clone();
    let generator = crate::workload::in_ns(&gen.name, move || -> Result<GeneratorOutcome> {
        let gateway = |i: usize| endpoint(i, gen_spec.tunnels);
        let source =
            (!gen_spec.shared_source).then_some(&peer_source as &dyn Fn(usize) -> Ipv4Addr);
        let mut g = Generator::new(peers, &gateway, source)?;
        // No session is older than this: the phase must end before the first ones
        // expire (REJECT_AFTER_TIME), or the gateway refuses their last packets.
        let sessions_from = Instant::now();
        // 30 s, and the time to send every initiation at the pacing rate (at least
        // 500/s: an unpaced storm is answered about that fast here).
        let rate = gen_spec.handshake_rate.map_or(500.0, |r| r.min(500.0));
        let limit = Duration::from_secs(30) + Duration::from_secs_f64(gen_spec.peers as f64 / rate);
        let hs = g.handshake(gen_spec.handshake_rate, limit)?;
        g.keepalive()?;
        let plan = |peers: std::ops::Range<usize>, per_peer, pps, max_burst| SealPlan {
            peers,
            per_peer,
            size: gen_spec.size,
            total_pps: pps,
            family: gen_spec.family,
            blackhole,
            max_burst,
        };
        let heavy = gen_spec.heavy_peers();
        let sealed = (gen_spec.way == Way::Rx).then(|| {
            let bulk = plan(0..heavy, per_peer, gen_spec.offered_pps, usize::MAX);
            g.seal(&bulk)
        });
        // The light peers' packets leave one at a time, from a sender of their own.
        let light = (gen_spec.way == Way::Rx && gen_spec.light_peers > 0).then(|| {
            let pps = gen_spec.light_pps() * gen_spec.light_peers as f64;
            g.seal(&plan(heavy..gen_spec.peers, light_per_peer, Some(pps), 1))
        });
        for (log, s) in [(&logs.heavy, &sealed), (&logs.light, &light)] {
            let planned = s
                .as_ref()
                .and_then(|s| SendLog::new(s.burst_interval_ns, s.bursts()));
            if let Some(l) = planned {
                let _ = log.set(l);
            }
        }
        let _ = ready_tx.send(hs);
        let Some(t0) = go_rx.recv().ok().flatten() else {
            return Ok(GeneratorOutcome::CalledOff);
        };
        match sealed {
            Some(s) => {
                let ends = t0
                    + s.last_scheduled()
                        .max(Duration::from_secs_f64(gen_spec.seconds));
                let expire = sessions_from + REJECT_AFTER_TIME - Duration::from_secs(2);
                if ends > expire {
                    return Err(format!(
                        "star: the phase would end {:.1} s after the first sessions began, \
                         past their {} s lifetime: shorten it (the handshakes and the \
                         sealing took {:.1} s before it)",
                        (ends - sessions_from).as_secs_f64(),
                        REJECT_AFTER_TIME.as_secs(),
                        (t0 - sessions_from).as_secs_f64()
                    )
                    .into());
                }
                let send_limit =
                    Duration::from_secs_f64(gen_spec.seconds) * 2 + Duration::from_secs(5);
                let (heavy_log, light_log) = (logs.heavy.get(), logs.light.get());
                let (heavy_sent, light_sent) = std::thread::scope(|scope| {
                    let light = light.as_ref().map(|l| {
                        let g = &g;
                        scope.spawn(move || g.send(l, t0, send_limit, light_log))
                    });
                    let heavy_sent = g.send(&s, t0, send_limit, heavy_log);
                    let light_sent = light.map(|h| h.join().map_err(|_| "light sender panicked"));
                    (heavy_sent, light_sent)
                });
                let light = match (light_sent, &light) {
                    (Some(r), Some(l)) => Some((r??, l.packets() as u64)),
                    _ => None,
                };
                Ok(GeneratorOutcome::Sent {
                    heavy: heavy_sent?,
                    sealed: s.packets() as u64,
                    light,
                })
            }
            None => {
                let limit = Instant::now()
                    + Duration::from_secs_f64(gen_spec.seconds)
                    + Duration::from_secs(30);
                let r = g.receive(
                    &gen_stop,
                    Duration::from_millis(300),
                    limit,
                    gen_spec.sample_every,
                    gen_spec
                        .rekey_after_s
                        .map_or(emulated::REKEY_ON_RECEIVE, Duration::from_secs_f64),
                )?;
                Ok(GeneratorOutcome::Received(r))
            }
        }
    });
    let hs = match ready_rx.recv_timeout(limit + Duration::from_secs(60)) {
        Ok(hs) => hs,
        Err(_) => {
            stop.store(true, Ordering::Release);
            return Err(match crate::workload::join(generator) {
                Err(e) => e,
                Ok(_) => "the generator stopped before the timed phase".into(),
            });
        }
    };
    rec.handshake = hs.clone();
    if hs.established < spec.peers {
        stop.store(true, Ordering::Release);
        let _ = go_tx.send(None);
        let _ = crate::workload::join(generator);
        return Err(format!(
            "only {} of {} peers completed a handshake",
            hs.established, spec.peers
        )
        .into());
    }
    // Let the keepalives land, so the gateway may send on every session.
    std::thread::sleep(Duration::from_millis(300));

    let threads_before: Vec<_> = pids
        .iter()
        .map(|&p| cpu::read_threads_and_ended(p))
        .collect();
    let cores_before = cpu::read_cores();
    let counters_before = GatewayCounters::read(&gw, &tuns)?;
    // wirelane's own counters (its execution-order signatures and queue figures).
    let sigs_before = which
        .is_wirelane()
        .then(|| crate::signatures::snapshot_tunnels(&tuns).ok())
        .flatten();
    let start = Instant::now() + Duration::from_millis(20);
    let _ = t0.set(start);
    let _ = go_tx.send(Some(start));
    let rss_sampler = (!pids.is_empty()).then(|| sample_rss(pids.clone(), start, stop.clone()));
    if let Some((_, go)) = &storm {
        let _ = go.send(Some(start));
    }

    let mut inner_sent = None;
    if spec.way == Way::Tx {
        let (n, size, secs, pps) = (spec.peers, spec.size, spec.seconds, spec.offered_pps);
        let family = spec.family;
        let h = crate::workload::in_ns(&gw.name, move || {
            std::thread::sleep(start.saturating_duration_since(Instant::now()));
            sink::send_inner(n, family, size, pps, Duration::from_secs_f64(secs))
        });
        // Kept, not returned yet: the generator, sink and storm are joined first.
        inner_sent = Some(crate::workload::join(h));
        stop.store(true, Ordering::Release);
    }
    let outcome = crate::workload::join(generator);
    stop.store(true, Ordering::Release);
    let sunk = sink.map(|(h, _)| crate::workload::join(h));
    // The phase's CPU, counters and signatures are read when its traffic has arrived,
    // before a storm that outlasts the phase is joined: the storm's handshakes after
    // the phase are not the bytes' cost.
    let cores_after = cpu::read_cores();
    let threads_after: Vec<_> = pids
        .iter()
        .map(|&p| cpu::read_threads_and_ended(p))
        .collect();
    rec.daemon_threads =
        (!pids.is_empty()).then(|| pids.iter().map(|&p| cpu::read_threads(p).len()).sum());
    let counters = GatewayCounters::read(&gw, &tuns).map(|c| c.since(&counters_before));
    if let Some(before) = &sigs_before {
        if let Ok(after) = crate::signatures::snapshot_tunnels(&tuns) {
            rec.signatures = Some(crate::signatures::Signatures::between(
                "gateway", before, &after,
            ));
        }
    }
    // Joined whatever the others gave: an error above must not leave it running.
    if let Some((h, _)) = storm {
        rec.storm_during = crate::workload::join(h)?;
    }
    let (outcome, sunk, counters) = (outcome?, sunk.transpose()?, counters?);
    let inner_sent = inner_sent.transpose()?;
    if let Some(h) = rss_sampler {
        rec.rss_kib_each_s = h.join().unwrap_or_default();
    }
    if !pids.is_empty() {
        for (before, after) in threads_before.iter().zip(&threads_after) {
            rec.daemon_cpu_s += cpu::thread_deltas(&which.name(), before, after)
                .iter()
                .map(|t| t.cpu_s)
                .sum::<f64>();
        }
        // With a process per tunnel, the sum of their peaks: they run the same load
        // at once, so it overstates their joint peak by little.
        rec.peak_rss_kib = pids.iter().map(|&p| cpu::peak_rss_kib(p)).sum();
    }
    rec.core_busy = cpu::core_splits(&cores_before, &cores_after)
        .iter()
        .map(|c| c.busy())
        .collect();

    match (outcome, sunk, inner_sent) {
        (
            GeneratorOutcome::Sent {
                heavy: sent,
                sealed,
                light,
            },
            Some(s),
            _,
        ) => {
            let end = s.last.unwrap_or(start);
            rec.seconds = end.saturating_duration_since(start).as_secs_f64();
            let light_sent = light.as_ref().map_or(0, |l| l.0.packets);
            let light_sealed = light.as_ref().map_or(0, |l| l.1);
            rec.sent = sent.packets + light_sent;
            rec.unsent = (sealed + light_sealed).saturating_sub(rec.sent);
            rec.gateway_socket_drops = counters.listen_drops;
            // The veth loses nothing; its packet counter counts a GSO burst once, as
            // does the drop counter of a socket that takes bursts whole, so the loss
            // at the gateway is counted in packets from what was sent.
            let written = counters.tun_rx_packets(spec.size);
            rec.lost_in_gateway = rec.sent.saturating_sub(written);
            if blackhole {
                rec.delivered = written;
            } else {
                rec.delivered = s.unique;
                rec.sink_socket_drops = s.socket_drops;
                // Drop events, not packets: subtracted, a dropped super-packet of k
                // packets would leave k - 1 of them counted nowhere.
                rec.lost_after_gateway = written.saturating_sub(s.received);
            }
            rec.reordered = s.reordered;
            rec.duplicates = s.duplicates;
            rec.corrupted = s.corrupted;
            rec.misdelivered = s.misdelivered;
            if !blackhole {
                // The heavy peers': the light ones offer far less, by design.
                let heavy = spec.heavy_peers().min(s.per_peer.len());
                rec.tunnel_delivered = per_tunnel(&s.per_peer[..heavy], tunnels);
            }
            [rec.delay_p50_us, rec.delay_p99_us, rec.delay_p999_us] = quantiles_us(&s.delay);
            [
                rec.gateway_delay_p50_us,
                rec.gateway_delay_p99_us,
                rec.gateway_delay_p999_us,
            ] = quantiles_us(&s.gateway_delay);
            if let Some((l, _)) = &light {
                let [p50, p99, p999] = quantiles_us(&s.light_delay);
                rec.light = Some(LightReport {
                    sent: l.packets,
                    delivered: s.light_unique,
                    delay_p50_us: p50,
                    delay_p99_us: p99,
                    delay_p999_us: p999,
                    late_p99_us: quantiles_us(&l.lateness)[1],
                    gateway_delay_p99_us: quantiles_us(&s.light_gateway_delay)[1],
                });
            }
            rec.generator_late_p99_us = quantiles_us(&sent.lateness)[1];
            let light_cpu_s = light.as_ref().map_or(0.0, |l| l.0.cpu_s);
            rec.generator_cores = (sent.cpu_s + light_cpu_s) / sent.wall_s.max(1e-9);
        }
        (GeneratorOutcome::Received(r), None, Some(inner)) => {
            let end = r.last.unwrap_or(start);
            rec.seconds = end.saturating_duration_since(start).as_secs_f64();
            rec.sent = inner.packets;
            // Delivered once: a duplicate counter is not a packet delivered.
            let once = r.packets - r.duplicates;
            rec.delivered = once;
            rec.tunnel_delivered = per_tunnel(&r.per_peer, tunnels);
            rec.lost_in_gateway = counters.tun_tx.saturating_sub(once);
            rec.generator_socket_drops = r.socket_drops;
            rec.gateway_socket_drops = counters.tun_tx_dropped;
            rec.duplicates = r.duplicates;
            rec.reordered = r.reordered;
            rec.sampled = r.sampled;
            rec.sample_bad = r.sample_bad;
            rec.sample_unique = r.sample_unique;
            rec.rekeys = r.rekeys;
            rec.answered = r.answered;
            rec.generator_cores = r.cpu_s / rec.seconds.max(1e-9);
        }
        _ => return Err("star: the phase's parts disagree on its direction".into()),
    }
    let bytes = rec.delivered as f64 * spec.size as f64;
    rec.goodput_bps = bytes * 8.0 / rec.seconds.max(1e-9);
    if bytes > 0.0 && rec.daemon_cpu_s > 0.0 {
        rec.cpu_s_per_gb = Some(rec.daemon_cpu_s / (bytes / 1e9));
    }
    drop(daemons);
    Ok(())
}

/// `per_peer` summed per tunnel (peer i's on tunnel i mod `tunnels`); empty with one.
fn per_tunnel(per_peer: &[u64], tunnels: usize) -> Vec<u64> {
    if tunnels < 2 {
        return Vec::new();
    }
    let mut out = vec![0; tunnels];
    for (i, n) in per_peer.iter().enumerate() {
        out[i % tunnels] += n;
    }
    out
}

/// Reads the daemon's resident set (summed over its processes `pids`) once a second
/// from `start` until `stop`: whether memory grows under a long overload is the
/// series' slope, not its peak.
fn sample_rss(
    pids: Vec<u32>,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<u64>> {
    std::thread::spawn(move || {
        let mut each_s = Vec::new();
        let mut next = start;
        while !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now < next {
                // Short naps, so that the end of the phase is seen within 100 ms.
                std::thread::sleep((next - now).min(Duration::from_millis(100)));
                continue;
            }
            match pids.iter().map(|&p| cpu::rss_kib(p)).sum::<Option<u64>>() {
                Some(k) => each_s.push(k),
                None => break, // a daemon is gone
            }
            next += Duration::from_secs(1);
        }
        each_s
    })
}

impl StarRecord {
    /// Jain's fairness index over what each tunnel delivered; None with one tunnel.
    ///
    /// Per peer: where N is no multiple of T, tunnel t < N mod T carries one peer
    /// more, and equal service to every peer must read as fair (1.0), not as the
    /// tunnels' unequal shares of the peers.
    pub fn tunnel_fairness(&self) -> Option<f64> {
        let tunnels = self.tunnel_delivered.len().max(1);
        let peers = self.spec.as_ref().map_or(tunnels, |s| s.heavy_peers());
        let xs: Vec<f64> = (self.tunnel_delivered.iter().enumerate())
            .map(|(t, &n)| {
                let on = peers / tunnels + usize::from(t < peers % tunnels);
                n as f64 / on.max(1) as f64
            })
            .collect();
        crate::stats::jain(&xs)
    }

    /// How much the daemon's resident set grew over a phase of two minutes or more:
    /// the largest reading of its last minute less the largest of its first, KiB.
    pub fn rss_growth_kib(&self) -> Option<i64> {
        let s = &self.rss_kib_each_s;
        let max = |w: &[u64]| w.iter().copied().max().unwrap_or(0) as i64;
        (s.len() >= 120).then(|| max(&s[s.len() - 60..]) - max(&s[..60]))
    }
}

enum GeneratorOutcome {
    /// What was sent and how many packets were sealed: by the bulk sender, and by
    /// the light peers' sender if there were light peers.
    Sent {
        heavy: generator::SendReport,
        sealed: u64,
        light: Option<(generator::SendReport, u64)>,
    },
    Received(generator::ReceiveReport),
    /// The run was called off before its timed phase.
    CalledOff,
}

/// Sets its flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}
