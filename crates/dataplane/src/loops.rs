//! The I/O loops, which no execution model owns: every model runs the same ones.
//!
//! - One handshake thread (and its urgent half) for every interface's handshake lanes,
//!   and one timer thread for every interface's protocol timers and rtnetlink
//!   notifications. The readers, of the TUN (TX-1..3) and of the UDP sockets
//!   (RX-1..2), are shared by every interface too (`tun_readers`, `udp_readers`); what
//!   they have in common with each other is here.
//!
//! Readers are marked ([`is_reader_thread`]): a model may run a small item on such a
//! thread rather than wake a worker for it (the workqueue model's idle shortcut).

use crate::interface::Interface;
use crate::sched::Scheduler;
use crate::stages::{self, StageCtx};
use crate::threads;
use crossbeam_channel::{Receiver, Sender};
use std::cell::Cell;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use wirelane_io::netlink::Monitor;
use wirelane_io::poll::{wait_readable, Ready, Waker};

/// Timer resolution: well under the 333 ms of handshake jitter.
pub const TIMER_TICK: Duration = Duration::from_millis(10);
/// Nice value of the handshake thread and the handshake sockets' readers. The thread's
/// every message costs Diffie-Hellman work (the gate answered the rest), and a flood
/// can fill the lanes with such work before under-load mode begins; the readers carry
/// whatever a flood sends. At equal priority either would take a full share of a core
/// from the data path; niced, they yield to transport data, and what they cannot take
/// overflows their socket in the kernel.
pub(crate) const HANDSHAKE_NICE: libc::c_int = 10;
/// A handshake message that waited this long is urgent: the urgent handshake thread,
/// at the data path's priority, then empties the lanes.
/// Niced, the handshake thread gets a few percent of a core while transport data
/// saturates the machine: at 10,000 peers rekeying under overload, messages waited
/// 6 s on average and sessions reached REJECT_AFTER_TIME before their rekey
/// completed. What waits in the lanes has passed the gate (under load, only proven
/// source addresses, rate-limited per address), so the urgent thread takes a fair
/// share of a core for it, as the kernel's handshake workers do. Well under
/// REKEY_TIMEOUT, so that an initiator does not time out while its message waits.
const HANDSHAKE_URGENT: Duration = Duration::from_secs(1);
/// How often the urgent handshake thread looks at the lanes. Each look takes at most
/// one message that is not urgent (handled at once, like any other), so it takes at
/// most ten a second from the niced thread's share while nothing waits long.
const URGENT_POLL: Duration = Duration::from_millis(100);

thread_local! {
    pub(crate) static READER: Cell<bool> = const { Cell::new(false) };
    /// Crypt items this reader may still run itself in its current read.
    static SHORTCUTS: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread is one of the interfaces' readers.
pub fn is_reader_thread() -> bool {
    READER.get()
}

/// A reader begins handing on one read's packets: it may run the first `shortcuts`
/// small crypt items itself (the workqueue model's idle shortcut), and no more.
pub(crate) fn begin_read(shortcuts: u32) {
    SHORTCUTS.set(shortcuts);
}

/// Small crypt items a TUN reader may run itself per read, with `queues` TUN queues.
///
/// With one queue, one: unbounded, a read of one packet for each of 64 peers
/// (transmit to many peers) ran all 64 items on the reader, one after the other, each
/// finding the queue empty because the one before never reached it, while the workers
/// idled. With a reader per queue, all: the readers are as many as the workers by
/// default and share the cores between them, and an item run where it was read costs
/// neither a hand-off nor a wake-up. Large items still go to the workers.
pub fn shortcuts_per_read(queues: usize) -> u32 {
    if queues > 1 {
        u32::MAX
    } else {
        1
    }
}

/// Takes this read's shortcut, if the calling reader still has it.
pub fn take_shortcut() -> bool {
    let left = SHORTCUTS.get();
    if left > 0 {
        SHORTCUTS.set(left - 1);
    }
    left > 0
}

/// Where interfaces announce queued handshake messages to the runtime's handshake
/// thread: one token per message queued on an interface's lanes, in arrival order.
pub struct HandshakeHub {
    tx: Sender<Arc<Interface>>,
    rx: Receiver<Arc<Interface>>,
}

impl Default for HandshakeHub {
    fn default() -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        HandshakeHub { tx, rx }
    }
}

impl HandshakeHub {
    /// Announces one message queued on `iface`'s lanes. The tokens are bounded by the
    /// lanes' own bounds: one per message a lane took.
    pub fn notify(&self, iface: &Arc<Interface>) {
        let _ = self.tx.send(iface.clone());
    }
}

