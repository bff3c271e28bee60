//! The kernel's own cost of what a gateway's transmit path asks of it, with no tunnel:
//! one thread in a namespace sends sealed-size datagrams over a veth to N UDP sockets
//! in another namespace (as the star topology's emulated peers have, each on the
//! emulated peers' epoll set: `readiness`), either in GSO sends of K segments to each
//! destination in turn (what a flush to one busy peer becomes, or at many peers a
//! flush that found K packets of its peer) or one datagram per destination, rotating
//! over them, in `sendmmsg` calls (what a read with a packet for each of many peers
//! becomes). The sending thread's CPU-seconds per GB are the floor under any gateway's
//! transmit cost at that many peers and that many packets per send: a gateway makes at
//! least these calls, and on a veth the receiving side's softirq work runs in them.
//!
//! Why: at 1,000 peers the daemons' transmit cost per byte is three times the one-peer
//! figure. This says how much of that is the kernel's path per send and per datagram,
//! which no user-space design avoids: a gateway's sends carry as many datagrams as
//! its flushes find for one peer, few when each read holds a packet for each of many.

use super::generator::{message_len, thread_cpu_s};
use super::readiness::Readiness;
use crate::netns::{unique, Netns};
use crate::workload::{in_ns, join};
use crate::Result;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wirelane_io::udp::{Outgoing, RecvBatch, UdpSocket, GSO_MAX_BYTES, GSO_MAX_SEGMENTS, NOT_ECT};

const SENDER: &str = "10.77.0.1";
const RECEIVER: &str = "10.77.0.2";
/// The receivers' first port; peer i listens on BASE_PORT + i.
const BASE_PORT: u16 = 20_000;
/// Most destinations a run may have: one socket each, and ports above BASE_PORT.
pub const MAX_PEERS: usize = 40_000;
/// The least a paced sender sleeps: it sends in bursts of this much of its rate.
const PACE_SLICE: Duration = Duration::from_micros(500);
/// Most datagrams per `sendmmsg` (the kernel's UIO_MAXIOV).
pub const MAX_BATCH: usize = 1024;

/// One run's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Floor {
    pub peers: usize,
    /// Datagrams per `sendmmsg` (when `segments` is 1).
    pub batch: usize,
    /// Datagrams per GSO send to one destination (1: no GSO, `sendmmsg` calls).
    pub segments: usize,
    /// Bytes of each datagram (a sealed transport message).
    pub datagram: usize,
    pub gbit_per_s: f64,
    /// The sending thread's CPU-seconds per GB of datagrams sent.
    pub cpu_s_per_gb: f64,
    /// Datagrams the receivers got, of those sent (the rest overflowed their buffers).
    pub received: u64,
    pub sent: u64,
}

