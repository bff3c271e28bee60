//! The star scenario's load generator: N emulated peers (`emulated`), each on a UDP
//! socket of its own in the generator's namespace.
//!
//! Flow: `Generator::new` binds the sockets → `handshake` completes every peer's
//! handshake as initiator, paced, answering cookie replies and retrying as the protocol
//! says → `keepalive` confirms each session to the gateway → `seal` builds every
//! transport message of the timed phase ahead of it (counters in order per peer) →
//! `send` sends them, one peer's run of equal-size segments per `sendmsg` (UDP GSO),
//! rotating over the peers, paced or unlimited. In the transmit direction `receive`
//! counts what the gateway sends each peer and opens a sample; there the peers rekey
//! as receiving initiators do, so a phase may outlast their first sessions.
//!
//! One thread runs it all, inside the generator's namespace (the sockets are created
//! there); its own CPU time is measured so that the gateway is never charged for it.

use super::emulated::{EmulatedPeer, Heard, Session};
use super::inner::{self, Stamp};
use super::readiness::{Readiness, MAX_EVENTS};
use super::send_log::SendLog;
use crate::hist::Histogram;
use crate::workload::udp::SeqTracker;
use crate::Result;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};
use wirelane_io::udp::{
    socket_drops, RecvBatch, UdpSocket, GSO_MAX_BYTES, GSO_MAX_SEGMENTS, NOT_ECT,
};
use wirelane_proto::messages::TRANSPORT_HEADER_LEN;

/// The first emulated peer's UDP port; peer i uses FIRST_PORT + i.
pub const FIRST_PORT: u16 = 20_000;
/// Peers one generator emulates at most (their ports end below 65,536).
pub const MAX_PEERS: usize = 40_000;
/// The tunnel MTU the gateway is configured with (the `wg-quick` default).
pub const MTU: usize = 1420;
/// How long the transmit-direction receiver sleeps after finding no datagram: at 10
/// Gbit/s to one peer, 170 packets, far inside each socket's 7 MiB buffer.
const RECEIVE_POLL: Duration = Duration::from_micros(200);

pub struct Generator {
    pub peers: Vec<EmulatedPeer>,
    socks: Vec<UdpSocket>,
    ready: Readiness,
    /// Each peer's endpoint: the gateway's address and the port of the peer's tunnel.
    gateways: Vec<SocketAddr>,
    /// The generator's monotonic clock origin (cookie ages, keypair birth).
    base: Instant,
}

/// When the peers got their sessions, and what it took.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct HandshakeReport {
    pub peers: usize,
    pub established: usize,
    /// Seconds from the first initiation until 50%, 99% and all of the peers had a
    /// session (None: never reached).
    pub to_half_s: Option<f64>,
    pub to_99_s: Option<f64>,
    pub to_all_s: Option<f64>,
    pub initiations: u64,
    pub cookie_replies: u64,
}

/// What to seal for one sender of a receive-direction phase.
#[derive(Debug, Clone)]
pub struct SealPlan {
    /// The peers it sends for.
    pub peers: std::ops::Range<usize>,
    /// Packets per peer (rounded up to whole bursts).
    pub per_peer: usize,
    /// Inner packet size, bytes.
    pub size: usize,
    /// Packets per second over these peers (None: unlimited).
    pub total_pps: Option<f64>,
    pub family: inner::Family,
    /// To the blackhole's address instead of the sink's.
    pub blackhole: bool,
    /// Most messages per send: a GSO run of one peer's packets for a bulk sender, 1 for
    /// a light one, whose packets go out one at a time.
    pub max_burst: usize,
}

/// The sealed traffic of one sender of a receive-direction phase, built before it.
pub struct Sealed {
    /// The first peer it sends for; `per_peer[k]` is peer `first_peer + k`'s.
    first_peer: usize,
    /// Per peer, its messages laid end to end, `outer_len` bytes each.
    per_peer: Vec<Vec<u8>>,
    pub outer_len: usize,
    pub per_peer_count: usize,
    /// Messages per `sendmsg` (one peer's, consecutive).
    pub burst: usize,
    /// Time between the starts of consecutive bursts when paced, ns (0: unlimited).
    pub burst_interval_ns: u64,
}

