use super::*;
use std::net::IpAddr;

#[test]
fn batch_roundtrip_on_loopback() {
    let a = UdpSocket::bind(false, 0).unwrap();
    let b = UdpSocket::bind(false, 0).unwrap();
    let dst = SocketAddr::from(([127, 0, 0, 1], b.local_port().unwrap()));
    let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + i as usize]).collect();
    let msgs: Vec<(&[u8], SocketAddr)> = payloads.iter().map(|p| (p.as_slice(), dst)).collect();
    assert_eq!(a.send_batch(&msgs, None, NOT_ECT).unwrap(), 10);
    let mut batch = RecvBatch::new(4, 2048);
    let mut got: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    // Four buffers for ten datagrams: the headers are reused across receives.
    while got.len() < 10 && std::time::Instant::now() < deadline {
        match b.recv_batch(&mut batch) {
            Ok(n) => got.extend((0..n).map(|i| {
                let r = batch.datagram(i).unwrap();
                (r.data.to_vec(), r.src)
            })),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got.len(), 10);
    for (i, (d, src)) in got.iter().enumerate() {
        assert_eq!(d, &payloads[i]);
        assert_eq!(src.port(), a.local_port().unwrap());
    }
}

/// Replies leave from the address the question arrived at (any 127/8 address is
/// local on lo); a source that is not local falls back to the route's choice.
#[test]
fn replies_leave_from_the_address_asked() {
    let a = UdpSocket::bind(false, 0).unwrap();
    let b = UdpSocket::bind(false, 0).unwrap();
    let asked = Ipv4Addr::new(127, 0, 0, 2);
    let to_b = SocketAddr::from((asked, b.local_port().unwrap()));
    a.send_to(b"question", &to_b).unwrap();
    let mut batch = RecvBatch::new(4, 2048);
    let recv_one = |sock: &UdpSocket, batch: &mut RecvBatch| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            if let Ok(1) = sock.recv_batch(batch) {
                let r = batch.datagram(0).unwrap();
                return (r.src, r.local);
            }
            std::thread::yield_now();
        }
        panic!("nothing received");
    };
    let (from_a, local) = recv_one(&b, &mut batch);
    let local = local.expect("IP_PKTINFO reports the local end");
    assert_eq!(local.ip, IpAddr::V4(asked));
    assert!(local.ifindex > 0);
    b.send_from(b"answer", &from_a, Some(local), NOT_ECT)
        .unwrap();
    assert_eq!(recv_one(&a, &mut batch).0, to_b);
    // The same through the batched and segmented paths.
    b.send_batch(&[(b"answer", from_a)], Some(local), NOT_ECT)
        .unwrap();
    assert_eq!(recv_one(&a, &mut batch).0, to_b);
    if b.send_segmented(&[b"ab", b"cd"], 2, &from_a, Some(local), NOT_ECT)
        .unwrap()
    {
        assert_eq!(recv_one(&a, &mut batch).0, to_b);
        while a.recv_batch(&mut batch).is_ok_and(|n| n > 0) {}
    }
    // A source that is not ours is refused by the kernel; the datagram still goes.
    let gone = LocalAddr {
        ip: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 99)),
        ifindex: 0,
    };
    b.send_from(b"answer", &from_a, Some(gone), NOT_ECT)
        .unwrap();
    assert_eq!(
        recv_one(&a, &mut batch).0.ip(),
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    );
    b.send_batch(&[(b"answer", from_a)], Some(gone), NOT_ECT)
        .unwrap();
    assert_eq!(
        recv_one(&a, &mut batch).0.ip(),
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    );
    assert!(
        b.send_segmented(&[b"ab", b"cd"], 2, &from_a, Some(gone), NOT_ECT)
            .unwrap()
            || !b.gso_enabled()
    );
}

