//! Receive-side queue management on a simulated wall clock.

use super::*;

const MS: u64 = 1_000_000;

/// A decrypted IPv4 packet with TOS `tos`, received at `arrival_ns` with outer ECN
/// field `outer_ecn`.
fn received(tos: u8, arrival_ns: u64, outer_ecn: u8) -> Packet {
    let mut ip = [0u8; 40];
    ip[0] = 0x45;
    ip[1] = tos;
    ip[2..4].copy_from_slice(&40u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    let sum = inner::checksum(&[&ip[..20]]);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let mut p = Packet::from_plaintext(&[&ip]);
    p.arrival_ns = arrival_ns;
    p.outer_ecn = outer_ecn;
    p
}

/// Both clocks at `ns`: the simulated wall clock never steps unless a test says so.
fn at(ns: u64) -> JudgedAt {
    JudgedAt {
        wall: ns,
        monotonic: ns,
    }
}

fn all(packets: &[Packet]) -> Vec<(usize, usize)> {
    packets
        .iter()
        .enumerate()
        .map(|(i, p)| (i, p.len))
        .collect()
}

#[test]
fn outer_ce_marks_ect_inner_packets_and_drops_the_others() {
    // Not-ECT, ECT(0) and ECT(1) inner packets under an outer CE; one more not-ECT
    // packet under an outer ECT(0), which passes untouched; then ECT(0) and not-ECT
    // under an outer ECT(1): the first becomes ECT(1) (RFC 6040 §4.2), the second stays.
    let mut packets = vec![
        received(0x00, 0, inner::CE),
        received(0x02, 0, inner::CE),
        received(0x01, 0, inner::CE),
        received(0x00, 0, 0b10),
        received(0x02, 0, inner::ECT_1),
        received(0x00, 0, inner::ECT_1),
    ];
    let mut keep = all(&packets);
    let t = judge_all(None, at(0), &mut packets, &mut keep);
    assert_eq!(t.ce_not_ect, 1);
    assert_eq!(
        keep.iter().map(|k| k.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    let ecn = |i: usize| inner::ecn(packets[i].plaintext());
    assert_eq!(
        [ecn(1), ecn(2), ecn(3), ecn(4), ecn(5)],
        [
            inner::CE,
            inner::CE,
            inner::NOT_ECT,
            inner::ECT_1,
            inner::NOT_ECT
        ]
    );
    assert_eq!(inner::checksum(&[&packets[4].plaintext()[..20]]), 0);
}

#[test]
fn sojourn_is_counted_from_the_arrival_time_without_a_controller() {
    let now = 1_000 * MS;
    let mut packets = vec![
        received(0, now - 3 * MS, 0),
        received(0, now - 200_000, 0),
        received(0, 0, 0),        // no timestamp: not timed
        received(0, now + MS, 0), // the clock stepped back: counts as none
    ];
    let mut keep = all(&packets);
    let t = judge_all(None, at(now), &mut packets, &mut keep);
    assert_eq!(keep.len(), 4, "nothing is dropped without a controller");
    assert_eq!(t.sojourn.timed, 3);
    assert_eq!(t.sojourn.sum_ns, 3 * MS + 200_000);
    assert_eq!(t.sojourn.max_ns, 3 * MS);
    // 3 ms falls in [2048, 4096) µs, 200 µs in [128, 256) µs, 0 in the first bucket.
    assert_eq!(
        (t.sojourn.hist[12], t.sojourn.hist[8], t.sojourn.hist[0]),
        (1, 1, 1)
    );
}

/// `judge_all` with an RFC-default controller on every packet of `packets`; the tally
/// and the indices kept.
fn judge_rfc(codel: &mut Codel, now: u64, packets: &mut [Packet]) -> (Tally, Vec<(usize, usize)>) {
    let mut keep = all(packets);
    let t = judge_all(
        Some((codel, &CodelParams::RFC)),
        at(now),
        packets,
        &mut keep,
    );
    (t, keep)
}

/// Packets arriving every 100 µs and leaving `wait` later, from `from` to `until`:
/// when `wait` exceeds 100 µs, each leaves others queued behind it.
fn run(codel: &mut Codel, tos: u8, wait: u64, from: u64, until: u64) -> Tally {
    let mut sum = Tally::default();
    let mut now = from;
    while now < until {
        let mut packets = vec![received(tos, now - wait, 0)];
        packets[0].queued_behind = wait > 100_000;
        let (t, keep) = judge_rfc(codel, now, &mut packets);
        assert_eq!(keep.is_empty(), t.dropped == 1);
        sum.dropped += t.dropped;
        sum.marked += t.marked;
        sum.sojourn.timed += t.sojourn.timed;
        now += 100_000;
    }
    sum
}

#[test]
fn the_controller_drops_not_ect_and_marks_ect_after_an_interval_above_target() {
    // 2 ms of sojourn is under the 5 ms target: never touched.
    let mut codel = Codel::default();
    let t = run(&mut codel, 0, 2 * MS, 10 * MS, 510 * MS);
    assert_eq!((t.dropped, t.marked, t.sojourn.timed), (0, 0, 5000));

    // 8 ms for half a second: nothing in the first interval, then drops.
    let t = run(&mut codel, 0, 8 * MS, 510 * MS, 600 * MS);
    assert_eq!(t.dropped, 0, "within the first interval");
    let t = run(&mut codel, 0, 8 * MS, 600 * MS, 1_010 * MS);
    assert!(t.dropped >= 4, "{t:?}");
    assert_eq!(t.marked, 0);

    // The same standing sojourn on ECN-capable packets: marks, no drops.
    let t = run(&mut codel, 0x02, 8 * MS, 1_010 * MS, 1_510 * MS);
    assert!(t.marked >= 4, "{t:?}");
    assert_eq!(t.dropped, 0);

    // The sojourn recovers: the controller stops at once.
    let t = run(&mut codel, 0, MS, 1_510 * MS, 2_010 * MS);
    assert_eq!((t.dropped, t.marked), (0, 0));
    assert!(!codel.dropping());
}

#[test]
fn a_lone_packet_is_no_standing_queue_however_long_it_waited() {
    // A standing 8 ms queue arms the controller (first interval above target).
    let mut codel = Codel::default();
    let t = run(&mut codel, 0, 8 * MS, 10 * MS, 100 * MS);
    assert_eq!(t.dropped, 0);

    // Then single packets, each alone in the socket and in its delivery run, 200 ms
    // apart and 160 ms late (a slow wake-up, a rebound socket): an interval has long
    // passed since the sojourn first went above target, yet none is dropped.
    for k in 1..=5 {
        let now = 100 * MS + k * 200 * MS;
        let mut packets = vec![received(0, now - 160 * MS, 0)];
        let (t, keep) = judge_rfc(&mut codel, now, &mut packets);
        assert_eq!((t.dropped, keep.len()), (0, 1), "lone packet {k}");
    }

    // A lone packet resets the controller: a standing queue forming afterwards gets a
    // full interval again before the first drop.
    let t = run(&mut codel, 0, 8 * MS, 1_200 * MS, 1_290 * MS);
    assert_eq!(t.dropped, 0, "the interval restarts after the lone packet");
}

#[test]
fn packets_delivered_together_stand_behind_each_other() {
    // Arm the controller with a standing queue, then deliver one run of three packets,
    // 8 ms late, each read last from its socket: the first two had another behind them
    // in the run, so the first enters the dropping state; the last had none, so the
    // queue ran empty with it and the controller leaves that state.
    let mut codel = Codel::default();
    let t = run(&mut codel, 0, 8 * MS, 10 * MS, 100 * MS);
    assert_eq!(t.dropped, 0);
    let now = 150 * MS;
    let mut packets: Vec<Packet> = (0..3).map(|_| received(0, now - 8 * MS, 0)).collect();
    let (t, keep) = judge_rfc(&mut codel, now, &mut packets);
    assert_eq!(t.dropped, 1);
    assert_eq!(keep.iter().map(|k| k.0).collect::<Vec<_>>(), [1, 2]);
    assert!(!codel.dropping());
}

#[test]
fn a_step_of_the_wall_clock_neither_stops_nor_hurries_the_drops() {
    // A standing 8 ms queue puts the controller in its dropping state.
    let mut codel = Codel::default();
    let t = run(&mut codel, 0, 8 * MS, 10 * MS, 400 * MS);
    assert!(t.dropped >= 1 && codel.dropping(), "{t:?}");
    // The wall clock steps back 300 ms; the kernel's stamps step with it, so the
    // sojourn stays 8 ms. Drops go on within the next 100 ms of monotonic time (on
    // the wall clock they would wait until it caught up with the next drop time).
    let mut dropped = 0;
    let mut mono = 400 * MS;
    while mono < 500 * MS {
        let wall = mono - 300 * MS;
        let mut packets = vec![received(0, wall - 8 * MS, 0)];
        packets[0].queued_behind = true;
        let mut keep = all(&packets);
        let when = JudgedAt {
            wall,
            monotonic: mono,
        };
        let t = judge_all(
            Some((&mut codel, &CodelParams::RFC)),
            when,
            &mut packets,
            &mut keep,
        );
        dropped += t.dropped;
        mono += 100_000;
    }
    assert!(dropped >= 1, "the controller went on dropping");
}
