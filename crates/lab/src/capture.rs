//! `wirelane-lab capture`: real traffic, written out as seed inputs for the fuzz targets
//! in `fuzz/`.
//!
//! For each implementation it builds a pair-router testbed, records the outer datagrams
//! at the relay (handshake and transport data, both directions) and the inner packets
//! at host A's tunnel interface through an AF_PACKET socket with PACKET_VNET_HDR (raw:
//! a TUN has no link header), which
//! delivers them with the same virtio-net header a TUN read carries (TSO super-packets
//! included). The published protocol vectors are added as framed messages.
//!
//! Seed formats follow each target's input layout (see `fuzz/fuzz_targets/*.rs`).

use crate::impls::{Impl, Tunnel};
use crate::relay::Impairment;
use crate::topology::{Testbed, Topology};
use crate::workload::{in_ns, join, tcp, udp};
use crate::Result;
use std::path::Path;
use std::time::{Duration, Instant};

/// Inner packets kept per implementation; super-packets are large, so few of them.
const MAX_INNER: usize = 120;
const MAX_SUPER: usize = 12;
/// Outer datagrams recorded per implementation.
const MAX_OUTER: usize = 160;

/// How many seeds were written per target.
#[derive(Debug, Default)]
pub struct Written {
    pub udp_datagram: usize,
    pub handshake: usize,
    pub offload: usize,
    pub inner_ip: usize,
}

fn write_seed(dir: &Path, target: &str, name: &str, bytes: &[u8]) -> Result<()> {
    let d = dir.join(target);
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join(name), bytes)?;
    Ok(())
}

/// The `udp_datagram` script for delivering one datagram: op 0 (to endpoint `to`),
/// a 2-byte little-endian length, the bytes.
pub fn datagram_op(to: u8, bytes: &[u8]) -> Vec<u8> {
    let n = bytes.len().min(u16::MAX as usize);
    let mut v = vec![to & 1];
    v.extend_from_slice(&(n as u16).to_le_bytes());
    v.extend_from_slice(&bytes[..n]);
    v
}

/// Reads packets from `ifname` with their virtio-net header until `limit` packets or
/// `until`. Runs in the calling thread's namespace.
fn capture_inner(ifname: &str, limit: usize, until: Instant) -> Result<Vec<Vec<u8>>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let cname = std::ffi::CString::new(ifname)?;
    // SAFETY: plain socket/setsockopt/bind calls with valid, local arguments; the
    // descriptor is owned by `fd` from here on.
    let fd = unsafe {
        let raw = libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            (libc::ETH_P_ALL as u16).to_be() as i32,
        );
        if raw < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        OwnedFd::from_raw_fd(raw)
    };
    let on: libc::c_int = 1;
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 200_000,
    };
    // SAFETY: valid fd and option buffers of the sizes given.
    let ok = unsafe {
        let ifindex = libc::if_nametoindex(cname.as_ptr());
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        ifindex != 0
            && libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_VNET_HDR,
                &on as *const _ as *const libc::c_void,
                std::mem::size_of_val(&on) as u32,
            ) == 0
            && libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of_val(&tv) as u32,
            ) == 0
            && libc::bind(
                fd.as_raw_fd(),
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of_val(&sll) as u32,
            ) == 0
    };
    if !ok {
        return Err(format!(
            "cannot capture on {ifname}: {}",
            std::io::Error::last_os_error()
        )
        .into());
    }
    let mut out = Vec::new();
    let mut supers = 0;
    let mut buf = vec![0u8; 65536 + 10];
    while out.len() < limit && Instant::now() < until {
        // SAFETY: buf is valid for buf.len() bytes.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
            )
        };
        if n <= 10 {
            continue; // timeout or an empty frame
        }
        let n = n as usize;
        if n > 2000 {
            if supers >= MAX_SUPER {
                continue;
            }
            supers += 1;
        }
        out.push(buf[..n].to_vec());
    }
    Ok(out)
}