#[test]
fn segmented_send_arrives_as_separate_datagrams() {
    let a = UdpSocket::bind(false, 0).unwrap();
    let b = UdpSocket::bind(false, 0).unwrap();
    let dst = SocketAddr::from(([127, 0, 0, 1], b.local_port().unwrap()));
    let pieces: Vec<Vec<u8>> = (0..5u8)
        .map(|i| vec![i; if i == 4 { 300 } else { 1000 }])
        .collect();
    let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
    if !a.send_segmented(&refs, 1000, &dst, None, NOT_ECT).unwrap() {
        assert!(!a.gso_enabled());
        return; // Kernel without UDP GSO: the fallback path is what callers use.
    }
    let mut batch = RecvBatch::new(8, 65536);
    // With UDP_GRO the five may arrive as one coalesced buffer; split them back.
    let mut dgrams: Vec<Vec<u8>> = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while dgrams.len() < 5 && std::time::Instant::now() < deadline {
        if let Ok(n) = b.recv_batch(&mut batch) {
            for i in 0..n {
                let r = batch.datagram(i).unwrap();
                dgrams.extend(r.datagrams().map(<[u8]>::to_vec));
            }
        }
    }
    assert_eq!(dgrams.len(), 5);
    for (i, d) in dgrams.iter().enumerate() {
        assert_eq!(d.len(), if i == 4 { 300 } else { 1000 });
        assert!(d.iter().all(|x| *x == i as u8));
    }
}

/// Receives until `want` datagrams came or 2 s passed.
fn receive(sock: &UdpSocket, want: usize) -> Vec<Vec<u8>> {
    let mut batch = RecvBatch::new(8, 2048);
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while got.len() < want && std::time::Instant::now() < deadline {
        match sock.recv_batch(&mut batch) {
            Ok(n) => got.extend((0..n).map(|i| batch.datagram(i).unwrap().data.to_vec())),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    }
    got
}

#[test]
fn steered_group_splits_data_handshakes_and_proofs_and_keeps_its_port() {
    // WireGuard's shapes: data is type 4; a type 1 of 148 bytes or a type 2 of 92
    // bytes carries its proof (mac2) in its last 16 bytes.
    let steering = Steering {
        data_first_byte: 4,
        proof: vec![
            ProofRule {
                first_byte: 1,
                len: 148,
                field: 132,
            },
            ProofRule {
                first_byte: 2,
                len: 92,
                field: 76,
            },
        ],
    };
    let (data, others) = UdpSocket::bind_steered(false, 0, &steering).unwrap();
    let (handshake, proof) = others.expect("this kernel steers SO_REUSEPORT groups");
    let port = data.local_port().unwrap();
    assert_eq!(handshake.local_port().unwrap(), port);
    assert_eq!(proof.local_port().unwrap(), port);
    // The port is taken for anyone else, steered or not.
    let in_use = |r: io::Result<()>| r.unwrap_err().raw_os_error() == Some(libc::EADDRINUSE);
    assert!(in_use(UdpSocket::bind(false, port).map(drop)));
    assert!(in_use(
        UdpSocket::bind_steered(false, port, &steering).map(drop)
    ));

    let client = UdpSocket::bind(false, 0).unwrap();
    let dst = SocketAddr::from(([127, 0, 0, 1], port));
    let message = |kind: u8, len: usize, proof_byte: Option<usize>| {
        let mut m = vec![0u8; len];
        m[0] = kind;
        m[1] = 0xaa; // nonzero outside the proof field
        if let Some(at) = proof_byte {
            m[at] = 1;
        }
        m
    };
    let msgs: Vec<Vec<u8>> = vec![
        vec![4, 0, 0, 0, 1],        // 0 data
        message(1, 148, None),      // 1 initiation without a proof
        message(1, 148, Some(147)), // 2 initiation, proof in its last byte
        vec![4, 0, 0, 0, 3],        // 3 data
        message(2, 92, Some(76)),   // 4 response, proof in its first byte
        message(2, 92, None),       // 5 response without a proof
        message(1, 147, Some(140)), // 6 a type 1 of the wrong length
        message(1, 148, Some(131)), // 7 nonzero just before the proof field
        message(3, 64, Some(63)),   // 8 cookie reply
        vec![],                     // 9 empty
        vec![9],                    // 10 unknown type
    ];
    let batch: Vec<(&[u8], SocketAddr)> = msgs.iter().map(|m| (&m[..], dst)).collect();
    assert_eq!(
        client.send_batch(&batch, None, NOT_ECT).unwrap(),
        msgs.len()
    );
    let pick = |idx: &[usize]| idx.iter().map(|&i| msgs[i].clone()).collect::<Vec<_>>();
    // Type 4 and the empty datagram to the data socket, in order; the rest aside.
    assert_eq!(receive(&data, 3), pick(&[0, 3, 9]));
    assert_eq!(receive(&proof, 2), pick(&[2, 4]));
    assert_eq!(receive(&handshake, 6), pick(&[1, 5, 6, 7, 8, 10]));
    let drops = [&data, &handshake, &proof].map(|s| s.drops().unwrap());
    assert_eq!(drops, [0, 0, 0]);
}

/// Each datagram comes with the kernel's arrival time and its outer ECN bits, in both
/// families: the receive side's queue controller and RFC 6040 decapsulation use them.
#[test]
fn received_datagrams_carry_arrival_time_and_ecn() {
    for v6 in [false, true] {
        let a = UdpSocket::bind(v6, 0).unwrap();
        let b = UdpSocket::bind(v6, 0).unwrap();
        let (level, opt) = if v6 {
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
        } else {
            (libc::IPPROTO_IP, libc::IP_TOS)
        };
        // DSCP 8 with CE: only the low two bits may come back as the ECN field.
        setsockopt_int(a.fd(), level, opt, 0x20 | 0b11).unwrap();
        let lo: IpAddr = if v6 {
            Ipv6Addr::LOCALHOST.into()
        } else {
            Ipv4Addr::LOCALHOST.into()
        };
        let dst = SocketAddr::new(lo, b.local_port().unwrap());
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        a.send_to(b"ecn", &dst).unwrap();
        let mut batch = RecvBatch::new(1, 64);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let n = loop {
            match b.recv_batch(&mut batch) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline, "nothing arrived");
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        };
        let after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert_eq!(n, 1);
        let r = batch.datagram(0).unwrap();
        assert_eq!(r.data, b"ecn");
        assert_eq!(r.ecn, 0b11, "v6={v6}");
        assert!(
            (before..=after).contains(&r.rx_time_ns),
            "v6={v6}: {} not in {before}..={after}",
            r.rx_time_ns
        );
    }
}

