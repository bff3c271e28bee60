//! Stage TX-5, per-peer ordered flush. Input: the peer's TX queue. Output: every sealed
//! batch at its head sent to the peer's endpoint in queue order, then timer
//! bookkeeping. Runs of equal-sized datagrams to one destination with one outer ECN
//! field (RFC 6040 encapsulation, chosen at `encrypt`) go out as one UDP GSO send
//! (UDP_SEGMENT); the other datagrams go out together in `sendmmsg` calls. Runs as one
//! work item per peer at a time (see `OrderedQueue`). Each packet sent counts its
//! sojourn since its TUN read (`tx_sojourn_ns`). With `--queue fq-codel` it then pumps
//! the peer's flow queues into the room it made (`fq::pump`).
//!
//! The transmit plug ([`plugged`]): a TUN reader hands on each read inside a plug. A
//! flush that runs on it meanwhile (the workqueue's idle shortcut runs small ones
//! there) drains its peer's queue but keeps the claim (`OrderedQueue::drain_held`)
//! and leaves the batches in the plug. When the read has been handed on, the plug
//! sends what every such flush drained, in drain order, then finishes each flush and
//! releases its claim. Why: sending to 1,000 peers, each read holds one packet for
//! each of 64 peers, and each was a `sendmsg` of its own; plugged, they are one
//! `sendmmsg`. Order: a peer's claim is held from its drain until its datagrams have
//! left, so no other thread's flush of the peer can send a later batch first.
//! Race (a reader waiting on itself): while the plug holds a peer's claim, batches of
//! that peer finished meanwhile stay queued, counted in the interface's transmit
//! budget; a later group of the same read waiting for budget room might wait for room
//! only the plug can make, and drop after the backpressure wait. So a reader about to
//! wait sends what its plug holds first ([`send_plugged_before_waiting`]). (A reader
//! enqueues each peer once per read, `route` grouping by peer, so its own queue's room
//! is never held by its plug.)

use super::nonce::step;
use super::StageCtx;
use crate::fq_codel::QueueDiscipline;
use crate::packet::{Batch, BatchBody};
use crate::peer::Peer;
use crate::ports::UdpPort;
use crate::queue::{Drained, GiveUpOnUnwind, Ordered};
use crate::sched::{Direction, Serial};
use crate::stats::SojournTally;
use std::cell::RefCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use wirelane_io::udp::{Outgoing, GSO_MAX_BYTES, GSO_MAX_SEGMENTS};

