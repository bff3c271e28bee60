//! The `workqueue` execution model (default): one worker per core takes every work item
//! (encrypt, decrypt, per-peer flush, per-peer delivery) from one shared FIFO, all at
//! the same priority. A peer's serial stage is just another item, run by whichever
//! worker is free. Beside the workers: one reader per I/O source (TUN, each UDP
//! socket: data, handshake and proof, per family), one handshake thread with its own
//! bounded queue, and one timer thread.
//! A reader that finds the FIFO empty runs a small item itself (see `run_here`).

use super::Work;
use crate::device::{Device, SocketRole};
use crate::packet::MAX_BATCH;
use crate::stages;
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wirelane_io::poll::{wait_readable, Ready};

/// How often an idle UDP reader looks for sockets a UAPI rebind replaced. Stopping
/// never waits for it: the device's waker wakes every poller at once.
const IDLE_CHECK: Duration = Duration::from_millis(200);
/// Longest a reader waits for room in a peer's queue before dropping.
const BACKPRESSURE_WAIT: Duration = Duration::from_millis(100);
/// Timer resolution: well under the 333 ms of handshake jitter.
const TIMER_TICK: Duration = Duration::from_millis(10);

pub struct Running {
    threads: Vec<JoinHandle<()>>,
    dev: Arc<Device>,
}

impl Running {
    /// Stops every thread and waits for them.
    pub fn stop(self) {
        self.dev.stop();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(f)
}

pub fn start(dev: Arc<Device>, workers: usize) -> std::io::Result<Running> {
    let mut threads = Vec::new();
    for i in 0..workers.max(1) {
        let d = dev.clone();
        threads.push(spawn(format!("wl-worker-{i}"), move || worker(&d))?);
    }
    let d = dev.clone();
    threads.push(spawn("wl-tun-read".into(), move || tun_reader(&d))?);
    for role in SocketRole::ALL {
        for v6 in [false, true] {
            let d = dev.clone();
            let suffix = match role {
                SocketRole::Data => "read",
                SocketRole::Handshake => "hs",
                SocketRole::Proof => "proof",
            };
            let name = format!("wl-udp{}-{suffix}", if v6 { 6 } else { 4 });
            threads.push(spawn(name, move || udp_reader(&d, v6, role))?);
        }
    }
    let d = dev.clone();
    threads.push(spawn("wl-handshake".into(), move || handshake_worker(&d))?);
    let d = dev.clone();
    threads.push(spawn("wl-timers".into(), move || timer_thread(&d))?);
    Ok(Running { threads, dev })
}

fn worker(dev: &Device) {
    loop {
        // Work first: a queued item is taken without touching the stop channel.
        let w = match dev.work_rx.try_recv() {
            Ok(w) => w,
            Err(_) => crossbeam_channel::select! {
                recv(dev.work_rx) -> w => match w {
                    Ok(w) => w,
                    Err(_) => return,
                },
                recv(dev.stop_rx) -> _ => return,
            },
        };
        run(dev, w);
    }
}

fn run(dev: &Device, w: Work) {
    match w {
        Work::Encrypt(b) => stages::encrypt::encrypt(dev, b),
        Work::Decrypt(b) => stages::decrypt::decrypt(dev, b),
        Work::FlushTx(p) => stages::tx_flush::flush(dev, &p),
        Work::DeliverRx(p) => stages::rx_deliver::deliver(dev, &p),
    }
}

thread_local! {
    /// Set on the I/O reader threads, which may take the idle shortcut.
    static IO_READER: Cell<bool> = const { Cell::new(false) };
}

/// Largest crypt batch, or serial-stage backlog, a reader runs itself.
const SHORTCUT_MAX_PACKETS: usize = 4;

/// The idle shortcut: on an I/O reader thread, with the shared FIFO empty, a small item
/// runs at once on this thread rather than waking a worker for it. Returns the item
/// when it must be queued instead.
///
/// Order is unchanged: with the FIFO empty the item would have been the only one
/// queued, so no earlier stage is overtaken; a batch a worker is still sealing or
/// opening keeps its place in the peer's ordered queue, which the serial stage drains
/// in order whichever thread runs it. What it saves is the wake-up of a sleeping worker
/// (tens of microseconds on a VM) in each direction of a request and its response.
/// Larger batches are queued still: a reader busy with crypto stops reading, and the
/// workers exist to run those in parallel.
pub(crate) fn run_here(dev: &Device, w: Work) -> Option<Work> {
    // A serial stage drains everything finished in its peer's queue, which under bulk
    // traffic can be many batches sealed by the workers: those stay with the workers.
    let small = match &w {
        Work::Encrypt(b) | Work::Decrypt(b) => b.len() <= SHORTCUT_MAX_PACKETS,
        Work::FlushTx(p) => p.tx_queue.queued_packets() <= SHORTCUT_MAX_PACKETS,
        Work::DeliverRx(p) => p.rx_queue.queued_packets() <= SHORTCUT_MAX_PACKETS,
    };
    if small && IO_READER.get() && dev.work_rx.is_empty() {
        run(dev, w);
        None
    } else {
        Some(w)
    }
}

fn tun_reader(dev: &Device) {
    IO_READER.set(true);
    let mut scratch = vec![0u8; stages::tun_read::SCRATCH_LEN];
    while !dev.stopping() {
        match wait_readable(dev.tun.fd(), &dev.waker, -1) {
            Ok(Ready::Readable) => {}
            Ok(Ready::Timeout) => continue,
            Ok(Ready::Woken) => return,
            Err(e) => return dev.fail(format!("polling the TUN device failed: {e}")),
        }
        match stages::tun_read::read_batch(dev, &mut scratch) {
            Ok(packets) => {
                for (peer, mut group) in stages::route::route(dev, packets) {
                    // Backpressure: let the peer's queue drain rather than drop, one
                    // batch-sized chunk at a time.
                    while !group.is_empty() {
                        let rest = group.split_off(group.len().min(MAX_BATCH));
                        peer.tx_queue.wait_for_room(group.len(), BACKPRESSURE_WAIT);
                        stages::nonce::assign_and_enqueue(dev, &peer, group);
                        group = rest;
                    }
                }
            }
            // The interface was deleted (e.g. `ip link del`, `wg-quick down`).
            Err(e) => return dev.fail(format!("TUN device is gone: {e}")),
        }
    }
}

/// Serves one family's data, handshake or proof socket (the last two at the handshake
/// thread's lower priority: under a flood their sockets overflow in the kernel, and
/// data waits for nothing). All run the whole receive path; which datagrams each sees
/// is the kernel's steering, and without it the data socket sees everything.
fn udp_reader(dev: &Device, v6: bool, role: SocketRole) {
    IO_READER.set(true);
    if role != SocketRole::Data {
        lower_priority("UDP handshake and proof readers");
    }
    while !dev.stopping() {
        let generation = dev.sockets_generation.load(Ordering::SeqCst);
        let sock = dev.sockets().for_reader(v6, role).cloned();
        let Some(sock) = sock else {
            // No socket of this kind (yet): wait for a rebind or stop.
            let _ = wait_readable(dev.waker.fd(), &dev.waker, IDLE_CHECK.as_millis() as i32);
            continue;
        };
        let mut scratch = stages::udp_recv::RecvScratch::new(sock.gro_enabled());
        while dev.sockets_generation.load(Ordering::SeqCst) == generation && !dev.stopping() {
            // After a receive that used every buffer the socket likely holds more: skip
            // the poll, which under load would cost a syscall per batch for nothing.
            if !scratch.filled() {
                match wait_readable(sock.fd(), &dev.waker, IDLE_CHECK.as_millis() as i32) {
                    Ok(Ready::Readable) => {}
                    Ok(Ready::Timeout) => continue,
                    Ok(Ready::Woken) => return,
                    Err(e) => return dev.fail(format!("polling the UDP socket failed: {e}")),
                }
            }
            match stages::udp_recv::recv_batch(&sock, &mut scratch) {
                Ok(packets) => stages::classify::classify(dev, packets),
                Err(e) => tracing::warn!(error = %e, "UDP receive failed"),
            }
        }
    }
}

/// Nice value of the handshake thread and the handshake sockets' readers. The thread's
/// every message costs Diffie-Hellman work (the gate answered the rest), and a flood
/// can fill its queue with such work before under-load mode begins; the readers carry
/// whatever a flood sends. At equal priority either would take a full share of a core
/// from the data path; niced, they yield to transport data, and what they cannot take
/// overflows their socket in the kernel.
const HANDSHAKE_NICE: libc::c_int = 10;

/// Lowers this thread's priority to [`HANDSHAKE_NICE`].
fn lower_priority(what: &str) {
    // SAFETY: setpriority on this thread's own id (a thread is a process id for it).
    let r = unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::gettid() as libc::id_t,
            HANDSHAKE_NICE,
        )
    };
    if r != 0 {
        tracing::debug!("could not lower the priority of the {what}");
    }
}

