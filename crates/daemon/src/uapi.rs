//! The cross-platform WireGuard UAPI (`get=1` / `set=1` over a Unix socket), as `wg`
//! and wireguard-go speak it.
//!
//! A `set` request is parsed and validated completely before anything is applied, so a
//! bad line anywhere leaves the device untouched. Errors are answered with a negative
//! errno (`errno=-22`), which is how `wg` expects them after `set`, and logged with the
//! offending key.

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;
use wirelane_dataplane::config::{self, ApplyError};
use wirelane_dataplane::sockets::SocketRole;
use wirelane_dataplane::{DeviceSnapshot, DeviceUpdate, Interface, PeerUpdate, Runtime};
use wirelane_proto::{hex_key, parse_hex_key, Prefix};

use crate::timed::Timed;

/// Longest line we accept; the longest legitimate one is a 64-digit key or an endpoint.
const MAX_LINE: usize = 4096;
/// The fewest lines one `set` may hold, whatever the interface's limits: generous for
/// 10^5 peers with several allowed IPs each.
const MAX_LINES: usize = 4_000_000;
/// The fewest bytes one `set` may hold while it is read, counting each line's
/// bookkeeping (`LINE_OVERHEAD`): 10^5 peers with a few allowed IPs each take about
/// 25 MiB.
const MAX_SET_BYTES: usize = 64 << 20;
/// What a kept line costs beside its bytes (a `String`'s header and allocation).
const LINE_OVERHEAD: usize = 32;
/// A peer's lines at their longest, as held: public and preshared keys, an endpoint,
/// a keepalive, `replace_allowed_ips`, `update_only`, `protocol_version`.
const PEER_LINES_BYTES: usize = 640;
/// An `allowed_ip` line at its longest (an IPv6 prefix), as held.
const ALLOWED_IP_LINE_BYTES: usize = 96;

/// How many lines and bytes one `set` may hold while it is read (and, all sets at once,
/// twice the bytes: `SetHeld`): whatever a whole configuration within the interface's
/// own limits takes (`wg setconf` and `syncconf`
/// send every peer in one request, so a configuration the limits admit must fit), and
/// never less than `MAX_LINES` and `MAX_SET_BYTES`. Without a bound a client could make
/// one connection hold any amount of memory before a line was checked.
fn set_bounds(dev: &Interface) -> (usize, usize) {
    let (peers, ips) = (dev.max_peers(), dev.max_allowed_ips());
    let lines = peers.saturating_mul(7).saturating_add(ips);
    let bytes = (peers.saturating_mul(PEER_LINES_BYTES))
        .saturating_add(ips.saturating_mul(ALLOWED_IP_LINE_BYTES));
    (lines.max(MAX_LINES), bytes.max(MAX_SET_BYTES))
}

/// Reads and drops the rest of a `set` past its bound, up to its blank line (`mid_line`:
/// the bound fell inside a line, whose end is no blank line's start): the answer then reaches a client that writes its whole request before
/// it reads (as `wg` does), which would otherwise die of SIGPIPE on the closed
/// connection without printing why. Bytes, not lines: nothing past the bound is
/// checked or kept, however long its lines or whatever their encoding. The request's
/// time limit still bounds how long this reads.
fn discard_rest_of_request(r: &mut impl BufRead, mid_line: bool) {
    let mut at_line_start = !mid_line;
    loop {
        let Ok(chunk) = r.fill_buf() else { return };
        if chunk.is_empty() {
            return;
        }
        for (i, &b) in chunk.iter().enumerate() {
            if b == b'\n' && at_line_start {
                r.consume(i + 1);
                return;
            }
            at_line_start = b == b'\n';
        }
        let n = chunk.len();
        r.consume(n);
    }
}

/// Bytes held by every `set` being read, over all connections (`SetHeld`).
static SET_BYTES_HELD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One request's share of [`SET_BYTES_HELD`], given back when it is dropped. Each
/// request may hold what a whole configuration takes (`set_bounds`), and all of them
/// together twice that: sixteen connections at once must not hold sixteen
/// configurations' worth, and two large sets at once (a pool's tunnels configured
/// together at boot) still fit.
#[derive(Default)]
struct SetHeld(usize);

