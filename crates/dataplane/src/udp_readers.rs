//! RX-1..2 for every interface of a runtime: the data-socket readers, shared. One
//! reader per address family waits on that family's data socket of every interface at
//! once, receives from whichever is ready and classifies what came, so a tunnel beyond
//! the first adds a socket to wait on, not a thread. The handshake and proof sockets
//! keep their own, niced readers per interface (`loops`): what a flood sends them must
//! not take the data path's threads.
//!
//! Flow: `serve` adds each family's data socket of an interface to that family's
//! reader, with the sockets' `retired` waker beside it → the reader receives one batch
//! from each ready socket and classifies it (`stages::classify`) → when a new listen
//! port replaces the sockets, their `retired` waker fires and the reader moves that
//! interface to the successors → `unserve` takes the interface out and returns once
//! no batch of it is in progress.
//!
//! Why shared: with a reader per interface, sixteen tunnels had sixteen data readers,
//! each woken for a sixteenth of the traffic; receive cost 2.53 CPU-s/GB against
//! 1.47 with one tunnel (BENCHMARKS.md, "Many tunnels at the gateway").
//!
//! Race: a replacement between reading the sockets and registering them is not
//! missed. The waker comes with the sockets it retires and stays readable once fired,
//! so the next wait reports it, and the reader moves on to the successors then.

use crate::interface::Interface;
use crate::loops::{begin_read, READER};
use crate::ports::UdpPort;
use crate::sched::Scheduler;
use crate::shared_readers::{Member, Pool, Set};
use crate::sockets::SocketRole;
use crate::stages::{self, gate::Replies, udp_recv::RecvScratch, StageCtx};
use crate::threads::Registry;
use std::os::fd::RawFd;
use std::sync::Arc;
use wirelane_io::poll::Waker;

/// What a data reader waits on for one interface and family.
#[derive(Clone)]
struct DataSocket {
    iface: Arc<Interface>,
    v6: bool,
    watch: Watch,
}

#[derive(Clone)]
enum Watch {
    /// The family's data socket: datagrams to receive.
    Socket(Arc<dyn UdpPort>),
    /// The `retired` waker of the sockets in use: they were replaced.
    Retired(Arc<Waker>),
}

impl Member for DataSocket {
    fn iface(&self) -> &Arc<Interface> {
        &self.iface
    }
    fn fd(&self) -> RawFd {
        match &self.watch {
            Watch::Socket(s) => s.fd(),
            Watch::Retired(w) => w.fd(),
        }
    }
}

/// The runtime's data-socket readers: index 0 for IPv4, 1 for IPv6.
pub struct UdpReaders {
    sched: Arc<dyn Scheduler>,
    pool: Pool<DataSocket>,
}

impl UdpReaders {
    pub fn new(sched: Arc<dyn Scheduler>, registry: Arc<Registry>) -> UdpReaders {
        UdpReaders {
            sched,
            pool: Pool::new(registry),
        }
    }

    /// Adds `iface`'s data sockets (and the waker that retires them) to the readers of
    /// their families. On an error what was added is taken out again.
    pub fn serve(&self, iface: &Arc<Interface>) -> std::io::Result<()> {
        for v6 in [false, true] {
            let added = self.set(v6).and_then(|set| watch(&set, iface, v6));
            if let Err(e) = added {
                self.unserve(iface);
                return Err(e);
            }
        }
        Ok(())
    }

    fn set(&self, v6: bool) -> std::io::Result<Arc<Set<DataSocket>>> {
        let sched = self.sched.clone();
        let name = |i: usize| format!("wl-udp{}-read", if i == 1 { 6 } else { 4 });
        self.pool
            .set(usize::from(v6), name, move |set| read_loop(set, &*sched))
    }

    /// Takes `iface` out; returns once no batch of it runs.
    pub fn unserve(&self, iface: &Interface) {
        self.pool.unserve(iface);
    }

    pub fn stop(&self) {
        self.pool.stop();
    }
}

/// Adds `iface`'s current data socket of the family (if it has one) and the waker
/// that retires it.
fn watch(set: &Set<DataSocket>, iface: &Arc<Interface>, v6: bool) -> std::io::Result<()> {
    let (sock, retired) = {
        let s = iface.sockets();
        (
            s.for_reader(v6, SocketRole::Data).cloned(),
            s.retired.clone(),
        )
    };
    let member = |watch| DataSocket {
        iface: iface.clone(),
        v6,
        watch,
    };
    if let Some(w) = retired {
        set.add(member(Watch::Retired(w)))?;
    }
    if let Some(s) = sock {
        set.add(member(Watch::Socket(s)))?;
    }
    Ok(())
}

/// One reader: receives one batch from each ready socket, and moves an interface
/// whose sockets were replaced to their successors.
fn read_loop(set: &Set<DataSocket>, sched: &dyn Scheduler) {
    READER.set(true);
    // Per kind of socket, allocated on first use (mapped: see `RecvScratch`).
    let mut scratch: [Option<RecvScratch>; 2] = [None, None];
    let mut replies = Replies::default();
    set.run(|_, DataSocket { iface, v6, watch }| match watch {
        Watch::Retired(_) => {
            set.remove_if(|m| m.iface.id == iface.id && m.v6 == v6);
            if let Err(e) = self::watch(set, &iface, v6) {
                iface.fail(format!("watching the new UDP sockets failed: {e}"));
            }
        }
        Watch::Socket(sock) => {
            let c = StageCtx {
                iface: &iface,
                sched,
            };
            let gro = sock.gro_enabled();
            let scratch = scratch[usize::from(gro)].get_or_insert_with(|| RecvScratch::new(gro));
            match stages::udp_recv::recv_batch(&*sock, scratch) {
                Ok(packets) => {
                    begin_read(1);
                    let classified = || stages::classify::classify(c, packets, &mut replies);
                    if stages::contained(&iface, "udp receive", classified).is_none() {
                        replies = Replies::default();
                    }
                }
                Err(e) => tracing::warn!(error = %e, "UDP receive failed"),
            }
        }
    });
}
