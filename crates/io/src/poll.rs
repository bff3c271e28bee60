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

/// Readiness over many descriptors at once (epoll, level-triggered): one thread waits
/// for whichever is readable, each known by the token it was added with. A descriptor
/// stays ready while it holds data, so a waiter that reads one batch per readiness
/// serves every ready descriptor in turn.
pub struct ReadySet {
    fd: OwnedFd,
}

/// Ready tokens one [`ReadySet::wait`] reports at most.
pub const READY_MAX: usize = 64;

impl ReadySet {
    pub fn new() -> io::Result<ReadySet> {
        // SAFETY: epoll_create1 has no memory-safety preconditions; checked by cvt.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: a fresh descriptor we exclusively own.
        Ok(ReadySet {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Watches `fd` for input, reported as `token`. The caller keeps `fd` open until
    /// it removes it (or drops the set).
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: `ev` is a valid epoll_event for the call's duration.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })?;
        Ok(())
    }

    /// Stops watching `fd`.
    pub fn remove(&self, fd: RawFd) -> io::Result<()> {
        // SAFETY: EPOLL_CTL_DEL ignores the event argument (null is allowed since 2.6.9).
        let r = unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
        cvt(r)?;
        Ok(())
    }

    /// Waits up to `timeout_ms` (-1: forever) and puts the ready tokens in `tokens`
    /// (cleared first; at most [`READY_MAX`]). An interrupted wait reports none.
    pub fn wait(&self, tokens: &mut Vec<u64>, timeout_ms: i32) -> io::Result<()> {
        tokens.clear();
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; READY_MAX];
        // SAFETY: `events` holds READY_MAX valid entries for the kernel to fill.
        let r = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr(),
                READY_MAX as i32,
                timeout_ms,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::Interrupted => Ok(()),
                _ => Err(e),
            };
        }
        tokens.extend(events[..r as usize].iter().map(|e| e.u64));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_set_reports_the_tokens_of_readable_descriptors_until_removed() {
        let set = ReadySet::new().unwrap();
        let (a, b) = (Waker::new().unwrap(), Waker::new().unwrap());
        set.add(a.fd(), 7).unwrap();
        set.add(b.fd(), 9).unwrap();
        let mut tokens = Vec::new();
        set.wait(&mut tokens, 0).unwrap();
        assert!(tokens.is_empty());
        b.wake();
        set.wait(&mut tokens, 1000).unwrap();
        assert_eq!(tokens, [9]);
        // Level-triggered: still readable, still reported.
        a.wake();
        set.wait(&mut tokens, 1000).unwrap();
        tokens.sort_unstable();
        assert_eq!(tokens, [7, 9]);
        set.remove(b.fd()).unwrap();
        set.wait(&mut tokens, 0).unwrap();
        assert_eq!(tokens, [7]);
        // Bad input: a descriptor never added, or added twice, is an error.
        assert!(set.remove(b.fd()).is_err());
        assert!(set.add(a.fd(), 8).is_err());
    }
}
