//! The daemon's main loop: the tunnels one process serves, on one runtime.
//!
//! Each tunnel is its interface (TUN, sockets, state) and its UAPI socket. The loop
//! polls, beside the signal descriptor and a pool's control socket, every tunnel's UAPI
//! socket (accepting connections, each served on a thread of its own), the inotify
//! watch on that socket's file (deleted: the tunnel goes), and the interface's waker
//! (its TUN went away, as after `ip link del` or `wg-quick down`: the tunnel goes).
//! A tunnel going takes nothing else with it. The process ends with its last tunnel,
//! unless told to stay.
//!
//! Lock order: `tunnels` is the only lock here; creating a tunnel (an interface and
//! its sockets) happens under it, so two requests for one name cannot both succeed.

use crate::listener::{self, UapiListener};
use crate::pool::{Control, Request};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use wirelane_dataplane::{Interface, Runtime, Sockets};
use wirelane_io::poll::Waker;
use wirelane_io::tun::Tun;

/// One tunnel: its interface and its UAPI socket.
pub struct Tunnel {
    pub iface: Arc<Interface>,
    pub uapi: UapiListener,
}

/// Creates the interface, sockets and UAPI socket of tunnel `ifname`, refusing a name
/// another process serves. Runs before the runtime exists for the tunnels named at
/// start (while privileges allow what only set-up needs), and on a pool's requests.
pub fn open_tunnel(ifname: &str, offloads: bool) -> Result<Tunnel, String> {
    listener::ensure_not_served(ifname).map_err(|e| e.to_string())?;
    let tun = listener::retry_while_exiting(|| Tun::create(ifname, offloads))
        .map_err(|e| format!("cannot create TUN interface '{ifname}': {e}"))?;
    let sockets =
        Sockets::bind(0, 0).map_err(|e| format!("{ifname}: cannot bind UDP sockets: {e}"))?;
    let iface = Interface::new(Box::new(tun), sockets)
        .map_err(|e| format!("{ifname}: cannot create the interface: {e}"))?;
    let uapi = UapiListener::bind(ifname)
        .map_err(|e| format!("{ifname}: cannot create UAPI socket: {e}"))?;
    Ok(Tunnel { iface, uapi })
}

/// Why the daemon stops.
pub enum Stop {
    Signal(i32),
    /// Its last tunnel went (and it was not told to stay).
    LastTunnelGone,
}

pub struct Supervisor {
    runtime: Arc<Runtime>,
    tunnels: Mutex<BTreeMap<String, Tunnel>>,
    /// Signalled when the set of tunnels changes, so the loop polls the new set.
    changed: Waker,
    offloads: bool,
    stay: bool,
}

