//! The `threaded` execution model: threaded NAPI (seeds 000 §4.1 and 004). Crypt
//! workers, one per core, share a FIFO of crypt items; each peer's serial stages (its
//! ordered flush and its ordered delivery) run on a thread of the peer's own, left to
//! the OS scheduler like any thread: same priority as the workers, no pinning.
//!
//! Threads come and go with traffic, not with configuration: a peer's thread is
//! created the first time its serial stage is scheduled (it has a session and
//! traffic), and retires after [`IDLE_RETIRE`] without work, so 10,000 configured
//! peers do not mean 10,000 threads at start.
//!
//! The bound: at most [`MAX_SERIAL_THREADS`] serial threads. A peer that needs one
//! while that many exist shares the thread of an existing peer, chosen by its id, so
//! past the bound threads serve several peers each (as threaded NAPI would if the
//! kernel capped its kthreads). Nothing is dropped at the bound.
//!
//! Race (retirement against a new item): a thread retires only under the map lock and
//! only if its channel is empty, and items are sent under the same lock, so an item is
//! never sent to a thread that has decided to exit.

use super::{next_or_stop, ExecModel, Joined, Model, Shared, StopSignal};
use crate::interface::Interface;
use crate::peer::Peer;
use crate::sched::{Crypt, CryptWork, Scheduler, Serial, SerialWork};
use crate::stages;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Serial threads at most (see the module comment).
pub const MAX_SERIAL_THREADS: usize = 1024;
/// How long a peer's thread waits for work before it retires.
pub const IDLE_RETIRE: Duration = Duration::from_secs(5);

/// A serial thread's inbox.
struct SerialThread {
    tx: Sender<SerialWork>,
}

/// Which peer a serial thread serves: its interface and id.
type PeerKey = (u32, u32);

/// The serial threads, and which peers each serves. A thread's inbox closes (and the
/// thread exits) when neither list holds it any more.
#[derive(Default)]
struct SerialMap {
    by_peer: HashMap<PeerKey, Arc<SerialThread>>,
    all: Vec<Arc<SerialThread>>,
}

impl SerialMap {
    /// Forgets `thread` entirely.
    fn drop_thread(&mut self, thread: *const SerialThread) {
        self.by_peer
            .retain(|_, t| !std::ptr::eq(Arc::as_ptr(t), thread));
        self.all.retain(|t| !std::ptr::eq(Arc::as_ptr(t), thread));
    }
}

pub struct Threaded {
    crypt_tx: Sender<CryptWork>,
    crypt_rx: Receiver<CryptWork>,
    serial: Mutex<SerialMap>,
    stop: StopSignal,
    threads: Joined,
    shared: Shared,
    me: Weak<Threaded>,
}

impl Threaded {
    pub fn start(workers: usize, shared: Shared) -> std::io::Result<Arc<dyn ExecModel>> {
        let (crypt_tx, crypt_rx) = crossbeam_channel::unbounded();
        let t = Arc::new_cyclic(|me| Threaded {
            crypt_tx,
            crypt_rx,
            serial: Mutex::default(),
            stop: StopSignal::default(),
            threads: Joined::default(),
            shared,
            me: me.clone(),
        });
        super::started(t, |t| {
            for i in 0..workers {
                let me = t.clone();
                let h = t.shared.threads.spawn(format!("wl-crypt-{i}"), move || {
                    while let Some(w) = next_or_stop(&me.crypt_rx, &me.stop) {
                        stages::run_crypt(&*me, w.as_crypt());
                    }
                })?;
                t.threads.push(h);
            }
            Ok(())
        })
    }

    /// The thread that runs `key`'s serial stages, started if need be. Called with the
    /// map locked.
    fn thread_for(&self, map: &mut SerialMap, key: PeerKey) -> Option<Arc<SerialThread>> {
        if let Some(t) = map.by_peer.get(&key) {
            return Some(t.clone());
        }
        let t = if map.all.len() >= MAX_SERIAL_THREADS {
            map.all[key.1 as usize % map.all.len()].clone()
        } else {
            let t = self.spawn_serial(key)?;
            map.all.push(t.clone());
            t
        };
        map.by_peer.insert(key, t.clone());
        Some(t)
    }

