//! Stage TX-1, tun read. Input: the TUN device. Output: a vector of plaintext packets
//! in the order the kernel handed them to us. Runs on one reader at a time per queue.

use crate::device::Device;
use crate::packet::{Packet, MAX_BATCH};
use std::io;

/// Reads up to [`MAX_BATCH`] packets without blocking. An empty result means the TUN
/// had nothing queued; an error other than `WouldBlock` means the TUN is gone.
pub fn read_batch(dev: &Device) -> io::Result<Vec<Packet>> {
    let mut out = Vec::new();
    let cap = dev.mtu().max(576);
    while out.len() < MAX_BATCH {
        let mut p = Packet::with_capacity(cap);
        let room = crate::packet::HEADROOM..crate::packet::HEADROOM + cap;
        match dev.tun.read(&mut p.buf[room]) {
            Ok(0) => break,
            Ok(n) => {
                p.len = n;
                out.push(p);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                if out.is_empty() {
                    return Err(e);
                }
                break;
            }
        }
    }
    Ok(out)
}
