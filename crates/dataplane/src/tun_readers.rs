//! TX-1..3 for every interface of a runtime: the TUN readers, shared. Reader q waits on
//! queue q of every interface at once and reads whichever is ready, so a tunnel beyond
//! the first adds descriptors to wait on, not threads.
//!
//! Flow: `serve` adds each TUN queue of an interface to the reader of its index,
//! starting that reader on first use → the reader waits on all of its queues
//! (`shared_readers::Set`) and, for each ready one, reads one batch and runs it
//! through route, nonce and the hand-on to the scheduler, as a reader of one interface
//! did → `unserve` takes the interface's queues out and returns once no batch of it is
//! in progress → `stop` ends the readers.
//!
//! Why shared: with a reader per interface and queue, sixteen tunnels on two workers
//! had 32 TUN readers, each woken for a thirty-second of the packets; the wake-ups
//! and switches took transmit from 5.8 to 9.9 CPU-s/GB at the same packets per serial
//! invocation (BENCHMARKS.md, "Many tunnels at the gateway").
//!
//! Order: one thread per queue index, so one queue is read by one thread, and its
//! packets keep their order into the nonce stage.
//!
//! Backpressure across tunnels: a reader that waits for room in a full peer queue (up
//! to `nonce::BACKPRESSURE_WAIT`) holds its other interfaces' queues meanwhile, as a
//! reader of one interface always held its other peers. The wait ends when that
//! peer's queue has drained by the batch, and the workers drain interfaces in deficit
//! round robin, so an overloaded tunnel slows the others' reads by its share of the
//! workers' time, not by its backlog. The data-socket readers (`udp_readers`) wait
//! the same way for a peer's receive queue.

use crate::interface::Interface;
use crate::loops::{begin_read, shortcuts_per_read, READER};
use crate::sched::Scheduler;
use crate::shared_readers::{Member, Pool, Set};
use crate::stages::{self, StageCtx};
use crate::threads::Registry;
use std::os::fd::RawFd;
use std::sync::Arc;
use wirelane_io::region::Region;

/// Queue `queue` of an interface's TUN.
#[derive(Clone)]
struct TunQueue {
    iface: Arc<Interface>,
    queue: usize,
}

impl Member for TunQueue {
    fn iface(&self) -> &Arc<Interface> {
        &self.iface
    }
    fn fd(&self) -> RawFd {
        self.iface.tun.queue_fd(self.queue)
    }
}

/// The runtime's TUN readers, one per queue index in use.
pub struct TunReaders {
    sched: Arc<dyn Scheduler>,
    pool: Pool<TunQueue>,
}

impl TunReaders {
    pub fn new(sched: Arc<dyn Scheduler>, registry: Arc<Registry>) -> TunReaders {
        TunReaders {
            sched,
            pool: Pool::new(registry),
        }
    }

    /// Adds every TUN queue of `iface` to the reader of its index. On an error the
    /// queues already added are taken out again.
    pub fn serve(&self, iface: &Arc<Interface>) -> std::io::Result<()> {
        for queue in 0..iface.tun.queues() {
            let sched = self.sched.clone();
            let name = |q: usize| match q {
                0 => "wl-tun".to_string(),
                q => format!("wl-tun{q}"),
            };
            let added = self
                .pool
                .set(queue, name, move |set, _| read_loop(set, &*sched))
                .and_then(|set| {
                    set.add(TunQueue {
                        iface: iface.clone(),
                        queue,
                    })
                });
            if let Err(e) = added {
                self.unserve(iface);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Takes `iface`'s queues out; returns once no batch of it runs.
    pub fn unserve(&self, iface: &Interface) {
        self.pool.unserve(iface);
    }

    pub fn stop(&self) {
        self.pool.stop();
    }
}

/// One reader: reads one batch from each ready queue, for as long as the set runs.
fn read_loop(set: &Set<TunQueue>, sched: &dyn Scheduler) {
    READER.set(true);
    let mut scratch = Region::new(stages::tun_read::SCRATCH_LEN);
    let mut packets = Vec::with_capacity(stages::tun_read::READ_CAPACITY);
    set.run(|token, TunQueue { iface, queue }| {
        let c = StageCtx {
            iface: &iface,
            sched,
        };
        match stages::tun_read::read_batch(&iface, queue, scratch.as_mut_slice(), &mut packets) {
            Ok(()) => {
                begin_read(shortcuts_per_read(iface.tun.queues()));
                // Plugged: the flushes this read runs here send together at its end.
                let routed = || {
                    stages::tx_flush::plugged(c, || {
                        stages::nonce::enqueue_routed(c, stages::route::route(c, &mut packets))
                    })
                };
                if stages::contained(&iface, "tun read", routed).is_none() {
                    packets.clear();
                }
            }
            // The interface was deleted (e.g. `ip link del`, `wg-quick down`): it fails,
            // and its queue leaves the set, which would report it for ever.
            Err(e) => {
                set.remove(token);
                iface.fail(format!("TUN device is gone: {e}"));
            }
        }
    });
}
