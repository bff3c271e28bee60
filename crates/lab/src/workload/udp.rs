//! UDP stream with sequence numbers: paced (packets per second) or unlimited. The
//! receiver reports delivered, lost, reordered and duplicated datagrams, and datagrams
//! whose contents differ from what was sent (each carries a pattern derived from its
//! sequence number). Losses are placed where the kernel counts them: on transmit at the
//! sender's host (a full TUN queue, for a tunnel) and at the receiving socket (a full
//! receive buffer); the rest were lost in between, by the tunnel.

use super::{in_ns, join, port_from};
use crate::Result;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct UdpResult {
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub reordered: u64,
    pub duplicates: u64,
    /// Datagrams delivered with contents other than the sender's.
    #[serde(default)]
    pub corrupted: u64,
    /// Datagrams the sender's host dropped on transmit though the send succeeded: the
    /// interfaces' transmit drops in its namespace over the stream (a full TUN queue).
    #[serde(default)]
    pub sender_drops: u64,
    /// Datagrams the kernel dropped at the receiving socket (a full receive buffer).
    #[serde(default)]
    pub receiver_drops: u64,
    pub loss_pct: f64,
    pub delivered_pps: f64,
    pub goodput_bps: f64,
}

impl UdpResult {
    /// Bytes delivered once: the datagrams, times their size (the goodput over the
    /// delivery rate, which share one window). Not the goodput times the run's wall
    /// time, which includes the receiver's grace period.
    pub fn delivered_bytes(&self) -> u64 {
        if self.delivered_pps > 0.0 {
            (self.received as f64 * self.goodput_bps / 8.0 / self.delivered_pps).round() as u64
        } else {
            0
        }
    }
}

/// Writes the sequence number and the content pattern that goes with it.
pub fn fill(buf: &mut [u8], seq: u64) {
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    let base = pattern_base(seq);
    for (i, b) in buf[8..].iter_mut().enumerate() {
        *b = base ^ (i as u8).wrapping_mul(31);
    }
}

