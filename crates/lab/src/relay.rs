//! The impairment relay: a user-space UDP forwarder on the outer path, run in the
//! router namespace (this kernel has no netem). Each direction applies loss, reorder,
//! duplication, delay with jitter, and corruption, with its own counters.
//!
//! Peers address the relay instead of each other: datagrams arriving on the A-side
//! socket go out of the B-side socket to B, and the reverse.

use crate::netns;
use crate::Result;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the relay does to datagrams, in percent and milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Impairment {
    #[serde(default)]
    pub loss: f64,
    #[serde(default)]
    pub reorder: f64,
    #[serde(default)]
    pub duplicate: f64,
    #[serde(default)]
    pub corrupt: f64,
    #[serde(default)]
    pub delay_ms: f64,
    #[serde(default)]
    pub jitter_ms: f64,
}

impl Impairment {
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("loss", self.loss),
            ("reorder", self.reorder),
            ("duplicate", self.duplicate),
            ("corrupt", self.corrupt),
        ] {
            if !(0.0..=100.0).contains(&v) {
                return Err(
                    format!("impairment {name} = {v}: must be a percentage 0..=100").into(),
                );
            }
        }
        for (name, v) in [("delay_ms", self.delay_ms), ("jitter_ms", self.jitter_ms)] {
            if !(0.0..=10_000.0).contains(&v) {
                return Err(format!("impairment {name} = {v}: must be 0..=10000 ms").into());
            }
        }
        if self.jitter_ms > self.delay_ms {
            return Err("impairment jitter_ms may not exceed delay_ms".into());
        }
        Ok(())
    }

    pub fn is_none(&self) -> bool {
        *self == Impairment::default()
    }
}

/// Per-direction counters.
#[derive(Debug, Default)]
pub struct Counters {
    pub received: AtomicU64,
    pub forwarded: AtomicU64,
    pub dropped: AtomicU64,
    pub duplicated: AtomicU64,
    /// Datagrams held back on purpose to reorder them. Jitter reorders too (a later
    /// datagram drawn a shorter delay overtakes), which this does not count.
    pub reordered: AtomicU64,
    pub corrupted: AtomicU64,
    /// Datagrams the relay meant to forward but its socket refused: its own loss,
    /// not the impairment's.
    pub send_failed: AtomicU64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CounterSnapshot {
    pub received: u64,
    pub forwarded: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    #[serde(default)]
    pub send_failed: u64,
}

impl CounterSnapshot {
    /// What was counted between `earlier` and this snapshot.
    pub fn since(&self, earlier: &CounterSnapshot) -> CounterSnapshot {
        CounterSnapshot {
            received: self.received - earlier.received,
            forwarded: self.forwarded - earlier.forwarded,
            dropped: self.dropped - earlier.dropped,
            duplicated: self.duplicated - earlier.duplicated,
            reordered: self.reordered - earlier.reordered,
            corrupted: self.corrupted - earlier.corrupted,
            send_failed: self.send_failed - earlier.send_failed,
        }
    }
}

impl Counters {
    pub fn snapshot(&self) -> CounterSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CounterSnapshot {
            received: g(&self.received),
            forwarded: g(&self.forwarded),
            dropped: g(&self.dropped),
            duplicated: g(&self.duplicated),
            reordered: g(&self.reordered),
            corrupted: g(&self.corrupted),
            send_failed: g(&self.send_failed),
        }
    }
}

/// Small fast generator (xorshift64) for the lab's impairment decisions and flood
/// contents; never for anything secret.
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn chance(&mut self, pct: f64) -> bool {
        pct > 0.0 && (self.next() % 1_000_000) as f64 / 10_000.0 < pct
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
    pub(crate) fn fill(&mut self, b: &mut [u8]) {
        for x in b {
            *x = self.next() as u8;
        }
    }
}

pub struct Relay {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub a_to_b: Arc<Counters>,
    pub b_to_a: Arc<Counters>,
    /// When set, everything is dropped (a link-down fault).
    pub blackhole: Arc<AtomicBool>,
    /// Datagrams as they arrived (before any impairment), once `record` is called.
    recorded: Arc<Mutex<Recording>>,
    /// Sockets facing A and B, shared with the relay thread, for injecting datagrams as
    /// an on-path attacker would: from the relay's own address and port.
    inject: [UdpSocket; 2],
    dests: [SocketAddr; 2],
}

/// What the relay has recorded: (towards B?, datagram), up to `limit` of them.
#[derive(Default)]
struct Recording {
    limit: usize,
    datagrams: Vec<(bool, Vec<u8>)>,
}

