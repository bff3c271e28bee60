//! TCP bulk transfer: N streams from a sender namespace to a receiver namespace for a
//! fixed duration. Goodput is what the receivers read; retransmissions come from the
//! senders' TCP_INFO. Senders write one constant byte, so receivers verify every byte
//! they read.

use super::{in_ns, join, port_from};
use crate::Result;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TcpResult {
    pub bytes: u64,
    pub seconds: f64,
    pub goodput_bps: f64,
    pub retransmits: u64,
    /// Bytes read that differ from what the senders wrote.
    #[serde(default)]
    pub corrupt_bytes: u64,
}

/// What every sender writes.
const FILL: u8 = 0x5a;

fn total_retrans(s: &TcpStream) -> u64 {
    // SAFETY: tcp_info is plain data; getsockopt writes at most `len` bytes into it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut info as *mut _ as *mut _,
            &mut len,
        )
    };
    if r == 0 {
        info.tcpi_total_retrans as u64
    } else {
        0
    }
}

/// The seconds a transfer's bytes are divided by: from the first read to the last,
/// but never less than the `dur` the senders were given, so a stream that stalled or
/// ended early shows the rate it achieved over the run, not over the part it ran.
pub(super) fn transfer_secs(first: Option<Instant>, last: Option<Instant>, dur: Duration) -> f64 {
    match (first, last) {
        (Some(f), Some(l)) => (l - f).max(dur).as_secs_f64(),
        _ => dur.as_secs_f64(),
    }
}

/// Runs `streams` parallel connections from `src` to `dst_addr` (in `dst`) for `dur`.
pub fn bulk(
    src: &str,
    dst: &str,
    dst_addr: IpAddr,
    streams: usize,
    dur: Duration,
) -> Result<TcpResult> {
    let (tx, rx) = std::sync::mpsc::channel();
    let deadline = Instant::now() + dur + Duration::from_secs(15);
    let server = in_ns(dst, move || -> Result<(u64, u64, f64)> {
        let l = TcpListener::bind(SocketAddr::new(dst_addr, 0))?;
        tx.send(l.local_addr()?.port())?;
        let mut readers = Vec::new();
        for _ in 0..streams {
            let mut s = super::accept_until(&l, deadline)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            readers.push(super::spawn_counted(
                move || -> (u64, u64, Option<Instant>, Option<Instant>) {
                    let mut buf = vec![0u8; 256 * 1024];
                    let expected = vec![FILL; buf.len()];
                    let (mut total, mut bad, mut first, mut last) = (0u64, 0u64, None, None);
                    while Instant::now() < deadline {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                let now = Instant::now();
                                first.get_or_insert(now);
                                last = Some(now);
                                total += n as u64;
                                // Slice equality is a memcmp, fast at any optimisation
                                // level; a byte loop is not, and in the unoptimised test
                                // build it took enough CPU to lower the figure measured.
                                if buf[..n] != expected[..n] {
                                    bad += buf[..n].iter().filter(|&&b| b != FILL).count() as u64;
                                }
                            }
                        }
                    }
                    (total, bad, first, last)
                },
            ));
        }
        let (mut bytes, mut corrupt) = (0, 0);
        let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
        for r in readers {
            let (b, c, f, l) = r.join().map_err(|_| "reader panicked")?;
            bytes += b;
            corrupt += c;
            first = match (first, f) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            last = match (last, l) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
        let secs = transfer_secs(first, last, dur);
        Ok((bytes, corrupt, secs))
    });
    let port = port_from(&rx)?;
    let client = in_ns(src, move || -> Result<u64> {
        let addr = SocketAddr::new(dst_addr, port);
        let mut writers = Vec::new();
        for _ in 0..streams {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
            s.set_write_timeout(Some(Duration::from_secs(5)))?;
            writers.push(super::spawn_counted(move || -> Result<u64> {
                let buf = vec![FILL; 128 * 1024];
                let end = Instant::now() + dur;
                while Instant::now() < end {
                    // A stream that stalls for the write timeout, or breaks, fails the
                    // run: its figures would describe a tunnel that stopped.
                    s.write_all(&buf)
                        .map_err(|e| format!("TCP stream stopped before its end: {e}"))?;
                }
                let r = total_retrans(&s);
                let _ = s.shutdown(std::net::Shutdown::Write);
                Ok(r)
            }));
        }
        let mut retransmits = 0;
        for w in writers {
            retransmits += w.join().map_err(|_| "writer panicked")??;
        }
        Ok(retransmits)
    });
    let retransmits = join(client)?;
    let (bytes, corrupt_bytes, seconds) = join(server)?;
    Ok(TcpResult {
        bytes,
        seconds,
        goodput_bps: bytes as f64 * 8.0 / seconds,
        retransmits,
        corrupt_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that stopped after 1 s of a 5 s run is divided by the 5 s it was
    /// given, not the 1 s it ran; one that drained past the end keeps its own span.
    #[test]
    fn a_transfer_is_divided_by_at_least_the_run() {
        let t0 = Instant::now();
        let run = Duration::from_secs(5);
        let secs = |a: u64, b: u64| {
            transfer_secs(
                Some(t0 + Duration::from_millis(a)),
                Some(t0 + Duration::from_millis(b)),
                run,
            )
        };
        assert_eq!(secs(0, 1000), 5.0);
        assert_eq!(secs(0, 5200), 5.2);
        assert_eq!(transfer_secs(None, None, run), 5.0);
    }
}
