//! The TUN device: a layer-3 interface whose packets we read and write as plain IP.

use crate::{cvt, cvt_size};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// MTU a new interface starts with, as wireguard-go chooses it.
pub const DEFAULT_MTU: u32 = 1420;

pub struct Tun {
    /// Queue 0's descriptor: the one ioctls go through.
    fd: OwnedFd,
    /// Queues 1.. of a multi-queue device (`IFF_MULTI_QUEUE`): the kernel spreads the
    /// packets routed into the interface over the queues by flow, and a flow whose
    /// packets were written through a queue is read from that queue.
    more: Vec<OwnedFd>,
    name: String,
    /// Packets carry a `virtio_net_hdr` (see [`crate::offload`]) in both directions.
    vnet: bool,
    /// The kernel took UDP segmentation offload (USO, Linux 6.2 and later): reads may
    /// be UDP super-packets, and writes may be too.
    uso: bool,
}

/// Most queues a device gets: the kernel takes up to 256 (`MAX_TAP_QUEUES`); one
/// reader per core is the use, and past this many cores readers are not the bound.
pub const MAX_QUEUES: usize = 16;

/// `TUNGETDEVNETNS` from `linux/if_tun.h`: `_IO('T', 227)`.
const TUNGETDEVNETNS: libc::c_ulong = 0x54e3;

fn fstat_ino(fd: RawFd) -> io::Result<u64> {
    // SAFETY: stat is plain data; fstat fills it for a valid descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st.st_ino)
}

/// `TUN_F_USO4` and `TUN_F_USO6` from `linux/if_tun.h` (libc lacks them). The kernel
/// takes them only together.
const TUN_F_USO: libc::c_uint = 0x20 | 0x40;

fn ifreq_with_name(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty()
        || name.len() >= libc::IFNAMSIZ
        || name.contains('/')
        || name.contains('%')
        || name.contains(char::is_whitespace)
    {
        // '%': the kernel would take the name as a template ("wg%d") and pick another.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid interface name '{name}': 1 to 15 characters, no '/', '%' or spaces"),
        ));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    Ok(req)
}

/// Runs an interface ioctl on a throwaway datagram socket.
fn if_ioctl(req: &mut libc::ifreq, op: libc::c_ulong) -> io::Result<()> {
    // SAFETY: plain socket creation; result checked.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: s is ours; wrapping closes it on every path.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: req is a valid ifreq for the interface ioctls we pass.
    cvt(unsafe { libc::ioctl(s.as_raw_fd(), op as _, req as *mut libc::ifreq) })?;
    Ok(())
}

impl Tun {
    /// Creates (or attaches to) the TUN interface `name` and sets its MTU to
    /// [`DEFAULT_MTU`]. With `offloads`, it asks for `IFF_VNET_HDR` with checksum, TCP
    /// and, where the kernel has it, UDP segmentation offload, so reads may return
    /// 64 KiB super-packets; when the kernel refuses, it falls back to plain packets.
    /// With `queues` > 1 the device is multi-queue with that many queues, unless the
    /// kernel refuses (an existing single-queue device of that name): one queue then.
    pub fn create(name: &str, offloads: bool, queues: usize) -> io::Result<Tun> {
        let multi = queues > 1;
        let (mut t, multi) = match Self::create_queue(name, offloads, multi) {
            Err(e) if multi && e.raw_os_error() == Some(libc::EINVAL) => {
                (Self::create_queue(name, offloads, false)?, false)
            }
            r => (r?, multi),
        };
        if multi {
            for _ in 1..queues.min(MAX_QUEUES) {
                let q = Self::open(name, t.vnet, true)?;
                t.more.push(q.fd);
            }
        }
        Ok(t)
    }

