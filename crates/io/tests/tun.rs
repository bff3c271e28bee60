//! The TUN device against the kernel: packets routed to it are read back as sent, and
//! packets written to it are delivered to a local socket, with and without the
//! virtio-net header. Also the path `scripts/sanitize.sh` runs under AddressSanitizer.
//!
//! Each case runs on a thread that first moves into a network namespace of its own
//! (network namespaces are per thread), so the interface and its addresses exist
//! nowhere else and disappear with the thread.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use wirelane_io::offload::{coalesce, split, VnetHdr, VNET_HDR_LEN};
use wirelane_io::tun::Tun;

mod common;
use common::ip_here;

const ME: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const OTHER: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);

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

/// Moves this thread into a new network namespace and creates `wltest0` there, up,
/// with ME/24; returns it and a UDP socket bound to ME.
fn tun_in_own_namespace(offloads: bool) -> (Tun, UdpSocket) {
    tun_with_queues(offloads, 1)
}

fn tun_with_queues(offloads: bool, queues: usize) -> (Tun, UdpSocket) {
    // SAFETY: moves only this thread into a new network namespace.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    let tun = Tun::create("wltest0", offloads, queues).expect("TUN created");
    assert_eq!(tun.mtu().unwrap(), 1420);
    ip_here("addr add 10.9.0.1/24 dev wltest0");
    ip_here("link set wltest0 up");
    let sock = UdpSocket::bind(SocketAddrV4::new(ME, 0)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    (tun, sock)
}

/// Whether `pkt`, after a header of `hdr` bytes, is an IPv4 UDP packet (what else the
/// kernel sends a new interface, IPv6 solicitations, is not).
fn is_ipv4_udp(pkt: &[u8], hdr: usize) -> bool {
    pkt.len() > hdr + 28 && pkt[hdr] >> 4 == 4 && pkt[hdr + 9] == 17
}

/// The first IPv4/UDP packet read from the TUN, with its vnet header if it has one
/// (what else the kernel sends a new interface, IPv6 solicitations, is skipped).
fn read_udp_packet(tun: &Tun) -> Vec<u8> {
    let hdr = if tun.has_vnet_hdr() { VNET_HDR_LEN } else { 0 };
    let mut buf = vec![0u8; 65536 + VNET_HDR_LEN];
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        assert!(
            Instant::now() < deadline,
            "nothing routed to the TUN was read"
        );
        match tun.read(0, &mut buf) {
            Ok(n) if is_ipv4_udp(&buf[..n], hdr) => return buf[..n].to_vec(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("TUN read: {e}"),
        }
    }
}

fn roundtrip(offloads: bool) {
    let (tun, sock) = tun_in_own_namespace(offloads);
    let hdr = if tun.has_vnet_hdr() { VNET_HDR_LEN } else { 0 };

    // Kernel → TUN: a datagram routed to the interface is read back as sent.
    let payload = b"wirelane tun read";
    sock.send_to(payload, SocketAddrV4::new(OTHER, 9999))
        .unwrap();
    let pkt = read_udp_packet(&tun)[hdr..].to_vec();
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

/// A persistent device left with a 12-byte vnet header and TSO by another program:
/// attached to, it gets the 10-byte header it is read with, and the plain fallback
/// clears the offloads (the kernel keeps both across owners).
fn persistent_device_is_reset() {
    // SAFETY: moves only this thread into a new network namespace.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    let ioctl = |fd: i32, op: libc::c_ulong, arg: libc::c_ulong| {
        // SAFETY: each call below passes what its ioctl expects (a value or a pointer).
        assert_eq!(unsafe { libc::ioctl(fd, op as _, arg) }, 0, "ioctl {op:#x}");
    };
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .unwrap();
        // SAFETY: ifreq is plain data.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in req.ifr_name.iter_mut().zip(b"wltest0") {
            *d = *s as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as _;
        let fd = f.as_raw_fd();
        ioctl(
            fd,
            libc::TUNSETIFF as _,
            &mut req as *mut _ as libc::c_ulong,
        );
        let twelve: libc::c_int = 12;
        ioctl(
            fd,
            libc::TUNSETVNETHDRSZ as _,
            &twelve as *const _ as libc::c_ulong,
        );
        ioctl(
            fd,
            libc::TUNSETOFFLOAD as _,
            (libc::TUN_F_CSUM | libc::TUN_F_TSO4) as _,
        );
        ioctl(fd, libc::TUNSETPERSIST as _, 1);
    }
    let hdr_len = |tun: &Tun| {
        let mut len: libc::c_int = 0;
        ioctl(
            tun.fd(),
            libc::TUNGETVNETHDRSZ as _,
            &mut len as *mut _ as libc::c_ulong,
        );
        len as usize
    };
    let tun = Tun::create("wltest0", true, 1).expect("attached");
    assert!(tun.has_vnet_hdr());
    assert_eq!(hdr_len(&tun), VNET_HDR_LEN);
    ip_here("addr add 10.9.0.1/24 dev wltest0");
    ip_here("link set wltest0 up");
    let sock = UdpSocket::bind(SocketAddrV4::new(ME, 0)).unwrap();
    sock.send_to(b"aligned", SocketAddrV4::new(OTHER, 9999))
        .unwrap();
    let pkt = read_udp_packet(&tun);
    assert_eq!(&pkt[VNET_HDR_LEN + 28..], b"aligned");
    drop(tun);
    let tun = Tun::create("wltest0", false, 1).expect("attached without offloads");
    assert!(!tun.has_vnet_hdr());
    ioctl(tun.fd(), libc::TUNSETPERSIST as _, 0);
}

