//! The `softirq` execution model: the kernel's own arrangement (seed 000 §2.2, §3),
//! kept for study, because it reproduces execution-order inversion.
//!
//! - Crypt workers, one per core and pinned to it, each with a FIFO of its own; crypt
//!   items go to them round robin, as `wg_queue_enqueue_per_device_and_peer` picks the
//!   next online CPU for each.
//! - A poller per core, pinned, at a higher priority than the workers: SCHED_FIFO
//!   where permitted (CAP_SYS_NICE), otherwise nice -20, otherwise (logged) the same
//!   priority. A worker that completes an RX batch raises the peer's delivery on the
//!   poller of the core it runs on (`napi_schedule` on the current CPU); the poller,
//!   woken, preempts whatever crypt work runs there, drains with a budget of 64
//!   packets per poll, and polls the peer again (at the end of its list) while more is
//!   ready: the peer stays on that core while it has work. Between polls the poller
//!   also takes newly raised peers.
//! - After [`SOFTIRQ_PACKETS`] packets in one run of its list the poller drops to the
//!   workers' priority until its list is empty, as `__do_softirq` hands what is left to
//!   the normal-priority `ksoftirqd` after its restart budget.
//! - The TX flush is not NAPI: it runs as an item on the worker queue of a core fixed
//!   per peer, at the workers' priority, as the kernel runs a peer's transmit work on
//!   its `serial_work_cpu`. Transmit is never inverted, in the kernel or here.

