//! The gateway side of the star scenario's traffic, in the gateway's namespace.
//!
//! - `sink`: receive direction. Takes what the gateway wrote to its TUN device and the
//!   kernel routed to the gateway's inner address, and checks every packet against
//!   what its peer sent: sequence numbers per peer (loss, reordering, duplicates), the
//!   pattern (corruption), the source address (misdelivery), and, in paced runs, the
//!   one-way delay from the packet's scheduled send time (CLOCK_MONOTONIC, which the
//!   namespaces share).
//! - `send_inner`: transmit direction. Sends inner UDP to every peer's inner address,
//!   rotating over the peers, for the gateway to seal and send on.

use super::inner::{self, Stamp, SINK_PORT};
use crate::hist::Histogram;
use crate::workload::udp::SeqTracker;
use crate::Result;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use wirelane_io::poll::wait_readable_any;
use wirelane_io::udp::{socket_drops, RecvBatch, UdpSocket, NOT_ECT};

/// The sink's receive buffer: deep enough that the sink is never where a saturated
/// gateway's packets are lost.
const SINK_BUFFER: usize = 64 << 20;

#[derive(Debug, Clone, Default)]
pub struct SinkReport {
    pub received: u64,
    /// Packets per peer in order, each once: the unique sequence numbers.
    pub unique: u64,
    pub reordered: u64,
    pub duplicates: u64,
    /// Damaged payloads, and intact ones from another peer's address than their own.
    pub corrupted: u64,
    pub misdelivered: u64,
    /// The kernel's drops at the sink's socket (a full receive buffer).
    pub socket_drops: u64,
    /// One-way delay from the scheduled send time, ns (paced runs only).
    pub delay: Histogram,
    pub first: Option<Instant>,
    pub last: Option<Instant>,
}

/// Runs the sink on the calling thread (inside the gateway's namespace) for `peers`
/// peers: announces itself ready on `ready`, then receives until `stop` is set and
/// nothing came for `quiet`, or `limit`. Delays are measured once `t0` (the phase
/// start) is set, when `paced`.
#[allow(clippy::too_many_arguments)]
pub fn sink(
    peers: usize,
    paced: bool,
    t0: Arc<OnceLock<Instant>>,
    stop: Arc<AtomicBool>,
    quiet: Duration,
    limit: Duration,
    ready: std::sync::mpsc::Sender<()>,
) -> Result<SinkReport> {
    let sock = UdpSocket::bind(false, SINK_PORT)?;
    sock.set_receive_buffer(SINK_BUFFER)?;
    let drops0 = socket_drops(sock.fd()).unwrap_or(0);
    let _ = ready.send(());
    let mut trackers: Vec<SeqTracker> = (0..peers).map(|_| SeqTracker::default()).collect();
    let mut r = SinkReport::default();
    let mut batch = RecvBatch::new(64, 65536);
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let idle = r.last.is_none_or(|l| l.elapsed() >= quiet);
        if stop.load(Ordering::Acquire) && idle {
            break;
        }
        let got = match sock.recv_batch(&mut batch) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                wait_readable_any(sock.fd(), &[], 20)?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let now = Instant::now();
        let start = t0.get().copied().filter(|_| paced);
        for k in 0..got {
            let Some(d) = batch.datagram(k) else { continue };
            for payload in d.datagrams() {
                r.received += 1;
                r.first.get_or_insert(now);
                r.last = Some(now);
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
                    let due = t0 + Duration::from_nanos(stamp.scheduled_ns);
                    r.delay
                        .record(now.saturating_duration_since(due).as_nanos() as u64);
                }
            }
        }
    }
    for t in &trackers {
        r.unique += t.unique;
        r.reordered += t.reordered;
        r.duplicates += t.duplicates;
    }
    r.socket_drops = u64::from(socket_drops(sock.fd()).unwrap_or(0).wrapping_sub(drops0));
    Ok(r)
}

fn from_its_peer(src: &SocketAddr, stamp: &Stamp, peers: usize) -> bool {
    let IpAddr::V4(ip) = src.ip() else {
        return false;
    };
    (stamp.peer as usize) < peers && inner::peer_of(ip) == Some(stamp.peer as usize)
}

#[derive(Debug, Clone, Default)]
pub struct InnerSendReport {
    pub packets: u64,
    pub cpu_s: f64,
}

/// Sends `size`-byte inner packets to every peer's inner address, one batch of
/// consecutive peers per `sendmmsg`, for `dur` (on the calling thread, inside the
/// gateway's namespace), at `pps` packets per second in all (None: unlimited).
pub fn send_inner(
    peers: usize,
    size: usize,
    pps: Option<f64>,
    dur: Duration,
) -> Result<InnerSendReport> {
    let cpu0 = super::generator::thread_cpu_s();
    let sock = UdpSocket::bind(false, 0)?;
    let len = size - inner::IPV4_HEADER - inner::UDP_HEADER;
    const BATCH: usize = 64;
    let mut bufs = vec![vec![0u8; len]; BATCH];
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
            inner::write_payload(buf, peer as u32, j / peers as u64 + 1, 0);
            dsts.push(SocketAddr::new(
                IpAddr::V4(inner::peer_inner(peer)),
                SINK_PORT,
            ));
        }
        let msgs: Vec<(&[u8], SocketAddr)> =
            bufs.iter().zip(&dsts).map(|(b, d)| (&b[..], *d)).collect();
        let sent = sock.send_batch(&msgs, None, NOT_ECT)?;
        report.packets += sent as u64;
        next += k as u64;
    }
    report.cpu_s = super::generator::thread_cpu_s() - cpu0;
    Ok(report)
}
