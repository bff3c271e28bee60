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
use crate::queue::Drained;
use crate::sched::{CryptWork, Direction, Scheduler, SerialWork};
use std::sync::Arc;
use std::time::Instant;

/// What every stage is given.
#[derive(Clone, Copy)]
pub struct StageCtx<'a> {
    pub iface: &'a Arc<Interface>,
    pub sched: &'a dyn Scheduler,
}

/// Runs one crypt item (seal or open); a model's workers call this. The time it takes
/// counts as its interface's busy time.
pub fn run_crypt(sched: &dyn Scheduler, w: CryptWork) {
    let started = Instant::now();
    let CryptWork {
        iface,
        peer,
        batch,
        dir,
    } = w;
    let c = StageCtx {
        iface: &iface,
        sched,
    };
    match dir {
        Direction::Tx => encrypt::encrypt(c, &peer, batch),
        Direction::Rx => decrypt::decrypt(c, &peer, batch),
    }
    iface.stats.add_busy(started.elapsed());
}

/// Runs one serial item for at most `budget` packets (`usize::MAX`: everything
/// ready). When the result says [`Drained::more`], the stage is still scheduled and
/// the caller must run it again.
pub fn run_serial(sched: &dyn Scheduler, w: &SerialWork, budget: usize) -> Drained {
    let started = Instant::now();
    let c = StageCtx {
        iface: &w.iface,
        sched,
    };
    let d = match w.dir {
        Direction::Tx => tx_flush::flush(c, &w.peer, budget),
        Direction::Rx => rx_deliver::deliver(c, &w.peer, budget),
    };
    w.iface.stats.add_busy(started.elapsed());
    d
}