/// Runs traffic through `which` and writes its seeds.
fn capture_one(which: Impl, out: &Path, w: &mut Written) -> Result<()> {
    let bed = Testbed::build(Topology::PairRouter, Impairment::default())?;
    let relay = bed.relay.as_ref().ok_or("pair-router has a relay")?;
    relay.record(MAX_OUTER);
    let tun = Tunnel::up(which, &bed)?;
    let (a, b) = (bed.hosts[0].ns.name.clone(), bed.hosts[1].ns.name.clone());
    let ifname = tun.daemons[0].ifname.clone();
    let until = Instant::now() + Duration::from_secs(4);
    let sniffer = in_ns(&a, move || capture_inner(&ifname, MAX_INNER, until));
    std::thread::sleep(Duration::from_millis(100));
    udp::stream(
        &a,
        &b,
        tun.addr_b,
        200,
        Some(200),
        Duration::from_millis(300),
    )?;
    tcp::bulk(&a, &b, tun.addr_b, 1, Duration::from_millis(700))?;
    tcp::bulk(&b, &a, tun.addr_a, 1, Duration::from_millis(700))?;
    let inner = join(sniffer)?;
    let tag = which.name();
    for (i, (to_b, d)) in relay.recorded().iter().enumerate() {
        let name = format!("{tag}-{i:03}");
        write_seed(out, "udp_datagram", &name, &datagram_op(u8::from(*to_b), d))?;
        w.udp_datagram += 1;
        if d.first().is_some_and(|&t| t != 4) {
            write_seed(out, "handshake", &name, d)?;
            w.handshake += 1;
        }
    }
    for (i, p) in inner.iter().enumerate() {
        let name = format!("{tag}-{i:03}");
        write_seed(out, "offload", &name, &[&[0u8][..], p].concat())?;
        write_seed(out, "inner_ip", &name, &p[10..])?;
        w.offload += 1;
        w.inner_ip += 1;
    }
    // Runs of consecutive small packets become coalesce inputs (mode 1).
    for (i, run) in inner
        .iter()
        .filter(|p| p.len() <= 2000)
        .collect::<Vec<_>>()
        .chunks(8)
        .enumerate()
    {
        let mut seed = vec![1u8];
        for p in run {
            seed.extend_from_slice(&((p.len() - 10) as u16).to_le_bytes());
            seed.extend_from_slice(&p[10..]);
        }
        write_seed(out, "offload", &format!("{tag}-run{i:03}"), &seed)?;
        w.offload += 1;
    }
    Ok(())
}

/// Frames the Noise IKpsk2 vector's messages as WireGuard messages: message 0 as an
/// initiation, message 1 as a response, the rest as transport data.
fn vector_seeds(vectors: &Path, out: &Path, w: &mut Written) -> Result<()> {
    let text = std::fs::read_to_string(vectors.join("noise_ikpsk2.txt"))?;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(" = ") else {
            continue;
        };
        let Some(n) = k
            .strip_prefix("msg")
            .and_then(|k| k.strip_suffix("_ciphertext"))
        else {
            continue;
        };
        let n: usize = n.parse()?;
        let body: Vec<u8> = (0..v.len() / 2)
            .map(|i| u8::from_str_radix(&v[2 * i..2 * i + 2], 16))
            .collect::<std::result::Result<_, _>>()?;
        let (ty, len, head) = match n {
            0 => (1u8, 148, 8),
            1 => (2, 92, 12),
            _ => (4, 16 + body.len(), 16),
        };
        let mut m = vec![0u8; len];
        m[0] = ty;
        let take = body.len().min(len - head);
        m[head..head + take].copy_from_slice(&body[..take]);
        let name = format!("vector-msg{n}");
        write_seed(
            out,
            "udp_datagram",
            &name,
            &datagram_op(u8::from(n.is_multiple_of(2)), &m),
        )?;
        w.udp_datagram += 1;
        if ty != 4 {
            write_seed(out, "handshake", &name, &m)?;
            w.handshake += 1;
        }
    }
    Ok(())
}

/// Writes seeds for every available implementation in `impls` into `out/<target>/`.
pub fn run(impls: &[Impl], vectors: Option<&Path>, out: &Path) -> Result<Written> {
    let mut w = Written::default();
    for &which in impls {
        if which == Impl::None {
            return Err("capture needs a tunnel; 'none' has no tunnel traffic to capture".into());
        }
        which.available()?;
        capture_one(which, out, &mut w)?;
    }
    if let Some(v) = vectors {
        vector_seeds(v, out, &mut w)?;
    }
    Ok(w)
}
