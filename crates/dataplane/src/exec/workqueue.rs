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
//! empty runs a small item itself rather than waking a worker for it, at most one
//! crypt item per read (see [`Workqueue::run_here`]).

use super::fairq::FairQueue;
use super::{ExecModel, Joined, Model, Shared};
use crate::interface::Interface;
use crate::loops::{is_reader_thread, take_shortcut};
use crate::sched::{CryptWork, Direction, Scheduler, SerialWork};
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
        for i in 0..workers {
            let me = wq.clone();
            let h = wq
                .shared
                .threads
                .spawn(format!("wl-worker-{i}"), move || me.worker())?;
            wq.threads.push(h);
        }
        Ok(wq)
    }

    fn run(&self, item: Item) {
        match item {
            Item::Crypt(w) => stages::run_crypt(self, w),
            Item::Serial(w) => {
                stages::run_serial(self, &w, usize::MAX);
            }
        }
    }

    /// The idle shortcut: on a reader thread, with the shared FIFO empty, a small item
    /// runs at once on this thread rather than waking a worker for it. Returns the item
    /// when it must be queued instead.
    ///
    /// Order is unchanged: with the FIFO empty the item would have been the only one
    /// queued, so no earlier stage is overtaken; a batch a worker is still sealing or
    /// opening keeps its place in the peer's ordered queue, which the serial stage
    /// drains in order whichever thread runs it. What it saves is the wake-up of a
    /// sleeping worker (tens of microseconds on a VM) in each direction of a request
    /// and its response. Larger batches are queued still: a reader busy with crypto
    /// stops reading, and the workers exist to run those in parallel.
    fn run_here(&self, item: Item) -> Option<Item> {
        // A serial stage drains everything finished in its peer's queue, which under
        // bulk traffic can be many batches sealed by the workers: those stay with them.
        let small = match &item {
            Item::Crypt(w) => w.batch.len() <= SHORTCUT_MAX_PACKETS,
            Item::Serial(w) => {
                let q = match w.dir {
                    Direction::Tx => &w.peer.tx_queue,
                    Direction::Rx => &w.peer.rx_queue,
                };
                q.queued_packets() <= SHORTCUT_MAX_PACKETS
            }
        };
        // A crypt item also needs the read's one shortcut (`loops::take_shortcut`):
        // the first item of a read runs here, the rest of a read go to the workers.
        // A serial stage needs none: it follows an item this reader ran, or finds
        // four packets at most.
        let allowed = |item: &Item| matches!(item, Item::Serial(_)) || take_shortcut();
        if small && is_reader_thread() && self.queue.is_empty() && allowed(&item) {
            self.run(item);
            None
        } else {
            Some(item)
        }
    }

    /// A worker: runs items until the model stops.
    fn worker(&self) {
        while let Some(item) = self.queue.pop() {
            self.run(item);
        }
    }

    fn submit(&self, item: Item) {
        if let Some(item) = self.run_here(item) {
            // Cost in packets: a crypt batch's, or what a serial stage will find.
            let (lane, cost) = match &item {
                Item::Crypt(w) => (w.iface.id, w.batch.len()),
                Item::Serial(w) => {
                    let q = match w.dir {
                        Direction::Tx => &w.peer.tx_queue,
                        Direction::Rx => &w.peer.rx_queue,
                    };
                    (w.iface.id, q.queued_packets())
                }
            };
            self.queue.push(lane, item, cost);
        }
    }
}

impl Scheduler for Workqueue {
    fn submit_crypt(&self, work: CryptWork) {
        self.submit(Item::Crypt(work));
    }

    fn schedule_serial(&self, work: SerialWork) {
        self.submit(Item::Serial(work));
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