/// Sends `size`-byte inner packets' worth of datagrams to `peers` destinations for
/// `seconds`, as fast as one thread can, and measures the sender: GSO sends of
/// `segments` datagrams to each destination in turn (None: as many as one send takes
/// at one destination, 1 at many), or with 1, `batch` datagrams per `sendmmsg`.
pub fn measure(
    peers: usize,
    size: usize,
    seconds: f64,
    batch: usize,
    segments: Option<usize>,
    gbit: Option<f64>,
) -> Result<Floor> {
    if !(1..=MAX_BATCH).contains(&batch) {
        return Err(format!("batch must be 1..={MAX_BATCH}, not {batch}").into());
    }
    if !(1..=MAX_PEERS).contains(&peers) {
        return Err(format!("peers must be 1..={MAX_PEERS}, not {peers}").into());
    }
    if gbit.is_some_and(|g| !(0.01..=100.0).contains(&g)) {
        return Err("the offered rate must be 0.01..=100 Gbit/s".into());
    }
    if !(0.1..=60.0).contains(&seconds) {
        return Err(format!("seconds must be 0.1..=60, not {seconds}").into());
    }
    let datagram = message_len(size);
    if datagram > GSO_MAX_BYTES {
        return Err(format!("a {size}-byte packet does not fit a datagram").into());
    }
    let most = (GSO_MAX_BYTES / datagram).min(GSO_MAX_SEGMENTS);
    let segments = segments.unwrap_or(if peers == 1 { most } else { 1 });
    if !(1..=most).contains(&segments) {
        return Err(format!(
            "segments must be 1..={most} for a {datagram}-byte datagram, not {segments}"
        )
        .into());
    }
    let (a, b) = (Netns::new("lfa")?, Netns::new("lfb")?);
    let (va, vb) = (unique("lfv"), unique("lfv"));
    crate::netns::sh(&format!(
        "ip link add {va} netns {} type veth peer name {vb} netns {}",
        a.name, b.name
    ))?;
    a.run(&format!(
        "ip addr add {SENDER}/24 dev {va} && ip link set {va} up"
    ))?;
    b.run(&format!(
        "ip addr add {RECEIVER}/24 dev {vb} && ip link set {vb} up"
    ))?;
    super::generator::ensure_descriptors(peers + 16)?;

    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let receiver = {
        let (stop, received) = (stop.clone(), received.clone());
        in_ns(&b.name, move || -> Result<()> {
            let mut ready = Readiness::new()?;
            let socks = (0..peers)
                .map(|i| {
                    let addr = SocketAddr::new(RECEIVER.parse()?, BASE_PORT + i as u16);
                    let s = UdpSocket::bind_addr(addr)?;
                    ready.watch(s.fd(), i)?;
                    Ok(s)
                })
                .collect::<Result<Vec<_>>>()?;
            let _ = ready_tx.send(());
            let mut recv = RecvBatch::new(64, 65536);
            // Bounded: the sender stops at its deadline and then sets `stop`.
            let limit = Instant::now() + Duration::from_secs_f64(seconds) * 2;
            while !stop.load(Ordering::Relaxed) && Instant::now() < limit {
                let mut got = 0;
                for i in ready.poll(0)? {
                    // Drained to empty, so the next datagram finds an empty queue, as
                    // the emulated peers' do. A buffer holds several datagrams where
                    // UDP GRO kept a GSO send whole.
                    while let Ok(n) = socks[i].recv_batch(&mut recv) {
                        got += (0..n)
                            .filter_map(|k| recv.datagram(k))
                            .map(|r| r.datagrams().count() as u64)
                            .sum::<u64>();
                        if n < recv.capacity() {
                            break;
                        }
                    }
                }
                received.fetch_add(got, Ordering::Relaxed);
                if got == 0 {
                    std::thread::yield_now();
                }
            }
            Ok(())
        })
    };
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| "the receivers did not start")?;
    let sender = in_ns(&a.name, move || {
        send(peers, datagram, seconds, batch, segments, gbit)
    });
    let result = join(sender);
    stop.store(true, Ordering::Relaxed);
    join(receiver)?;
    let (sent, cpu_s, wall_s) = result?;
    let bytes = (sent * datagram as u64) as f64;
    Ok(Floor {
        peers,
        batch,
        segments,
        datagram,
        gbit_per_s: bytes * 8.0 / wall_s / 1e9,
        cpu_s_per_gb: cpu_s / (bytes / 1e9),
        received: received.load(Ordering::Relaxed),
        sent,
    })
}

/// The sender, paced to `gbit` of datagrams if given: (datagrams sent, its
/// CPU-seconds, wall seconds). Why pace: a receiver that cannot keep up makes the
/// floor too cheap, since a datagram dropped at a full socket costs less than one
/// delivered (GSO sends of 8 outrun it here); a run counts only where all arrived.
fn send(
    peers: usize,
    datagram: usize,
    seconds: f64,
    batch: usize,
    segments: usize,
    gbit: Option<f64>,
) -> Result<(u64, f64, f64)> {
    let sock = UdpSocket::bind_addr(SocketAddr::new(SENDER.parse()?, 0))?;
    let payload = vec![0x5au8; datagram];
    let receiver: std::net::IpAddr = RECEIVER.parse()?;
    let dst = |i: usize| SocketAddr::new(receiver, BASE_PORT + i as u16);
    let pieces = vec![&payload[..]; segments];
    // Built once and re-addressed in place: the timed loop is the kernel's cost, so it
    // neither allocates nor parses.
    let mut msgs: Vec<Outgoing<'_>> = (0..batch)
        .map(|k| Outgoing {
            payload: &payload,
            dst: dst(k % peers),
            src: None,
            ecn: NOT_ECT,
        })
        .collect();
    let mut next = 0;
    let mut sent_flags = vec![false; batch];
    let (started, cpu0) = (Instant::now(), thread_cpu_s());
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut sent = 0u64;
    let ns_per_datagram = gbit.map(|g| datagram as f64 * 8.0 / g);
    while Instant::now() < deadline {
        if let Some(ns) = ns_per_datagram {
            let due = started + Duration::from_nanos((sent as f64 * ns) as u64);
            // Slept in slices of at least PACE_SLICE, so the pacing's own wake-ups stay
            // a small part of what is measured.
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                if wait >= PACE_SLICE {
                    std::thread::sleep(wait);
                }
            }
        }
        if segments > 1 {
            if sock.send_segmented(&pieces, datagram as u16, &dst(next), None, NOT_ECT)? {
                sent += segments as u64;
                next = (next + 1) % peers;
                continue;
            }
            return Err("the kernel refused UDP segmentation offload".into());
        }
        for (k, m) in msgs.iter_mut().enumerate() {
            m.dst = dst((next + k) % peers);
        }
        next = (next + batch) % peers;
        sent += match batch {
            1 => sock
                .send_from(&payload, &msgs[0].dst, None, NOT_ECT)
                .map_or(0, |_| 1),
            _ => sock.send_each(&msgs, &mut sent_flags)? as u64,
        };
    }
    Ok((sent, thread_cpu_s() - cpu0, started.elapsed().as_secs_f64()))
}
