//! RX-1..2 for every interface of a runtime: the UDP socket readers, shared. Per kind
//! of socket (data, handshake, proof) and address family, one reader waits on that
//! socket of every interface at once, receives from whichever is ready and classifies
//! what came, so a tunnel beyond the first adds sockets to wait on, not threads.
//!
//! Flow: `serve` adds each of an interface's sockets, with the sockets' `retired`
//! waker beside it, to the reader of its kind and family → the reader receives one
//! batch from each ready socket and classifies it (`stages::classify`); for a data
//! socket under fq-codel it then weighs the batch's oldest wait for the socket's
//! buffer size (`stages::udp_recv::follow_buffer`, `socket_buffer`) → when a new
//! listen port replaces the sockets, their `retired` waker fires and each reader moves
//! that interface to the successors → `unserve` takes the interface out and returns
//! once no batch of it is in progress.
//!
//! Priorities: the handshake and proof readers are niced (`HANDSHAKE_NICE`), the data
//! readers are not. What a flood sends the handshake sockets must not take the data
//! path's share of a core; what the niced readers cannot take overflows those sockets
//! in the kernel. Which datagrams each kind sees is the kernel's steering; without it
//! the data socket sees all.
//!
//! Why shared: with a reader per interface, sixteen tunnels had sixteen data readers,
//! each woken for a sixteenth of the traffic; receive cost 2.53 CPU-s/GB against
//! 1.47 with one tunnel (BENCHMARKS.md, "Many tunnels at the gateway"). The handshake
//! and proof readers followed, so that a tunnel adds no thread at all, and a rebind is
//! followed one way only.
//!
//! Race: a replacement between reading the sockets and registering them is not
//! missed. The waker comes with the sockets it retires and stays readable once fired,
//! so the next wait reports it, and the reader moves on to the successors then.

use crate::fq_codel::QueueDiscipline;
use crate::interface::Interface;
use crate::loops::{begin_read, HANDSHAKE_NICE, READER};
use crate::ports::UdpPort;
use crate::sched::Scheduler;
use crate::shared_readers::{Member, Pool, Set};
use crate::socket_buffer::SocketBuffer;
use crate::sockets::SocketRole;
use crate::stages::{self, gate::Replies, udp_recv, udp_recv::RecvScratch, StageCtx};
use crate::threads::{self, Registry};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use wirelane_io::poll::Waker;

/// What a reader waits on for one interface (its kind and family are the set's).
#[derive(Clone)]
struct Watched {
    iface: Arc<Interface>,
    watch: Watch,
}

#[derive(Clone)]
enum Watch {
    /// The interface's socket of the set's kind and family: datagrams to receive, and
    /// for a data socket under fq-codel, its receive buffer's controller.
    Socket(Arc<dyn UdpPort>, Option<Arc<Mutex<SocketBuffer>>>),
    /// The `retired` waker of the sockets in use: they were replaced.
    Retired(Arc<Waker>),
}

impl Member for Watched {
    fn iface(&self) -> &Arc<Interface> {
        &self.iface
    }
    fn fd(&self) -> RawFd {
        match &self.watch {
            Watch::Socket(s, _) => s.fd(),
            Watch::Retired(w) => w.fd(),
        }
    }
}

/// The runtime's UDP socket readers: one pool per kind of socket (in
/// `SocketRole::ALL`'s order), each with index 0 for IPv4 and 1 for IPv6.
pub struct UdpReaders {
    sched: Arc<dyn Scheduler>,
    pools: [Pool<Watched>; 3],
}

impl UdpReaders {
    pub fn new(sched: Arc<dyn Scheduler>, registry: Arc<Registry>) -> UdpReaders {
        UdpReaders {
            sched,
            pools: SocketRole::ALL.map(|_| Pool::new(registry.clone())),
        }
    }