    fn spawn_serial(&self, key: PeerKey) -> Option<Arc<SerialThread>> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = Arc::new(SerialThread { tx });
        let me = self.me.upgrade()?;
        let handle = Arc::downgrade(&thread);
        let name = format!("wl-peer-{}-{}", key.0, key.1);
        match self
            .shared
            .threads
            .spawn(name, move || me.serial_loop(rx, handle))
        {
            Ok(h) => {
                self.threads.push(h);
                Some(thread)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start a serial thread");
                None
            }
        }
    }

    /// A peer's thread: runs its serial items until idle for [`IDLE_RETIRE`], its
    /// peers are gone (the channel disconnects), or the model stops.
    fn serial_loop(&self, rx: Receiver<SerialWork>, me: Weak<SerialThread>) {
        loop {
            let item = crossbeam_channel::select! {
                recv(rx) -> item => item.map_err(|_| RecvTimeoutError::Disconnected),
                recv(self.stop.rx) -> _ => return,
                default(IDLE_RETIRE) => Err(RecvTimeoutError::Timeout),
            };
            match item {
                Ok(w) => {
                    stages::run_serial(self, w.as_serial(), usize::MAX);
                }
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {
                    let mut map = self.serial.lock().unwrap_or_else(|p| p.into_inner());
                    if rx.is_empty() {
                        map.drop_thread(me.as_ptr());
                        return;
                    }
                }
            }
        }
    }
}

impl Scheduler for Threaded {
    fn submit_crypt(&self, work: Crypt<'_>) {
        let _ = self.crypt_tx.send(work.into_owned());
    }

    fn schedule_serial(&self, work: Serial<'_>) {
        let key = (work.iface.id, work.peer.id);
        let mut map = self.serial.lock().unwrap_or_else(|p| p.into_inner());
        // A crypt item that finished after its peer (or interface) was taken out of the
        // map must not put it back: at the thread limit nothing would take it out
        // again. Its queue was cleared; running it here only ends the wake-up. Checked
        // under the map's lock: a peer is marked removed before `peer_removed` takes
        // it, so either this sees the mark or `peer_removed` sees the entry.
        if work.peer.is_removed() || work.iface.stopping() {
            drop(map);
            stages::run_serial(self, work, usize::MAX);
            return;
        }
        match self.thread_for(&mut map, key) {
            Some(t) => {
                if let Err(unsent) = t.tx.send(work.into_owned()) {
                    // Its thread has ended (a bug that escaped its loop): forget it and
                    // run the item here. Dropped, it would leave the peer's stage
                    // claimed (`scheduled`) with no one to run it, for good.
                    map.drop_thread(Arc::as_ptr(&t));
                    drop(map);
                    stages::run_serial(self, unsent.0.as_serial(), usize::MAX);
                }
            }
            // No thread could be started (the process is out of threads): run it here,
            // so the wake-up is not lost.
            None => {
                drop(map);
                stages::run_serial(self, work, usize::MAX);
            }
        }
    }

    fn submit_handshake(&self, iface: &Arc<Interface>) {
        self.shared.handshakes.notify(iface);
    }

    fn peer_removed(&self, iface: &Arc<Interface>, peer: &Arc<Peer>) {
        // Its thread exits once no peer maps to it any more (the inbox closes when the
        // last sender goes), after its queued items, now for a removed peer, are done.
        let mut map = self.serial.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = map.by_peer.remove(&(iface.id, peer.id)) {
            if !map.by_peer.values().any(|u| Arc::ptr_eq(u, &t)) {
                map.drop_thread(Arc::as_ptr(&t));
            }
        }
    }
}

impl ExecModel for Threaded {
    fn model(&self) -> Model {
        Model::Threaded
    }

    fn stop(&self) {
        self.stop.stop();
        *self.serial.lock().unwrap_or_else(|p| p.into_inner()) = SerialMap::default();
        self.threads.join_all();
    }
}
