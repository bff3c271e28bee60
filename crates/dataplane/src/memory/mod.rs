//! In-memory ports: a TUN device and UDP sockets that live in memory, so that the
//! pipeline benchmark and the scheduling stress test run the real stages, execution
//! model and runtime (handshakes included) with no system call on the data path. A
//! [`MemoryNet`] delivers datagrams between the sockets registered on it by address.
//!
//! Readiness is an eventfd per port, readable while data waits, so the readers' poll
//! loops are the daemon's own. Invariant (no lost wake-up): a port's queue and its
//! eventfd change together under the queue's lock; the eventfd is emptied only when a
//! read leaves the queue empty.

pub mod rig;
pub mod stress;

use crate::ports::{TunPort, UdpPort};
use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use wirelane_io::udp::{LocalAddr, Outgoing, Received, RecvBatch};

/// Datagrams a memory socket holds before it drops (its receive buffer).
pub const SOCKET_DATAGRAMS: usize = 1 << 16;

/// Something to run on every packet that crosses a port: the stress test injects
/// yields and sleeps through it.
pub type Hook = Arc<dyn Fn() + Send + Sync>;

/// Where a [`MemoryTun`] puts the packets the pipeline writes.
pub type Sink = Box<dyn Fn(&[u8]) + Send + Sync>;

/// A queue with an eventfd readable while it is not empty.
struct Ready<T> {
    queue: Mutex<VecDeque<T>>,
    fd: OwnedFd,
}

impl<T> Ready<T> {
    fn new() -> io::Result<Ready<T>> {
        // SAFETY: eventfd has no preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Ready {
            queue: Mutex::new(VecDeque::new()),
            // SAFETY: a new descriptor that we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<T>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// Appends items (all, or up to `cap` in the queue); returns how many were dropped.
    fn push(&self, items: impl IntoIterator<Item = T>, cap: usize) -> usize {
        let mut q = self.lock();
        let mut dropped = 0;
        for it in items {
            if q.len() < cap {
                q.push_back(it);
            } else {
                dropped += 1;
            }
        }
        if !q.is_empty() {
            self.signal();
        }
        dropped
    }

    /// Takes up to `n` items.
    fn take(&self, n: usize) -> Vec<T> {
        let mut q = self.lock();
        let k = n.min(q.len());
        let out: Vec<T> = q.drain(..k).collect();
        if q.is_empty() {
            self.clear();
        }
        out
    }
}

/// A TUN device in memory: packets [`MemoryTun::inject`]ed are read by the pipeline;
/// packets the pipeline writes go to the sink.
pub struct MemoryTun {
    name: String,
    inbound: Ready<Vec<u8>>,
    sink: Sink,
    hook: Option<Hook>,
}

impl MemoryTun {
    pub fn new(
        name: &str,
        sink: impl Fn(&[u8]) + Send + Sync + 'static,
        hook: Option<Hook>,
    ) -> io::Result<Arc<MemoryTun>> {
        Ok(Arc::new(MemoryTun {
            name: name.into(),
            inbound: Ready::new()?,
            sink: Box::new(sink),
            hook,
        }))
    }