impl SetHeld {
    /// Takes `n` bytes more; false, taking nothing, if this request would pass `bound`
    /// or all of them together twice `bound`.
    fn take(&mut self, n: usize, bound: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if self.0.saturating_add(n) > bound {
            return false;
        }
        let all = bound.saturating_mul(2);
        let taken = SET_BYTES_HELD.fetch_update(Relaxed, Relaxed, |held| {
            held.checked_add(n).filter(|&h| h <= all)
        });
        if taken.is_err() {
            return false;
        }
        self.0 += n;
        true
    }
}

impl Drop for SetHeld {
    fn drop(&mut self) {
        SET_BYTES_HELD.fetch_sub(self.0, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How long one request may take to arrive and its answer to leave: a client that
/// trickles a byte at a time, or never reads its answer, holds one of the few
/// connection slots no longer than this. A `set` of 10^5 peers arrives in about a
/// second.
const REQUEST_LIMIT: Duration = Duration::from_secs(120);
/// Longest wait for any one read or write within that, and so for the next request.
const IO_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{message}")]
pub struct UapiError {
    /// Positive errno value; sent negated.
    pub errno: i32,
    pub message: String,
}

fn invalid(message: String) -> UapiError {
    UapiError {
        errno: libc::EINVAL,
        message,
    }
}

/// A line without `=` is no request at all: EPROTO, as wireguard-go answers it; a
/// key or value it does not take is EINVAL.
fn key_value(line: &str) -> Result<(&str, &str), UapiError> {
    line.split_once('=').ok_or_else(|| UapiError {
        errno: libc::EPROTO,
        message: format!("line '{line}' is not key=value"),
    })
}

fn parse_key(field: &str, v: &str) -> Result<[u8; 32], UapiError> {
    parse_hex_key(v).ok_or_else(|| invalid(format!("{field}: expected 64 hex digits")))
}

fn parse_true(field: &str, v: &str) -> Result<bool, UapiError> {
    match v {
        "true" => Ok(true),
        _ => Err(invalid(format!(
            "{field}: only 'true' is accepted, got '{v}'"
        ))),
    }
}

fn parse_num<T: std::str::FromStr>(field: &str, v: &str) -> Result<T, UapiError> {
    // Digits only: str::parse would also take a leading '+'.
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(format!("{field}: '{v}' is not a number in range")));
    }
    v.parse()
        .map_err(|_| invalid(format!("{field}: '{v}' is not a number in range")))
}

/// Parses the body of a `set=1` request (the lines after `set=1`, without the blank
/// terminator) into one validated update.
/// `IP:port` or `[IPv6]:port`, where a link-local IPv6 address may name its scope by
/// number or by interface: `wg` prints (and so `wg showconf` writes) the interface's
/// name, as `getnameinfo` gives it, so `[fe80::1%eth0]:51820` must be taken back.
fn parse_endpoint(v: &str) -> Result<SocketAddr, String> {
    if let Ok(ep) = v.parse() {
        return Ok(ep);
    }
    let not_an_endpoint = || format!("'{v}' is not IP:port or [IPv6]:port");
    let (host, port) = v
        .strip_prefix('[')
        .and_then(|rest| rest.split_once("]:"))
        .ok_or_else(not_an_endpoint)?;
    let (addr, zone) = host.split_once('%').ok_or_else(not_an_endpoint)?;
    let addr: std::net::Ipv6Addr = addr.parse().map_err(|_| not_an_endpoint())?;
    let port: u16 = port.parse().map_err(|_| not_an_endpoint())?;
    let scope = match zone.parse::<u32>() {
        Ok(n) => n,
        Err(_) => {
            let name = std::ffi::CString::new(zone).map_err(|_| not_an_endpoint())?;
            // SAFETY: name is a NUL-terminated string that outlives the call.
            match unsafe { libc::if_nametoindex(name.as_ptr()) } {
                0 => return Err(format!("'{v}': no interface named '{zone}'")),
                i => i,
            }
        }
    };
    Ok(std::net::SocketAddrV6::new(addr, port, 0, scope).into())
}

pub fn parse_set<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<DeviceUpdate, UapiError> {
    let mut up = DeviceUpdate::default();
    let mut peer: Option<PeerUpdate> = None;
    for line in lines {
        let (k, v) = key_value(line)?;
        if k == "public_key" {
            up.peers.extend(peer.take());
            peer = Some(PeerUpdate::new(parse_key(k, v)?));
            continue;
        }
        let Some(p) = peer.as_mut() else {
            match k {
                "private_key" => up.private_key = Some(parse_key(k, v)?),
                "listen_port" => up.listen_port = Some(parse_num(k, v)?),
                "fwmark" => up.fwmark = Some(parse_num(k, v)?),
                "replace_peers" => up.replace_peers = parse_true(k, v)?,
                _ => return Err(invalid(format!("unknown device key '{k}'"))),
            }
            continue;
        };
        match k {
            "remove" => p.remove = parse_true(k, v)?,
            "update_only" => p.update_only = parse_true(k, v)?,
            "preshared_key" => p.preshared_key = Some(parse_key(k, v)?),
            "endpoint" => {
                let ep = parse_endpoint(v).map_err(|e| invalid(format!("endpoint: {e}")))?;
                if ep.port() == 0 || ep.ip().is_unspecified() {
                    return Err(invalid(format!("endpoint: '{v}' is not a usable address")));
                }
                p.endpoint = Some(ep);
            }
            "persistent_keepalive_interval" => p.persistent_keepalive = Some(parse_num(k, v)?),
            "replace_allowed_ips" => p.replace_allowed_ips = parse_true(k, v)?,
            "allowed_ip" => {
                let (add, text) = match v.strip_prefix('-') {
                    Some(rest) => (false, rest),
                    None => (true, v),
                };
                let prefix: Prefix = text
                    .parse()
                    .map_err(|e| invalid(format!("allowed_ip: {e}")))?;
                p.allowed_ips.push((prefix, add));
            }
            "protocol_version" => {
                if v != "1" {
                    return Err(invalid(format!(
                        "protocol_version: only 1 is supported, got '{v}'"
                    )));
                }
            }
            _ => return Err(invalid(format!("unknown peer key '{k}'"))),
        }
    }
    up.peers.extend(peer);
    Ok(up)
}

/// Renders the answer to `get=1`, without the final `errno` line.
pub fn format_get(s: &DeviceSnapshot) -> String {
    let mut out = String::with_capacity(256 + s.peers.len() * 400);
    if let Some(k) = s.private_key {
        let _ = writeln!(out, "private_key={}", hex_key(&k));
    }
    if s.listen_port != 0 {
        let _ = writeln!(out, "listen_port={}", s.listen_port);
    }
    if s.fwmark != 0 {
        let _ = writeln!(out, "fwmark={}", s.fwmark);
    }
    for p in &s.peers {
        let _ = writeln!(out, "public_key={}", hex_key(&p.public_key));
        let _ = writeln!(out, "preshared_key={}", hex_key(&p.preshared_key));
        out.push_str("protocol_version=1\n");
        if let Some(ep) = p.endpoint {
            let _ = writeln!(out, "endpoint={ep}");
        }
        let hs = p.last_handshake.unwrap_or(Duration::ZERO);
        let _ = writeln!(out, "last_handshake_time_sec={}", hs.as_secs());
        let _ = writeln!(out, "last_handshake_time_nsec={}", hs.subsec_nanos());
        let _ = writeln!(out, "tx_bytes={}", p.tx_bytes);
        let _ = writeln!(out, "rx_bytes={}", p.rx_bytes);
        let _ = writeln!(
            out,
            "persistent_keepalive_interval={}",
            p.persistent_keepalive
        );
        for a in &p.allowed_ips {
            let _ = writeln!(out, "allowed_ip={a}");
        }
    }
    out
}

/// The `stats=1` answer: every counter of the interface, the handshake gate's live
/// state, then the runtime's: its execution model and each of its threads' busy time
/// and context switches (`thread.NAME.FIELD`), which the interfaces share.
pub fn format_stats(dev: &Interface, rt: &Runtime) -> String {
    let mut out = String::with_capacity(1024);
    for (name, v) in dev.stats.fields() {
        let _ = writeln!(out, "{name}={v}");
    }
    let _ = writeln!(out, "under_load={}", u8::from(dev.under_load()));
    let _ = writeln!(out, "handshake_queue={}", dev.handshake_queue_len());
    let _ = writeln!(out, "ratelimiter_sources={}", dev.ratelimiter_sources());
    for role in SocketRole::ALL {
        let drops = dev.kernel_drops(role);
        let _ = writeln!(out, "{}_socket_drops={drops}", role.name());
    }
    let table = dev.table();
    let staged_max = table.by_id.values().map(|p| p.staged_len()).max();
    let _ = writeln!(out, "peers={}", table.by_id.len());
    let _ = writeln!(out, "staged_max={}", staged_max.unwrap_or(0));
    drop(table);
    let _ = writeln!(out, "queued_items={}", rt.queued_for(dev));
    let _ = writeln!(out, "model={}", rt.model());
    let _ = writeln!(out, "workers={}", rt.workers());
    for t in rt.thread_stats() {
        let n = &t.name;
        let _ = writeln!(out, "thread.{n}.busy_ns={}", t.busy_ns);
        let _ = writeln!(
            out,
            "thread.{n}.voluntary_switches={}",
            t.voluntary_switches
        );
        let _ = writeln!(
            out,
            "thread.{n}.involuntary_switches={}",
            t.involuntary_switches
        );
    }
    out
}

fn apply_errno(e: &ApplyError) -> i32 {
    match e {
        ApplyError::Bind { .. } | ApplyError::Fwmark { .. } => libc::EADDRINUSE,
        // As the kernel answers a peer past its bound: `wg` prints "Cannot allocate
        // memory"; the log says which limit.
        ApplyError::TooManyPeers { .. } | ApplyError::TooManyAllowedIps { .. } => libc::ENOMEM,
    }
}

/// Answers a request that cannot be read on, before the connection closes; returns
/// the error for the log. EMSGSIZE for a line or a request past its bound, EPROTO for
/// a stream that ended inside a line, EINVAL for one that is not UTF-8; a failed read
/// gets no answer.
fn refuse_unreadable(writer: &mut impl Write, e: io::Error) -> io::Error {
    let errno = match e.kind() {
        io::ErrorKind::FileTooLarge => libc::EMSGSIZE,
        io::ErrorKind::UnexpectedEof => libc::EPROTO,
        io::ErrorKind::InvalidData => libc::EINVAL,
        _ => return e,
    };
    let _ = refuse(writer, errno);
    e
}

/// Answers the request in hand with `errno`, applying nothing.
fn refuse(writer: &mut impl Write, errno: i32) -> io::Result<()> {
    writeln!(writer, "errno=-{errno}\n")?;
    writer.flush()
}

/// Reads one line (without the newline); `None` at end of stream.
fn read_line(r: &mut impl BufRead, buf: &mut Vec<u8>) -> io::Result<Option<String>> {
    buf.clear();
    let n = io::Read::take(&mut *r, MAX_LINE as u64 + 1).read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        // Past MAX_LINE bytes, or the stream ended inside the line.
        return Err(if n > MAX_LINE {
            io::Error::new(io::ErrorKind::FileTooLarge, "UAPI line too long")
        } else {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "UAPI stream ended inside a line",
            )
        });
    }
    buf.pop();
    String::from_utf8(std::mem::take(buf))
        .map(Some)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "UAPI line is not UTF-8"))
}

