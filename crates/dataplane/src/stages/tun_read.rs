//! Stage TX-1, tun read. Input: one of the TUN device's queues. Output: a vector of
//! plaintext IP packets in the order the kernel handed them to us. With offloads on,
//! TCP (TSO) and UDP (USO) super-packets are split into MTU-sized segments here
//! (checksums completed), so every later stage sees ordinary packets, each stamped
//! with the time of its read (the transmit sojourn's start). Runs on one reader at a
//! time per queue.

use crate::interface::Interface;
use crate::packet::{Packet, MAX_BATCH};
use std::io;
use std::sync::atomic::Ordering;
use wirelane_io::offload::{split, VnetHdr, VNET_HDR_LEN};

/// Scratch space for one read: the largest super-packet plus its vnet header. An IPv6
/// UDP super-packet may carry a full 65,535-byte payload after its 40-byte header; a
/// read that fills the buffer anyway was truncated and is dropped.
pub const SCRATCH_LEN: usize = 40 + 65535 + VNET_HDR_LEN + 1;

/// Room a reader's packet vector needs: one super-packet past [`MAX_BATCH`] splits
/// into at most 46 more (64 KiB of 1,400).
pub const READ_CAPACITY: usize = MAX_BATCH + 48;

/// Reads into `out` (empty, with [`READ_CAPACITY`]: the reader keeps one, as a fresh
/// one per read was a 9 KiB allocation each time) until about [`MAX_BATCH`] packets
/// are gathered, without blocking. Nothing read means the TUN had nothing queued; an
/// error other than `WouldBlock` means the TUN is gone.
pub fn read_batch(
    dev: &Interface,
    queue: usize,
    scratch: &mut [u8],
    out: &mut Vec<Packet>,
) -> io::Result<()> {
    let vnet = dev.tun.has_vnet_hdr();
    while out.len() < MAX_BATCH {
        let n = match dev.tun.read(queue, scratch) {
            Ok(0) => break,
            // Truncated (see SCRATCH_LEN). The kernel reports the packet's whole length,
            // not what it copied (`tun_put_user`), so a longer one reads as more than
            // the buffer.
            Ok(n) if n >= scratch.len() => {
                dev.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // One packet the kernel could not describe in a vnet header; it freed it,
            // and the device is still there.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                dev.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Err(e) if out.is_empty() => return Err(e),
            Err(_) => break,
        };
        let first = out.len();
        let mut push = |head: &[u8], payload: &[u8]| {
            out.push(Packet::from_plaintext(&[head, payload]));
        };
        if !vnet {
            push(&scratch[..n], &[]);
            continue;
        }
        let split_ok = VnetHdr::parse(&scratch[..n])
            .is_some_and(|hdr| split(&hdr, &mut scratch[VNET_HDR_LEN..n], &mut push).is_ok());
        if !split_ok {
            dev.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
        }
        // One super-packet's segments are one run; only its last ends it.
        if let Some((_, run)) = out[first..].split_last_mut() {
            run.iter_mut().for_each(|p| p.ends_run = false);
        }
    }
    // One clock read per batch: the reads of one batch take microseconds, the
    // sojourns it measures (`tx_flush`) milliseconds.
    let now = dev.wall().as_nanos() as u64;
    for p in out.iter_mut() {
        p.arrival_ns = now;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fq_codel::QueuePolicy;
    use crate::ports::TunPort;
    use crate::sockets::Sockets;
    use std::collections::VecDeque;
    use std::io::IoSlice;
    use std::os::fd::RawFd;
    use std::sync::Mutex;

    /// What one read of the scripted TUN returns.
    enum Read {
        /// The kernel's answer to a packet longer than the buffer: its whole length.
        Longer,
        Error(i32),
        Packet(Vec<u8>),
    }

    struct ScriptedTun(Mutex<VecDeque<Read>>);

    impl TunPort for ScriptedTun {
        fn fd(&self) -> RawFd {
            -1
        }
        fn read(&self, _: usize, buf: &mut [u8]) -> io::Result<usize> {
            match self.0.lock().unwrap().pop_front() {
                None => Err(io::ErrorKind::WouldBlock.into()),
                Some(Read::Longer) => Ok(buf.len() + 100),
                Some(Read::Error(e)) => Err(io::Error::from_raw_os_error(e)),
                Some(Read::Packet(p)) => {
                    buf[..p.len()].copy_from_slice(&p);
                    Ok(p.len())
                }
            }
        }
        fn write_pieces(&self, _: usize, _: &[IoSlice<'_>]) -> io::Result<usize> {
            Ok(0)
        }
        fn write_packet(&self, p: &[u8]) -> io::Result<usize> {
            Ok(p.len())
        }
        fn has_vnet_hdr(&self) -> bool {
            false
        }
        fn has_uso(&self) -> bool {
            false
        }
        fn name(&self) -> String {
            "wl-scripted".into()
        }
    }

    /// A packet longer than the buffer and one the kernel could not describe are each
    /// one dropped packet, not a panic (the reported length past the buffer) or the
    /// end of the interface (EINVAL); the packets around them are read. A read error
    /// with nothing read yet is the device gone.
    #[test]
    fn an_overlong_or_undescribable_packet_is_one_drop() {
        let packet = vec![0x45u8; 60];
        let script = [
            Read::Packet(packet.clone()),
            Read::Longer,
            Read::Error(libc::EINVAL),
            Read::Packet(packet.clone()),
        ];
        let tun = ScriptedTun(Mutex::new(script.into_iter().collect()));
        let sockets = Sockets::bind(0, 0).unwrap();
        let iface = Interface::new(Box::new(tun), sockets, QueuePolicy::default()).unwrap();
        let mut scratch = vec![0u8; 2048];
        let mut out = Vec::new();
        read_batch(&iface, 0, &mut scratch, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|p| p.plaintext() == packet.as_slice()));
        assert_eq!(iface.stats.total(|c| &c.tx_dropped), 2);

        let gone = ScriptedTun(Mutex::new([Read::Error(libc::EBADFD)].into()));
        let sockets = Sockets::bind(0, 0).unwrap();
        let iface = Interface::new(Box::new(gone), sockets, QueuePolicy::default()).unwrap();
        assert!(read_batch(&iface, 0, &mut scratch, &mut Vec::new()).is_err());
    }
}
