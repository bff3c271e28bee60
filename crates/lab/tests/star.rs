//! star:50 against wirelane (as root), both directions: every emulated peer completes a
//! handshake, and every packet arrives once, in order and intact (paced well below
//! any build's capacity, so that nothing is lost for want of speed); and the same while
//! 200 more peers storm the gateway with handshakes. Behaviour only: no figure of speed
//! is asserted.

use wirelane_lab::star::{run_one, StarRecord, StarSpec, Way};

fn star50(way: Way, pps: f64, storm_peers: usize) -> StarRecord {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the lab needs root for namespaces"
    );
    let spec = StarSpec {
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
    };
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
    let rec = star50(Way::Rx, 5_000.0, 0);
    // The schedule rounds each peer's share up to whole GSO runs.
    assert_eq!(rec.unsent, 0, "{rec:?}");
    assert!(rec.sent >= 10_000, "{rec:?}");
    assert_eq!(rec.delivered, rec.sent, "{rec:?}");
}

#[test]
fn star_50_transmit_delivers_every_packet_once_intact() {
    let rec = star50(Way::Tx, 5_000.0, 0);
    assert_eq!(rec.sent, 10_000, "{rec:?}");
    assert_eq!(rec.delivered, rec.sent, "{rec:?}");
    // Every message was opened: each held its own peer's packet, each sequence number
    // of each peer once.
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
    assert_eq!(rec.unsent, 0, "{rec:?}");
    assert_eq!(rec.delivered, rec.sent, "{rec:?}");
}
