//! The TUN device against the kernel: packets routed to it are read back as sent, and
//! packets written to it are delivered to a local socket, with and without the
//! virtio-net header. Also the path `scripts/sanitize.sh` runs under AddressSanitizer.
//!
//! Each case runs on a thread that first moves into a network namespace of its own
//! (network namespaces are per thread), so the interface and its addresses exist
//! nowhere else and disappear with the thread.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};
use wirelane_io::offload::VNET_HDR_LEN;
use wirelane_io::tun::Tun;

const ME: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const OTHER: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);

/// Runs `ip ARGS` in the calling thread's network namespace.
fn ip_here(args: &str) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // Not /proc/self: that would be nsenter's own.
    let ns = format!("/proc/{}/task/{tid}/ns/net", std::process::id());
    let st = Command::new("nsenter")
        .arg(format!("--net={ns}"))
        .arg("ip")
        .args(args.split_whitespace())
        .status()
        .expect("nsenter runs");
    assert!(st.success(), "ip {args}");
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4/UDP packet from OTHER:9999 to ME:`port` (UDP checksum 0: none, allowed on
/// IPv4).
fn udp_packet(port: u16, payload: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&OTHER.octets());
    p[16..20].copy_from_slice(&ME.octets());
    let c = checksum(&p[..20]);
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p[20..22].copy_from_slice(&9999u16.to_be_bytes());
    p[22..24].copy_from_slice(&port.to_be_bytes());
    p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p[28..].copy_from_slice(payload);
    p
}

fn roundtrip(offloads: bool) {
    // SAFETY: moves only this thread into a new network namespace.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    let tun = Tun::create("wltest0", offloads).expect("TUN created");
    assert_eq!(tun.mtu().unwrap(), 1420);
    ip_here("addr add 10.9.0.1/24 dev wltest0");
    ip_here("link set wltest0 up");
    let hdr = if tun.has_vnet_hdr() { VNET_HDR_LEN } else { 0 };

    // Kernel → TUN: a datagram routed to the interface is read back as sent.
    let sock = UdpSocket::bind(SocketAddrV4::new(ME, 0)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let payload = b"wirelane tun read";
    sock.send_to(payload, SocketAddrV4::new(OTHER, 9999))
        .unwrap();
    let mut buf = vec![0u8; 65536 + VNET_HDR_LEN];
    let deadline = Instant::now() + Duration::from_secs(2);
    let pkt = loop {
        assert!(
            Instant::now() < deadline,
            "nothing routed to the TUN was read"
        );
        match tun.read(&mut buf) {
            // Skip what else the kernel sends to a new interface (IPv6 solicitations).
            Ok(n) if n > hdr && buf[hdr] >> 4 == 4 && buf[hdr + 9] == 17 => {
                break buf[hdr..n].to_vec()
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("TUN read: {e}"),
        }
    };
    assert_eq!(&pkt[16..20], &OTHER.octets());
    assert_eq!(&pkt[28..], payload);

    // TUN → kernel: a written packet reaches the socket it is addressed to.
    let port = sock.local_addr().unwrap().port();
    let mut out = vec![0u8; hdr]; // an all-zero header: no offload requested
    out.extend_from_slice(&udp_packet(port, b"wirelane tun write"));
    assert_eq!(tun.write(&out).unwrap(), out.len());
    let mut got = [0u8; 64];
    let (n, from) = sock.recv_from(&mut got).expect("written packet delivered");
    assert_eq!(&got[..n], b"wirelane tun write");
    assert_eq!(from, SocketAddrV4::new(OTHER, 9999).into());

    // A malformed write is refused by the kernel, not delivered, and nothing breaks.
    let _ = tun.write(&vec![0xffu8; hdr + 3]);
    assert!(tun.write(&out).is_ok());
}

#[test]
fn roundtrip_with_vnet_header() {
    std::thread::spawn(|| roundtrip(true)).join().unwrap();
}

#[test]
fn roundtrip_plain() {
    std::thread::spawn(|| roundtrip(false)).join().unwrap();
}