    /// Adds `iface`'s sockets (and the waker that retires them) to the readers of
    /// their kinds and families. On an error what was added is taken out again.
    pub fn serve(&self, iface: &Arc<Interface>) -> std::io::Result<()> {
        for role in SocketRole::ALL {
            for v6 in [false, true] {
                let added = self
                    .set(role, v6)
                    .and_then(|set| watch(&set, iface, role, v6));
                if let Err(e) = added {
                    self.unserve(iface);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn set(&self, role: SocketRole, v6: bool) -> std::io::Result<Arc<Set<Watched>>> {
        let sched = self.sched.clone();
        let kind = match role {
            SocketRole::Data => "read",
            SocketRole::Handshake => "hs",
            SocketRole::Proof => "proof",
        };
        let name = |i: usize| format!("wl-udp{}-{kind}", if i == 1 { 6 } else { 4 });
        self.pools[role as usize].set(usize::from(v6), name, move |set, i| {
            read_loop(set, &*sched, role, i == 1)
        })
    }

    /// Takes `iface` out; returns once no batch of it runs.
    pub fn unserve(&self, iface: &Interface) {
        for pool in &self.pools {
            pool.unserve(iface);
        }
    }

    pub fn stop(&self) {
        for pool in &self.pools {
            pool.stop();
        }
    }
}

/// Adds `iface`'s current socket of the kind and family (if it has one) and the
/// waker that retires it.
fn watch(
    set: &Set<Watched>,
    iface: &Arc<Interface>,
    role: SocketRole,
    v6: bool,
) -> std::io::Result<()> {
    let (sock, retired) = {
        let s = iface.sockets();
        (s.for_reader(v6, role).cloned(), s.retired.clone())
    };
    let member = |watch| Watched {
        iface: iface.clone(),
        watch,
    };
    if let Some(w) = retired {
        set.add(member(Watch::Retired(w)))?;
    }
    if let Some(s) = sock {
        let follows = role == SocketRole::Data && iface.queue == QueueDiscipline::FqCodel;
        let buffer = follows.then(|| Arc::new(Mutex::new(udp_recv::buffer_control(iface))));
        set.add(member(Watch::Socket(s, buffer)))?;
    }
    Ok(())
}

/// One reader: receives one batch from each ready socket, and moves an interface
/// whose sockets were replaced to their successors.
fn read_loop(set: &Set<Watched>, sched: &dyn Scheduler, role: SocketRole, v6: bool) {
    READER.set(true);
    if role != SocketRole::Data && !threads::set_nice(HANDSHAKE_NICE) {
        tracing::debug!("could not lower the priority of a handshake socket reader");
    }
    // With and without GRO, allocated on first use (mapped: see `RecvScratch`).
    let mut scratch: [Option<RecvScratch>; 2] = [None, None];
    let mut replies = Replies::default();
    set.run(|_, Watched { iface, watch }| match watch {
        Watch::Retired(_) => {
            set.remove_if(|m| m.iface.id == iface.id);
            if let Err(e) = self::watch(set, &iface, role, v6) {
                iface.fail(format!("watching the new UDP sockets failed: {e}"));
            }
        }
        Watch::Socket(sock, buffer) => {
            let c = StageCtx {
                iface: &iface,
                sched,
            };
            let gro = sock.gro_enabled();
            let scratch = scratch[usize::from(gro)].get_or_insert_with(|| RecvScratch::new(gro));
            match udp_recv::recv_batch(&*sock, scratch) {
                Ok(packets) => {
                    begin_read(1);
                    let oldest = packets.first().map(|p| p.arrival_ns);
                    let classified = || stages::classify::classify(c, packets, &mut replies);
                    if stages::contained(&iface, "udp receive", classified).is_none() {
                        replies = Replies::default();
                    }
                    let cut = scratch.truncated() as u64;
                    if cut > 0 {
                        iface.stats.rx_truncated.fetch_add(cut, Ordering::Relaxed);
                    }
                    if let (Some(ctl), Some(oldest)) = (&buffer, oldest) {
                        let n = scratch.received();
                        udp_recv::follow_buffer(&iface, &*sock, ctl, oldest, n);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "UDP receive failed"),
            }
        }
    });
}
