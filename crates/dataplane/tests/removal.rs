//! A peer's removal clears its queues and counts what they held (`removed_dropped`).
//! A TUN reader may have routed packets to the peer just before: those reach the flow
//! queues or the nonce stage after the clear, and must be counted too, not queued where
//! no pump would ever take them, holding budget room until the peer is freed.

use std::net::Ipv4Addr;
use wirelane_dataplane::exec::Model;
use wirelane_dataplane::memory::rig::Rig;
use wirelane_dataplane::packet::Packet;
use wirelane_dataplane::stages::{fq, nonce};

fn packets(n: usize) -> Vec<Packet> {
    (0..n).map(|_| Packet::with_capacity(4)).collect()
}

#[test]
fn packets_routed_before_a_removal_are_counted_as_its_drops() {
    let rig = Rig::new(Model::Workqueue, 1, 2, None).unwrap();
    let gw = &rig.gateway.iface;
    let c = rig.runtime.ctx(gw);
    let peer = gw
        .table()
        .route(Ipv4Addr::new(10, 128, 0, 1).into())
        .unwrap()
        .clone();
    let before = gw.stats.total(|s| &s.removed_dropped);
    peer.mark_removed();
    let now = gw.now().as_nanos() as u64;
    fq::enqueue(c, &peer, packets(3), now);
    nonce::assign_and_enqueue(c, &peer, packets(2), nonce::Budget::Enforced);
    assert_eq!(gw.stats.total(|s| &s.removed_dropped) - before, 5);
    assert_eq!(
        peer.tx_fq.lock().len(),
        0,
        "nothing left where no pump goes"
    );
    assert_eq!(peer.tx_queue.queued_packets(), 0);
    assert_eq!(gw.budgets.tx.used(), 0, "no budget room held");
}
