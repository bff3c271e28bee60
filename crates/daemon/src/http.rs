//! The metrics endpoint's HTTP server: `GET /metrics` and nothing else, on threads of
//! its own, bounded in memory and time so that no client can hold it.
//!
//! Flow: the `wl-metrics` thread accepts; each connection gets a `wl-metrics-conn`
//! thread (at most [`MAX_CONNECTIONS`] at once; past that, a 503 and close) that reads
//! one request head of at most [`MAX_HEAD`] bytes within [`READ_DEADLINE`], answers it
//! (the client has `WRITE_DEADLINE` to take the answer) and closes. Only the answer's
//! body is built per request, by the `render` function the server was given; no lock
//! of the data path is held while it formats.
//!
//! Answers: 200 for `GET /metrics` (a query string is ignored), 405 for another method
//! on `/metrics`, 404 for any other path, 400 for a request that is not HTTP/1.x, 431
//! for a head over the limit, and nothing (the connection closes) for a client that
//! does not finish its request in time.
//!
//! Stopping: [`MetricsServer::stop`] shuts the listening socket down, which wakes the
//! blocked `accept` with an error; connection threads end by their own deadlines.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::places::{Place, Places};
use crate::timed::Timed;

/// Connections served at once, each with a thread of its own; Prometheus needs one per
/// scrape. Places are taken before the request arrives, so a client that opens
/// connections and sends nothing holds one for the read deadline: sixteen, not a
/// handful, so that a few idle connections (a port scan, a stalled proxy) leave room
/// for the scrapes, at sixteen small threads at most.
pub const MAX_CONNECTIONS: usize = 16;
/// Longest request head (request line and headers) read.
pub const MAX_HEAD: usize = 8 << 10;
/// Time a client has to send its request head, whatever its pace.
pub const READ_DEADLINE: Duration = Duration::from_secs(5);
/// Time a client has to take the whole answer, whatever its pace: a timeout per write
/// alone let a client that read a little every few seconds keep its place for as long
/// as a large answer (a thousand peers' series) lasted.
const WRITE_DEADLINE: Duration = Duration::from_secs(30);

/// The body of a `GET /metrics`.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

