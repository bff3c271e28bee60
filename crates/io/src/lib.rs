//! Platform I/O only: the TUN device, UDP sockets, and a wakeable poll. Nothing here
//! knows about peers, keys or WireGuard messages.

pub mod memory;
pub mod netlink;
pub mod offload;
pub mod poll;
pub mod region;
pub mod tun;
pub mod udp;

use std::io;

/// Converts a libc return value into an `io::Result`.
pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub(crate) fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}
