//! What the readers a runtime shares among its interfaces have in common
//! (`tun_readers`, `udp_readers`): a reader is a thread waiting on one `Set` of
//! descriptors of many interfaces at once, and reading whichever is ready; a `Pool`
//! holds the readers of one kind, by index, starting each on first use.
//!
//! Invariants and races:
//! - Tokens are never reused within a set. A readiness reported for a member just
//!   removed names nothing and is skipped; it cannot be taken for a newer member.
//! - `busy` is held from a member's lookup to the end of its batch. `Pool::unserve`
//!   takes each set's `busy` and removes the interface's members under it: a batch
//!   that was running has ended (and whatever it added is removed too: a reader may
//!   re-add an interface's members when its sockets are replaced), and none can start
//!   after, so when it returns no batch of that interface runs (the models may then
//!   let its peers go). Lock order: `busy`, then `members`.
//! - Fairness: each ready member gets one batch per wait, and one still ready is
//!   reported again at the next wait, after the others that were ready with it.

use crate::interface::Interface;
use crate::threads::Registry;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use wirelane_io::poll::{ReadySet, Waker};

/// The token of a set's stop waker; members' tokens start above it.
const STOP: u64 = 0;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One descriptor of one interface that a shared reader waits on.
pub(crate) trait Member: Clone + Send + 'static {
    fn iface(&self) -> &Arc<Interface>;
    /// Stays open while the member is in a set (the member holds what owns it).
    fn fd(&self) -> RawFd;
}

/// The descriptors one reader waits on.
pub(crate) struct Set<M> {
    ready: ReadySet,
    members: Mutex<HashMap<u64, M>>,
    next_token: AtomicU64,
    /// Held while a batch runs (see the module comment).
    busy: Mutex<()>,
    stop: Waker,
}

impl<M: Member> Set<M> {
    fn new() -> std::io::Result<Set<M>> {
        let set = Set {
            ready: ReadySet::new()?,
            members: Mutex::default(),
            next_token: AtomicU64::new(STOP + 1),
            busy: Mutex::new(()),
            stop: Waker::new()?,
        };
        set.ready.add(set.stop.fd(), STOP)?;
        Ok(set)
    }

    pub fn add(&self, m: M) -> std::io::Result<()> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let fd = m.fd();
        lock(&self.members).insert(token, m);
        self.ready.add(fd, token).inspect_err(|_| {
            lock(&self.members).remove(&token);
        })
    }

    /// Takes out the members `which` picks.
    pub fn remove_if(&self, mut which: impl FnMut(&M) -> bool) {
        lock(&self.members).retain(|_, m| {
            let out = which(m);
            if out {
                // A descriptor that failed may be gone from the set already.
                let _ = self.ready.remove(m.fd());
            }
            !out
        });
    }

    /// The reader's loop: waits, then hands each ready member to `each` with its token,
    /// until the set is stopped (or waiting fails, which is logged).
    pub fn run(&self, mut each: impl FnMut(u64, M)) {
        let mut tokens = Vec::new();
        loop {
            if let Err(e) = self.ready.wait(&mut tokens, -1) {
                tracing::error!(error = %e, "a shared reader's wait failed; it stops");
                return;
            }
            for &token in &tokens {
                if token == STOP {
                    return;
                }
                let _busy = lock(&self.busy);
                let Some(m) = lock(&self.members).get(&token).cloned() else {
                    continue; // taken out since the wait returned
                };
                if m.iface().stopping() {
                    // Taken out now, not when the runtime unserves the interface: its
                    // descriptor stays readable (readiness is level-triggered), and
                    // skipped in the set, it woke this reader again and again.
                    drop(m);
                    self.remove(token);
                } else {
                    each(token, m);
                }
            }
        }
    }

    /// Takes out the member `token` (its descriptor failed, or was replaced).
    pub fn remove(&self, token: u64) {
        if let Some(m) = lock(&self.members).remove(&token) {
            let _ = self.ready.remove(m.fd());
        }
    }
}

/// A reader: its set, and its thread.
type Reader<M> = (Arc<Set<M>>, JoinHandle<()>);

/// The shared readers of one kind, by index.
pub(crate) struct Pool<M> {
    registry: Arc<Registry>,
    readers: Mutex<Vec<Reader<M>>>,
}

impl<M: Member> Pool<M> {
    pub fn new(registry: Arc<Registry>) -> Pool<M> {
        Pool {
            registry,
            readers: Mutex::default(),
        }
    }

    /// Set `index`; its reader (and those of lower indices) started first if need be,
    /// each named by `name` and running `body` on its set and index.
    pub fn set<B>(
        &self,
        index: usize,
        name: impl Fn(usize) -> String,
        body: B,
    ) -> std::io::Result<Arc<Set<M>>>
    where
        B: Fn(&Set<M>, usize) + Clone + Send + 'static,
    {
        let mut readers = lock(&self.readers);
        while readers.len() <= index {
            let set = Arc::new(Set::new()?);
            let (s, body, i) = (set.clone(), body.clone(), readers.len());
            let h = self.registry.spawn(name(i), move || body(&s, i))?;
            readers.push((set, h));
        }
        Ok(readers[index].0.clone())
    }

    /// Takes `iface`'s members out of every set; returns once no batch of it runs.
    pub fn unserve(&self, iface: &Interface) {
        let sets: Vec<Arc<Set<M>>> = lock(&self.readers).iter().map(|r| r.0.clone()).collect();
        for set in sets {
            let _busy = lock(&set.busy);
            set.remove_if(|m| m.iface().id == iface.id);
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