/// One byte that depends on every bit of `seq`, so a change to the sequence number
/// itself shows up as a pattern mismatch (with probability 255/256).
fn pattern_base(seq: u64) -> u8 {
    (seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

/// The sequence number of a datagram `fill` wrote, or `None` if its contents do not
/// match the pattern its sequence number implies.
pub fn check(buf: &[u8]) -> Option<u64> {
    let seq = u64::from_le_bytes(buf.get(..8)?.try_into().ok()?);
    let base = pattern_base(seq);
    let intact = buf[8..]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == base ^ (i as u8).wrapping_mul(31));
    intact.then_some(seq)
}

/// Receiver-side bookkeeping of sequence numbers.
#[derive(Default)]
pub struct SeqTracker {
    seen: Vec<u64>,
    highest: Option<u64>,
    pub unique: u64,
    pub reordered: u64,
    pub duplicates: u64,
}

impl SeqTracker {
    pub fn record(&mut self, seq: u64) {
        let (w, b) = ((seq / 64) as usize, seq % 64);
        if w >= self.seen.len() {
            if w > 1 << 26 {
                return; // Absurd sequence number (corruption): ignore, bound memory.
            }
            self.seen.resize(w + 1, 0);
        }
        if self.seen[w] & (1 << b) != 0 {
            self.duplicates += 1;
            return;
        }
        self.seen[w] |= 1 << b;
        self.unique += 1;
        match self.highest {
            Some(h) if seq < h => self.reordered += 1,
            _ => self.highest = Some(seq),
        }
    }
}

/// Every interface of the calling thread's network namespace with its counters, as
/// `/proc/thread-self/net/dev` (the thread's own namespace) lists them: eight receive
/// counters (bytes, packets, errs, drop, ...), then eight transmit ones.
pub(crate) fn net_dev_here() -> Result<Vec<(String, Vec<u64>)>> {
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev")?;
    let mut out = Vec::new();
    for line in dev.lines().skip(2) {
        let Some((name, counters)) = line.split_once(':') else {
            continue;
        };
        let counters = counters
            .split_whitespace()
            .map(|c| c.parse::<u64>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| "unreadable net/dev")?;
        out.push((name.trim().to_string(), counters));
    }
    Ok(out)
}

/// Transmit drops summed over every interface of the calling thread's network
/// namespace.
fn transmit_drops_here() -> Result<u64> {
    let mut total = 0;
    for (_, counters) in net_dev_here()? {
        total += counters.get(11).ok_or("unreadable net/dev")?;
    }
    Ok(total)
}

/// Sends `size`-byte datagrams for `dur`, at `pps` packets per second or unlimited.
pub fn stream(
    src: &str,
    dst: &str,
    dst_addr: IpAddr,
    size: usize,
    pps: Option<u64>,
    dur: Duration,
) -> Result<UdpResult> {
    let size = size.max(16);
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let server = in_ns(dst, move || -> Result<(SeqTracker, u64, f64, u64)> {
        let s = UdpSocket::bind(SocketAddr::new(dst_addr, 0))?;
        s.set_read_timeout(Some(Duration::from_millis(100)))?;
        tx.send(s.local_addr()?.port())?;
        let mut t = SeqTracker::default();
        let mut corrupted = 0u64;
        let mut buf = vec![0u8; 65536];
        let (mut first, mut last) = (None, None);
        let hard_end = Instant::now() + dur + Duration::from_secs(15);
        let mut sender_done_at: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if now > hard_end
                || sender_done_at.is_some_and(|d| now > d + Duration::from_millis(500))
            {
                break;
            }
            if sender_done_at.is_none() && done_rx.try_recv().is_ok() {
                sender_done_at = Some(now);
            }
            if let Ok(n) = s.recv(&mut buf) {
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
                match check(&buf[..n]).filter(|_| n == size) {
                    Some(seq) => t.record(seq),
                    None => corrupted += 1,
                }
            }
        }
        // At least the stream's length, as for TCP: a tunnel that stops delivering
        // partway must not report its rate over the part it delivered in.
        let secs = super::tcp::transfer_secs(first, last, dur);
        let drops = wirelane_io::udp::socket_drops(s.as_raw_fd())?;
        Ok((t, corrupted, secs, drops.into()))
    });
    let port = port_from(&rx)?;
    let client = in_ns(src, move || -> Result<(u64, u64)> {
        let s = UdpSocket::bind(SocketAddr::new(
            if dst_addr.is_ipv4() {
                [0, 0, 0, 0].into()
            } else {
                [0u16; 8].into()
            },
            0,
        ))?;
        s.connect(SocketAddr::new(dst_addr, port))?;
        let mut buf = vec![0u8; size];
        let drops_before = transmit_drops_here()?;
        let start = Instant::now();
        let end = start + dur;
        let mut seq = 0u64;
        while Instant::now() < end {
            if let Some(rate) = pps {
                // Pace: do not run ahead of rate × elapsed.
                let allowed = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                if seq >= allowed {
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
            }
            fill(&mut buf, seq);
            // ENOBUFS and friends mean the datagram was not sent: count only successes.
            if s.send(&buf).is_ok() {
                seq += 1;
            }
        }
        // What is still queued leaves within the receiver's grace period; a drop
        // counted after this read is put down to the tunnel.
        Ok((seq, transmit_drops_here()?.saturating_sub(drops_before)))
    });
    let (sent, sender_drops) = join(client)?;
    let _ = done_tx.send(());
    let (t, corrupted, secs, receiver_drops) = join(server)?;
    let lost = sent.saturating_sub(t.unique);
    Ok(UdpResult {
        sent,
        received: t.unique,
        lost,
        reordered: t.reordered,
        duplicates: t.duplicates,
        corrupted,
        sender_drops,
        receiver_drops,
        loss_pct: if sent > 0 {
            lost as f64 * 100.0 / sent as f64
        } else {
            0.0
        },
        delivered_pps: t.unique as f64 / secs,
        goodput_bps: t.unique as f64 * size as f64 * 8.0 / secs,
    })
}

#[cfg(test)]
mod tests {
    use super::{check, fill, SeqTracker, UdpResult};

    #[test]
    fn delivered_bytes_are_the_datagrams_times_their_size() {
        let u = UdpResult {
            received: 1000,
            delivered_pps: 200.0,
            goodput_bps: 200.0 * 1380.0 * 8.0,
            ..UdpResult::default()
        };
        assert_eq!(u.delivered_bytes(), 1_380_000);
        assert_eq!(UdpResult::default().delivered_bytes(), 0);
    }

    #[test]
    fn content_pattern_catches_any_changed_byte() {
        let mut b = vec![0u8; 1380];
        fill(&mut b, 123_456);
        assert_eq!(check(&b), Some(123_456));
        for i in [0, 7, 8, 700, 1379] {
            b[i] ^= 0x10;
            assert_eq!(check(&b).filter(|&s| s == 123_456), None, "flip at {i}");
            b[i] ^= 0x10;
        }
    }

    #[test]
    fn tracks_loss_reorder_duplicates() {
        let mut t = SeqTracker::default();
        for s in [0, 1, 3, 2, 2, 5, 4, 9] {
            t.record(s);
        }
        assert_eq!(t.unique, 7);
        assert_eq!(t.duplicates, 1);
        assert_eq!(t.reordered, 2); // 2 after 3, 4 after 5
        t.record(u64::MAX);
        assert_eq!(t.unique, 7, "absurd numbers are ignored");
    }
}