impl Sealed {
    pub fn bursts(&self) -> usize {
        self.per_peer.len() * (self.per_peer_count / self.burst)
    }

    pub fn bytes(&self) -> usize {
        self.packets() * self.outer_len
    }

    pub fn packets(&self) -> usize {
        self.per_peer.len() * self.per_peer_count
    }

    /// When the last burst is scheduled, after the phase's start: what the pacing
    /// plans (whole bursts per peer, so it may run past the phase asked for); zero
    /// when unlimited.
    pub fn last_scheduled(&self) -> std::time::Duration {
        let bursts = self.bursts().saturating_sub(1) as u64;
        std::time::Duration::from_nanos(bursts.saturating_mul(self.burst_interval_ns))
    }
}

#[derive(Debug, Clone, Default)]
pub struct SendReport {
    pub packets: u64,
    pub cpu_s: f64,
    pub wall_s: f64,
    /// How late each burst left against its schedule, ns (paced runs).
    pub lateness: Histogram,
}

/// What the peers received in the transmit direction.
#[derive(Debug, Clone, Default)]
pub struct ReceiveReport {
    pub packets: u64,
    pub per_peer: Vec<u64>,
    /// Outer counters seen again, or below one already seen, per peer.
    pub duplicates: u64,
    pub reordered: u64,
    pub sampled: u64,
    /// Samples that failed to open, or opened to another packet than the peer's.
    pub sample_bad: u64,
    /// Distinct inner sequence numbers among the good samples, over all peers.
    pub sample_unique: u64,
    /// New sessions the peers got by rekeying.
    pub rekeys: u64,
    /// Sessions the gateway began, answered by the peers, that the gateway then used.
    pub answered: u64,
    pub first: Option<Instant>,
    pub last: Option<Instant>,
    pub cpu_s: f64,
    /// Drop events the kernel counted at the peers' own sockets (their receive
    /// buffers full while the generator was not running): losses of the generator,
    /// not of the gateway.
    pub socket_drops: u64,
}

/// A peer's new session became current: its counters start afresh, and the current
/// session's tracker becomes the previous one's.
fn new_session(trackers: &mut [SeqTracker; 2]) {
    trackers[1] = std::mem::take(&mut trackers[0]);
}

/// The length of the transport message that carries a `size`-byte inner packet.
pub fn message_len(size: usize) -> usize {
    EmulatedPeer::sealed_len(inner::padded(size, MTU))
}

/// CPU time of the calling thread, in seconds.
pub fn thread_cpu_s() -> f64 {
    // SAFETY: clock_gettime writes one timespec we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Raises the open-file limit to hold `need` more descriptors, or says why it cannot.
pub fn ensure_descriptors(need: usize) -> Result<()> {
    // SAFETY: getrlimit/setrlimit read and write one rlimit we own.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let want = (need as u64 + 1024).max(lim.rlim_cur);
    if want <= lim.rlim_cur {
        return Ok(());
    }
    let new = libc::rlimit {
        rlim_cur: want,
        rlim_max: want.max(lim.rlim_max),
    };
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
        return Err(format!(
            "{need} emulated peers need {need} sockets, but the open-file limit is {} (hard {}) \
             and could not be raised: {}",
            lim.rlim_cur,
            lim.rlim_max,
            std::io::Error::last_os_error()
        )
        .into());
    }
    Ok(())
}