/// A handshake thread's body: the lanes' hub, the scheduler, the stop signal.
pub type HandshakeLoop = fn(&HandshakeHub, &dyn Scheduler, &Receiver<()>);

/// The handshake thread: takes one message of the announcing interface per token (its
/// cookie lane first) through the handshake stage, until `stop` disconnects.
pub fn handshake_loop(hub: &HandshakeHub, sched: &dyn Scheduler, stop: &Receiver<()>) {
    if !threads::set_nice(HANDSHAKE_NICE) {
        tracing::debug!("could not lower the priority of the handshake thread");
    }
    loop {
        let iface = match hub.rx.try_recv() {
            Ok(i) => i,
            Err(_) => crossbeam_channel::select! {
                recv(hub.rx) -> i => match i {
                    Ok(i) => i,
                    Err(_) => return,
                },
                recv(stop) -> _ => return,
            },
        };
        handle_handshake(&iface, sched);
    }
}

/// The urgent handshake thread, at the data path's priority (see HANDSHAKE_URGENT):
/// every URGENT_POLL it takes one message; if that one had waited HANDSHAKE_URGENT, it
/// takes everything queued until the lanes are empty, until `stop` disconnects. Not
/// "while each had waited": the cookie lane goes first, and its messages are fresh
/// (a mac2 resend follows its cookie reply at once), so that rule stopped at the first
/// of them and left the old ones behind. The two threads share the lanes' tokens, one
/// per message; the stage runs on several threads at once, as the kernel's does (each
/// peer's handshake state is under its lock).
pub fn urgent_handshake_loop(hub: &HandshakeHub, sched: &dyn Scheduler, stop: &Receiver<()>) {
    while let Err(crossbeam_channel::RecvTimeoutError::Timeout) = stop.recv_timeout(URGENT_POLL) {
        let mut urgent = false;
        while let Ok(iface) = hub.rx.try_recv() {
            let waited = handle_handshake(&iface, sched);
            urgent |= waited.is_some_and(|w| w >= HANDSHAKE_URGENT);
            if !urgent {
                break;
            }
        }
    }
}

/// One message of `iface`'s lanes through the handshake stage; how long it waited.
fn handle_handshake(iface: &Arc<Interface>, sched: &dyn Scheduler) -> Option<Duration> {
    if iface.stopping() {
        return None;
    }
    let (job, waited) = iface.take_handshake()?;
    let c = StageCtx { iface, sched };
    stages::contained(iface, "handshake", || stages::handshake::process(c, job));
    Some(waited)
}

/// The timer thread: every [`TIMER_TICK`] runs every interface's due protocol timers
/// and re-sizes its receive and transmit budgets (`budget`), and hands rtnetlink's
/// notifications (the runtime's `monitor`) to every interface's `NetWatch` as soon as
/// they arrive. The interface list is read afresh each round, so interfaces come and
/// go freely.
pub fn timer_loop(
    interfaces: &RwLock<Vec<Arc<Interface>>>,
    monitor: Option<&Monitor>,
    sched: &dyn Scheduler,
    stop: &Waker,
) {
    let mut next_tick = Instant::now() + TIMER_TICK;
    // Without a monitor the stop waker stands in: it never fires until stop.
    let monitor_fd = monitor.map_or(stop.fd(), Monitor::fd);
    loop {
        // Rounded up: a wait rounded down to 0 ms would spin until the tick, taking a
        // core from the data path for up to a millisecond in every ten.
        let left = next_tick.saturating_duration_since(Instant::now());
        let wait_ms = left.as_micros().div_ceil(1000) as i32;
        let list = || interfaces.read().unwrap_or_else(|p| p.into_inner()).clone();
        match wait_readable(monitor_fd, stop, wait_ms) {
            Ok(Ready::Readable) => {
                let events = monitor.map(Monitor::drain).unwrap_or_default();
                for iface in list() {
                    if let Some(up) = iface.netwatch.handle(&events, iface.tun.as_tun()) {
                        let c = StageCtx {
                            iface: &iface,
                            sched,
                        };
                        stages::contained(&iface, "link", || crate::config::link_changed(c, up));
                    }
                }
            }
            Ok(Ready::Timeout) => {}
            _ => return,
        }
        if Instant::now() >= next_tick {
            let now = Instant::now();
            let live: Vec<_> = list().into_iter().filter(|i| !i.stopping()).collect();
            for iface in &live {
                iface.refresh_wall_offset();
                let c = StageCtx { iface, sched };
                stages::contained(iface, "timers", || stages::timers::run_due(c));
                // Every interface here draws on the one pool: they share its floor.
                iface.budgets.resize(now, live.len());
            }
            next_tick = Instant::now() + TIMER_TICK;
        }
    }
}
