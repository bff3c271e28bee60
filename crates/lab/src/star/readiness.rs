//! Readiness over many UDP sockets, as the emulated peers receive: one epoll set, each
//! socket registered with its index as the token, polled without waiting in the
//! timed phase (see `Generator::receive` for why).
//!
//! The send floor receives through the same set so that the kernel's work per
//! delivered datagram, which on a veth runs in the sender's system call, is the same
//! in both: each socket on an epoll set has the set's callback on its wait queue, and
//! a datagram that lands on an empty receive queue runs it.

use crate::Result;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Ready sockets one poll reports at most.
pub const MAX_EVENTS: usize = 256;

pub struct Readiness {
    epoll: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl Readiness {
    /// An empty set that reports up to [`MAX_EVENTS`] ready sockets per poll.
    pub fn new() -> Result<Readiness> {
        // SAFETY: epoll_create1 has no memory preconditions; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(format!("epoll_create1: {}", std::io::Error::last_os_error()).into());
        }
        Ok(Readiness {
            // SAFETY: fd is a fresh descriptor we own.
            epoll: unsafe { OwnedFd::from_raw_fd(fd) },
            events: vec![libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS],
        })
    }

    /// Watches `fd` for input; a poll reports it as `token`.
    pub fn watch(&self, fd: RawFd, token: usize) -> Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token as u64,
        };
        // SAFETY: both descriptors are open; ev is a valid event for the call.
        if unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0
        {
            return Err(format!("epoll_ctl: {}", std::io::Error::last_os_error()).into());
        }
        Ok(())
    }

    /// Waits up to `timeout_ms` (0: not at all) and returns the tokens of the sockets
    /// that have input; an interrupted wait returns none.
    pub fn poll(&mut self, timeout_ms: i32) -> Result<impl Iterator<Item = usize> + '_> {
        // SAFETY: events is a valid buffer of its length for the call.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as i32,
                timeout_ms,
            )
        };
        let n = if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("epoll_wait: {e}").into());
            }
            0
        } else {
            n as usize
        };
        Ok(self.events[..n].iter().map(|ev| ev.u64 as usize))
    }
}
