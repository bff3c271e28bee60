//! The peers' traffic: when each peer sends a burst, and, for window-limited (TCP-like)
//! peers, how much of it the window lets through. Flow: `Schedule` says when a peer's
//! application has a burst ready; an open-loop peer sends it at once, a windowed one
//! queues it behind its congestion window, which acknowledgements (a delivery plus the
//! round trip) open and losses halve.

use super::engine::Ns;

/// A small, fast, seeded generator (SplitMix64): runs must be reproducible.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// Mixes a peer id into a hash (for RSS and thread sharing).
pub fn hash(x: u64) -> u64 {
    Rng::new(x).next_u64()
}

/// When each peer's application has a burst ready.
pub struct Schedule {
    peers: usize,
    /// Time between two bursts of one peer, ns.
    period: f64,
    /// Paced: peers in the order of their phase within a period, and the phases.
    order: Vec<u32>,
    phase: Vec<f64>,
    k: u64,
    /// Poisson: the merged stream's next time, and the generator.
    poisson: Option<(f64, Rng)>,
    next: (Ns, u32),
}

impl Schedule {
    /// `peers` peers, each with a burst every `period` ns: paced with random phases, or
    /// as one Poisson stream of the same mean rate with peers drawn at random.
    pub fn new(peers: usize, period: f64, poisson: bool, rng: &mut Rng) -> Schedule {
        let mut phase: Vec<f64> = (0..peers).map(|_| rng.unit() * period).collect();
        let mut order: Vec<u32> = (0..peers as u32).collect();
        order.sort_by(|a, b| phase[*a as usize].total_cmp(&phase[*b as usize]));
        let sorted: Vec<f64> = order.iter().map(|&p| phase[p as usize]).collect();
        phase = sorted;
        let poisson = poisson.then(|| (0.0, Rng::new(rng.next_u64())));
        let mut s = Schedule {
            peers,
            period,
            order,
            phase,
            k: 0,
            poisson,
            next: (0, 0),
        };
        s.advance();
        s
    }

    fn advance(&mut self) {
        if let Some((t, rng)) = &mut self.poisson {
            *t += rng.exp(self.period / self.peers as f64);
            self.next = (*t as Ns, rng.below(self.peers) as u32);
            return;
        }
        let n = self.peers as u64;
        let (round, i) = (self.k / n, (self.k % n) as usize);
        let t = self.phase[i] + round as f64 * self.period;
        self.next = (t as Ns, self.order[i]);
        self.k += 1;
    }

    pub fn peek(&self) -> Ns {
        self.next.0
    }

    pub fn pop(&mut self) -> (Ns, u32) {
        let n = self.next;
        self.advance();
        n
    }
}

/// A window-limited peer: what TCP does to a flow whose packets the gateway delays or
/// drops. Slow start to the first loss, then additive increase; at most one halving per
/// round trip. The application stalls (sends nothing more) once `MAX_BACKLOG` packets
/// wait for the window, as a blocking socket would.
#[derive(Clone, Debug)]
pub struct Window {
    pub cwnd: f64,
    pub ssthresh: f64,
    pub in_flight: u32,
    pub backlog: u32,
    pub last_halving: Option<Ns>,
}

/// Packets an application may have waiting for the window.
pub const MAX_BACKLOG: u32 = 256;
/// The initial window (RFC 6928).
pub const INITIAL_WINDOW: f64 = 10.0;

impl Default for Window {
    fn default() -> Self {
        Window {
            cwnd: INITIAL_WINDOW,
            ssthresh: f64::INFINITY,
            in_flight: 0,
            backlog: 0,
            last_halving: None,
        }
    }
}

impl Window {
    /// The application has `n` more packets; returns how many the window sends now.
    pub fn offer(&mut self, n: u32) -> u32 {
        self.backlog = (self.backlog + n).min(MAX_BACKLOG);
        self.release()
    }

    fn release(&mut self) -> u32 {
        let room = (self.cwnd.floor() as u32).saturating_sub(self.in_flight);
        let n = room.min(self.backlog);
        self.backlog -= n;
        self.in_flight += n;
        n
    }

    /// `n` packets were acknowledged; returns how many the window sends now. As in
    /// Linux (`tcp_is_cwnd_limited`), the window grows only while it limits the
    /// sender: an application-limited flow's window stays near what it uses, so a loss
    /// that halves it slows the flow.
    pub fn acked(&mut self, n: u32) -> u32 {
        let used = f64::from(self.in_flight);
        let limited = self.backlog > 0
            || if self.cwnd < self.ssthresh {
                2.0 * used > self.cwnd
            } else {
                used >= self.cwnd.floor()
            };
        self.in_flight = self.in_flight.saturating_sub(n);
        if limited {
            for _ in 0..n {
                if self.cwnd < self.ssthresh {
                    self.cwnd += 1.0;
                } else {
                    self.cwnd += 1.0 / self.cwnd;
                }
            }
        }
        self.release()
    }

    /// `n` packets were lost and are sent again; returns how many the window sends now.
    /// A loss the retransmission timer found (`timeout`) drops the window to one packet.
    pub fn lost(&mut self, n: u32, timeout: bool, now: Ns, rtt: Ns) -> u32 {
        self.in_flight = self.in_flight.saturating_sub(n);
        let halve = self.last_halving.is_none_or(|t| now >= t + rtt);
        if timeout {
            self.ssthresh = (self.cwnd / 2.0).max(2.0);
            self.cwnd = 1.0;
            self.last_halving = Some(now);
        } else if halve {
            self.ssthresh = (self.cwnd / 2.0).max(2.0);
            self.cwnd = self.ssthresh;
            self.last_halving = Some(now);
        }
        self.backlog = (self.backlog + n).min(MAX_BACKLOG);
        self.release()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paced_schedule_gives_every_peer_one_burst_per_period() {
        let mut rng = Rng::new(7);
        let mut s = Schedule::new(100, 1_000_000.0, false, &mut rng);
        let mut seen = vec![0u32; 100];
        let mut last = 0;
        for _ in 0..1000 {
            let (t, p) = s.pop();
            assert!(t >= last);
            last = t;
            seen[p as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n == 10));
        assert!(last < 10_000_000);
    }

    #[test]
    fn window_halves_once_per_round_trip_and_grows_back() {
        let mut w = Window::default();
        assert_eq!(w.offer(100), 10);
        assert_eq!(w.acked(10), 20); // slow start: 10 → 20, all of it sent
        let sent = w.lost(1, false, 1_000, 50_000);
        assert_eq!(w.cwnd, 10.0);
        assert_eq!(sent, 0); // 19 still in flight, window 10
        w.lost(1, false, 2_000, 50_000); // within the round trip: no second halving
        assert_eq!(w.cwnd, 10.0);
        w.lost(1, false, 60_000, 50_000);
        assert_eq!(w.cwnd, 5.0);
    }

    #[test]
    fn an_application_limited_window_does_not_grow() {
        let mut w = Window::default();
        for _ in 0..100 {
            assert_eq!(w.offer(2), 2); // two packets a round trip, window 10
            w.acked(2);
        }
        assert_eq!(w.cwnd, INITIAL_WINDOW);
        assert_eq!(w.offer(30), 10); // now the window limits: it grows again
        w.acked(10);
        assert_eq!(w.cwnd, 2.0 * INITIAL_WINDOW);
    }
}