impl Generator {
    /// Binds one socket per peer, in the calling thread's namespace, and registers
    /// them for readiness: peer i on port FIRST_PORT + i, at address `source(i)` when
    /// given (each peer its own host, as a gateway's clients are), else at the
    /// wildcard (all peers behind one address); peer i sends to `gateway(i)`.
    pub fn new(
        peers: Vec<EmulatedPeer>,
        gateway: &dyn Fn(usize) -> SocketAddr,
        source: Option<&dyn Fn(usize) -> std::net::Ipv4Addr>,
    ) -> Result<Generator> {
        if peers.len() > MAX_PEERS {
            return Err(format!("at most {MAX_PEERS} emulated peers").into());
        }
        ensure_descriptors(peers.len())?;
        let peers_len = peers.len();
        let ready = Readiness::new()?;
        let mut socks = Vec::with_capacity(peers.len());
        for i in 0..peers.len() {
            let port = FIRST_PORT + i as u16;
            let s = match source {
                Some(f) => UdpSocket::bind_addr(SocketAddr::new(f(i).into(), port)),
                None => UdpSocket::bind(false, port),
            }
            .map_err(|e| format!("binding emulated peer {i}'s port {port}: {e}"))?;
            ready.watch(s.fd(), i)?;
            socks.push(s);
        }
        Ok(Generator {
            peers,
            socks,
            ready,
            gateways: (0..peers_len).map(gateway).collect(),
            base: Instant::now(),
        })
    }

    fn since(&self, now: Instant) -> Duration {
        now.duration_since(self.base)
    }

    /// Waits up to `timeout_ms` for datagrams and hands each (peer, bytes) to `each`;
    /// returns how many sockets had some.
    fn poll(
        &mut self,
        timeout_ms: i32,
        batch: &mut RecvBatch,
        each: &mut dyn FnMut(&mut Generator, usize, &[u8]),
    ) -> Result<usize> {
        let mut peers = [0usize; MAX_EVENTS];
        let mut n = 0;
        for (slot, peer) in peers.iter_mut().zip(self.ready.poll(timeout_ms)?) {
            *slot = peer;
            n += 1;
        }
        for &peer in &peers[..n] {
            loop {
                let got = match self.socks[peer].recv_batch(batch) {
                    Ok(got) => got,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(format!("receive at peer {peer}: {e}").into()),
                };
                for k in 0..got {
                    let Some(r) = batch.datagram(k) else { continue };
                    for d in r.datagrams() {
                        each(self, peer, d);
                    }
                }
                if got < batch.capacity() {
                    break;
                }
            }
        }
        Ok(n)
    }

    fn initiate(&mut self, i: usize) {
        let now = Instant::now();
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let since = self.since(now);
        let msg = self.peers[i].initiation(now, since, wall);
        // A full send buffer loses this initiation; the retry timer covers it.
        let _ = self.socks[i].send_to(&msg, &self.gateways[i]);
    }

    /// Every peer initiates, `rate` per second (None: all at once), until all have a
    /// session or `limit` passes.
    pub fn handshake(&mut self, rate: Option<f64>, limit: Duration) -> Result<HandshakeReport> {
        let n = self.peers.len();
        let start = Instant::now();
        let mut next = 0;
        let mut done: Vec<f64> = Vec::with_capacity(n);
        let mut batch = RecvBatch::new(16, 2048);
        let mut last_retry_scan = start;
        while done.len() < n && start.elapsed() < limit {
            // Initiations due by now under the pacing.
            let due = match rate {
                None => n,
                Some(r) => ((start.elapsed().as_secs_f64() * r) as usize + 1).min(n),
            };
            while next < due {
                self.initiate(next);
                next += 1;
            }
            let now = Instant::now();
            if now.duration_since(last_retry_scan) >= Duration::from_millis(100) {
                last_retry_scan = now;
                for i in 0..next {
                    if self.peers[i].retry_due(now) {
                        self.initiate(i);
                    }
                }
            }
            let wait = if next < n { 1 } else { 20 };
            let mut cookies = Vec::new();
            self.poll(wait, &mut batch, &mut |g, peer, msg| {
                let now = Instant::now();
                let since = g.since(now);
                match g.peers[peer].hear(msg, now, since) {
                    Heard::Established => done.push(now.duration_since(start).as_secs_f64()),
                    Heard::Cookie => cookies.push(peer),
                    _ => {}
                }
            })?;
            // A cookie reply answers our last initiation: send it again, now with mac2.
            for peer in cookies {
                self.initiate(peer);
            }
        }
        let at = |share: f64| -> Option<f64> {
            let k = ((n as f64 * share).ceil() as usize).max(1);
            done.get(k - 1).copied()
        };
        Ok(HandshakeReport {
            peers: n,
            established: done.len(),
            to_half_s: at(0.5),
            to_99_s: at(0.99),
            to_all_s: (done.len() == n).then(|| done.last().copied()).flatten(),
            initiations: self.peers.iter().map(|p| u64::from(p.initiations)).sum(),
            cookie_replies: self.peers.iter().map(|p| u64::from(p.cookie_replies)).sum(),
        })
    }

