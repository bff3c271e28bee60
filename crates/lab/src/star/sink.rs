//! The gateway side of the star scenario's traffic, in the gateway's namespace.
//!
//! - `sink`: receive direction. Takes what the gateway wrote to its TUN device and the
//!   kernel routed to the gateway's inner address, and checks every packet against
//!   what its peer sent: sequence numbers per peer (loss, reordering, duplicates), the
//!   pattern (corruption), the source address (misdelivery), and, in paced runs, the
//!   one-way delay from the packet's scheduled send time (CLOCK_MONOTONIC, which the
//!   namespaces share).
//! - `count_blackholed`: receive direction with the blackhole sink. The kernel drops
//!   what the gateway writes right after its route lookup, so the gateway's TUN
//!   receive counter is all that is left to count: delivery, but no order, integrity
//!   or delay check. It takes the least of the kernel's time after the TUN write.
//! - `send_inner`: transmit direction. Sends inner UDP to every peer's inner address,
//!   rotating over the peers, for the gateway to seal and send on.

use super::inner::{self, Family, Stamp, SINK_PORT};
use super::send_log::SendLogs;
use crate::hist::Histogram;
use crate::workload::udp::SeqTracker;
use crate::Result;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use wirelane_io::udp::{socket_drops, RecvBatch, UdpSocket, NOT_ECT};

/// The sink's receive buffer: deep enough that the sink is never where a saturated
/// gateway's packets are lost.
const SINK_BUFFER: usize = 64 << 20;

/// Where the receive direction's inner packets end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// A UDP socket at the gateway's inner address that checks every packet.
    #[default]
    Socket,
    /// A blackhole route: only counted, at the gateway's TUN device.
    Blackhole,
}

impl std::str::FromStr for SinkKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "socket" => Ok(SinkKind::Socket),
            "blackhole" => Ok(SinkKind::Blackhole),
            _ => Err(format!("sink '{s}': socket or blackhole")),
        }
    }
}

impl std::fmt::Display for SinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SinkKind::Socket => "socket",
            SinkKind::Blackhole => "blackhole",
        })
    }
}

#[derive(Debug, Clone, Default)]
pub struct SinkReport {
    pub received: u64,
    /// Packets per peer in order, each once: the unique sequence numbers.
    pub unique: u64,
    /// Delivered once, intact, per peer.
    pub per_peer: Vec<u64>,
    pub reordered: u64,
    pub duplicates: u64,
    /// Damaged payloads, and intact ones from another peer's address than their own.
    pub corrupted: u64,
    pub misdelivered: u64,
    /// The kernel's drops at the sink's socket (a full receive buffer).
    pub socket_drops: u64,
    /// One-way delay from the scheduled send time, ns (paced runs only).
    pub delay: Histogram,
    /// One-way delay from when the packet's burst really left (`send_log`), ns.
    pub gateway_delay: Histogram,
    /// The light peers' (from `light_from` on) unique packets and one-way delays.
    pub light_unique: u64,
    pub light_delay: Histogram,
    pub light_gateway_delay: Histogram,
    pub first: Option<Instant>,
    pub last: Option<Instant>,
}