#[test]
fn a_persistent_device_left_otherwise_is_reset() {
    std::thread::spawn(persistent_device_is_reset)
        .join()
        .unwrap();
}

#[test]
fn roundtrip_plain() {
    std::thread::spawn(|| roundtrip(false)).join().unwrap();
}

/// A multi-queue device: the kernel spreads flows over its queues, each packet is read
/// from exactly one, and a flow written through a queue is read back from that queue.
fn multi_queue() {
    let (tun, sock) = tun_with_queues(true, 2);
    assert_eq!(tun.queues(), 2);
    let hdr = VNET_HDR_LEN;
    // 64 flows (source ports): all on one queue would be a 1 in 2^63 hash.
    let socks: Vec<UdpSocket> = (0..64)
        .map(|_| UdpSocket::bind(SocketAddrV4::new(ME, 0)).unwrap())
        .collect();
    for s in &socks {
        s.send_to(b"spread", SocketAddrV4::new(OTHER, 9999))
            .unwrap();
    }
    let mut per_queue = [0usize; 2];
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut buf = vec![0u8; 65536 + hdr];
    while per_queue.iter().sum::<usize>() < socks.len() && Instant::now() < deadline {
        for (q, n) in per_queue.iter_mut().enumerate() {
            match tun.read(q, &mut buf) {
                Ok(len) if is_ipv4_udp(&buf[..len], hdr) => *n += 1,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("TUN read on queue {q}: {e}"),
            }
        }
    }
    assert_eq!(
        per_queue.iter().sum::<usize>(),
        socks.len(),
        "{per_queue:?}"
    );
    assert!(per_queue.iter().all(|&n| n > 0), "{per_queue:?}");

    // A flow written through a queue (its reply path) is read from that queue: the
    // kernel learns the queue from the write, its flow hash being symmetric.
    let port = sock.local_addr().unwrap().port();
    let mut reply = vec![0u8; hdr];
    reply.extend_from_slice(&udp_packet(port, b"reply"));
    let mut got = [0u8; 64];
    for q in [1, 0, 1] {
        tun.write_pieces(q, &[std::io::IoSlice::new(&reply)])
            .unwrap();
        let (n, _) = sock.recv_from(&mut got).expect("written packet delivered");
        assert_eq!(&got[..n], b"reply");
        sock.send_to(b"back", SocketAddrV4::new(OTHER, 9999))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        let read_on = loop {
            assert!(Instant::now() < deadline, "the answer was not read");
            let hit = (0..2).find(|&r| {
                matches!(tun.read(r, &mut buf),
                    Ok(len) if is_ipv4_udp(&buf[..len], hdr) && buf[len - 4..len] == *b"back")
            });
            match hit {
                Some(r) => break r,
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        };
        assert_eq!(read_on, q, "the answer to a write through queue {q}");
    }
}

#[test]
fn multi_queue_spreads_flows() {
    std::thread::spawn(multi_queue).join().unwrap();
}

/// UDP segmentation offload both ways, where the kernel has it (6.2 and later): an
/// application's `UDP_SEGMENT` send is read as one super-packet that splits into the
/// datagrams it carried, and datagrams coalesced into one write reach the socket one by
/// one, checksums and all.
fn uso_both_ways() {
    let (tun, sock) = tun_in_own_namespace(true);
    if !tun.has_uso() {
        eprintln!("this kernel has no TUN USO; nothing to test");
        return;
    }
    let seg: libc::c_int = 1000;
    // SAFETY: sets an int option on a socket we own; the pointer is valid for the call.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            (&seg as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "UDP_SEGMENT");
    let payload: Vec<u8> = (0..2500u32).map(|i| (i * 7 % 251) as u8).collect();
    sock.send_to(&payload, SocketAddrV4::new(OTHER, 9999))
        .unwrap();
    let pkt = read_udp_packet(&tun);
    let hdr = VnetHdr::parse(&pkt).unwrap();
    assert_eq!(
        (hdr.gso_type, hdr.gso_size),
        (5, 1000),
        "a UDP super-packet"
    );
    let mut datagrams = Vec::new();
    split(&hdr, &mut pkt[VNET_HDR_LEN..].to_vec(), |h, d| {
        datagrams.push([h, d].concat())
    })
    .unwrap();
    let sizes: Vec<usize> = datagrams.iter().map(|d| d.len() - 28).collect();
    assert_eq!(sizes, [1000, 1000, 500]);
    let carried: Vec<u8> = datagrams.iter().flat_map(|d| d[28..].to_vec()).collect();
    assert_eq!(carried, payload);

    // The other way: the same datagrams, readdressed to our socket, in one write.
    let port = sock.local_addr().unwrap().port();
    let to_us: Vec<Vec<u8>> = datagrams
        .iter()
        .map(|d| udp_packet(port, &d[28..]))
        .collect();
    let refs: Vec<&[u8]> = to_us.iter().map(Vec::as_slice).collect();
    let mut writes = 0;
    coalesce(&refs, &mut Vec::new(), true, |pieces, _| {
        writes += 1;
        tun.write_pieces(0, pieces)
            .expect("the kernel takes the UDP super-packet");
    });
    assert_eq!(writes, 1);
    let mut got = vec![0u8; 4096];
    for d in &datagrams {
        let (n, from) = sock.recv_from(&mut got).expect("each datagram delivered");
        assert_eq!(&got[..n], &d[28..]);
        assert_eq!(from, SocketAddrV4::new(OTHER, 9999).into());
    }
}

#[test]
fn udp_segmentation_offload_both_ways() {
    std::thread::spawn(uso_both_ways).join().unwrap();
}