impl Supervisor {
    pub fn new(runtime: Arc<Runtime>, offloads: bool, stay: bool) -> std::io::Result<Supervisor> {
        Ok(Supervisor {
            runtime,
            tunnels: Mutex::default(),
            changed: Waker::new()?,
            offloads,
            stay,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Tunnel>> {
        self.tunnels.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts serving a tunnel opened by [`open_tunnel`].
    pub fn serve(&self, ifname: &str, t: Tunnel) -> Result<(), String> {
        let mut tunnels = self.lock();
        if tunnels.contains_key(ifname) {
            return Err(format!("{ifname} is already served by this process"));
        }
        self.runtime
            .serve(&t.iface)
            .map_err(|e| format!("{ifname}: cannot start its readers: {e}"))?;
        tracing::info!(
            interface = ifname,
            port = t.iface.sockets().port,
            tunnels = tunnels.len() + 1,
            "tunnel up"
        );
        tunnels.insert(ifname.to_string(), t);
        self.changed.wake();
        Ok(())
    }

    /// Opens and serves a new tunnel (a pool's `add`).
    pub fn add(&self, ifname: &str) -> Result<(), String> {
        crate::parse_ifname(ifname)?;
        // Under the lock: a second request for the same name waits, then finds it.
        let tunnels = self.lock();
        if tunnels.contains_key(ifname) {
            return Err(format!("{ifname} is already served by this pool"));
        }
        let t = open_tunnel(ifname, self.offloads)?;
        drop(tunnels);
        self.serve(ifname, t)
    }

    /// Stops serving tunnel `ifname`: its UAPI socket goes first (a new daemon may
    /// take the name at once), then its readers; queued work finds it gone.
    pub fn remove(&self, ifname: &str, why: &str) -> Result<(), String> {
        let t = self
            .lock()
            .remove(ifname)
            .ok_or_else(|| format!("no tunnel {ifname} in this process"))?;
        t.uapi.remove();
        self.runtime.unserve(&t.iface);
        tracing::info!(interface = ifname, reason = why, "tunnel down");
        tracing::debug!(interface = ifname, stats = ?t.iface.stats.fields(), "final counters");
        self.changed.wake();
        Ok(())
    }

    fn list(&self) -> String {
        self.lock().keys().cloned().collect::<Vec<_>>().join(" ")
    }

    fn handle(&self, req: Request) -> Result<String, String> {
        match req {
            Request::Add(name) => self.add(&name).map(|_| String::new()),
            Request::Remove(name) => self
                .remove(&name, "removed on request")
                .map(|_| String::new()),
            Request::List => Ok(self.list()),
        }
    }

    /// Serves until a signal, or until the last tunnel is gone (unless told to stay).
    pub fn run(self: &Arc<Self>, sig: &OwnedFd, control: Option<&Control>) -> Stop {
        loop {
            // The poll set: [signal, changed, control?, per tunnel: uapi, watch, waker].
            let names: Vec<String>;
            let mut fds: Vec<RawFd> = vec![sig.as_raw_fd(), self.changed.fd()];
            fds.extend(control.map(Control::fd));
            let fixed = fds.len();
            {
                let tunnels = self.lock();
                if tunnels.is_empty() && !self.stay {
                    return Stop::LastTunnelGone;
                }
                names = tunnels.keys().cloned().collect();
                for t in tunnels.values() {
                    fds.extend([t.uapi.fd(), t.uapi.watch_fd(), t.iface.waker.fd()]);
                }
            }
            let mut pfds: Vec<libc::pollfd> = fds
                .iter()
                .map(|&fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: pfds is a valid array of pollfds for the call's duration.
            let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as _, -1) };
            if r < 0 {
                continue; // EINTR
            }
            if pfds[0].revents != 0 {
                if let Some(signo) = read_signal(sig) {
                    return Stop::Signal(signo);
                }
            }
            if pfds[1].revents != 0 {
                drain_eventfd(self.changed.fd());
            }
            if control.is_some() && pfds[2].revents != 0 {
                if let Some(stream) = control.and_then(Control::accept) {
                    let me = self.clone();
                    let spawned = std::thread::Builder::new()
                        .name("wl-pool-ctl".into())
                        .spawn(move || crate::pool::serve(stream, |req| me.handle(req)));
                    if let Err(e) = spawned {
                        tracing::warn!(error = %e, "cannot serve a pool request");
                    }
                }
            }
            for (i, name) in names.iter().enumerate() {
                let [uapi, watch, waker] = [0, 1, 2].map(|k| pfds[fixed + 3 * i + k].revents != 0);
                if uapi {
                    self.accept_uapi(name);
                }
                if watch && self.socket_removed(name) {
                    let _ = self.remove(name, "its UAPI socket was removed");
                } else if waker {
                    let why = self.failure(name);
                    let _ = self.remove(name, &why);
                }
            }
        }
    }

    fn accept_uapi(&self, name: &str) {
        if !listener::room_for_client() {
            return; // they wait in the backlog
        }
        let tunnels = self.lock();
        let Some(t) = tunnels.get(name) else { return };
        if let Some(stream) = t.uapi.accept() {
            listener::spawn_connection(stream, t.iface.clone(), self.runtime.clone());
        }
    }

    fn socket_removed(&self, name: &str) -> bool {
        self.lock().get(name).is_some_and(|t| t.uapi.removed())
    }

    fn failure(&self, name: &str) -> String {
        let tunnels = self.lock();
        let f = tunnels
            .get(name)
            .and_then(|t| t.iface.fatal.lock().ok().and_then(|f| f.clone()));
        f.unwrap_or_else(|| "stopped".into())
    }

    /// Removes every tunnel (shutdown), sockets first.
    pub fn remove_all(&self) {
        let names: Vec<String> = self.lock().keys().cloned().collect();
        for n in names {
            let _ = self.remove(&n, "shutting down");
        }
    }
}

/// The signal number pending on `sig`, if any.
fn read_signal(sig: &OwnedFd) -> Option<i32> {
    // SAFETY: signalfd_siginfo is plain data; read fills it from our signalfd.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let n = unsafe {
        libc::read(
            sig.as_raw_fd(),
            &mut info as *mut _ as *mut libc::c_void,
            std::mem::size_of_val(&info),
        )
    };
    (n > 0).then_some(info.ssi_signo as i32)
}

/// Empties an eventfd so it stops being readable.
fn drain_eventfd(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}