/// Runs the sink on the calling thread (inside the gateway's namespace) for `peers`
/// peers: announces itself ready on `ready`, then receives until `stop` is set and
/// nothing came for `quiet`, or `limit`. Delays are measured once `t0` (the phase
/// start) is set, when `paced`, from each packet's scheduled time and from when its
/// burst left by `sent`; the light peers' (`light_from..peers`) apart.
#[allow(clippy::too_many_arguments)]
pub fn sink(
    peers: usize,
    light_from: usize,
    family: Family,
    paced: bool,
    t0: Arc<OnceLock<Instant>>,
    sent: Arc<SendLogs>,
    stop: Arc<AtomicBool>,
    quiet: Duration,
    limit: Duration,
    ready: std::sync::mpsc::Sender<()>,
) -> Result<SinkReport> {
    // One socket per family the run uses (the io crate's IPv6 sockets are IPv6-only).
    let mut socks = Vec::new();
    for v6 in [false, true] {
        if (v6 && family.has_v6()) || (!v6 && family.has_v4()) {
            let sock = UdpSocket::bind(v6, SINK_PORT)?;
            sock.set_receive_buffer(SINK_BUFFER)?;
            let drops0 = socket_drops(sock.fd()).unwrap_or(0);
            socks.push((sock, drops0));
        }
    }
    let _ = ready.send(());
    let mut trackers: Vec<SeqTracker> = (0..peers).map(|_| SeqTracker::default()).collect();
    let mut r = SinkReport::default();
    let mut batch = RecvBatch::new(64, 65536);
    let deadline = Instant::now() + limit;
    // When the sink last read anything (`r.last` is when it last arrived): a backlog
    // being drained is not quiet.
    let mut last_read: Option<Instant> = None;
    while Instant::now() < deadline {
        let idle = last_read.is_none_or(|l| l.elapsed() >= quiet);
        if stop.load(Ordering::Acquire) && idle {
            break;
        }
        let mut got_any = false;
        for (sock, _) in &socks {
            let got = match sock.recv_batch(&mut batch) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.into()),
            };
            got_any = true;
            let (now, now_real_ns) = (Instant::now(), realtime_ns());
            last_read = Some(now);
            let start = t0.get().copied().filter(|_| paced);
            for k in 0..got {
                let Some(d) = batch.datagram(k) else { continue };
                // When it reached our socket: the sink's own backlog (it shares the
                // cores with a saturated gateway) is not the gateway's delay, nor
                // part of the phase. The kernel's stamp is wall-clock time; only its
                // distance from now is used.
                let waited = match d.rx_time_ns {
                    0 => 0,
                    t => now_real_ns.saturating_sub(t),
                };
                let arrived = now.checked_sub(Duration::from_nanos(waited)).unwrap_or(now);
                for payload in d.datagrams() {
                    r.received += 1;
                    r.first = Some(r.first.map_or(arrived, |f| f.min(arrived)));
                    r.last = Some(r.last.map_or(arrived, |l| l.max(arrived)));
                    let Some(stamp) = inner::read_payload(payload) else {
                        r.corrupted += 1;
                        continue;
                    };
                    if !from_its_peer(&d.src, &stamp, peers) {
                        r.misdelivered += 1;
                        continue;
                    }
                    trackers[stamp.peer as usize].record(stamp.seq);
                    if let Some(t0) = start {
                        let light = stamp.peer as usize >= light_from;
                        let since = |ns: u64| {
                            let from = t0 + Duration::from_nanos(ns);
                            arrived.saturating_duration_since(from).as_nanos() as u64
                        };
                        let delay = since(stamp.scheduled_ns);
                        let log = if light { &sent.light } else { &sent.heavy };
                        let left = log.get().and_then(|l| l.sent_ns(stamp.scheduled_ns));
                        match light {
                            true => r.light_delay.record(delay),
                            false => r.delay.record(delay),
                        }
                        if let Some(left) = left {
                            match light {
                                true => r.light_gateway_delay.record(since(left)),
                                false => r.gateway_delay.record(since(left)),
                            }
                        }
                    }
                }
            }
        }
        if !got_any {
            wait_readable(&socks, 20);
        }
    }
    r.per_peer = trackers.iter().map(|t| t.unique).collect();
    for (i, t) in trackers.iter().enumerate() {
        if i >= light_from {
            r.light_unique += t.unique;
        }
        r.unique += t.unique;
        r.reordered += t.reordered;
        r.duplicates += t.duplicates;
    }
    r.socket_drops = socks
        .iter()
        .map(|(s, drops0)| u64::from(socket_drops(s.fd()).unwrap_or(0).wrapping_sub(*drops0)))
        .sum();
    Ok(r)
}

