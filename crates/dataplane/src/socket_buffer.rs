//! The data socket's receive buffer, sized by how long datagrams wait in it.
//!
//! Why: the kernel holds received datagrams in the socket until a reader takes them.
//! While the offered load stays above what the pipeline drains, the buffer stays full
//! and the kernel drops whatever does not fit, whatever the buffer's size. The size
//! then only sets how long each accepted datagram waits (7 MiB asked, 14 MiB granted,
//! drained at 1 GB/s is 14 ms) and how much memory the kernel writes and the reader
//! later copies out cold. Below the drain rate, the same buffer absorbs the reader's
//! absences from its core, and a small one overflows under TCP. BENCHMARKS.md ("A
//! smaller receive buffer on the data socket") measured both: a fixed 2 MiB buffer
//! made the overloaded gateway faster and its delay seven times shorter, and gave TCP
//! on `pair` 500 to 4,800 retransmits a run.
//!
//! So the size follows the evidence, once per interval (CoDel's 100 ms). The socket is
//! **overloaded** when the kernel dropped at least one in a hundred of what reached it
//! (`LOSS_RATIO`): a load that does not back off, since no responsive sender (TCP)
//! keeps losing that much.
//! - **Shrink** when overloaded and every read found its oldest datagram older than
//!   the target: a standing queue. The new size holds `AIM` of the target at the rate
//!   the buffer drained: size × aim / least sojourn (a full buffer's sojourn grows
//!   with its size), never below `floor`.
//! - **Restore** the configured size when not overloaded: nothing is gained by
//!   dropping what the room would absorb.
//! - Otherwise keep. An overloaded reader may still find the buffer short at times
//!   (the sender paused, the reader caught up); that is no reason to let the queue
//!   stand again.
//!
//! A responsive load (TCP) is not shrunk for: with the configured buffer it backs off
//! before the kernel drops much, and the receive CoDel (`stages::rx_aqm`) manages its
//! queue. Drops and reads are both counted in the kernel's buffers (with UDP GRO, one
//! holds many datagrams), so their ratio is the buffers' loss.
//! Time is the caller's nanosecond clock (the kernel's arrival stamps' one), so the
//! tests run on a simulated clock.

/// What the controller aims for, and its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferParams {
    /// The standing sojourn above which a dropping socket is shrunk, ns.
    pub target: u64,
    /// How often the evidence is weighed, ns.
    pub interval: u64,
    /// The smallest size set, bytes (as asked of the kernel, which doubles it).
    pub floor: usize,
    /// The configured size, restored when the loss ends.
    pub ceiling: usize,
}

/// Of the target, what a shrink aims at: below it, so that a steady overload's wait
/// settles under the target and the next intervals keep the size instead of shrinking
/// it again on noise.
const AIM_NUM: u64 = 3;
const AIM_DEN: u64 = 4;

/// The least loss, one in this many of the buffers that reached the socket, that marks
/// an overload.
const LOSS_RATIO: u64 = 100;

/// One socket's controller; its reader is the only caller.
#[derive(Debug, Clone)]
pub struct SocketBuffer {
    params: BufferParams,
    size: usize,
    /// When the interval being observed began; `None` before the first stamped read.
    since: Option<u64>,
    /// The least sojourn of a read's oldest datagram in this interval.
    least: u64,
    /// The kernel's buffers read in this interval.
    read: u64,
    /// The socket's drop count when the interval began.
    drops: u32,
}

impl SocketBuffer {
    /// A controller for a socket just bound, with its buffer at `params.ceiling`.
    pub fn new(params: BufferParams) -> SocketBuffer {
        SocketBuffer {
            params,
            size: params.ceiling,
            since: None,
            least: u64::MAX,
            read: 0,
            drops: 0,
        }
    }

    /// The size to set now.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Notes one read at `now` of `buffers` of the kernel's buffers, whose oldest
    /// datagram the kernel stamped `oldest` (0: not stamped, ignored). True when an
    /// interval has passed: call [`SocketBuffer::decide`].
    pub fn observe(&mut self, now: u64, oldest: u64, buffers: usize) -> bool {
        if oldest == 0 {
            return false;
        }
        self.read += buffers as u64;
        self.least = self.least.min(now.saturating_sub(oldest));
        let since = *self.since.get_or_insert(now);
        now.saturating_sub(since) >= self.params.interval
    }

