//! Deadlines for the daemon's connections (the UAPI socket, the pool's control socket,
//! the metrics endpoint's answers): a whole request, or a whole answer, must arrive or
//! leave within a limit, however slowly the client trickles or reads. A timeout per
//! call alone is reset by every byte, so a client sending or taking one byte just
//! inside it could hold a connection, and the thread and slot behind it, for as long
//! as it liked.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A socket whose reads and writes can be given a timeout.
pub trait Timeouts {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()>;
}

impl Timeouts for UnixStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, d)
    }
}

impl Timeouts for TcpStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, d)
    }
}

impl<T: Timeouts + ?Sized> Timeouts for &T {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        (**self).set_read_timeout(d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        (**self).set_write_timeout(d)
    }
}

/// One direction of a connection, with a deadline its reads or writes must meet: each
/// call waits at most until it (and at most `io_wait`), and fails once it has passed.
pub struct Timed<S> {
    stream: S,
    limit: Duration,
    io_wait: Duration,
    deadline: Instant,
}

impl<S> Timed<S> {
    /// `limit` from now to the deadline; no one call waits longer than `io_wait`.
    pub fn new(stream: S, limit: Duration, io_wait: Duration) -> Timed<S> {
        Timed {
            stream,
            limit,
            io_wait,
            deadline: Instant::now() + limit,
        }
    }

    /// Starts the clock again: the next request or answer has the whole limit.
    pub fn restart(&mut self) {
        self.deadline = Instant::now() + self.limit;
    }

    /// What is left before the deadline, at most `io_wait`; an error once none is.
    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request or answer took longer than its limit",
            ));
        }
        Ok(left.min(self.io_wait))
    }
}

impl Timed<UnixStream> {
    /// Ends the writing side (the client reads end of stream after the answer).
    pub fn shutdown_write(&self) -> io::Result<()> {
        self.stream.shutdown(std::net::Shutdown::Write)
    }
}

impl<S: Read + Timeouts> Read for Timed<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        self.stream.read(buf)
    }
}

impl<S: Write + Timeouts> Write for Timed<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(60);

    #[test]
    fn a_connection_past_its_deadline_neither_reads_nor_writes() {
        let (a, mut b) = UnixStream::pair().unwrap();
        b.write_all(b"get=1\n\n").unwrap();
        let mut r = Timed::new(a.try_clone().unwrap(), LIMIT, LIMIT);
        let mut w = Timed::new(a, LIMIT, LIMIT);
        let mut buf = [0u8; 8];
        // Within the limit: data waiting is read.
        assert!(io::Read::read(&mut r, &mut buf).unwrap() > 0);
        r.deadline = Instant::now() - Duration::from_secs(1);
        w.deadline = r.deadline;
        let kind = |e: io::Error| e.kind();
        assert_eq!(
            io::Read::read(&mut r, &mut buf).map_err(kind),
            Err(io::ErrorKind::TimedOut)
        );
        assert_eq!(w.write(b"x").map_err(kind), Err(io::ErrorKind::TimedOut));
        // A restart gives the next request the whole limit again.
        w.restart();
        assert_eq!(w.write(b"x").unwrap(), 1);
    }
}