/// CLOCK_REALTIME in ns, as the kernel stamps arrivals (`SO_TIMESTAMPNS`).
fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Waits until any of the sink's sockets is readable, or `timeout_ms` passes.
fn wait_readable(socks: &[(UdpSocket, u32)], timeout_ms: i32) {
    let mut fds: Vec<libc::pollfd> = socks
        .iter()
        .map(|(s, _)| libc::pollfd {
            fd: s.fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `fds` holds valid pollfds for the duration of the call. An error (EINTR)
    // just means another look at the sockets.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
}

fn from_its_peer(src: &SocketAddr, stamp: &Stamp, peers: usize) -> bool {
    (stamp.peer as usize) < peers && inner::peer_of(src.ip()) == Some(stamp.peer as usize)
}

/// The blackhole sink's clock, on the calling thread (inside the gateway's namespace):
/// watches the gateway's writes to its tunnels `tuns` from when it announces itself ready on
/// `ready` until `stop` is set and they stood still for `quiet`, or `limit`, and
/// reports when they began and last moved (`first`, `last`), to within the poll
/// interval (a millisecond against phases of seconds). How many packets those writes
/// held, the caller counts (`GatewayCounters::tun_rx_packets`).
pub fn count_blackholed(
    tuns: &[String],
    stop: Arc<AtomicBool>,
    quiet: Duration,
    limit: Duration,
    ready: std::sync::mpsc::Sender<()>,
) -> Result<SinkReport> {
    const POLL: Duration = Duration::from_millis(1);
    let start = tun_received(tuns)?;
    let _ = ready.send(());
    let mut r = SinkReport::default();
    let deadline = Instant::now() + limit;
    let mut seen = start;
    while Instant::now() < deadline {
        let now_count = tun_received(tuns)?;
        let now = Instant::now();
        if now_count != seen {
            seen = now_count;
            r.first.get_or_insert(now);
            r.last = Some(now);
        } else if stop.load(Ordering::Acquire) && r.last.is_none_or(|l| l.elapsed() >= quiet) {
            break;
        }
        std::thread::sleep(POLL);
    }
    Ok(r)
}

/// The packets the kernel received from `tuns` (what the gateway wrote to them), in
/// the calling thread's own namespace.
fn tun_received(tuns: &[String]) -> Result<u64> {
    let dev = crate::workload::udp::net_dev_here()?;
    tuns.iter()
        .map(|tun| {
            dev.iter()
                .find(|(name, _)| name == tun)
                .and_then(|(_, counters)| counters.get(1).copied())
                .ok_or_else(|| format!("no receive counter for {tun} in /proc/net/dev").into())
        })
        .sum()
}

#[derive(Debug, Clone, Default)]
pub struct InnerSendReport {
    pub packets: u64,
    pub cpu_s: f64,
}

/// Sends `size`-byte inner packets to every peer's inner address in its family, one
/// batch of consecutive peers per `sendmmsg`, for `dur` (on the calling thread, inside
/// the gateway's namespace), at `pps` packets per second in all (None: unlimited).
/// An IPv6 socket sends both families (to IPv4 as IPv4-mapped).
pub fn send_inner(
    peers: usize,
    family: Family,
    size: usize,
    pps: Option<f64>,
    dur: Duration,
) -> Result<InnerSendReport> {
    let cpu0 = super::generator::thread_cpu_s();
    let v4 = family
        .has_v4()
        .then(|| UdpSocket::bind(false, 0))
        .transpose()?;
    let v6 = family
        .has_v6()
        .then(|| UdpSocket::bind(true, 0))
        .transpose()?;
    // The payload that makes a `size`-byte packet in peer `i`'s family.
    let len = |i: usize| {
        let header = if family.peer_is_v6(i) {
            inner::IPV6_HEADER
        } else {
            inner::IPV4_HEADER
        };
        size - header - inner::UDP_HEADER
    };
    const BATCH: usize = 64;
    let mut bufs = vec![vec![0u8; size]; BATCH];
    let mut report = InnerSendReport::default();
    let start = Instant::now();
    let mut next = 0u64; // packet number over all peers: peer next % peers, seq next / peers
    let total = pps.map_or(u64::MAX, |r| (r * dur.as_secs_f64()) as u64);
    while start.elapsed() < dur && next < total {
        if let Some(r) = pps {
            let due = start + Duration::from_secs_f64(next as f64 / r);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        let k = BATCH.min((total - next) as usize);
        let mut dsts = Vec::with_capacity(k);
        for (b, buf) in bufs.iter_mut().take(k).enumerate() {
            let j = next + b as u64;
            let peer = (j % peers as u64) as usize;
            inner::write_payload(&mut buf[..len(peer)], peer as u32, j / peers as u64 + 1, 0);
            let to = SocketAddr::new(family.peer_addr(peer), SINK_PORT);
            dsts.push((len(peer), to));
        }
        // Each family's share of the batch through its own socket.
        for (sock, v6) in [(&v4, false), (&v6, true)] {
            let Some(sock) = sock else { continue };
            let msgs: Vec<(&[u8], SocketAddr)> = bufs
                .iter()
                .zip(&dsts)
                .filter(|(_, (_, d))| d.is_ipv6() == v6)
                .map(|(b, (len, d))| (&b[..*len], *d))
                .collect();
            if !msgs.is_empty() {
                report.packets += sock.send_batch(&msgs, None, NOT_ECT)? as u64;
            }
        }
        next += k as u64;
    }
    report.cpu_s = super::generator::thread_cpu_s() - cpu0;
    Ok(report)
}