struct Side {
    sock: UdpSocket,
    /// Where datagrams for this side go (updated from what arrives, so peers may roam).
    dest: SocketAddr,
}

struct Pending {
    due: Instant,
    seq: u64,
    to_b: bool,
    data: Vec<u8>,
}
impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(o.due, o.seq))
    }
}

impl Relay {
    /// Starts a relay in namespace `ns`: `listen_a` faces A and forwards to `b`,
    /// `listen_b` faces B and forwards to `a`.
    pub fn start(
        ns: &str,
        listen_a: SocketAddr,
        listen_b: SocketAddr,
        a: SocketAddr,
        b: SocketAddr,
        imp: Impairment,
    ) -> Result<Relay> {
        imp.validate()?;
        let stop = Arc::new(AtomicBool::new(false));
        let blackhole = Arc::new(AtomicBool::new(false));
        let (ab, ba) = (Arc::new(Counters::default()), Arc::new(Counters::default()));
        let (tx, rx) = std::sync::mpsc::channel();
        let ns = ns.to_string();
        let (s, bh, c_ab, c_ba) = (stop.clone(), blackhole.clone(), ab.clone(), ba.clone());
        let recorded = Arc::new(Mutex::new(Recording::default()));
        let rec = recorded.clone();
        let thread = std::thread::Builder::new()
            .name("lab-relay".into())
            .spawn(move || {
                let setup = (|| -> Result<(Side, Side)> {
                    netns::enter(&ns)?;
                    let sa = UdpSocket::bind(listen_a)?;
                    let sb = UdpSocket::bind(listen_b)?;
                    for sk in [&sa, &sb] {
                        sk.set_nonblocking(true)?;
                        // The daemons' buffers, for bursts at line rate: with the
                        // defaults (about 200 KiB) the relay's own socket could
                        // overflow, a loss the impaired cell would charge to the tunnel.
                        use wirelane_io::udp::{force_buffers, SOCKET_BUFFER};
                        force_buffers(sk.as_raw_fd(), SOCKET_BUFFER);
                    }
                    Ok((Side { sock: sa, dest: a }, Side { sock: sb, dest: b }))
                })();
                match setup {
                    Ok((sa, sb)) => {
                        let clones = sa
                            .sock
                            .try_clone()
                            .and_then(|x| Ok([x, sb.sock.try_clone()?]));
                        let _ = tx.send(clones.map_err(|e| e.to_string()));
                        run(sa, sb, imp, &s, &bh, [&c_ab, &c_ba], &rec);
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                    }
                }
            })?;
        let inject = rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| "relay did not start")?
            .map_err(|e| format!("relay: {e}"))?;
        Ok(Relay {
            stop,
            thread: Some(thread),
            a_to_b: ab,
            b_to_a: ba,
            blackhole,
            recorded,
            inject,
            dests: [a, b],
        })
    }

    /// Starts recording the next `limit` datagrams (both directions), dropping any
    /// earlier recording.
    pub fn record(&self, limit: usize) {
        let mut r = self.recorded.lock().expect("relay recording lock");
        *r = Recording {
            limit,
            datagrams: Vec::new(),
        };
    }

    /// The datagrams recorded so far, as (travelling towards B?, bytes).
    pub fn recorded(&self) -> Vec<(bool, Vec<u8>)> {
        self.recorded
            .lock()
            .expect("relay recording lock")
            .datagrams
            .clone()
    }

    /// The first recorded datagram towards B whose message type is `ty` and whose length
    /// is at least `min_len`.
    pub fn recorded_to_b(&self, ty: u8, min_len: usize) -> Result<Vec<u8>> {
        let r = self.recorded.lock().expect("relay recording lock");
        r.datagrams
            .iter()
            .find(|(to_b, d)| *to_b && d.first() == Some(&ty) && d.len() >= min_len)
            .map(|(_, d)| d.clone())
            .ok_or_else(|| format!("no message of type {ty} towards B was captured").into())
    }

    /// Sends `data` to B (or A) from the relay's socket, as if it had been forwarded:
    /// a replay by an on-path attacker. Returns how many sends succeeded.
    pub fn inject(&self, to_b: bool, data: &[u8], times: usize) -> usize {
        let (sock, dest) = if to_b {
            (&self.inject[1], self.dests[1])
        } else {
            (&self.inject[0], self.dests[0])
        };
        let mut sent = 0;
        for _ in 0..times {
            // The sockets are non-blocking: wait briefly for room instead of counting a
            // full send buffer as an injection.
            for _ in 0..1000 {
                match sock.send_to(data, dest) {
                    Ok(_) => {
                        sent += 1;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_micros(100))
                    }
                    Err(_) => break,
                }
            }
        }
        sent
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Longest a datagram is held back for reordering when nothing follows it.
const HOLD_LIMIT: Duration = Duration::from_millis(5);