pub struct MetricsServer {
    listener: Arc<TcpListener>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves `listener` (bound before privileges are dropped: a port below 1024
    /// needs them) on a thread of its own until [`stop`](Self::stop).
    pub fn start(listener: TcpListener, render: Render) -> io::Result<MetricsServer> {
        let listener = Arc::new(listener);
        let stopping = Arc::new(AtomicBool::new(false));
        let (l, s) = (listener.clone(), stopping.clone());
        let thread = std::thread::Builder::new()
            .name("wl-metrics".into())
            .spawn(move || accept_loop(&l, &s, render))?;
        Ok(MetricsServer {
            listener,
            stopping,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // SAFETY: shutdown on a descriptor the listener owns for as long as we hold it.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: &TcpListener, stopping: &AtomicBool, render: Render) {
    let places = Places::new(MAX_CONNECTIONS);
    loop {
        let accepted = listener.accept();
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was taken: wait
                // a moment rather than spin on an error that persists.
                tracing::debug!(error = %e, "metrics: accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Some(place) = places.take() else {
            // Answered from the accepting thread, so it may hold that thread 100 ms at most.
            let busy = Duration::from_millis(100);
            let out = Timed::new(&stream, busy, busy);
            let _ = respond(out, 503, "Service Unavailable", &[], "busy\n");
            // Closed with the request unread, the socket would send a reset, which
            // may reach the client before the 503 does: end our side, then take what
            // the client sent, 50 ms at most, and close on an empty queue.
            let _ = stream.shutdown(Shutdown::Write);
            drain(&stream, Duration::from_millis(50));
            continue;
        };
        let render = render.clone();
        let spawned = std::thread::Builder::new()
            .name("wl-metrics-conn".into())
            .spawn(move || serve(stream, &render, place));
        if let Err(e) = spawned {
            // The closure, place and stream drop with the error: the place is given back.
            tracing::warn!(error = %e, "metrics: cannot start a connection thread");
        }
    }
}

/// Reads and drops what the client sent, until it closes, [`MAX_HEAD`] bytes, or `wait`.
fn drain(stream: &TcpStream, wait: Duration) {
    let mut pending = Timed::new(stream, wait, wait).take(MAX_HEAD as u64);
    let _ = io::copy(&mut pending, &mut io::sink());
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    Metrics,
    /// HEAD /metrics: the answer's head alone (RFC 9110 §9.3.2), for health checks.
    MetricsHead,
    WrongMethod,
    NotFound,
    BadRequest,
}

/// Parses a request head's first line.
pub fn parse_request_line(head: &[u8]) -> Request {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let Ok(line) = std::str::from_utf8(line) else {
        return Request::BadRequest;
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Request::BadRequest;
    };
    let token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphabetic());
    // The absolute form (`http://host:port/metrics`), which a server must accept (RFC
    // 9112 §3.2.2): the path is what follows the authority.
    let target = match target.strip_prefix("http://") {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    if !token(method) || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Request::BadRequest;
    }
    let path = target.split('?').next().unwrap_or_default();
    match (method, path) {
        ("GET", "/metrics") => Request::Metrics,
        ("HEAD", "/metrics") => Request::MetricsHead,
        (_, "/metrics") => Request::WrongMethod,
        _ => Request::NotFound,
    }
}

/// Reads a request head: Ok(Some(len)) once a blank line ends it, Ok(None) when it
/// outgrows [`MAX_HEAD`], Err when the client closes or the deadline passes.
fn read_head(mut stream: &TcpStream, buf: &mut Vec<u8>) -> io::Result<Option<usize>> {
    let deadline = Instant::now() + READ_DEADLINE;
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(Some(end + 4));
        }
        if let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            return Ok(Some(end + 2));
        }
        if buf.len() >= MAX_HEAD {
            return Ok(None);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        let want = chunk.len().min(MAX_HEAD - buf.len());
        // A signal landing on this thread ends a read that has a timeout with EINTR
        // even under SA_RESTART; that is no reason to drop the client.
        match stream.read(&mut chunk[..want]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Answers one connection, then gives back its place (`place`) and closes it.
fn serve(stream: TcpStream, render: &Render, place: Place) {
    let mut head = Vec::with_capacity(1024);
    let result = match read_head(&stream, &mut head) {
        // An answer to HEAD has the head GET's would, and no body (RFC 9110 §9.3.2).
        Ok(Some(_)) if head.starts_with(b"HEAD ") && !is_metrics_head(&head) => {
            let (code, reason, headers, body) = match parse_request_line(&head) {
                Request::NotFound => (404, "Not Found", &[][..], "only /metrics\n"),
                _ => (400, "Bad Request", &[][..], "bad request\n"),
            };
            let text = answer_head(code, reason, headers, body.len());
            answer(&stream).write_all(text.as_bytes())
        }
        Ok(Some(_)) => match parse_request_line(&head) {
            Request::Metrics => {
                let body = render();
                respond(
                    answer(&stream),
                    200,
                    "OK",
                    &[("Content-Type", prometheus::TEXT_FORMAT)],
                    &body,
                )
            }
            Request::MetricsHead => {
                // The length GET would send, so the head is GET's.
                let body = render();
                let mut out = answer(&stream);
                let text = answer_head(
                    200,
                    "OK",
                    &[("Content-Type", prometheus::TEXT_FORMAT)],
                    body.len(),
                );
                out.write_all(text.as_bytes())
            }
            Request::WrongMethod => respond(
                answer(&stream),
                405,
                "Method Not Allowed",
                &[("Allow", "GET, HEAD")],
                "only GET or HEAD /metrics\n",
            ),
            Request::NotFound => respond(answer(&stream), 404, "Not Found", &[], "only /metrics\n"),
            Request::BadRequest => {
                respond(answer(&stream), 400, "Bad Request", &[], "bad request\n")
            }
        },
        Ok(None) => respond(
            &stream,
            431,
            "Request Header Fields Too Large",
            &[],
            "request head too large\n",
        ),
        // Too slow, or gone: nothing to answer.
        Err(_) => Ok(()),
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "metrics: answer not delivered");
    }
    // Race: the place goes back before the shutdown that ends the client's read, so a
    // client that has read its whole answer holds no place any more. The other order
    // left a window in which a scraper that reconnects at once (or the next of a
    // test's clients) found the place still taken and got a 503.
    drop(place);
    // Closed with input unread (a request's body, a pipelined request, the rest of a
    // head past its bound), the socket would send a reset, which can discard the
    // answer's tail before the client reads it: end our side, take what the client
    // still sends (bounded in bytes and time), then close.
    let _ = stream.shutdown(Shutdown::Write);
    drain(&stream, Duration::from_millis(100));
}

/// Whether `head` asks HEAD /metrics, which `serve` answers with GET's head.
fn is_metrics_head(head: &[u8]) -> bool {
    parse_request_line(head) == Request::MetricsHead
}

/// The writer of an answer on `stream`: the client has [`WRITE_DEADLINE`] to take it.
fn answer(stream: &TcpStream) -> Timed<&TcpStream> {
    Timed::new(stream, WRITE_DEADLINE, WRITE_DEADLINE)
}

fn respond(
    mut out: impl Write,
    code: u16,
    reason: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> io::Result<()> {
    out.write_all(answer_head(code, reason, headers, body.len()).as_bytes())?;
    out.write_all(body.as_bytes())
}

/// An answer's head, for a body of `len` bytes.
fn answer_head(code: u16, reason: &str, headers: &[(&str, &str)], len: usize) -> String {
    let mut head =
        format!("HTTP/1.1 {code} {reason}\r\nContent-Length: {len}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !headers.iter().any(|(k, _)| *k == "Content-Type") {
        head.push_str("Content-Type: text/plain; charset=utf-8\r\n");
    }
    head.push_str("\r\n");
    head
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_not_taken_by_its_deadline_is_abandoned() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        // A client that never reads: its socket buffers fill and the writes block.
        let _client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let big = vec![b'x'; 64 << 20];
        // As `respond` writes, with a deadline short enough for a test.
        let limit = Duration::from_millis(200);
        let err = Timed::new(&server, limit, limit)
            .write_all(&big)
            .unwrap_err();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{err}"
        );
    }

    #[test]
    fn request_lines() {
        for (line, want) in [
            ("GET /metrics HTTP/1.1\r\n", Request::Metrics),
            ("GET /metrics?x=1 HTTP/1.0\r\n", Request::Metrics),
            ("POST /metrics HTTP/1.1\r\n", Request::WrongMethod),
            ("HEAD /metrics HTTP/1.1\r\n", Request::MetricsHead),
            ("PUT /metrics HTTP/1.1\r\n", Request::WrongMethod),
            ("GET / HTTP/1.1\r\n", Request::NotFound),
            ("GET /metricsx HTTP/1.1\r\n", Request::NotFound),
            ("GET /metrics HTTP/2\r\n", Request::BadRequest),
            ("GET /metrics\r\n", Request::BadRequest),
            ("GET  /metrics HTTP/1.1\r\n", Request::BadRequest),
            ("G\u{e9}T /metrics HTTP/1.1\r\n", Request::BadRequest),
            ("GET metrics HTTP/1.1\r\n", Request::BadRequest),
            (
                "GET http://10.0.0.1:9586/metrics HTTP/1.1\r\n",
                Request::Metrics,
            ),
            ("GET http://h/metrics?x HTTP/1.1\r\n", Request::Metrics),
            ("GET http://h HTTP/1.1\r\n", Request::NotFound),
            ("GET https://h/metrics HTTP/1.1\r\n", Request::BadRequest),
            ("", Request::BadRequest),
        ] {
            assert_eq!(parse_request_line(line.as_bytes()), want, "{line:?}");
        }
        assert_eq!(
            parse_request_line(&[0xff, 0xfe, b'\n']),
            Request::BadRequest
        );
    }
}
