//! Waiting for readability with a way out: every blocking reader polls its fd together
//! with a shared eventfd, so shutdown wakes all of them at once.

use crate::cvt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An eventfd that, once signalled, stays readable: a level-triggered shutdown flag.
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions; the fd is checked by cvt.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: fd is a freshly created descriptor we exclusively own.
        Ok(Waker {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own eventfd. Failure (counter
        // overflow) still leaves it readable, which is all we need.
        unsafe { libc::write(self.fd.as_raw_fd(), &one as *const u64 as *const _, 8) };
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Outcome of waiting on one descriptor.
#[derive(Debug, PartialEq, Eq)]
pub enum Ready {
    Readable,
    Woken,
    Timeout,
}

/// Waits until `fd` is readable, the waker fires, or `timeout_ms` passes (-1: forever).
pub fn wait_readable(fd: RawFd, waker: &Waker, timeout_ms: i32) -> io::Result<Ready> {
    wait_readable_any(fd, &[waker], timeout_ms)
}

/// Waits until `fd` is readable, any of `wakers` fires, or `timeout_ms` passes (-1:
/// forever). A negative `fd` waits for the wakers alone.
pub fn wait_readable_any(fd: RawFd, wakers: &[&Waker], timeout_ms: i32) -> io::Result<Ready> {
    const MAX_WAKERS: usize = 3;
    if wakers.len() > MAX_WAKERS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("at most {MAX_WAKERS} wakers can be polled at once"),
        ));
    }
    let entry = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [entry(-1); 1 + MAX_WAKERS];
    fds[0] = entry(fd);
    for (slot, w) in fds[1..].iter_mut().zip(wakers) {
        *slot = entry(w.fd());
    }
    let n = 1 + wakers.len();
    loop {
        // SAFETY: fds is a valid array of at least n pollfd structs for the call's
        // duration; poll ignores the entries whose fd is negative.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, timeout_ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[1..n].iter().any(|f| f.revents != 0) {
            return Ok(Ready::Woken);
        }
        if fds[0].revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            return Ok(Ready::Readable);
        }
        if r == 0 {
            return Ok(Ready::Timeout);
        }
    }
}
