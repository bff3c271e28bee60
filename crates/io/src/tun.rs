//! The TUN device: a layer-3 interface whose packets we read and write as plain IP.

use crate::{cvt, cvt_size};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// MTU a new interface starts with, as wireguard-go chooses it.
pub const DEFAULT_MTU: u32 = 1420;

pub struct Tun {
    fd: OwnedFd,
    name: String,
    /// Packets carry a `virtio_net_hdr` (see [`crate::offload`]) in both directions.
    vnet: bool,
    /// The kernel took UDP segmentation offload (USO, Linux 6.2 and later): reads may
    /// be UDP super-packets, and writes may be too.
    uso: bool,
}

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
        || name.contains(char::is_whitespace)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid interface name '{name}': 1 to 15 characters, no '/' or spaces"),
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
    pub fn create(name: &str, offloads: bool) -> io::Result<Tun> {
        if offloads {
            match Self::open(name, true) {
                Ok(mut t) => {
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
        let t = Self::open(name, false)?;
        t.set_mtu(DEFAULT_MTU)?;
        Ok(t)
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

    fn open(name: &str, vnet: bool) -> io::Result<Tun> {
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
        req.ifr_ifru.ifru_flags = flags as libc::c_short;
        // SAFETY: TUNSETIFF takes a pointer to ifreq.
        cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF as _, &mut req) })?;
        // SAFETY: the kernel wrote a NUL-terminated name into ifr_name.
        let actual = unsafe { CStr::from_ptr(req.ifr_name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(Tun {
            fd,
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

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
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

    /// Reads one packet; `WouldBlock` when none is queued (the fd is non-blocking).
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for writes of buf.len() bytes.
        cvt_size(unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) })
    }

    /// Writes one packet given as pieces laid end to end (`writev`): the kernel gathers
    /// them, so a super-packet's payloads need not be copied together first.
    pub fn write_pieces(&self, pieces: &[io::IoSlice<'_>]) -> io::Result<usize> {
        // More pieces than writev takes (IOV_MAX) fail with EINVAL, never a short packet.
        let n = pieces.len().min(libc::c_int::MAX as usize) as libc::c_int;
        // SAFETY: IoSlice is ABI-compatible with iovec on Unix, and every piece borrows
        // a live slice for the duration of the call.
        cvt_size(unsafe { libc::writev(self.fd.as_raw_fd(), pieces.as_ptr().cast(), n) })
    }

    /// Writes one plain IP packet, with an empty virtio header first where the device
    /// expects one.
    pub fn write_packet(&self, pkt: &[u8]) -> io::Result<usize> {
        if !self.vnet {
            return self.write(pkt);
        }
        let none = [0u8; crate::offload::VNET_HDR_LEN];
        self.write_pieces(&[io::IoSlice::new(&none), io::IoSlice::new(pkt)])
    }

    /// Writes one buffer as it is.
    pub fn write(&self, pkt: &[u8]) -> io::Result<usize> {
        // SAFETY: pkt is valid for reads of pkt.len() bytes.
        cvt_size(unsafe { libc::write(self.fd.as_raw_fd(), pkt.as_ptr().cast(), pkt.len()) })
    }
}