/// What a send asks for in the outer ECN field arrives, in both families and by every
/// send path, with or without a source, and when a refused source is dropped.
#[test]
fn sends_carry_the_ecn_field_asked_for() {
    for v6 in [false, true] {
        let a = UdpSocket::bind(v6, 0).unwrap();
        let b = UdpSocket::bind(v6, 0).unwrap();
        let (lo, gone): (IpAddr, IpAddr) = if v6 {
            (Ipv6Addr::LOCALHOST.into(), "2001:db8::99".parse().unwrap())
        } else {
            (
                Ipv4Addr::LOCALHOST.into(),
                Ipv4Addr::new(192, 0, 2, 99).into(),
            )
        };
        let dst = SocketAddr::new(lo, b.local_port().unwrap());
        let mut batch = RecvBatch::new(8, 65536);
        // Every buffer received until `want` datagrams arrived: their ECN fields.
        let mut received = |want: usize| {
            let mut fields = Vec::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            let mut got = 0;
            while got < want {
                assert!(std::time::Instant::now() < deadline, "v6={v6}: lost");
                if let Ok(n) = b.recv_batch(&mut batch) {
                    for i in 0..n {
                        let r = batch.datagram(i).unwrap();
                        got += match r.segment {
                            0 => 1,
                            s => r.data.len().div_ceil(s),
                        };
                        fields.push(r.ecn);
                    }
                }
            }
            fields
        };
        for ecn in [0b01, 0b10, 0b11] {
            for src in [
                None,
                Some(LocalAddr { ip: lo, ifindex: 0 }),
                Some(LocalAddr {
                    ip: gone,
                    ifindex: 0,
                }),
            ] {
                let case = format!("v6={v6} ecn={ecn} src={src:?}");
                a.send_from(b"one", &dst, src, ecn).unwrap();
                assert_eq!(received(1), [ecn], "send_from {case}");
                a.send_batch(&[(b"two", dst), (b"two", dst)], src, ecn)
                    .unwrap();
                assert!(received(2).iter().all(|&e| e == ecn), "send_batch {case}");
                if a.send_segmented(&[b"ab", b"cd"], 2, &dst, src, ecn)
                    .unwrap()
                {
                    assert!(received(2).iter().all(|&e| e == ecn), "segmented {case}");
                }
            }
        }
    }
}