/// Serves requests on one connection until the client closes it or errs.
pub fn serve_connection(stream: UnixStream, dev: &Arc<Interface>, rt: &Runtime) -> io::Result<()> {
    let mut reader = BufReader::new(Timed::new(stream.try_clone()?, REQUEST_LIMIT, IO_WAIT));
    let mut writer = io::BufWriter::new(Timed::new(stream, REQUEST_LIMIT, IO_WAIT));
    let mut buf = Vec::new();
    loop {
        let op = match read_line(&mut reader, &mut buf) {
            Ok(Some(op)) => op,
            Ok(None) => return Ok(()),
            Err(e) => return Err(refuse_unreadable(&mut writer, e)),
        };
        if dev.stopping() {
            return Ok(()); // The tunnel was removed while this connection waited.
        }
        writer.get_mut().restart();
        match op.as_str() {
            "get=1" => {
                // The request ends with a blank line; anything else is a protocol error.
                if read_line(&mut reader, &mut buf)?.as_deref() != Some("") {
                    return refuse(&mut writer, libc::EPROTO);
                }
                writer.write_all(format_get(&dev.snapshot()).as_bytes())?;
                writer.write_all(b"errno=0\n\n")?;
            }
            "stats=1" => {
                // wirelane's own operation (wg never sends it): interface counters.
                if read_line(&mut reader, &mut buf)?.as_deref() != Some("") {
                    return refuse(&mut writer, libc::EPROTO);
                }
                writer.write_all(format_stats(dev, rt).as_bytes())?;
                writer.write_all(b"errno=0\n\n")?;
            }
            "set=1" => {
                let mut lines = Vec::new();
                let mut held = SetHeld::default();
                let (max_lines, max_bytes) = set_bounds(dev);
                loop {
                    match read_line(&mut reader, &mut buf) {
                        // The stream ended inside the request: nothing is applied, and
                        // a client that only shut down its side learns so.
                        Ok(None) => return refuse(&mut writer, libc::EPROTO),
                        Ok(Some(l)) if l.is_empty() => break,
                        Ok(Some(l)) => {
                            let fits = held.take(l.len() + LINE_OVERHEAD, max_bytes);
                            if lines.len() >= max_lines || !fits {
                                drop(lines);
                                drop(held);
                                discard_rest_of_request(&mut reader, false);
                                let e = io::Error::new(
                                    io::ErrorKind::FileTooLarge,
                                    "UAPI request too large",
                                );
                                return Err(refuse_unreadable(&mut writer, e));
                            }
                            lines.push(l);
                        }
                        Err(e) => {
                            // Past a line's bound, or a line not UTF-8: the rest goes
                            // unread into the void, so that the answer is read.
                            drop(lines);
                            drop(held);
                            match e.kind() {
                                io::ErrorKind::FileTooLarge => {
                                    discard_rest_of_request(&mut reader, true)
                                }
                                io::ErrorKind::InvalidData => {
                                    discard_rest_of_request(&mut reader, false)
                                }
                                _ => {}
                            }
                            return Err(refuse_unreadable(&mut writer, e));
                        }
                    }
                }
                let errno = match parse_set(lines.iter().map(String::as_str)) {
                    Err(e) => {
                        tracing::warn!(error = %e, "rejected UAPI set request");
                        e.errno
                    }
                    Ok(update) => match config::apply(rt.ctx(dev), &update) {
                        Ok(()) => 0,
                        Err(e) => {
                            tracing::warn!(error = %e, "UAPI set request failed");
                            apply_errno(&e)
                        }
                    },
                };
                if errno == 0 {
                    writer.write_all(b"errno=0\n\n")?;
                } else {
                    writeln!(writer, "errno=-{errno}\n")?;
                }
            }
            "" => continue,
            other => {
                // Unknown operation: answered once, then the connection is closed (its
                // request's end cannot be known).
                tracing::warn!(operation = other, "unknown UAPI operation");
                return refuse(&mut writer, libc::EINVAL);
            }
        }
        writer.flush()?;
        // The next request has the limit to arrive in, from now.
        reader.get_mut().restart();
    }
}

#[cfg(test)]
#[path = "uapi_tests.rs"]
mod tests;