    /// Hands plaintext packets to the pipeline, as an application sending through the
    /// interface would.
    pub fn inject(&self, packets: impl IntoIterator<Item = Vec<u8>>) {
        self.inbound.push(packets, usize::MAX);
    }
}

impl TunPort for Arc<MemoryTun> {
    fn fd(&self) -> RawFd {
        self.inbound.fd.as_raw_fd()
    }
    fn read(&self, _q: usize, buf: &mut [u8]) -> io::Result<usize> {
        match self.inbound.take(1).pop() {
            Some(p) => {
                let n = p.len().min(buf.len());
                buf[..n].copy_from_slice(&p[..n]);
                Ok(n)
            }
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
    fn write_pieces(&self, _q: usize, pieces: &[IoSlice<'_>]) -> io::Result<usize> {
        let whole: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        self.write_packet(&whole)
    }
    fn write_packet(&self, pkt: &[u8]) -> io::Result<usize> {
        if let Some(h) = &self.hook {
            h();
        }
        (self.sink)(pkt);
        Ok(pkt.len())
    }
    fn has_vnet_hdr(&self) -> bool {
        false
    }
    fn has_uso(&self) -> bool {
        false
    }
    fn name(&self) -> String {
        self.name.clone()
    }
}

/// Delivers datagrams between the memory sockets registered on it.
#[derive(Default)]
pub struct MemoryNet {
    sockets: RwLock<HashMap<SocketAddr, Weak<MemoryUdp>>>,
}

impl MemoryNet {
    /// A socket at `addr` on this network.
    pub fn socket(
        self: &Arc<Self>,
        addr: SocketAddr,
        hook: Option<Hook>,
    ) -> io::Result<Arc<MemoryUdp>> {
        let s = Arc::new(MemoryUdp {
            addr,
            net: Arc::downgrade(self),
            inbox: Ready::new()?,
            drops: AtomicU32::new(0),
            hook,
        });
        self.sockets
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, Arc::downgrade(&s));
        Ok(s)
    }

    fn deliver(&self, from: SocketAddr, dgrams: Vec<(Vec<u8>, SocketAddr)>) {
        let sockets = self.sockets.read().unwrap_or_else(|p| p.into_inner());
        // Consecutive datagrams to one socket are delivered together.
        let mut i = 0;
        while i < dgrams.len() {
            let dst = dgrams[i].1;
            let j = i + dgrams[i..].iter().take_while(|(_, d)| *d == dst).count();
            if let Some(s) = sockets.get(&dst).and_then(Weak::upgrade) {
                let batch = dgrams[i..j].iter().map(|(d, _)| (d.clone(), from));
                let dropped = s.inbox.push(batch, SOCKET_DATAGRAMS);
                s.drops.fetch_add(dropped as u32, Ordering::Relaxed);
            }
            i = j;
        }
    }
}

/// A UDP socket in memory, on a [`MemoryNet`].
pub struct MemoryUdp {
    addr: SocketAddr,
    net: Weak<MemoryNet>,
    inbox: Ready<(Vec<u8>, SocketAddr)>,
    drops: AtomicU32,
    hook: Option<Hook>,
}

impl MemoryUdp {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Runs the hook, delivers, and runs it again: a delay before holds the sender
    /// between taking its datagrams and their leaving (where another sender of the
    /// same peer could overtake them), one after holds it just after they left, while
    /// the receiver may already answer them.
    fn send(&self, dgrams: Vec<(Vec<u8>, SocketAddr)>) {
        if let Some(h) = &self.hook {
            h();
        }
        if let Some(net) = self.net.upgrade() {
            net.deliver(self.addr, dgrams);
        }
        if let Some(h) = &self.hook {
            h();
        }
    }
}

impl UdpPort for MemoryUdp {
    fn fd(&self) -> RawFd {
        self.inbox.fd.as_raw_fd()
    }
    fn gro_enabled(&self) -> bool {
        false
    }
    fn gso_enabled(&self) -> bool {
        true
    }
    fn recv_each(
        &self,
        batch: &mut RecvBatch,
        each: &mut dyn FnMut(Received<'_>),
    ) -> io::Result<usize> {
        let got = self.inbox.take(batch.capacity());
        if got.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        for (data, src) in &got {
            each(Received {
                data,
                src: *src,
                segment: 0,
                local: None,
                rx_time_ns: 0,
                ecn: 0,
                truncated: false,
            });
        }
        Ok(got.len())
    }
    fn send_each(&self, msgs: &[Outgoing<'_>], sent: &mut [bool]) -> io::Result<usize> {
        self.send(msgs.iter().map(|m| (m.payload.to_vec(), m.dst)).collect());
        sent[..msgs.len()].fill(true);
        Ok(msgs.len())
    }
    fn try_send_replies(
        &self,
        msgs: &[(&[u8], SocketAddr, Option<LocalAddr>)],
    ) -> io::Result<usize> {
        self.send(msgs.iter().map(|(d, a, _)| (d.to_vec(), *a)).collect());
        Ok(msgs.len())
    }
    fn send_segmented(
        &self,
        dgrams: &[&[u8]],
        segment: u16,
        dst: &SocketAddr,
        _src: Option<LocalAddr>,
        _ecn: u8,
    ) -> io::Result<bool> {
        // As the kernel cuts a GSO send: the pieces end to end, in `segment`s. When
        // each piece is one datagram (the pipeline's case), without gathering first.
        let seg = usize::from(segment).max(1);
        let aligned = dgrams
            .split_last()
            .is_some_and(|(last, rest)| rest.iter().all(|d| d.len() == seg) && last.len() <= seg);
        let cut = if aligned {
            dgrams.iter().map(|d| (d.to_vec(), *dst)).collect()
        } else {
            let whole: Vec<u8> = dgrams.iter().flat_map(|d| d.iter().copied()).collect();
            whole.chunks(seg).map(|c| (c.to_vec(), *dst)).collect()
        };
        self.send(cut);
        Ok(true)
    }
    fn send_from(
        &self,
        payload: &[u8],
        dst: &SocketAddr,
        _src: Option<LocalAddr>,
        _ecn: u8,
    ) -> io::Result<usize> {
        self.send(vec![(payload.to_vec(), *dst)]);
        Ok(payload.len())
    }
    fn drops(&self) -> io::Result<u32> {
        Ok(self.drops.load(Ordering::Relaxed))
    }
}