    fn create_queue(name: &str, offloads: bool, multi: bool) -> io::Result<Tun> {
        // An existing persistent device keeps what its last owner set: the vnet header's
        // size and the offloads (the kernel resets neither on attach). Both are set here
        // every time, or reads and writes misalign, or super-packets arrive without the
        // header that describes them.
        if offloads {
            match Self::open(name, true, multi) {
                Ok(mut t) => {
                    t.set_vnet_hdr_len()?;
                    let tso = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;
                    // Kernels before 6.2 refuse the USO flags: TSO alone then.
                    for (flags, uso) in [(tso | TUN_F_USO, true), (tso, false)] {
                        if t.set_offload(flags).is_ok() {
                            t.uso = uso;
                            t.set_mtu(DEFAULT_MTU)?;
                            return Ok(t);
                        }
                    }
                    // Offloads refused: the vnet header stays, always empty. Simpler to
                    // reopen without it.
                    drop(t);
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(e),
            }
        }
        let t = Self::open(name, false, multi)?;
        t.set_offload(0)?;
        t.set_mtu(DEFAULT_MTU)?;
        Ok(t)
    }

    fn set_vnet_hdr_len(&self) -> io::Result<()> {
        let len = crate::offload::VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::TUNSETVNETHDRSZ as _, &len) }).map(drop)
    }

    fn set_offload(&self, flags: libc::c_uint) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes the flags by value.
        cvt(unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                libc::TUNSETOFFLOAD as _,
                flags as libc::c_ulong,
            )
        })
        .map(drop)
    }

    fn open(name: &str, vnet: bool, multi: bool) -> io::Result<Tun> {
        let mut req = ifreq_with_name(name)?;
        // SAFETY: path is a valid C string; result checked.
        let fd = cvt(unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        })?;
        // SAFETY: fd was just opened and is exclusively ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut flags = libc::IFF_TUN | libc::IFF_NO_PI;
        if vnet {
            flags |= libc::IFF_VNET_HDR;
        }
        if multi {
            flags |= libc::IFF_MULTI_QUEUE;
        }
        req.ifr_ifru.ifru_flags = flags as libc::c_short;
        // SAFETY: TUNSETIFF takes a pointer to ifreq.
        cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF as _, &mut req) })?;
        // SAFETY: the kernel wrote a NUL-terminated name into ifr_name.
        let actual = unsafe { CStr::from_ptr(req.ifr_name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(Tun {
            fd,
            more: Vec::new(),
            name: actual,
            vnet,
            uso: false,
        })
    }

    /// Whether packets carry a vnet header (offloads are on).
    pub fn has_vnet_hdr(&self) -> bool {
        self.vnet
    }

    /// Whether the kernel took UDP segmentation offload: UDP super-packets may be
    /// written (see [`crate::offload::coalesce`]).
    pub fn has_uso(&self) -> bool {
        self.uso
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Queue 0's descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// How many queues the device was opened with.
    pub fn queues(&self) -> usize {
        1 + self.more.len()
    }

    /// The descriptor of queue `q` (queue 0 past the last).
    pub fn queue_fd(&self, q: usize) -> RawFd {
        match q.checked_sub(1).and_then(|i| self.more.get(i)) {
            Some(fd) => fd.as_raw_fd(),
            None => self.fd(),
        }
    }

    /// The interface's name now (`ip link set … name` may have changed it).
    pub fn current_name(&self) -> io::Result<String> {
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        // SAFETY: TUNGETIFF fills the ifreq it is given.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::TUNGETIFF as _, &mut req) })?;
        // SAFETY: the kernel wrote a NUL-terminated name into ifr_name.
        Ok(unsafe { CStr::from_ptr(req.ifr_name.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// The network namespace the interface lives in now, which `ip link set … netns`
    /// may have changed since it was created (`TUNGETDEVNETNS`, needs CAP_NET_ADMIN).
    pub fn netns(&self) -> io::Result<OwnedFd> {
        // SAFETY: TUNGETDEVNETNS takes no argument and returns a new descriptor.
        let fd = cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), TUNGETDEVNETNS as _) })?;
        // SAFETY: the descriptor is new and ours.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Whether the interface lives in the calling thread's network namespace.
    pub fn in_own_netns(&self) -> io::Result<bool> {
        let theirs = fstat_ino(self.netns()?.as_raw_fd())?;
        let ours = std::fs::metadata("/proc/thread-self/ns/net")?;
        Ok(theirs == std::os::unix::fs::MetadataExt::ino(&ours))
    }

    /// The MTU, asked by name in the calling thread's namespace: right only while the
    /// interface lives there (the data plane follows moves through rtnetlink).
    pub fn mtu(&self) -> io::Result<u32> {
        let mut req = ifreq_with_name(&self.name)?;
        if_ioctl(&mut req, libc::SIOCGIFMTU)?;
        // SAFETY: SIOCGIFMTU filled the mtu member of the union.
        Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
    }

    pub fn set_mtu(&self, mtu: u32) -> io::Result<()> {
        let mut req = ifreq_with_name(&self.name)?;
        req.ifr_ifru.ifru_mtu = mtu as libc::c_int;
        if_ioctl(&mut req, libc::SIOCSIFMTU)
    }

    /// Reads one packet from queue `q`; `WouldBlock` when none is queued (the
    /// descriptors are non-blocking).
    pub fn read(&self, q: usize, buf: &mut [u8]) -> io::Result<usize> {
        let fd = self.queue_fd(q);
        // SAFETY: buf is valid for writes of buf.len() bytes.
        cvt_size(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) })
    }

    /// Writes one packet given as pieces laid end to end (`writev`) through queue `q`:
    /// the kernel gathers them, so a super-packet's payloads need not be copied
    /// together first. The kernel then reads that packet's flow from queue `q`.
    pub fn write_pieces(&self, q: usize, pieces: &[io::IoSlice<'_>]) -> io::Result<usize> {
        // More pieces than writev takes (IOV_MAX) fail with EINVAL, never a short packet.
        let n = pieces.len().min(libc::c_int::MAX as usize) as libc::c_int;
        // SAFETY: IoSlice is ABI-compatible with iovec on Unix, and every piece borrows
        // a live slice for the duration of the call.
        cvt_size(unsafe { libc::writev(self.queue_fd(q), pieces.as_ptr().cast(), n) })
    }

    /// Writes one plain IP packet, with an empty virtio header first where the device
    /// expects one.
    pub fn write_packet(&self, pkt: &[u8]) -> io::Result<usize> {
        if !self.vnet {
            return self.write(pkt);
        }
        let none = [0u8; crate::offload::VNET_HDR_LEN];
        self.write_pieces(0, &[io::IoSlice::new(&none), io::IoSlice::new(pkt)])
    }

    /// Writes one buffer as it is.
    pub fn write(&self, pkt: &[u8]) -> io::Result<usize> {
        // SAFETY: pkt is valid for reads of pkt.len() bytes.
        cvt_size(unsafe { libc::write(self.fd.as_raw_fd(), pkt.as_ptr().cast(), pkt.len()) })
    }
}
