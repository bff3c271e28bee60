//! star:50 against wirelane (as root), both directions: every emulated peer completes a
//! handshake, and every packet arrives once, in order and intact (paced well below
//! any build's capacity, so that nothing is lost for want of speed); the same while
//! 200 more peers storm the gateway with handshakes, with dual-stack inner traffic,
//! and into the blackhole sink, whose count must match what was sent. Behaviour
//! only: no figure of speed is asserted.

use wirelane_lab::star::inner::Family;
use wirelane_lab::star::sink::SinkKind;
use wirelane_lab::star::{run_one, StarRecord, StarSpec, Way};

fn star50(way: Way, pps: f64, storm_peers: usize) -> StarRecord {
    star50_with(way, pps, storm_peers, Family::Ipv4, SinkKind::Socket)
}

fn spec50(way: Way, pps: f64, storm_peers: usize, family: Family, sink: SinkKind) -> StarSpec {
    StarSpec {
        peers: 50,
        way,
        size: 1420,
        offered_pps: Some(pps),
        seconds: 2.0,
        handshake_rate: Some(500.0),
        sealed_max_mib: 64,
        shared_source: false,
        sample_every: 1,
        storm_peers,
        family,
        sink,
        light_peers: 0,
        light_mbit: 0.0,
        rekey_after_s: None,
        tunnels: 1,
    }
}

fn star50_with(
    way: Way,
    pps: f64,
    storm_peers: usize,
    family: Family,
    sink: SinkKind,
) -> StarRecord {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the lab needs root for namespaces"
    );
    let spec = spec50(way, pps, storm_peers, family, sink);
    let rec = run_one("wirelane".parse().unwrap(), &spec, 0, 1.0);
    assert_eq!(rec.error, None, "{rec:?}");
    assert_eq!(rec.handshake.established, 50, "{:?}", rec.handshake);
    assert!(rec.handshake.initiations >= 50);
    assert_eq!(
        (
            rec.reordered,
            rec.duplicates,
            rec.corrupted,
            rec.misdelivered
        ),
        (0, 0, 0, 0),
        "{rec:?}"
    );
    rec
}

#[test]
fn star_50_receive_delivers_every_packet_once_intact() {
    assert_received_whole(&star50(Way::Rx, 5_000.0, 0));
}

fn assert_received_whole(rec: &StarRecord) {
    // The schedule rounds each peer's share up to whole GSO runs.
    assert_eq!(rec.unsent, 0, "{rec:?}");
    assert!(rec.sent >= 10_000, "{rec:?}");
    assert_eq!(rec.delivered, rec.sent, "{rec:?}");
    // Nothing placed as lost anywhere, however the gateway grouped its TUN writes.
    assert_eq!(
        (
            rec.lost_in_gateway,
            rec.lost_after_gateway,
            rec.sink_socket_drops
        ),
        (0, 0, 0),
        "{rec:?}"
    );
}

#[test]
fn star_50_transmit_delivers_every_packet_once_intact() {
    assert_transmitted_whole(&star50(Way::Tx, 5_000.0, 0));
}

fn assert_transmitted_whole(rec: &StarRecord) {
    assert_eq!(rec.sent, 10_000, "{rec:?}");
    assert_eq!(rec.delivered, rec.sent, "{rec:?}");
    // Every message was opened: each held its own peer's packet, each sequence number
    // of each peer once.
    assert_eq!(rec.sampled, rec.delivered, "{rec:?}");
    assert_eq!(rec.sample_bad, 0, "{rec:?}");
    assert_eq!(rec.sample_unique, rec.sent, "{rec:?}");
}

/// Every peer rekeys during the phase (after 1 s instead of 165, still valid
/// protocol), while the gateway is sending to it: every packet still arrives once,
/// intact, whichever session sealed it, and the peers' new sessions carry on.
#[test]
fn star_50_transmit_is_whole_across_rekeys() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the lab needs root");
    let spec = StarSpec {
        seconds: 3.0,
        rekey_after_s: Some(1.0),
        ..spec50(Way::Tx, 5_000.0, 0, Family::Ipv4, SinkKind::Socket)
    };
    let rec = run_one("wirelane".parse().unwrap(), &spec, 0, 1.0);
    assert_eq!(rec.error, None, "{rec:?}");
    assert!(rec.rekeys >= 1, "{rec:?}");
    assert_eq!((rec.reordered, rec.duplicates), (0, 0), "{rec:?}");
    assert_eq!(rec.sent, 15_000, "{rec:?}");
    assert_eq!(rec.delivered, rec.sent, "{rec:?}");
    assert_eq!(rec.sampled, rec.delivered, "{rec:?}");
    assert_eq!(rec.sample_bad, 0, "{rec:?}");
    assert_eq!(rec.sample_unique, rec.sent, "{rec:?}");
}

