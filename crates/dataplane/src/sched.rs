//! The scheduling seam, as the kernel's `queueing.h` is one: everything the pipeline's
//! stages ask of whoever runs them, and nothing else. Stages call only this trait; an
//! execution model (`exec::workqueue`, `exec::threaded`, `exec::softirq`) implements
//! it and decides which thread runs what, and at which priority.
//!
//! The hand-off every model must keep (design.md §4, "the wake-up must never be lost"):
//! a stage that completes a crypt batch calls its peer queue's `schedule()`; if that
//! returns true, exactly one [`SerialWork`] for the peer is handed to
//! [`Scheduler::schedule_serial`], and the model must run it (until its drain says it
//! is done, see `OrderedQueue::drain`) without waiting for another completion. Work
//! items carry their interface, so one set of threads can serve many.
//!
//! Stages hand work over borrowed ([`Crypt`], [`Serial`]): a model that runs an item
//! at once (the workqueue's idle shortcut) takes no reference to the interface or the
//! peer, and one that queues it takes its own ([`Crypt::into_owned`]). Why: with a
//! thousand peers each item is a packet, and each reference taken and dropped was a
//! write to the interface's reference count, a cache line every thread shares.

use crate::interface::Interface;
use crate::packet::Batch;
use crate::peer::Peer;
use crate::queue::OrderedQueue;
use std::sync::Arc;

/// Which of a peer's two pipelines a work item belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Encrypt, then the ordered flush to the peer's endpoint.
    Tx,
    /// Decrypt, then the ordered delivery to the TUN.
    Rx,
}

/// A batch to seal (TX) or open (RX): any thread may run it, in any order; the batch
/// already holds its place in its peer's ordered queue.
pub struct Crypt<'a> {
    pub iface: &'a Arc<Interface>,
    pub peer: &'a Arc<Peer>,
    pub batch: Arc<Batch>,
    pub dir: Direction,
}

impl Crypt<'_> {
    /// The item with references of its own, to queue.
    pub fn into_owned(self) -> CryptWork {
        CryptWork {
            iface: self.iface.clone(),
            peer: self.peer.clone(),
            batch: self.batch,
            dir: self.dir,
        }
    }
}

/// A queued [`Crypt`].
pub struct CryptWork {
    pub iface: Arc<Interface>,
    pub peer: Arc<Peer>,
    pub batch: Arc<Batch>,
    pub dir: Direction,
}

impl CryptWork {
    /// The queued item, to run.
    pub fn as_crypt(&self) -> Crypt<'_> {
        Crypt {
            iface: &self.iface,
            peer: &self.peer,
            batch: self.batch.clone(),
            dir: self.dir,
        }
    }
}

/// A peer's serial stage (ordered flush or delivery) to run: one at a time per peer and
/// direction, which the ordered queue's `scheduled` flag guarantees.
#[derive(Clone, Copy)]
pub struct Serial<'a> {
    pub iface: &'a Arc<Interface>,
    pub peer: &'a Arc<Peer>,
    pub dir: Direction,
}

impl Serial<'_> {
    /// The item with references of its own, to queue.
    pub fn into_owned(self) -> SerialWork {
        SerialWork {
            iface: self.iface.clone(),
            peer: self.peer.clone(),
            dir: self.dir,
        }
    }

    /// The peer's ordered queue this stage drains.
    pub fn queue(&self) -> &OrderedQueue<Batch> {
        match self.dir {
            Direction::Tx => &self.peer.tx_queue,
            Direction::Rx => &self.peer.rx_queue,
        }
    }
}

/// A queued [`Serial`].
pub struct SerialWork {
    pub iface: Arc<Interface>,
    pub peer: Arc<Peer>,
    pub dir: Direction,
}

impl SerialWork {
    /// The queued item, to run.
    pub fn as_serial(&self) -> Serial<'_> {
        Serial {
            iface: &self.iface,
            peer: &self.peer,
            dir: self.dir,
        }
    }
}

/// What stages ask of the execution model.
pub trait Scheduler: Send + Sync {
    /// A crypt batch is ready.
    fn submit_crypt(&self, work: Crypt<'_>);
    /// A peer's serial stage has work: the caller won its queue's `schedule()`.
    fn schedule_serial(&self, work: Serial<'_>);
    /// A handshake message was queued on `iface`'s handshake lanes.
    fn submit_handshake(&self, iface: &Arc<Interface>);
    /// A peer joined `iface` (models that keep per-peer state learn of it here).
    fn peer_added(&self, _iface: &Arc<Interface>, _peer: &Arc<Peer>) {}
    /// A peer left `iface`; its queues are already cleared.
    fn peer_removed(&self, _iface: &Arc<Interface>, _peer: &Arc<Peer>) {}
}

/// A scheduler that runs nothing, for tests that look at state, not at packets moving.
#[cfg(test)]
pub(crate) struct Idle;

#[cfg(test)]
impl Scheduler for Idle {
    fn submit_crypt(&self, _: Crypt<'_>) {}
    fn schedule_serial(&self, _: Serial<'_>) {}
    fn submit_handshake(&self, _: &Arc<Interface>) {}
}