    /// Sends each established peer's first transport message (see `confirm`).
    pub fn keepalive(&mut self) -> Result<()> {
        for i in 0..self.peers.len() {
            self.confirm(i)?;
        }
        Ok(())
    }

    /// Sends peer `i` a keepalive on its current session; the first (counter 0)
    /// confirms the session: the gateway, as responder, may send on a session only
    /// once it has heard on it. Nothing before the first handshake.
    fn confirm(&mut self, i: usize) -> Result<()> {
        if let Some(msg) = self.peers[i].keepalive() {
            self.socks[i].send_to(&msg, &self.gateways[i])?;
        }
        Ok(())
    }

    /// Seals `plan.per_peer` inner packets of `plan.size` bytes for each of the plan's
    /// peers (counters from 1), scheduled for `plan.total_pps` packets per second in all
    /// (None: unlimited), on all of this machine's cores. Each peer sends from its
    /// address in the plan's family to the gateway's sink, or to the blackhole.
    pub fn seal(&self, plan: &SealPlan) -> Sealed {
        let (size, family, blackhole) = (plan.size, plan.family, plan.blackhole);
        let outer_len = message_len(size);
        let max_burst = (GSO_MAX_BYTES / outer_len).clamp(1, GSO_MAX_SEGMENTS);
        let burst = max_burst.min(plan.max_burst).min(plan.per_peer).max(1);
        let per_peer = plan.per_peer.max(1).div_ceil(burst) * burst;
        let peers = self.peers.get(plan.peers.clone()).unwrap_or(&[]);
        let (first, n) = (plan.peers.start, peers.len());
        let burst_interval_ns = plan
            .total_pps
            .map_or(0, |r| (burst as f64 * 1e9 / r) as u64);
        // `k` counts from the plan's first peer.
        let sched = |k: usize, seq: usize| -> u64 {
            // Burst j carries peer j % n's (j / n)-th run of `burst` packets.
            let j = (seq / burst) * n + k;
            j as u64 * burst_interval_ns
        };
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        let chunk = n.div_ceil(threads).max(1);
        let mut per_peer_bufs: Vec<Vec<u8>> = Vec::with_capacity(n);
        std::thread::scope(|scope| {
            let handles: Vec<_> = peers
                .chunks(chunk)
                .enumerate()
                .map(|(c, peers)| {
                    scope.spawn(move || {
                        peers
                            .iter()
                            .enumerate()
                            .map(|(k, p)| {
                                let k = c * chunk + k;
                                let peer = first + k;
                                let mut buf = vec![0u8; per_peer * outer_len];
                                let sealer = p.sealer();
                                for (seq, msg) in buf.chunks_exact_mut(outer_len).enumerate() {
                                    let stamp = Stamp {
                                        peer: peer as u32,
                                        seq: seq as u64 + 1,
                                        scheduled_ns: sched(k, seq),
                                    };
                                    inner::write_packet(
                                        &mut msg[TRANSPORT_HEADER_LEN..],
                                        size,
                                        family.peer_addr(peer),
                                        family.gateway_addr(peer, blackhole),
                                        stamp,
                                    );
                                    if let Some(sealer) = &sealer {
                                        sealer.seal(seq as u64 + 1, msg);
                                    }
                                }
                                buf
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for h in handles {
                per_peer_bufs.extend(h.join().expect("sealing thread panicked"));
            }
        });
        Sealed {
            first_peer: first,
            per_peer: per_peer_bufs,
            outer_len,
            per_peer_count: per_peer,
            burst,
            burst_interval_ns,
        }
    }

    /// Sends `sealed` from phase start `t0`, burst by burst on its schedule (or as fast
    /// as the sockets take them), giving up at `limit` after `t0`.
    /// With `log`, each burst's departure is recorded there (`send_log`).
    pub fn send(
        &self,
        sealed: &Sealed,
        t0: Instant,
        limit: Duration,
        log: Option<&SendLog>,
    ) -> Result<SendReport> {
        let cpu0 = thread_cpu_s();
        let n = sealed.per_peer.len();
        let mut report = SendReport::default();
        let burst_bytes = sealed.burst * sealed.outer_len;
        // Unpaced, the phase still starts at t0: bytes sent before it would count in
        // the goodput of a phase timed from t0.
        std::thread::sleep(t0.saturating_duration_since(Instant::now()));
        for j in 0..sealed.bursts() {
            let (k, run) = (j % n, j / n);
            let peer = sealed.first_peer + k;
            if sealed.burst_interval_ns > 0 {
                let target = t0 + Duration::from_nanos(j as u64 * sealed.burst_interval_ns);
                let now = Instant::now();
                if target > now {
                    std::thread::sleep(target - now);
                }
                let late = Instant::now().saturating_duration_since(target);
                report.lateness.record(late.as_nanos() as u64);
            }
            if t0.elapsed() > limit {
                break;
            }
            if let Some(log) = log {
                log.record(j, t0.elapsed().as_nanos() as u64);
            }
            let bytes = &sealed.per_peer[k][run * burst_bytes..(run + 1) * burst_bytes];
            let sock = &self.socks[peer];
            let segmented = sealed.burst > 1
                && sock.gso_enabled()
                && sock.send_segmented(
                    &[bytes],
                    sealed.outer_len as u16,
                    &self.gateways[peer],
                    None,
                    NOT_ECT,
                )?;
            if !segmented {
                let msgs: Vec<(&[u8], SocketAddr)> = bytes
                    .chunks_exact(sealed.outer_len)
                    .map(|m| (m, self.gateways[peer]))
                    .collect();
                sock.send_batch(&msgs, None, NOT_ECT)?;
            }
            report.packets += sealed.burst as u64;
        }
        report.wall_s = t0.elapsed().as_secs_f64();
        report.cpu_s = thread_cpu_s() - cpu0;
        Ok(report)
    }

    /// Counts what the gateway sends each peer until `stop` says so and nothing came
    /// for `quiet` (or `limit` passes), opening every `sample_every`-th message. A
    /// peer hearing data on a session `rekey_after` old rekeys.
    pub fn receive(
        &mut self,
        stop: &std::sync::atomic::AtomicBool,
        quiet: Duration,
        limit: Instant,
        sample_every: u64,
        rekey_after: Duration,
    ) -> Result<ReceiveReport> {
        use std::sync::atomic::Ordering;
        let cpu0 = thread_cpu_s();
        let n = self.peers.len();
        let mut r = ReceiveReport {
            per_peer: vec![0; n],
            ..ReceiveReport::default()
        };
        // Counters per session: [current, previous]; a new session shifts them.
        let mut trackers: Vec<[SeqTracker; 2]> = (0..n).map(|_| Default::default()).collect();
        let mut inner_seqs: Vec<SeqTracker> = (0..n).map(|_| SeqTracker::default()).collect();
        let mut batch = RecvBatch::new(64, 65536);
        let mut scratch = vec![0u8; 65536];
        let mut last_retry_scan = Instant::now();
        let mut confirms = Vec::new();
        let drops = |socks: &[UdpSocket]| -> u64 {
            socks
                .iter()
                .map(|s| u64::from(socket_drops(s.fd()).unwrap_or(0)))
                .sum()
        };
        let drops0 = drops(&self.socks);
        while Instant::now() < limit {
            let idle = r.last.is_none_or(|l| l.elapsed() >= quiet);
            if stop.load(Ordering::Acquire) && idle {
                break;
            }
            let now = Instant::now();
            if now.duration_since(last_retry_scan) >= Duration::from_millis(100) {
                last_retry_scan = now;
                for i in 0..n {
                    if self.peers[i].retry_due(now) {
                        self.initiate(i);
                    }
                    if self.peers[i].keepalive_due(now) {
                        self.confirm(i)?;
                    }
                }
            }
            // Polled, not waited for: a receiver asleep in epoll_wait is woken by the
            // datagram that arrives, and the wake-up runs in the gateway's send (its
            // softirq delivers to us), a cost a real peer on another host never puts
            // on the gateway. Between empty polls the sockets' buffers hold what comes.
            let ready = self.poll(0, &mut batch, &mut |g, peer, msg| {
                let now = Instant::now();
                let since = g.since(now);
                let (counter, session) = match g.peers[peer].hear(msg, now, since) {
                    Heard::Transport { counter, session } => (counter, session),
                    Heard::Established => {
                        r.rekeys += 1;
                        new_session(&mut trackers[peer]);
                        confirms.push(peer);
                        return;
                    }
                    // The gateway's first message on a session we answered.
                    Heard::Confirmed { counter } => {
                        r.answered += 1;
                        new_session(&mut trackers[peer]);
                        (counter, Session::Current)
                    }
                    // A full send buffer loses the response; the gateway retries.
                    Heard::Answer(response) => {
                        let _ = g.socks[peer].send_to(&response, &g.gateways[peer]);
                        return;
                    }
                    // A cookie reply answers our last initiation: again, with mac2.
                    Heard::Cookie => return g.initiate(peer),
                    Heard::Ignored => return,
                };
                if g.peers[peer].rekey_due(now, rekey_after) {
                    g.initiate(peer);
                }
                if msg.len() == EmulatedPeer::sealed_len(0) {
                    return; // a keepalive carries no data
                }
                r.first.get_or_insert(now);
                r.last = Some(now);
                r.packets += 1;
                r.per_peer[peer] += 1;
                let t = &mut trackers[peer][(session == Session::Previous) as usize];
                let (dups, reord) = (t.duplicates, t.reordered);
                t.record(counter);
                r.duplicates += t.duplicates - dups;
                r.reordered += t.reordered - reord;
                if (r.per_peer[peer] - 1).is_multiple_of(sample_every) {
                    r.sampled += 1;
                    let m = &mut scratch[..msg.len()];
                    m.copy_from_slice(msg);
                    match the_peers_packet(g, peer, session, counter, m) {
                        Some(seq) => inner_seqs[peer].record(seq),
                        None => r.sample_bad += 1,
                    }
                }
            })?;
            for peer in confirms.drain(..) {
                self.confirm(peer)?;
            }
            if ready == 0 {
                std::thread::sleep(RECEIVE_POLL);
            }
        }
        r.sample_unique = inner_seqs.iter().map(|t| t.unique).sum();
        r.cpu_s = thread_cpu_s() - cpu0;
        r.socket_drops = drops(&self.socks).saturating_sub(drops0);
        Ok(r)
    }
}

/// Opens one message the gateway sent `peer`; the inner sequence number if it carries
/// an intact packet to this peer's inner address (of either family), stamped for
/// this peer.
fn the_peers_packet(
    g: &Generator,
    peer: usize,
    session: Session,
    counter: u64,
    msg: &mut [u8],
) -> Option<u64> {
    let len = g.peers[peer].open(session, counter, msg)?;
    let (dst, stamp) = inner::read_packet(&msg[TRANSPORT_HEADER_LEN..TRANSPORT_HEADER_LEN + len])?;
    (inner::peer_of(dst) == Some(peer) && stamp.peer as usize == peer).then_some(stamp.seq)
}

#[cfg(test)]
mod tests {
    use super::Sealed;
    use std::time::Duration;

    /// The pacing's last burst: whole bursts per peer, so 46 packets a peer in bursts
    /// of 45 take two bursts each, and the schedule runs past the phase asked for.
    #[test]
    fn the_last_burst_is_where_the_schedule_puts_it() {
        let sealed = Sealed {
            first_peer: 0,
            per_peer: vec![Vec::new(); 100],
            outer_len: 1452,
            per_peer_count: 90,
            burst: 45,
            burst_interval_ns: 1_000_000,
        };
        assert_eq!(sealed.bursts(), 200);
        assert_eq!(sealed.last_scheduled(), Duration::from_millis(199));
        let unlimited = Sealed {
            burst_interval_ns: 0,
            ..sealed
        };
        assert_eq!(unlimited.last_scheduled(), Duration::ZERO);
    }
}