fn handshake_worker(dev: &Device) {
    lower_priority("handshake thread");
    loop {
        // The cookie lane first, always (see Device::cookie_lane_tx).
        let job = dev
            .cookie_lane_rx
            .try_recv()
            .or_else(|_| dev.handshake_rx.try_recv());
        match job {
            Ok(job) => stages::handshake::process(dev, job),
            Err(_) if dev.stopping() => return,
            Err(_) => {
                // Both empty: sleep until either has something, or the device stops
                // (the stop channel disconnects). The device holds both lanes'
                // senders, so neither of them can disconnect while we run.
                let mut sel = crossbeam_channel::Select::new();
                sel.recv(&dev.cookie_lane_rx);
                sel.recv(&dev.handshake_rx);
                sel.recv(&dev.stop_rx);
                let _ = sel.ready();
            }
        }
    }
}

/// Runs the protocol timers every [`TIMER_TICK`], and follows the host's network
/// (`NetWatch`) as soon as rtnetlink reports a change.
fn timer_thread(dev: &Device) {
    let watch = &dev.netwatch;
    // Without a monitor the waker stands in: it never becomes readable until stop.
    let monitor = watch.monitor_fd().unwrap_or(dev.waker.fd());
    let mut next_tick = Instant::now() + TIMER_TICK;
    loop {
        let left = next_tick.saturating_duration_since(Instant::now());
        match wait_readable(monitor, &dev.waker, left.as_millis() as i32) {
            Ok(Ready::Readable) => watch.handle(&dev.tun),
            Ok(Ready::Timeout) => {}
            _ => return,
        }
        if Instant::now() >= next_tick {
            stages::timers::run_due(dev);
            next_tick = Instant::now() + TIMER_TICK;
        }
    }
}