/// A storm of 200 peers' handshakes when the phase starts: every storming peer gets a
/// session, and the established peers' traffic still arrives whole, once and in order.
#[test]
fn star_50_receive_is_whole_during_a_handshake_storm() {
    let rec = star50(Way::Rx, 5_000.0, 200);
    let storm = rec.storm_during.clone().expect("the storm's report");
    assert_eq!(storm.established, 200, "{storm:?}");
    assert_received_whole(&rec);
}

/// Even peers send and receive IPv4, odd ones IPv6, each with both families in its
/// AllowedIPs: every packet arrives once, in order and intact, from and to the right
/// peer's address of its family.
#[test]
fn star_50_dual_stack_receive_delivers_every_packet_once_intact() {
    assert_received_whole(&star50_with(
        Way::Rx,
        5_000.0,
        0,
        Family::Dual,
        SinkKind::Socket,
    ));
}

#[test]
fn star_50_dual_stack_transmit_delivers_every_packet_once_intact() {
    let rec = star50_with(Way::Tx, 5_000.0, 0, Family::Dual, SinkKind::Socket);
    assert_transmitted_whole(&rec);
    // The gateway timed every packet it sent from its TUN read (`tx_sojourn_ns`), and
    // a sojourn has a histogram bucket for each of them.
    let q = &rec.signatures.as_ref().expect("wirelane's counters").queues;
    assert!(q.tx_timed >= rec.delivered, "{q:?}");
    assert_eq!(q.tx_hist.iter().sum::<u64>(), q.tx_timed, "{q:?}");
}

/// The blackhole sink counts at the gateway's TUN device what the socket sink counts
/// packet by packet: exactly what was sent, in both families.
#[test]
fn star_50_blackhole_sink_counts_every_packet() {
    assert_received_whole(&star50_with(
        Way::Rx,
        5_000.0,
        0,
        Family::Dual,
        SinkKind::Blackhole,
    ));
}

/// Ten of the fifty peers are light, sending one packet at a time from a sender of
/// their own beside the bulk of the other forty: everything arrives once, in order and
/// intact, and the light peers' packets and delay are reported apart.
#[test]
fn star_50_light_peers_are_counted_and_timed_apart() {
    let spec = StarSpec {
        light_peers: 10,
        light_mbit: 1.0,
        ..spec50(Way::Rx, 5_000.0, 0, Family::Ipv4, SinkKind::Socket)
    };
    let rec = run_one("wirelane".parse().unwrap(), &spec, 0, 1.0);
    assert_eq!(rec.error, None, "{rec:?}");
    assert_received_whole(&rec);
    let light = rec.light.clone().expect("the light peers' report");
    // 1 Mbit/s of 1,420-byte packets for 2 s: 177 packets each, 10 peers.
    assert_eq!(light.sent, 1_770, "{light:?}");
    assert_eq!(light.delivered, light.sent, "{light:?}");
    assert!(
        light.delay_p99_us.is_some() && rec.delay_p99_us.is_some(),
        "{rec:?}"
    );
    // Timed from when each burst really left as well: never before it was scheduled
    // to, so that delay is at most the one from the schedule.
    for (from_schedule, from_send) in [
        (rec.delay_p99_us, rec.gateway_delay_p99_us),
        (light.delay_p99_us, light.gateway_delay_p99_us),
    ] {
        let from_send = from_send.expect("the gateway's share is measured");
        assert!(from_send <= from_schedule.unwrap(), "{rec:?}");
    }
}

