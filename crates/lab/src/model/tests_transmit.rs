//! Transmit rules of the simulated pipeline that the lab's runs showed were missing:
//! the idle core's pull of a thread that waits behind a pinned one, and the byte limit
//! on each peer's ring. Deterministic, as the other model tests.

use super::params::{Pool, QueueFull};
use super::tests::bare;
use super::*;
use wirelane_dataplane::ring_limit::MAX_BYTES;

/// A flush that costs far more than the packets it sends, as a per-peer `sendmsg` does.
fn send_bound(mut p: Params) -> Params {
    p.platform.socket_packets = 4096;
    p.platform.inflight_packets = 1024;
    p.platform.peer_queue_full = QueueFull::Wait;
    p.tx.reader_packet_ns = 1000.0;
    p.tx.crypt_byte_ns = 0.5;
    p.tx.serial_invocation_ns = 8000.0;
    p.tx.serial_packet_ns = 400.0;
    p
}

fn overloaded_tx(model: Model, workers: usize, peers: usize) -> Scenario {
    Scenario {
        offered_gbit: 20.0,
        seconds: 0.2,
        warmup_s: 0.05,
        ..Scenario::star(model, workers, peers, Direction::Tx)
    }
}

/// `softirq` pins its one worker to core 0 and leaves the TUN reader free. When the
/// reader yields its slice there, the idle core 1 pulls it (Linux's busy core kicks an
/// idle one into balancing), so the reader fills the worker's queue from the other core
/// and each flush finds several packets of its peer. Left behind the worker on core 0,
/// the reader ran only when the worker had emptied its queue, and each flush found the
/// one packet that had scheduled it (1.3 a flush, against 7 in the lab).
#[test]
fn an_idle_core_pulls_a_thread_that_waits_behind_a_pinned_one() {
    let p = send_bound(bare(2, Pool::Shared, 1));
    let o = simulate(&p, &overloaded_tx(Model::Softirq, 1, 100)).unwrap();
    assert!(
        o.packets_per_poll > 4.0,
        "{} packets a flush",
        o.packets_per_poll
    );
    assert!(o.core_busy[1] > 0.2, "{:?}", o.core_busy);
}

/// One peer's ring behind its flow queues holds what its byte limit lets in (the
/// daemon's `RingLimit`, which starts at its floor and grows only when a flush finds
/// the ring dry while packets wait): a flush finds fewer packets than under the packet
/// bound alone, and never more on average than the limit's ceiling holds. Nothing is
/// lost at the peer's queue either way: what does not fit waits in the flow queues.
#[test]
fn a_transmit_ring_is_bounded_in_bytes_when_the_platform_has_the_limit() {
    let run = |limit: bool| {
        let mut p = send_bound(bare(2, Pool::Shared, 1));
        p.platform.tx_peer_queue_packets = 256;
        p.platform.tx_ring_limit = limit;
        simulate(&p, &overloaded_tx(Model::Workqueue, 1, 1)).unwrap()
    };
    let (bytes, packets) = (run(true), run(false));
    for o in [&bytes, &packets] {
        assert_eq!(o.drops.peer_queue, 0, "{:?}", o.drops);
        assert!(o.delivered_pps > 0.0);
    }
    let ceiling = (MAX_BYTES as usize).div_ceil(1420) as f64;
    assert!(
        bytes.packets_per_poll <= ceiling,
        "{} packets a flush",
        bytes.packets_per_poll
    );
    assert!(
        bytes.packets_per_poll < packets.packets_per_poll,
        "{} against {} packets a flush",
        bytes.packets_per_poll,
        packets.packets_per_poll
    );
}