/// `send_each` gives each datagram its own destination and ECN field in one call, and
/// says which it sent: a destination the kernel refuses (port 0) fails only its own.
#[test]
fn send_each_sends_each_datagram_as_asked_and_says_which_left() {
    let a = UdpSocket::bind(false, 0).unwrap();
    let (b, c) = (
        UdpSocket::bind(false, 0).unwrap(),
        UdpSocket::bind(false, 0).unwrap(),
    );
    let to = |s: &UdpSocket| SocketAddr::from(([127, 0, 0, 1], s.local_port().unwrap()));
    let msg = |payload: &'static [u8], dst, ecn| Outgoing {
        payload,
        dst,
        src: None,
        ecn,
    };
    let msgs = [
        msg(b"to b", to(&b), 0b01),
        msg(b"refused", SocketAddr::from(([127, 0, 0, 1], 0)), 0),
        msg(b"to c", to(&c), 0b10),
    ];
    let mut sent = [false; 3];
    assert_eq!(a.send_each(&msgs, &mut sent).unwrap(), 2);
    assert_eq!(sent, [true, false, true]);
    for (sock, payload, ecn) in [(&b, b"to b", 0b01), (&c, b"to c", 0b10)] {
        let mut batch = RecvBatch::new(2, 2048);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let got = loop {
            assert!(std::time::Instant::now() < deadline, "lost");
            if let Ok(1) = sock.recv_batch(&mut batch) {
                let r = batch.datagram(0).unwrap();
                break (r.data.to_vec(), r.ecn);
            }
        };
        assert_eq!(got, (payload.to_vec(), ecn));
    }
}

/// A receive buffer shrunk below what it holds keeps every datagram already queued and
/// drops only new arrivals, until its queue falls below the new size; given its size
/// back, it takes arrivals again. The dataplane's `socket_buffer` resizes a live data
/// socket on this: no datagram it accepted is lost by a resize.
#[test]
fn a_shrunk_receive_buffer_keeps_its_queue_and_drops_only_new_arrivals() {
    let a = UdpSocket::bind(false, 0).unwrap();
    let b = UdpSocket::bind(false, 0).unwrap();
    let dst = SocketAddr::from(([127, 0, 0, 1], b.local_port().unwrap()));
    let numbered = |range: std::ops::Range<u16>| -> Vec<Vec<u8>> {
        range
            .map(|i| [i.to_be_bytes().as_slice(), &[0; 998]].concat())
            .collect()
    };
    let send = |dgrams: &[Vec<u8>]| {
        let msgs: Vec<(&[u8], SocketAddr)> = dgrams.iter().map(|d| (&d[..], dst)).collect();
        assert_eq!(a.send_batch(&msgs, None, NOT_ECT).unwrap(), msgs.len());
    };
    // Loopback delivers within the send, so the counts are final when it returns.
    let queued = numbered(0..200);
    send(&queued);
    assert_eq!(b.drops().unwrap(), 0);
    // 200 datagrams of 1 KiB hold far more than the smallest buffer the kernel allows.
    b.set_receive_buffer(0).unwrap();
    send(&numbered(200..250));
    assert_eq!(b.drops().unwrap(), 50);
    assert_eq!(receive(&b, 200), queued);
    b.set_receive_buffer(SOCKET_BUFFER).unwrap();
    let later = numbered(250..260);
    send(&later);
    assert_eq!(receive(&b, 10), later);
    assert_eq!(b.drops().unwrap(), 50);
}

/// A coalesced run longer than the buffer (possible where GRO may exceed 64 KiB) is
/// cut by the kernel: only its whole datagrams are handed on, and the receive says it
/// lost the rest.
#[test]
fn a_run_cut_short_by_the_buffer_keeps_only_whole_datagrams() {
    let a = UdpSocket::bind(false, 0).unwrap();
    let b = UdpSocket::bind(false, 0).unwrap();
    let dst = SocketAddr::from(([127, 0, 0, 1], b.local_port().unwrap()));
    let pieces: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 1000]).collect();
    let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
    if !b.gro_enabled() || !a.send_segmented(&refs, 1000, &dst, None, NOT_ECT).unwrap() {
        return; // No UDP GSO/GRO here: nothing is coalesced, nothing cut.
    }
    let mut batch = RecvBatch::new(1, 4096 + 500);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let n = loop {
        match b.recv_batch(&mut batch) {
            Ok(n) if n > 0 => break n,
            _ if std::time::Instant::now() < deadline => std::thread::yield_now(),
            other => panic!("nothing received: {other:?}"),
        }
    };
    assert_eq!(n, 1);
    let r = batch.datagram(0).unwrap();
    assert!(r.truncated);
    let got: Vec<&[u8]> = r.datagrams().collect();
    assert_eq!(got, refs[..4].to_vec());
}
