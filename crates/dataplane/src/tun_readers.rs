//! TX-1..3 for every interface of a runtime: the TUN readers, shared. Reader q waits on
//! queue q of every interface at once and reads whichever is ready, so a tunnel beyond
//! the first adds descriptors to wait on, not threads.
//!
//! Flow: `serve` adds each TUN queue of an interface to the reader of its index,
//! starting that reader on first use → the reader waits on all of its queues (a
//! level-triggered `ReadySet`) and, for each ready one, reads one batch and runs it
//! through route, nonce and the hand-on to the scheduler, as a reader of one interface
//! did → `unserve` takes the interface's queues out and returns once no batch of it is
//! in progress → `stop` ends the readers.
//!
//! Why shared: with a reader per interface and queue, sixteen tunnels on two workers
//! had 32 TUN readers, each woken for a thirty-second of the packets; the wake-ups
//! and switches took transmit from 5.8 to 9.9 CPU-s/GB at the same packets per serial
//! invocation (BENCHMARKS.md, "Many tunnels at the gateway").
//!
//! Invariants and races:
//! - One thread per queue index, so one queue is read by one thread: its packets keep
//!   their order into the nonce stage.
//! - Tokens are never reused. A readiness reported for a queue just removed names no
//!   member and is skipped; it cannot be taken for a newer queue.
//! - `busy` is held from a member's lookup to the end of its batch. `unserve` removes
//!   the members first and then takes `busy` once, so when it returns no batch of the
//!   interface is running or can start (the models may then let its peers go).
//! - Fairness: each ready queue gets one batch per wait, and a queue still holding
//!   packets is reported again at the next wait, after the others ready with it.

use crate::interface::Interface;
use crate::loops::{begin_read, shortcuts_per_read, READER};
use crate::sched::Scheduler;
use crate::stages::{self, StageCtx};
use crate::threads::Registry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use wirelane_io::poll::{ReadySet, Waker};
use wirelane_io::region::Region;

/// The token of a reader's stop waker; members' tokens start above it.
const STOP: u64 = 0;

/// What one reader waits on.
struct Set {
    ready: ReadySet,
    /// Token → the interface and the queue index it names.
    members: Mutex<HashMap<u64, (Arc<Interface>, usize)>>,
    /// Held while a batch runs (see the module comment).
    busy: Mutex<()>,
    stop: Waker,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The runtime's TUN readers, one per queue index in use.
pub struct TunReaders {
    sched: Arc<dyn Scheduler>,
    registry: Arc<Registry>,
    readers: Mutex<Vec<(Arc<Set>, JoinHandle<()>)>>,
    next_token: AtomicU64,
}

impl TunReaders {
    pub fn new(sched: Arc<dyn Scheduler>, registry: Arc<Registry>) -> TunReaders {
        TunReaders {
            sched,
            registry,
            readers: Mutex::default(),
            next_token: AtomicU64::new(STOP + 1),
        }
    }

    /// Adds every TUN queue of `iface` to the reader of its index. On an error the
    /// queues already added are taken out again.
    pub fn serve(&self, iface: &Arc<Interface>) -> std::io::Result<()> {
        let mut readers = lock(&self.readers);
        for q in 0..iface.tun.queues() {
            let added = self.reader(&mut readers, q).and_then(|set| {
                let token = self.next_token.fetch_add(1, Ordering::Relaxed);
                lock(&set.members).insert(token, (iface.clone(), q));
                set.ready
                    .add(iface.tun.queue_fd(q), token)
                    .inspect_err(|_| {
                        lock(&set.members).remove(&token);
                    })
            });
            if let Err(e) = added {
                drop(readers);
                self.unserve(iface);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Reader `q`, started if it is not yet.
    fn reader(
        &self,
        readers: &mut Vec<(Arc<Set>, JoinHandle<()>)>,
        q: usize,
    ) -> std::io::Result<Arc<Set>> {
        while readers.len() <= q {
            let set = Arc::new(Set {
                ready: ReadySet::new()?,
                members: Mutex::default(),
                busy: Mutex::new(()),
                stop: Waker::new()?,
            });
            set.ready.add(set.stop.fd(), STOP)?;
            let (s, sched) = (set.clone(), self.sched.clone());
            let name = match readers.len() {
                0 => "wl-tun".to_string(),
                n => format!("wl-tun{n}"),
            };
            let h = self.registry.spawn(name, move || read_loop(&s, &*sched))?;
            readers.push((set, h));
        }
        Ok(readers[q].0.clone())
    }

    /// Takes `iface`'s queues out of every reader; returns once no batch of it runs.
    pub fn unserve(&self, iface: &Interface) {
        let sets: Vec<Arc<Set>> = lock(&self.readers).iter().map(|r| r.0.clone()).collect();
        for set in sets {
            lock(&set.members).retain(|_, (i, q)| {
                let ours = i.id == iface.id;
                if ours {
                    // It may be gone already (a read error took it out).
                    let _ = set.ready.remove(i.tun.queue_fd(*q));
                }
                !ours
            });
            drop(lock(&set.busy));
        }
    }

    /// Ends every reader and waits for it.
    pub fn stop(&self) {
        let readers = std::mem::take(&mut *lock(&self.readers));
        for (set, _) in &readers {
            set.stop.wake();
        }
        for (_, h) in readers {
            let _ = h.join();
        }
    }
}

/// One reader: waits on its queues and reads one batch from each ready one.
fn read_loop(set: &Set, sched: &dyn Scheduler) {
    READER.set(true);
    let mut scratch = Region::new(stages::tun_read::SCRATCH_LEN);
    let mut packets = Vec::with_capacity(stages::tun_read::READ_CAPACITY);
    let mut tokens = Vec::new();
    loop {
        if let Err(e) = set.ready.wait(&mut tokens, -1) {
            tracing::error!(error = %e, "waiting on the TUN queues failed; this reader stops");
            return;
        }
        for &token in &tokens {
            if token == STOP {
                return;
            }
            let _busy = lock(&set.busy);
            let Some((iface, q)) = lock(&set.members).get(&token).cloned() else {
                continue; // taken out since the wait returned
            };
            if iface.stopping() {
                continue;
            }
            let c = StageCtx {
                iface: &iface,
                sched,
            };
            match stages::tun_read::read_batch(&iface, q, scratch.as_mut_slice(), &mut packets) {
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
                // The interface was deleted (e.g. `ip link del`, `wg-quick down`): it
                // fails, and its queue leaves the set, which would report it for ever.
                Err(e) => {
                    lock(&set.members).remove(&token);
                    let _ = set.ready.remove(iface.tun.queue_fd(q));
                    iface.fail(format!("TUN device is gone: {e}"));
                }
            }
        }
    }
}
