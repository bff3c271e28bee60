//! The pipeline's stages, one per file, in the order of design.md §4:
//!
//! TX: tun_read → route → fq (flow queue, with `--queue fq-codel`) → nonce → encrypt (parallel) → tx_flush (per-peer ordered)
//! RX: udp_recv → classify → decrypt (parallel) → rx_deliver (per-peer ordered, with rx_aqm before the TUN write)
//! and beside them: gate (handshake messages, on the UDP reader) → handshake (its own
//! bounded lanes and thread), and timers. `protocol` is not a stage: it is the protocol
//! step any of them may take, and carries out what the step asks for.
//!
//! Each stage is a plain function of a [`StageCtx`]: the interface it works for and the
//! scheduler behind the seam (`sched`). Stages hand work on only through that trait, so
//! any execution model, a benchmark or a test with in-memory ports can drive them.

pub mod classify;
pub mod decrypt;
pub mod encrypt;
pub mod fq;
pub mod gate;
pub mod handshake;
pub mod nonce;
pub mod protocol;
pub mod route;
pub mod rx_aqm;
pub mod rx_deliver;
pub mod timers;
pub mod tun_read;
pub mod tx_flush;
pub mod udp_recv;

use crate::interface::Interface;
use crate::packet::Batch;
use crate::peer::Peer;
use crate::queue::Drained;
use crate::sched::{Crypt, Direction, Scheduler, Serial};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// What every stage is given.
#[derive(Clone, Copy)]
pub struct StageCtx<'a> {
    pub iface: &'a Arc<Interface>,
    pub sched: &'a dyn Scheduler,
}

thread_local! {
    /// Whether this thread is inside a timed item (see [`timed`]).
    static TIMING: Cell<bool> = const { Cell::new(false) };
}

/// Clears [`TIMING`] when the outermost timed item ends, even by unwinding.
struct TimingGuard;

impl Drop for TimingGuard {
    fn drop(&mut self) {
        TIMING.set(false);
    }
}

/// Runs `f`, counting the time it takes as `iface`'s busy time, unless an item this
/// thread is already running counts it: a reader's shortcut runs the serial stage
/// inside the crypt item that scheduled it, and the fq pump a crypt item inside a
/// serial stage, both of the same interface. Counted twice before, and each item cost
/// two clock reads more.
fn timed<R>(iface: &Interface, f: impl FnOnce() -> R) -> R {
    if TIMING.get() {
        return f();
    }
    TIMING.set(true);
    let _guard = TimingGuard;
    let started = Instant::now();
    let r = f();
    iface.stats.add_busy(started.elapsed());
    r
}

/// Runs one crypt item (seal or open); a model's workers call this. The time it takes
/// counts as its interface's busy time.
///
/// A panic (a bug) is caught here, counted and logged, and costs only its batch: one
/// left unfinished is marked done with every packet failed, so that its peer's ordered
/// stage passes it rather than wait on it for ever, and that stage is handed on as a
/// finished batch's would be. A thread that died instead would take its share of the
/// pool with it, and leave the peer's queue held.
pub fn run_crypt(sched: &dyn Scheduler, w: Crypt<'_>) {
    let Crypt {
        iface,
        peer,
        batch,
        dir,
    } = w;
    let c = StageCtx { iface, sched };
    let crypt = || match dir {
        Direction::Tx => encrypt::encrypt(c, peer, batch.clone()),
        Direction::Rx => decrypt::decrypt(c, peer, batch.clone()),
    };
    let stage = dir_name(dir, "encrypt", "decrypt");
    if contained(iface, stage, || timed(iface, crypt)).is_some() {
        return;
    }
    // Done means `schedule` was called after it, or the panic came later.
    if batch.is_done() {
        return;
    }
    complete_as_lost(c, peer, dir, [batch]);
}

/// Completes `batches`, queued in `peer`'s `dir` ordered queue but left unfinished by a
/// panic (a bug), so that the queue passes them rather than wait on them for good, and
/// hands its serial stage on as a finished batch's would be. Their packets are dropped
/// and counted as lost to the panic (`crypt_panic_dropped`): left in the batch as
/// failed, receive counted them as failed authentication, and transmit left their
/// counters as gaps no counter named. The queue's accounting does not need them (a
/// batch keeps its size from when it was made).
pub(crate) fn complete_as_lost(
    c: StageCtx<'_>,
    peer: &Arc<Peer>,
    dir: Direction,
    batches: impl IntoIterator<Item = Arc<Batch>>,
) {
    let mut any = false;
    for batch in batches {
        let lost = std::mem::take(&mut batch.body().packets).len();
        c.iface
            .stats
            .crypt_panic_dropped
            .fetch_add(lost as u64, Ordering::Relaxed);
        batch.mark_done();
        any = true;
    }
    let serial = Serial {
        iface: c.iface,
        peer,
        dir,
    };
    if any && serial.queue().schedule() {
        c.sched.schedule_serial(serial);
    }
}

fn dir_name(dir: Direction, tx: &'static str, rx: &'static str) -> &'static str {
    match dir {
        Direction::Tx => tx,
        Direction::Rx => rx,
    }
}

/// Runs `f`, one item's, read's or message's worth of stages; a panic in it (a bug) is
/// caught, counted and logged, and costs only that work: the thread, which nothing
/// would restart, goes on. None if it panicked.
pub(crate) fn contained<R>(iface: &Interface, stage: &str, f: impl FnOnce() -> R) -> Option<R> {
    let r = catch_unwind(AssertUnwindSafe(f)).ok();
    if r.is_none() {
        iface.stats.stage_panics.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            interface = %iface.tun.name(),
            stage,
            "a pipeline stage panicked (a bug; please report it); what it handled is lost"
        );
    }
    r
}

/// Runs one serial item for at most `budget` packets (`usize::MAX`: everything
/// ready). When the result says [`Drained::more`], the stage is still scheduled and
/// the caller must run it again.
///
/// A panic (a bug) is caught here, counted and logged: the drain gave up its claim as
/// it unwound (`OrderedQueue::drain`), so the stage is claimed and handed on again for
/// what the queue still holds, and only the batch in hand is lost.
pub fn run_serial(sched: &dyn Scheduler, w: Serial<'_>, budget: usize) -> Drained {
    let c = StageCtx {
        iface: w.iface,
        sched,
    };
    let serial = || match w.dir {
        Direction::Tx => tx_flush::flush(c, w.peer, budget),
        Direction::Rx => rx_deliver::deliver(c, w.peer, budget),
    };
    let stage = dir_name(w.dir, "ordered flush", "ordered delivery");
    contained(w.iface, stage, || timed(w.iface, serial)).unwrap_or_else(|| {
        if w.queue().schedule() {
            sched.schedule_serial(w);
        }
        Drained::default()
    })
}