fn run(
    mut sa: Side,
    mut sb: Side,
    imp: Impairment,
    stop: &AtomicBool,
    blackhole: &AtomicBool,
    [c_ab, c_ba]: [&Counters; 2],
    recording: &Mutex<Recording>,
) {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut queue: BinaryHeap<Reverse<Pending>> = BinaryHeap::new();
    // A datagram held back for reordering, per direction: it is released after the next,
    // or after HOLD_LIMIT when no next one comes (the end of a stream), so reordering
    // never turns into loss.
    let mut held: [Option<(Instant, Vec<u8>)>; 2] = [None, None];
    let mut seq = 0u64;
    let mut buf = vec![0u8; 65536];
    let base_delay = Duration::from_secs_f64(imp.delay_ms / 1000.0);
    while !stop.load(Ordering::Relaxed) {
        // Wait for input or the next due datagram, at most 50 ms.
        let mut wait = queue
            .peek()
            .map(|Reverse(p)| p.due.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_millis(50))
            .min(Duration::from_millis(50));
        if held.iter().any(Option::is_some) {
            wait = wait.min(HOLD_LIMIT);
        }
        let mut fds = [
            libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&sa.sock),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&sb.sock),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds for the duration of the call.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, wait.as_millis() as i32) };
        for to_b in [true, false] {
            let (from, counters, dir) = if to_b {
                (&mut sa, c_ab, 0)
            } else {
                (&mut sb, c_ba, 1)
            };
            for _ in 0..256 {
                let (n, src) = match from.sock.recv_from(&mut buf) {
                    Ok(x) => x,
                    Err(_) => break,
                };
                from.dest = src; // Replies go back to wherever this side sends from.
                counters.received.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut r) = recording.try_lock() {
                    if r.datagrams.len() < r.limit {
                        r.datagrams.push((to_b, buf[..n].to_vec()));
                    }
                }
                if blackhole.load(Ordering::Relaxed) || rng.chance(imp.loss) {
                    counters.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let mut data = buf[..n].to_vec();
                if rng.chance(imp.corrupt) && !data.is_empty() {
                    let i = (rng.next() % data.len() as u64) as usize;
                    data[i] ^= 1 << (rng.next() % 8);
                    counters.corrupted.fetch_add(1, Ordering::Relaxed);
                }
                let copies = if rng.chance(imp.duplicate) {
                    counters.duplicated.fetch_add(1, Ordering::Relaxed);
                    2
                } else {
                    1
                };
                let mut out = Vec::new();
                for _ in 0..copies {
                    out.push(data.clone());
                }
                if rng.chance(imp.reorder) && held[dir].is_none() {
                    held[dir] = out.pop().map(|d| (Instant::now(), d));
                    counters.reordered.fetch_add(1, Ordering::Relaxed);
                } else if let Some((_, h)) = held[dir].take() {
                    out.push(h); // The held one goes after this newer one.
                }
                for d in out {
                    let jitter = if imp.jitter_ms > 0.0 {
                        rng.uniform(-imp.jitter_ms, imp.jitter_ms)
                    } else {
                        0.0
                    };
                    let delay = (base_delay.as_secs_f64() + jitter / 1000.0).max(0.0);
                    seq += 1;
                    queue.push(Reverse(Pending {
                        due: Instant::now() + Duration::from_secs_f64(delay),
                        seq,
                        to_b,
                        data: d,
                    }));
                }
            }
        }
        let now = Instant::now();
        for (dir, h) in held.iter_mut().enumerate() {
            if h.as_ref().is_some_and(|(at, _)| now - *at >= HOLD_LIMIT) {
                let (_, data) = h.take().expect("checked");
                seq += 1;
                queue.push(Reverse(Pending {
                    due: now + base_delay,
                    seq,
                    to_b: dir == 0,
                    data,
                }));
            }
        }
        while queue.peek().is_some_and(|Reverse(p)| p.due <= now) {
            let Reverse(p) = queue.pop().expect("peeked");
            let (sock, dest, counters) = if p.to_b {
                (&sb.sock, sb.dest, c_ab)
            } else {
                (&sa.sock, sa.dest, c_ba)
            };
            let counter = match sock.send_to(&p.data, dest) {
                Ok(_) => &counters.forwarded,
                Err(_) => &counters.send_failed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}
