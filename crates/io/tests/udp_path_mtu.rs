//! A segmented send whose segments exceed the destination's path MTU, against the
//! kernel: refused as one send (EMSGSIZE since Linux 6.14, EINVAL before), it must
//! neither lose the datagrams nor switch segmentation offload off for the socket.
//! And outer IPv4 datagrams leave without the Don't Fragment bit, as the kernel's
//! WireGuard sends them, so a narrower path fragments rather than drops them.
//! Each test runs in a network namespace of its own.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use wirelane_io::udp::{RecvBatch, UdpSocket, NOT_ECT};

mod common;
use common::ip_here;

/// Receives until `want` datagrams came or 2 s passed; each coalesced buffer split.
fn receive(sock: &UdpSocket, want: usize) -> Vec<Vec<u8>> {
    let mut batch = RecvBatch::new(8, 65536);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    while got.len() < want && Instant::now() < deadline {
        match sock.recv_batch(&mut batch) {
            Ok(n) => {
                for i in 0..n {
                    let r = batch.datagram(i).unwrap();
                    got.extend(r.datagrams().map(<[u8]>::to_vec));
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    got
}

#[test]
fn a_run_past_the_path_mtu_is_refused_as_one_send_and_the_socket_keeps_gso() {
    // SAFETY: moves only this thread into a new network namespace.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    ip_here("link set lo mtu 1280 up");
    let a = UdpSocket::bind(false, 0).unwrap();
    let b = UdpSocket::bind(false, 0).unwrap();
    let dst = SocketAddr::from(([127, 0, 0, 1], b.local_port().unwrap()));

    // Small segments fit the path: one segmented send, if the kernel has UDP GSO.
    let small: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 500]).collect();
    let refs: Vec<&[u8]> = small.iter().map(Vec::as_slice).collect();
    if !a.send_segmented(&refs, 500, &dst, None, NOT_ECT).unwrap() {
        assert!(!a.gso_enabled());
        return; // No UDP GSO here: the single sends are all there is.
    }
    assert_eq!(receive(&b, 3), small);

    // 1,400-byte segments do not fit 1,280: refused, nothing sent, GSO kept.
    let big: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 10; 1400]).collect();
    let refs: Vec<&[u8]> = big.iter().map(Vec::as_slice).collect();
    assert!(!a.send_segmented(&refs, 1400, &dst, None, NOT_ECT).unwrap());
    assert!(
        a.gso_enabled(),
        "a path MTU is no reason to stop offloading"
    );
    // Singly, the kernel fragments them and they arrive whole.
    for d in &big {
        a.send_to(d, &dst).unwrap();
    }
    assert_eq!(receive(&b, 3), big);
    // And a run that fits still goes as one.
    let refs: Vec<&[u8]> = small.iter().map(Vec::as_slice).collect();
    assert!(a.send_segmented(&refs, 500, &dst, None, NOT_ECT).unwrap());
    assert_eq!(receive(&b, 3), small);
}

/// The IPv4 header's flags and fragment offset of the next UDP datagram a raw socket
/// sees, skipping ones that are not to `port`.
fn next_fragment_field(raw: i32, port: u16) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut buf = [0u8; 65536];
    while Instant::now() < deadline {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 28 {
            continue;
        }
        let ihl = (buf[0] & 0x0f) as usize * 4;
        if u16::from_be_bytes([buf[ihl + 2], buf[ihl + 3]]) == port {
            return u16::from_be_bytes([buf[6], buf[7]]);
        }
    }
    panic!("no datagram to port {port}");
}

#[test]
fn outer_ipv4_datagrams_carry_no_dont_fragment_bit() {
    // SAFETY: moves only this thread into a new network namespace.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    ip_here("link set lo up");
    // SAFETY: plain socket creation; checked below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_UDP) };
    assert!(raw >= 0, "raw socket");
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: tv is a valid timeval for SO_RCVTIMEO.
    unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let a = UdpSocket::bind(false, 0).unwrap();
    let b = UdpSocket::bind(false, 0).unwrap();
    let port = b.local_port().unwrap();
    let dst = SocketAddr::from(([127, 0, 0, 1], port));
    a.send_to(&[7; 1200], &dst).unwrap();
    const DF: u16 = 0x4000;
    assert_eq!(next_fragment_field(raw, port) & DF, 0, "a single send");
    let run: Vec<Vec<u8>> = (0..2u8).map(|i| vec![i; 1200]).collect();
    let refs: Vec<&[u8]> = run.iter().map(Vec::as_slice).collect();
    a.send_segmented(&refs, 1200, &dst, None, NOT_ECT).unwrap();
    // On loopback a segmented send may arrive as one large packet: its header is
    // what every segment's would be.
    assert_eq!(next_fragment_field(raw, port) & DF, 0, "a segmented send");
    // SAFETY: raw is ours and open.
    unsafe { libc::close(raw) };
}