/// The 50 peers spread over 3 tunnels of one wirelane process (dual-stack receive,
/// IPv4 transmit) and over 2 wireguard-go processes: every packet arrives once, in
/// order and intact, on the tunnel of its peer, and each tunnel carries its share.
#[test]
fn star_50_over_several_tunnels_is_whole_on_each() {
    for (implementation, tunnels, way, family) in [
        ("wirelane", 3, Way::Rx, Family::Dual),
        ("wirelane", 3, Way::Tx, Family::Ipv4),
        ("wireguard-go", 2, Way::Tx, Family::Ipv4),
    ] {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "the lab needs root");
        let spec = StarSpec {
            tunnels,
            ..spec50(way, 5_000.0, 0, family, SinkKind::Socket)
        };
        let rec = run_one(implementation.parse().unwrap(), &spec, 0, 1.0);
        assert_eq!(rec.error, None, "{implementation}: {rec:?}");
        assert_eq!(rec.handshake.established, 50, "{:?}", rec.handshake);
        match way {
            Way::Rx => assert_received_whole(&rec),
            Way::Tx => assert_transmitted_whole(&rec),
        }
        // Peer i is on tunnel i mod T, and every peer sent the same.
        let expected: Vec<u64> = (0..tunnels)
            .map(|t| (50 - t).div_ceil(tunnels) as u64 * rec.delivered / 50)
            .collect();
        assert_eq!(rec.tunnel_delivered, expected, "{implementation}");
        assert!(rec.daemon_threads.is_some_and(|t| t > 0), "{rec:?}");
    }
}

/// Bad input: a tunnel count of 0, above 64 or above the peers is refused, before any
/// namespace.
#[test]
fn star_tunnel_counts_out_of_range_are_refused() {
    for tunnels in [0, 51, 65] {
        let spec = StarSpec {
            tunnels,
            ..spec50(Way::Rx, 5_000.0, 0, Family::Ipv4, SinkKind::Socket)
        };
        let err = spec.validate().expect_err("refused").to_string();
        assert!(err.contains("tunnels must be 1..=64"), "{tunnels}: {err}");
    }
}

/// Bad input: the blackhole sink only takes the receive direction.
#[test]
fn star_blackhole_transmit_is_refused() {
    let spec = spec50(Way::Tx, 5_000.0, 0, Family::Ipv4, SinkKind::Blackhole);
    let rec = run_one("wirelane".parse().unwrap(), &spec, 0, 1.0);
    let err = rec.error.expect("a clear error");
    assert!(err.contains("blackhole"), "{err}");
}

/// The send floor (as root) sends in each of its ways, GSO to one destination or to
/// each in turn, `sendmmsg` over many, paced or not, and counts what it sent: every
/// datagram of its sealed size, none received that was not sent (a GSO send that UDP
/// GRO keeps whole counts as its datagrams). Bad arguments get an error before any
/// namespace.
#[test]
fn send_floor_sends_each_way_and_refuses_bad_arguments() {
    use wirelane_lab::star::send_floor::measure;
    for (peers, batch, segments, gbit) in [
        (1, 64, None, None),
        (10, 8, None, None),
        (10, 1, None, None),
        (10, 64, Some(4), Some(0.5)),
    ] {
        let f = measure(peers, 1420, 0.2, batch, segments, gbit).unwrap();
        let case = format!("{peers} peers, batch {batch}, segments {segments:?}");
        assert!(f.sent > 0, "{case}: nothing sent");
        assert!(f.received <= f.sent, "{case}: {} of {}", f.received, f.sent);
        assert_eq!(f.datagram, 1420 + 32, "a sealed 1420-byte packet");
        assert_eq!(
            f.segments,
            segments.unwrap_or(if peers == 1 { 45 } else { 1 })
        );
        if segments.is_some() {
            assert_eq!(f.sent % 4, 0, "{case}: whole GSO sends");
        }
    }
    assert!(measure(0, 1420, 0.2, 8, None, None).is_err());
    assert!(measure(10, 1420, 0.2, 0, None, None).is_err());
    assert!(measure(10, 70_000, 0.2, 8, None, None).is_err());
    assert!(measure(10, 1420, 0.2, 8, Some(0), None).is_err());
    assert!(
        measure(10, 1420, 0.2, 8, Some(46), None).is_err(),
        "46 × 1452 B > 64 KiB"
    );
    assert!(measure(10, 1420, 0.2, 8, None, Some(0.0)).is_err());
}