use super::{next_or_stop, ExecModel, Joined, Model, Shared, StopSignal};
use crate::interface::Interface;
use crate::sched::{Crypt, CryptWork, Direction, Scheduler, Serial, SerialWork};
use crate::stages;
use crate::threads;
use crossbeam_channel::{Receiver, Sender};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Packets one poll may handle (NAPI's weight).
pub const NAPI_BUDGET: usize = 64;
/// Packets a poller handles at high priority before yielding to `ksoftirqd` mode
/// (`netdev_budget`).
pub const SOFTIRQ_PACKETS: usize = 300;
/// The pollers' SCHED_FIFO priority: above every normal thread, below the kernel's
/// own real-time threads.
const POLLER_FIFO_PRIORITY: libc::c_int = 1;

enum Item {
    Crypt(CryptWork),
    Flush(SerialWork),
}

/// One core's worker queue and poller inbox.
struct Core {
    cpu: usize,
    work_tx: Sender<Item>,
    work_rx: Receiver<Item>,
    poll_tx: Sender<SerialWork>,
    poll_rx: Receiver<SerialWork>,
}

pub struct Softirq {
    cores: Vec<Core>,
    next: AtomicUsize,
    stop: StopSignal,
    threads: Joined,
    shared: Shared,
}

/// How the pollers got their priority.
#[derive(Clone, Copy, PartialEq)]
enum Priority {
    Fifo,
    Nice,
    Same,
}

impl Softirq {
    pub fn start(workers: usize, shared: Shared) -> std::io::Result<Arc<dyn ExecModel>> {
        // The CPUs this process may use (under a cpuset they need not start at 0),
        // one per core in turn.
        let cpus = threads::allowed_cpus();
        let cores = (0..workers)
            .map(|i| {
                let (work_tx, work_rx) = crossbeam_channel::unbounded();
                let (poll_tx, poll_rx) = crossbeam_channel::unbounded();
                Core {
                    cpu: cpus[i % cpus.len()],
                    work_tx,
                    work_rx,
                    poll_tx,
                    poll_rx,
                }
            })
            .collect();
        let s = Arc::new(Softirq {
            cores,
            next: AtomicUsize::new(0),
            stop: StopSignal::default(),
            threads: Joined::default(),
            shared,
        });
        super::started(s, |s| {
            for i in 0..workers {
                let me = s.clone();
                let h = s
                    .shared
                    .threads
                    .spawn(format!("wl-crypt-{i}"), move || me.worker(i))?;
                s.threads.push(h);
                let me = s.clone();
                let h = s
                    .shared
                    .threads
                    .spawn(format!("wl-poll-{i}"), move || me.poller(i))?;
                s.threads.push(h);
            }
            Ok(())
        })
    }

    fn worker(&self, i: usize) {
        let core = &self.cores[i];
        if !threads::pin_to(core.cpu) {
            tracing::warn!(cpu = core.cpu, "softirq model: cannot pin a worker");
        }
        while let Some(item) = next_or_stop(&core.work_rx, &self.stop) {
            match item {
                Item::Crypt(w) => stages::run_crypt(self, w.as_crypt()),
                Item::Flush(w) => {
                    stages::run_serial(self, w.as_serial(), usize::MAX);
                }
            }
        }
    }

    fn poller(&self, i: usize) {
        let core = &self.cores[i];
        if !threads::pin_to(core.cpu) {
            tracing::warn!(cpu = core.cpu, "softirq model: cannot pin a poller");
        }
        let priority = raise_priority();
        if i == 0 && priority == Priority::Same {
            tracing::warn!(
                "softirq model: the pollers could not be given a higher priority \
                 (needs CAP_SYS_NICE); they run at the workers' priority"
            );
        }
        let mut list: VecDeque<SerialWork> = VecDeque::new();
        loop {
            if list.is_empty() {
                match next_or_stop(&core.poll_rx, &self.stop) {
                    Some(w) => list.push_back(w),
                    None => return,
                }
            }
            // One softirq run: poll the list until it is empty or the run's budget is
            // spent, taking newly raised peers between polls.
            let mut handled = 0;
            while let Some(w) = list.pop_front() {
                let d = stages::run_serial(self, w.as_serial(), NAPI_BUDGET);
                handled += d.packets;
                if d.more {
                    list.push_back(w);
                }
                list.extend(core.poll_rx.try_iter());
                if handled >= SOFTIRQ_PACKETS && !list.is_empty() {
                    self.ksoftirqd_run(core, &mut list, priority);
                    break;
                }
            }
        }
    }

    /// What is left after a run's budget, at the workers' priority (the kernel's
    /// `ksoftirqd`), then back to the poller's priority.
    fn ksoftirqd_run(&self, core: &Core, list: &mut VecDeque<SerialWork>, priority: Priority) {
        lower_priority(priority);
        while let Some(w) = list.pop_front() {
            if stages::run_serial(self, w.as_serial(), NAPI_BUDGET).more {
                list.push_back(w);
            }
            list.extend(core.poll_rx.try_iter());
        }
        restore_priority(priority);
    }

    /// The core the calling thread runs on, as an index into `cores`.
    fn this_core(&self) -> usize {
        let cpu = threads::current_cpu();
        self.cores.iter().position(|c| c.cpu == cpu).unwrap_or(0)
    }
}

fn raise_priority() -> Priority {
    if threads::set_fifo(POLLER_FIFO_PRIORITY) {
        Priority::Fifo
    } else if threads::set_nice(-20) {
        Priority::Nice
    } else {
        Priority::Same
    }
}

fn lower_priority(p: Priority) {
    match p {
        Priority::Fifo => {
            threads::set_fifo(0);
        }
        Priority::Nice => {
            threads::set_nice(0);
        }
        Priority::Same => {}
    }
}

fn restore_priority(p: Priority) {
    match p {
        Priority::Fifo => {
            threads::set_fifo(POLLER_FIFO_PRIORITY);
        }
        Priority::Nice => {
            threads::set_nice(-20);
        }
        Priority::Same => {}
    }
}

impl Scheduler for Softirq {
    fn submit_crypt(&self, work: Crypt<'_>) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.cores.len();
        let _ = self.cores[i].work_tx.send(Item::Crypt(work.into_owned()));
    }

    fn schedule_serial(&self, work: Serial<'_>) {
        match work.dir {
            // napi_schedule(): on the poller of the core this completion runs on.
            Direction::Rx => {
                let _ = self.cores[self.this_core()].poll_tx.send(work.into_owned());
            }
            // The peer's transmit work, on its fixed core's worker queue.
            Direction::Tx => {
                let i = work.peer.id as usize % self.cores.len();
                let _ = self.cores[i].work_tx.send(Item::Flush(work.into_owned()));
            }
        }
    }

    fn submit_handshake(&self, iface: &Arc<Interface>) {
        self.shared.handshakes.notify(iface);
    }
}

impl ExecModel for Softirq {
    fn model(&self) -> Model {
        Model::Softirq
    }

    fn stop(&self) {
        self.stop.stop();
        self.threads.join_all();
    }
}