/// Where the datagram at `i` and those after it that may share its GSO send end: one
/// destination, source and ECN field, one size (the last may be shorter), within the
/// kernel's bounds. At least `i + 1`: a datagram too large for any GSO send (a plaintext
/// near 64 KiB through a TUN of that MTU) is a run of its own, sent singly, where the
/// kernel refuses it. An empty run here made `send_all` send nothing and never move
/// on, spinning with its peer's flush claimed.
fn gso_run_end(out: &[Outgoing<'_>], i: usize) -> usize {
    let first = &out[i];
    let seg = first.payload.len();
    let (mut j, mut bytes) = (i, 0);
    while let Some(d) = out.get(j).filter(|_| j - i < GSO_MAX_SEGMENTS) {
        let joins = d.payload.len() <= seg
            && (d.dst, d.src, d.ecn) == (first.dst, first.src, first.ecn)
            && bytes + d.payload.len() <= GSO_MAX_BYTES;
        if !joins {
            break;
        }
        bytes += d.payload.len();
        j += 1;
        if d.payload.len() < seg {
            break; // Only the last segment of a send may be short.
        }
    }
    j.max(i + 1)
}

/// Sends `out` on `sock` in order; `sent[i]` tells whether `out[i]` left. A run that
/// can share a GSO send takes one; the datagrams between runs, whatever their
/// destinations, go out together (`UdpPort::send_each`).
fn send_all(sock: &dyn UdpPort, out: &[Outgoing<'_>], sent: &mut [bool]) {
    let singles = |from: usize, to: usize, sent: &mut [bool]| {
        if from < to {
            let _ = sock.send_each(&out[from..to], &mut sent[from..to]);
        }
    };
    // `start`: the first datagram neither sent nor in a GSO run.
    let (mut start, mut i) = (0, 0);
    while i < out.len() {
        let j = if sock.gso_enabled() {
            gso_run_end(out, i)
        } else {
            i + 1
        };
        if j - i == 1 {
            i = j;
            continue;
        }
        singles(start, i, sent);
        let mut pieces: [&[u8]; GSO_MAX_SEGMENTS] = [&[]; GSO_MAX_SEGMENTS];
        for (piece, d) in pieces.iter_mut().zip(&out[i..j]) {
            *piece = d.payload;
        }
        let d = &out[i];
        // A run of two or more fits GSO_MAX_BYTES, so each segment fits a u16.
        let seg = u16::try_from(d.payload.len()).unwrap_or(u16::MAX);
        match sock.send_segmented(&pieces[..j - i], seg, &d.dst, d.src, d.ecn) {
            Ok(true) => sent[i..j].fill(true),
            // Refused as one send (for this destination's path MTU, or for good):
            // these go singly.
            Ok(false) => singles(i, j, sent),
            Err(_) => sent[i..j].fill(false),
        }
        (start, i) = (j, j);
    }
    singles(start, out.len(), sent);
}

/// One run of a peer's serial TX stage: the batches it drained, to send.
struct Flush {
    peer: Arc<Peer>,
    batches: Vec<Arc<Batch>>,
    drained: Drained,
}

/// What one flush's sends came to.
#[derive(Default, Clone, Copy)]
struct Sent {
    bytes: u64,
    any: bool,
    /// Any datagram longer than a keepalive (a transport message carrying only the
    /// 16-byte tag).
    data: bool,
}

/// Sends every flush's datagrams, each socket's in the flushes' order; returns what
/// each flush sent, and counts the sojourns.
fn send_flushes(c: StageCtx<'_>, flushes: &[Flush]) -> Vec<Sent> {
    let dev = c.iface;
    let now = dev.wall().as_nanos() as u64;
    let sockets = dev.sockets();
    let bodies: Vec<Vec<MutexGuard<'_, BatchBody>>> = flushes
        .iter()
        .map(|f| f.batches.iter().map(|b| b.body()).collect())
        .collect();
    // Per socket (two at most, one per family): the datagrams, and for each its flush
    // and its TUN read time.
    type Lane<'a> = (&'a Arc<dyn UdpPort>, Vec<Outgoing<'a>>, Vec<(usize, u64)>);
    let mut lanes: Vec<Lane<'_>> = Vec::new();
    for (k, (f, bodies)) in flushes.iter().zip(&bodies).enumerate() {
        if f.peer.is_removed() {
            // Drained before the removal's clear, or queued after it.
            let n: usize = f.batches.iter().map(|b| b.packets()).sum();
            dev.stats
                .removed_dropped
                .fetch_add(n as u64, Ordering::Relaxed);
            continue;
        }
        let Some(dst) = f.peer.state().endpoint() else {
            let n: usize = bodies.iter().map(|b| b.packets.len()).sum();
            dev.stats
                .tx_no_endpoint
                .fetch_add(n as u64, Ordering::Relaxed);
            continue;
        };
        // Before the socket table's read lock: the check may read it too.
        let src = dev.source_for(&f.peer, dst);
        let Some(sock) = sockets.for_destination(&dst) else {
            // No socket of the endpoint's family (its bind failed).
            let n = bodies
                .iter()
                .flat_map(|b| &b.packets)
                .filter(|p| p.ok)
                .count();
            dev.stats
                .tx_send_failed
                .fetch_add(n as u64, Ordering::Relaxed);
            continue;
        };
        let lane = match lanes.iter().position(|l| Arc::ptr_eq(l.0, sock)) {
            Some(l) => l,
            None => {
                lanes.push((sock, Vec::new(), Vec::new()));
                lanes.len() - 1
            }
        };
        let (_, out, owners) = &mut lanes[lane];
        for p in bodies.iter().flat_map(|b| &b.packets).filter(|p| p.ok) {
            out.push(Outgoing {
                payload: p.datagram(),
                dst,
                src,
                ecn: p.outer_ecn,
            });
            owners.push((k, p.arrival_ns));
        }
    }
    let mut totals = vec![Sent::default(); flushes.len()];
    let mut sojourns = SojournTally::default();
    for (sock, out, owners) in &lanes {
        let mut sent = vec![false; out.len()];
        send_all(&***sock, out, &mut sent);
        let mut unsent = 0;
        for ((d, &(k, arrival)), ok) in out.iter().zip(owners).zip(sent) {
            if !ok {
                unsent += 1;
                continue;
            }
            let t = &mut totals[k];
            t.bytes += d.payload.len() as u64;
            t.any = true;
            t.data |= d.payload.len() > 32;
            // Keepalives have no read time.
            if arrival != 0 {
                sojourns.add(arrival, now);
            }
        }
        if unsent > 0 {
            dev.stats
                .tx_send_failed
                .fetch_add(unsent, Ordering::Relaxed);
        }
    }
    dev.stats.record_tx_sojourns(&sojourns);
    totals
}

/// The rest of a flush once its datagrams left: counters, timers, and with
/// fq-codel the ring's limit and the pump into the room it made.
fn finish(c: StageCtx<'_>, f: &Flush, sent: Sent) {
    let dev = c.iface;
    let peer = &f.peer;
    peer.tx_bytes.fetch_add(sent.bytes, Ordering::Relaxed);
    if sent.any {
        step(c, peer, |state, ctx, _| state.on_sent(ctx, sent.data));
    }
    if dev.queue == QueueDiscipline::FqCodel && f.drained.packets > 0 {
        let completed: usize = f.batches.iter().map(|b| b.bytes()).sum();
        let left = peer.tx_queue.queued_bytes();
        let at = dev.now().as_nanos() as u64;
        if peer.tx_ring_limit.completed(completed, left, at) {
            dev.stats.tx_ring_starved.fetch_add(1, Ordering::Relaxed);
        }
        super::fq::pump(c, peer);
    }
}

/// Flushes what is ready at the head of the peer's TX queue, at most `budget` packets
/// (see `OrderedQueue::drain`). Inside a plug, leaves it to the plug to send.
///
/// Race: the claim is kept from the drain until the datagrams have left
/// (`drain_held`, then `release`). Released at the drain, as a drain that hands
/// each batch on before it looks at the next can be, another thread's flush of the
/// peer could take the next batches and send them first.
pub fn flush(c: StageCtx<'_>, peer: &Arc<Peer>, budget: usize) -> Drained {
    let plugged = PLUG.with_borrow(|p| p.as_ref().is_some_and(|p| p.iface == c.iface.id));
    let mut total = Drained::default();
    let drained = loop {
        let mut batches = Vec::new();
        let drained = peer
            .tx_queue
            .drain_held(budget - total.packets, |b| batches.push(b));
        total.batches += drained.batches;
        total.packets += drained.packets;
        let f = Flush {
            peer: peer.clone(),
            batches,
            drained,
        };
        if plugged {
            PLUG.with_borrow_mut(|p| p.as_mut().expect("plugged").held.push(f));
            c.iface.stats.serial_plugged.fetch_add(1, Ordering::Relaxed);
            break drained;
        }
        // A panic from here on gives the claim up, as one inside a drain does, so
        // that `run_serial` can hand the stage on.
        let claim = GiveUpOnUnwind(&peer.tx_queue);
        let sent = send_flushes(c, std::slice::from_ref(&f));
        finish(c, &f, sent[0]);
        std::mem::forget(claim);
        // More finished while these were sent: still scheduled, so this run goes on,
        // as a drain would have, unless the budget is spent.
        if drained.more || !peer.tx_queue.release() {
            break drained;
        }
        if total.packets >= budget {
            break Drained {
                more: true,
                ..drained
            };
        }
    };
    total.more = drained.more;
    total.head_pending = drained.head_pending;
    c.iface.stats.record_serial_run(&total);
    total
}

/// A reader's plug: the flushes run on it since it began, in order.
struct Plug {
    iface: u32,
    held: Vec<Flush>,
}

thread_local! {
    static PLUG: RefCell<Option<Plug>> = const { RefCell::new(None) };
}

/// Releases the claims the plug's flushes held, and hands the stage on where more
/// finished meanwhile. A flush stopped by its budget (`Drained::more`) never kept its
/// claim for the plug: the run after it did. Called outside any unwinding ([`plugged`]
/// catches panics first): handing a stage on may run it here.
fn release_claims(c: StageCtx<'_>, flushes: &[Flush]) {
    for f in flushes.iter().filter(|f| !f.drained.more) {
        if f.peer.tx_queue.release() {
            let serial = Serial {
                iface: c.iface,
                peer: &f.peer,
                dir: Direction::Tx,
            };
            c.sched.schedule_serial(serial);
        }
    }
}

/// Runs `f` (a reader handing on one read) with this thread's flushes of `c`'s
/// interface plugged, then sends what they drained and finishes them; again while
/// finishing them (a pump, a release that found more) plugs more. Inside a plug
/// already, just runs `f`.
///
/// A panic in `f` or in the sends (a bug) is caught until every claim the plug
/// holds is released (what was not sent is lost), then goes on to the caller.
pub fn plugged<R>(c: StageCtx<'_>, f: impl FnOnce() -> R) -> R {
    let nested = PLUG.with_borrow_mut(|p| {
        p.is_some() || {
            *p = Some(Plug {
                iface: c.iface.id,
                held: Vec::new(),
            });
            false
        }
    });
    if nested {
        return f();
    }
    let r = catch_unwind(AssertUnwindSafe(f));
    let panicked = send_held(c);
    PLUG.set(None);
    match (r, panicked) {
        (Ok(r), None) => r,
        (Err(p), _) | (Ok(_), Some(p)) => resume_unwind(p),
    }
}

/// Sends what this thread's plug holds before the reader waits for room in `c`'s
/// interface: the claims the plug holds keep the workers from draining those peers'
/// queues, so the room that the wait is for might only come from the plug itself, and
/// the reader would wait out the whole [`BACKPRESSURE_WAIT`](super::nonce) and then
/// drop. The plug stays in place for the rest of the read.
pub fn send_plugged_before_waiting(c: StageCtx<'_>) {
    let holds = PLUG.with_borrow(|p| {
        p.as_ref()
            .is_some_and(|p| p.iface == c.iface.id && !p.held.is_empty())
    });
    if holds {
        if let Some(p) = send_held(c) {
            resume_unwind(p);
        }
    }
}

/// Sends and finishes every flush this thread's plug holds, and releases their claims,
/// again for the flushes that this plugs meanwhile (a pump, a release that found
/// more), until it holds none. A panic in the sends (a bug) is caught until every
/// claim is released (what was not sent is lost), and returned.
fn send_held(c: StageCtx<'_>) -> Option<Box<dyn std::any::Any + Send>> {
    let mut panicked = None;
    loop {
        let held = PLUG.with_borrow_mut(|p| p.as_mut().map(|p| std::mem::take(&mut p.held)));
        let held = held.unwrap_or_default();
        if held.is_empty() {
            break;
        }
        c.iface
            .stats
            .serial_plug_sends
            .fetch_add(1, Ordering::Relaxed);
        let send = || {
            super::timed(c.iface, || {
                let sent = send_flushes(c, &held);
                for (f, s) in held.iter().zip(sent) {
                    finish(c, f, s);
                }
            })
        };
        if let Err(p) = catch_unwind(AssertUnwindSafe(send)) {
            panicked.get_or_insert(p);
        }
        release_claims(c, &held);
    }
    panicked
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::net::SocketAddr;
    use std::os::fd::RawFd;
    use std::sync::Mutex;
    use wirelane_io::udp::{LocalAddr, Received, RecvBatch};

    /// A socket that records each send as (datagrams, ECN field, destinations).
    struct Recorder {
        gso: bool,
        /// Refuses every segmented send as the kernel does one past the path MTU:
        /// nothing sent, offload kept.
        refuses_runs: bool,
        sends: Mutex<Vec<(usize, u8, usize)>>,
    }

    impl Recorder {
        fn new(gso: bool) -> Self {
            Recorder {
                gso,
                refuses_runs: false,
                sends: Mutex::new(Vec::new()),
            }
        }
        fn record(&self, n: usize, ecn: u8, dsts: usize) {
            self.sends.lock().unwrap().push((n, ecn, dsts));
        }
    }

    impl UdpPort for Recorder {
        fn fd(&self) -> RawFd {
            -1
        }
        fn gro_enabled(&self) -> bool {
            false
        }
        fn gso_enabled(&self) -> bool {
            self.gso
        }
        fn recv_each(
            &self,
            _: &mut RecvBatch,
            _: &mut dyn FnMut(Received<'_>),
        ) -> io::Result<usize> {
            Err(io::ErrorKind::WouldBlock.into())
        }
        fn send_each(&self, msgs: &[Outgoing<'_>], sent: &mut [bool]) -> io::Result<usize> {
            let mut dsts: Vec<SocketAddr> = msgs.iter().map(|m| m.dst).collect();
            dsts.dedup();
            // The ECN field of a mixed send is recorded as 0xff.
            let ecn = msgs[0].ecn;
            let mixed = msgs.iter().any(|m| m.ecn != ecn);
            self.record(msgs.len(), if mixed { 0xff } else { ecn }, dsts.len());
            sent.fill(true);
            Ok(msgs.len())
        }
        fn try_send_replies(
            &self,
            msgs: &[(&[u8], SocketAddr, Option<LocalAddr>)],
        ) -> io::Result<usize> {
            Ok(msgs.len())
        }
        fn send_segmented(
            &self,
            dgrams: &[&[u8]],
            _: u16,
            _: &SocketAddr,
            _: Option<LocalAddr>,
            ecn: u8,
        ) -> io::Result<bool> {
            if self.refuses_runs {
                return Ok(false);
            }
            self.record(dgrams.len(), ecn, 1);
            Ok(true)
        }
        fn send_from(
            &self,
            p: &[u8],
            _: &SocketAddr,
            _: Option<LocalAddr>,
            ecn: u8,
        ) -> io::Result<usize> {
            self.record(1, ecn, 1);
            Ok(p.len())
        }
    }

    fn out(payload: &[u8], ecn: u8, dst: SocketAddr) -> Outgoing<'_> {
        Outgoing {
            payload,
            dst,
            src: None,
            ecn,
        }
    }

    /// A datagram larger than any GSO send (65,507 bytes) goes out singly, where the
    /// kernel refuses it, and the sends around it go on.
    #[test]
    fn a_datagram_too_large_for_gso_is_sent_alone() {
        let (huge, big) = (vec![0u8; GSO_MAX_BYTES + 60], vec![0u8; 1000]);
        let ep: SocketAddr = "192.0.2.1:51820".parse().unwrap();
        let dgrams = [
            out(&big, 0, ep),
            out(&huge, 0, ep),
            out(&big, 0, ep),
            out(&big, 0, ep),
        ];
        let sock = Recorder::new(true);
        let mut sent = [false; 4];
        send_all(&sock, &dgrams, &mut sent);
        // The first and the huge one go singly (one `sendmmsg`), the last two as a run.
        assert_eq!(*sock.sends.lock().unwrap(), vec![(2, 0, 1), (2, 0, 1)]);
        assert!(sent.iter().all(|&s| s));
    }

    /// A run the kernel refuses as one send while keeping the offload (its segments
    /// exceed the destination's path MTU) goes singly, and the runs after it are still
    /// tried as runs. Before, the loop tried the same run again for ever.
    #[test]
    fn a_run_refused_for_its_path_goes_singly() {
        let d = vec![0u8; 1400];
        let ep = |port: u16| SocketAddr::from(([192, 0, 2, 1], port));
        let dgrams = [
            out(&d, 0, ep(1)),
            out(&d, 0, ep(1)),
            out(&d, 0, ep(1)),
            out(&d, 0, ep(2)),
            out(&d, 0, ep(3)),
            out(&d, 0, ep(3)),
        ];
        let sock = Recorder {
            refuses_runs: true,
            ..Recorder::new(true)
        };
        let mut sent = [false; 6];
        send_all(&sock, &dgrams, &mut sent);
        assert!(sent.iter().all(|&s| s));
        // Each refused run leaves as one `sendmmsg` of its own datagrams, in order.
        assert_eq!(
            *sock.sends.lock().unwrap(),
            vec![(3, 0, 1), (1, 0, 1), (2, 0, 1)]
        );
    }

    /// One segmented send carries one outer ECN field, so a run ends where the field
    /// changes as well as where the size does; without GSO, everything goes in one
    /// `sendmmsg`, each datagram with its own field.
    #[test]
    fn sends_split_where_the_outer_ecn_field_changes() {
        let (big, small) = (vec![0u8; 1000], vec![0u8; 500]);
        let ep: SocketAddr = "192.0.2.1:51820".parse().unwrap();
        let dgrams = [
            out(&big, 0b10, ep),
            out(&big, 0b10, ep),
            out(&big, 0b10, ep),
            out(&big, 0, ep),
            out(&big, 0, ep),
            out(&small, 0, ep), // A short last segment still joins its run.
            out(&big, 0b01, ep),
        ];
        for (gso, expected) in [
            (true, vec![(3, 0b10, 1), (3, 0, 1), (1, 0b01, 1)]),
            (false, vec![(7, 0xff, 1)]),
        ] {
            let sock = Recorder::new(gso);
            let mut sent = [false; 7];
            send_all(&sock, &dgrams, &mut sent);
            assert!(sent.iter().all(|&s| s), "gso={gso}");
            assert_eq!(*sock.sends.lock().unwrap(), expected, "gso={gso}");
        }
    }

    /// Single datagrams to many destinations (a plug's flushes of many peers) share
    /// one `sendmmsg`; a run to one destination between them takes a GSO send of its
    /// own, and the singles before it leave first, so the order holds.
    #[test]
    fn singles_to_many_destinations_share_one_send() {
        let d = vec![0u8; 1000];
        let ep = |port: u16| SocketAddr::from(([192, 0, 2, 1], port));
        let dgrams = [
            out(&d, 0, ep(1)),
            out(&d, 0, ep(2)),
            out(&d, 0, ep(3)),
            out(&d, 0, ep(4)),
            out(&d, 0, ep(4)),
            out(&d, 0, ep(5)),
            out(&d, 0, ep(6)),
        ];
        let sock = Recorder::new(true);
        let mut sent = [false; 7];
        send_all(&sock, &dgrams, &mut sent);
        assert!(sent.iter().all(|&s| s));
        assert_eq!(
            *sock.sends.lock().unwrap(),
            [(3, 0, 3), (2, 0, 1), (2, 0, 2)]
        );
    }
}
