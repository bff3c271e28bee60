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
            Ok(n) if n == scratch.len() => {
                dev.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
                continue; // truncated (see SCRATCH_LEN)
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
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
