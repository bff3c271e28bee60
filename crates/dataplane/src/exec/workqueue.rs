//! The `workqueue` execution model (default): a fixed pool, one worker per core, takes
//! every work item (encrypt, decrypt, per-peer flush, per-peer delivery, of every
//! interface) from one shared FIFO, all at the same priority. A peer's serial stage is
//! just another item, run by whichever worker is free; it never preempts the crypt work
//! before it, so the execution-order inversion of seed 000 cannot happen by
//! construction. This is the kernel workqueue fix of seed 000 §4.2, and the
//! multi-tunnel answer of seeds 003/004: no tunnel's serial work is tied to a core.
//!
//! With several interfaces the FIFO is one per interface, served deficit round robin
//! (`fairq`): under overload each tunnel gets an equal share of the pool, in packets.
//!
//! The idle shortcut: a reader (see `loops::is_reader_thread`) that finds the queue
//! empty runs a small item itself rather than waking a worker for it, as many crypt
//! items per read as `loops::shortcuts_per_read` allows (see [`Workqueue::runs_here`]).

use super::fairq::FairQueue;
use super::{ExecModel, Joined, Model, Shared};
use crate::interface::Interface;
use crate::loops::{is_reader_thread, take_shortcut};
use crate::sched::{Crypt, CryptWork, Scheduler, Serial, SerialWork};
use crate::stages;
use std::sync::Arc;

/// Largest crypt batch, or serial-stage backlog, a reader runs itself.
const SHORTCUT_MAX_PACKETS: usize = 4;

enum Item {
    Crypt(CryptWork),
    Serial(SerialWork),
}

pub struct Workqueue {
    queue: FairQueue<Item>,
    threads: Joined,
    shared: Shared,
}

impl Workqueue {
    pub fn start(workers: usize, shared: Shared) -> std::io::Result<Arc<dyn ExecModel>> {
        let wq = Arc::new(Workqueue {
            queue: FairQueue::default(),
            threads: Joined::default(),
            shared,
        });
        super::started(wq, |wq| {
            for i in 0..workers {
                let me = wq.clone();
                let h = wq
                    .shared
                    .threads
                    .spawn(format!("wl-worker-{i}"), move || me.worker())?;
                wq.threads.push(h);
            }
            Ok(())
        })
    }

    fn run(&self, item: Item) {
        match item {
            Item::Crypt(w) => stages::run_crypt(self, w.as_crypt()),
            Item::Serial(w) => {
                stages::run_serial(self, w.as_serial(), usize::MAX);
            }
        }
    }

    /// The idle shortcut: whether a small item, submitted on a reader thread with the
    /// shared FIFO empty, runs at once on this thread rather than waking a worker for
    /// it. `crypt` items also need the read's shortcut (`loops::take_shortcut`): the
    /// first items of a read run here, the rest go to the workers. A serial stage needs
    /// none: it follows an item this reader ran, or finds four packets at most.
    ///
    /// Order is unchanged: with the FIFO empty the item would have been the only one
    /// queued, so no earlier stage is overtaken; a batch a worker is still sealing or
    /// opening keeps its place in the peer's ordered queue, which the serial stage
    /// drains in order whichever thread runs it. What it saves is the wake-up of a
    /// sleeping worker (tens of microseconds on a VM) in each direction of a request
    /// and its response. Larger batches are queued still: a reader busy with crypto
    /// stops reading, and the workers exist to run those in parallel. A serial stage
    /// drains everything finished in its peer's queue, which under bulk traffic can be
    /// many batches sealed by the workers: those stay with them too.
    fn runs_here(&self, packets: usize, crypt: bool) -> bool {
        packets <= SHORTCUT_MAX_PACKETS
            && is_reader_thread()
            && self.queue.is_empty()
            && (!crypt || take_shortcut())
    }

    /// A worker: runs items until the model stops.
    fn worker(&self) {
        while let Some(item) = self.queue.pop() {
            self.run(item);
        }
    }
}

impl Scheduler for Workqueue {
    fn submit_crypt(&self, work: Crypt<'_>) {
        let packets = work.batch.len();
        if self.runs_here(packets, true) {
            return stages::run_crypt(self, work);
        }
        let lane = work.iface.id;
        self.queue
            .push(lane, Item::Crypt(work.into_owned()), packets);
    }

    fn schedule_serial(&self, work: Serial<'_>) {
        // Cost in packets: what the stage will find.
        let packets = work.queue().queued_packets();
        if self.runs_here(packets, false) {
            stages::run_serial(self, work, usize::MAX);
            return;
        }
        self.queue
            .push(work.iface.id, Item::Serial(work.into_owned()), packets);
    }

    fn submit_handshake(&self, iface: &Arc<Interface>) {
        self.shared.handshakes.notify(iface);
    }
}

impl ExecModel for Workqueue {
    fn model(&self) -> Model {
        Model::Workqueue
    }

    fn stop(&self) {
        self.queue.stop();
        self.threads.join_all();
    }

    fn queued_for(&self, iface: u32) -> usize {
        self.queue.len_of(iface)
    }
}