    /// Ends the interval at `now`, with the socket's drop count since it was bound;
    /// returns the size to set when it changes.
    pub fn decide(&mut self, now: u64, drops: u32) -> Option<usize> {
        let least = std::mem::replace(&mut self.least, u64::MAX);
        let read = std::mem::take(&mut self.read);
        self.since = Some(now);
        // The kernel's counter is a u32 that wraps.
        let dropped = u64::from(drops.wrapping_sub(std::mem::replace(&mut self.drops, drops)));
        let overloaded = dropped > 0 && dropped * LOSS_RATIO >= read + dropped;
        let p = &self.params;
        let wanted = if overloaded && least > p.target {
            let aim = p.target * AIM_NUM / AIM_DEN;
            let scaled = (self.size as u128 * u128::from(aim) / u128::from(least)) as usize;
            scaled.max(p.floor)
        } else if !overloaded {
            p.ceiling
        } else {
            self.size
        };
        (wanted != self.size).then(|| {
            self.size = wanted;
            wanted
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const MIB: usize = 1 << 20;
    const P: BufferParams = BufferParams {
        target: 5 * MS,
        interval: 100 * MS,
        floor: MIB / 4,
        ceiling: 7 * MIB,
    };

    /// Reads of 10 buffers every millisecond over one interval from `start` (1,010 in
    /// all), each finding its oldest datagram `sojourn(i)` old; then the decision with
    /// `drops` dropped since the socket was bound.
    fn interval(
        b: &mut SocketBuffer,
        start: u64,
        sojourn: impl Fn(u64) -> u64,
        drops: u32,
    ) -> Option<usize> {
        // Clock readings of a machine up for a second or more.
        let start = start + 1000 * MS;
        let mut due = false;
        for i in 0..=100 {
            let now = start + i * MS;
            due = b.observe(now, now - sojourn(i), 10);
        }
        assert!(due, "an interval passed");
        b.decide(start + 100 * MS, drops)
    }

    #[test]
    fn a_standing_queue_without_much_loss_is_left_to_the_sender() {
        // A responsive sender (TCP) fills the buffer and rarely overflows it: 5 of
        // 1,015 lost an interval, under one in a hundred.
        let mut b = SocketBuffer::new(P);
        for k in 0..5 {
            let kept = interval(&mut b, (1 + 100 * k) * MS, |_| 30 * MS, 5 * (k as u32 + 1));
            assert_eq!(kept, None);
        }
        assert_eq!(b.size(), P.ceiling);
    }

    #[test]
    fn an_overload_that_drops_shrinks_the_buffer_to_the_aim_and_keeps_it() {
        let mut b = SocketBuffer::new(P);
        assert_eq!(interval(&mut b, MS, |_| MS, 0), None);
        // 14 ms standing and 490 of 1,500 lost: 7 MiB × 3.75 / 14.
        let shrunk = interval(&mut b, 101 * MS, |_| 14 * MS, 490).unwrap();
        assert_eq!(shrunk, 7 * MIB * 15 / 56);
        assert_eq!(b.size(), shrunk);
        // Still overloaded, the queue now near the aim: kept.
        assert_eq!(interval(&mut b, 201 * MS, |_| 15 * MS / 4, 900), None);
        assert_eq!(b.size(), shrunk);
        // The overload ended: no drop in the interval.
        assert_eq!(interval(&mut b, 301 * MS, |_| 4 * MS, 900), Some(P.ceiling));
    }

    #[test]
    fn an_overloaded_reader_that_finds_the_queue_short_keeps_the_smaller_buffer() {
        let mut b = SocketBuffer::new(P);
        interval(&mut b, MS, |_| MS, 0);
        let shrunk = interval(&mut b, 101 * MS, |_| 14 * MS, 100).unwrap();
        // The sender paused once and the reader caught up, but the loss goes on.
        let paused = |i| if i == 50 { MS / 10 } else { 4 * MS };
        assert_eq!(interval(&mut b, 201 * MS, paused, 200), None);
        assert_eq!(b.size(), shrunk);
    }

    #[test]
    fn the_size_never_falls_below_the_floor() {
        let mut b = SocketBuffer::new(P);
        let mut drops = 0;
        for k in 0..6 {
            drops += 1000;
            interval(&mut b, (1 + 100 * k) * MS, |_| 400 * MS, drops);
        }
        assert_eq!(b.size(), P.floor);
    }

    #[test]
    fn unstamped_reads_and_a_counter_wrap_are_handled() {
        let mut b = SocketBuffer::new(P);
        let unstamped = b.observe(5 * MS, 0, 10);
        assert!(!unstamped, "an unstamped read is not evidence");
        interval(&mut b, MS, |_| MS, 0);
        interval(&mut b, 101 * MS, |_| MS, u32::MAX - 99);
        // The kernel's u32 counter wrapped: 200 dropped against 1,010 read.
        assert!(interval(&mut b, 201 * MS, |_| 14 * MS, 100).is_some());
    }
}
