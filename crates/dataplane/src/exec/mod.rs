//! Execution models: who runs the stages, on which threads, at which priority. Each
//! model is one module behind the one scheduling trait (`sched::Scheduler`), and the
//! only place that spawns its threads. They are the seeds' kernel asynchronous APIs
//! transposed to user space (design.md §4):
//!
//! | model | analogue | rule |
//! |---|---|---|
//! | `workqueue` | the kernel workqueue fix | one pool, one shared FIFO, crypt and serial items at equal priority |
//! | `threaded` | threaded NAPI | crypt workers; each peer's serial stages on a thread of its own |
//! | `softirq` | softirq NAPI (the kernel's default) | per-core crypt workers; a per-core poller at higher priority runs the RX serial stage where the decrypting worker ran |

mod fairq;
pub mod softirq;
pub mod threaded;
pub mod workqueue;

use crate::loops::HandshakeHub;
use crate::sched::Scheduler;
use crate::threads::Registry;
use crossbeam_channel::{Receiver, Sender};
use std::sync::{Arc, Mutex};

/// Execution models selectable at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Model {
    Workqueue,
    Threaded,
    Softirq,
}

impl Model {
    pub const ALL: [Model; 3] = [Model::Workqueue, Model::Threaded, Model::Softirq];

    pub fn name(self) -> &'static str {
        match self {
            Model::Workqueue => "workqueue",
            Model::Threaded => "threaded",
            Model::Softirq => "softirq",
        }
    }
}

impl std::fmt::Display for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Model {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Model::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("unknown execution model '{s}' (available: workqueue, threaded, softirq)")
            })
    }
}

/// Most crypt workers a runtime takes: far above any core count this runs on, low
/// enough that a typo cannot ask for a million threads.
pub const MAX_WORKERS: usize = 1024;

/// A running execution model: the scheduler stages call, plus what the runtime needs.
pub trait ExecModel: Scheduler {
    fn model(&self) -> Model;
    /// Stops every thread the model started and waits for them. Work still queued is
    /// dropped (the runtime stops its readers first).
    fn stop(&self);
    /// Items queued for interface `iface` (where the model keeps them apart).
    fn queued_for(&self, _iface: u32) -> usize {
        0
    }
}

/// What every model shares with the runtime.
#[derive(Clone)]
pub struct Shared {
    pub threads: Arc<Registry>,
    pub handshakes: Arc<HandshakeHub>,
}

/// Starts `model` with `workers` crypt workers (1..=[`MAX_WORKERS`]).
pub fn start(model: Model, workers: usize, shared: Shared) -> std::io::Result<Arc<dyn ExecModel>> {
    if !(1..=MAX_WORKERS).contains(&workers) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("the worker count must be 1 to {MAX_WORKERS}, not {workers}"),
        ));
    }
    Ok(match model {
        Model::Workqueue => workqueue::Workqueue::start(workers, shared)?,
        Model::Threaded => threaded::Threaded::start(workers, shared)?,
        Model::Softirq => softirq::Softirq::start(workers, shared)?,
    })
}

/// `model`, just built, once `spawn_all` has started its threads. If one fails to
/// start (a thread limit, memory), those started are stopped before the error is
/// returned: each holds the model, waiting on it for work, and nothing else would ever
/// stop them.
fn started<M: ExecModel + 'static>(
    model: Arc<M>,
    spawn_all: impl FnOnce(&Arc<M>) -> std::io::Result<()>,
) -> std::io::Result<Arc<dyn ExecModel>> {
    match spawn_all(&model) {
        Ok(()) => Ok(model),
        Err(e) => {
            model.stop();
            Err(e)
        }
    }
}

/// A stop signal for a model's threads: they select on the receiver, whose sender is
/// dropped on stop, so every waiter wakes at once (no polling timeout).
pub(crate) struct StopSignal {
    tx: Mutex<Option<Sender<()>>>,
    pub rx: Receiver<()>,
}

impl Default for StopSignal {
    fn default() -> Self {
        let (tx, rx) = crossbeam_channel::bounded(0);
        StopSignal {
            tx: Mutex::new(Some(tx)),
            rx,
        }
    }
}

impl StopSignal {
    pub fn stop(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// The next item of `rx`, waiting for one unless `stop` fires first (None then, or when
/// `rx` is disconnected). A queued item is taken without touching `stop`.
pub(crate) fn next_or_stop<T>(rx: &Receiver<T>, stop: &StopSignal) -> Option<T> {
    if let Ok(item) = rx.try_recv() {
        return Some(item);
    }
    crossbeam_channel::select! {
        recv(rx) -> item => item.ok(),
        recv(stop.rx) -> _ => None,
    }
}

/// Threads a model spawned, to join on stop.
#[derive(Default)]
pub(crate) struct Joined(Mutex<Vec<std::thread::JoinHandle<()>>>);

impl Joined {
    pub fn push(&self, h: std::thread::JoinHandle<()>) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Threads that retired on their own (the threaded model's idle ones).
        v.retain(|h| !h.is_finished());
        v.push(h);
    }

    /// Joins every thread, including any spawned while joining.
    pub fn join_all(&self) {
        loop {
            let batch = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
            if batch.is_empty() {
                return;
            }
            for h in batch {
                let _ = h.join();
            }
        }
    }
}
