//! A TUN reader's transmit plug must not make the reader wait on itself. Flushes run on
//! the reader during a read keep their peers' claims until the read is handed on; a
//! batch finished meanwhile stays queued, counted in the interface's transmit budget,
//! until then. A later group of the same read that waited for budget room held by those
//! batches could only wait out the whole backpressure wait and then drop its packets.
//! The reader now sends what its plug holds before it waits.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wirelane_dataplane::budget::{BUDGET_MIN_PACKETS, BUDGET_MIN_SHARE_PACKETS};
use wirelane_dataplane::exec::Model;
use wirelane_dataplane::memory::rig::Rig;
use wirelane_dataplane::packet::{Batch, Packet};
use wirelane_dataplane::stages::{fq, tx_flush};

fn packets(n: usize) -> Vec<Packet> {
    (0..n).map(|_| Packet::with_capacity(4)).collect()
}

#[test]
fn a_reader_never_waits_for_room_its_own_plug_holds() {
    let rig = Rig::new(Model::Workqueue, 1, 2, None).unwrap();
    let gw = &rig.gateway.iface;
    let c = rig.runtime.ctx(gw);
    let route = |i: u32| {
        let table = gw.table();
        table
            .route(Ipv4Addr::from(0x0a80_0000 + i).into())
            .unwrap()
            .clone()
    };
    let (p, q) = (route(1), route(2));
    let kp = Arc::new(wirelane_proto::sim::keypair(true));
    let done = |n: usize| {
        let b = Batch::new(kp.clone(), packets(n));
        b.mark_done();
        b
    };
    // The budget at its floor, where no drain rate this test makes can move it: the
    // rig's three interfaces share the pool's.
    let floor = (BUDGET_MIN_PACKETS / 3).max(BUDGET_MIN_SHARE_PACKETS);
    let deadline = Instant::now() + Duration::from_secs(30);
    while gw.budgets.tx.limit() > floor && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(gw.budgets.tx.limit(), floor);
    tx_flush::plugged(c, || {
        // A flush of P on this reader: plugged, it keeps P's claim.
        assert!(p.tx_queue.push(done(1), 1));
        assert!(p.tx_queue.schedule());
        tx_flush::flush(c, &p, usize::MAX);
        // Other peers' packets in flight take half the budget; P's next batch
        // finishes meanwhile, and as the claim is the plug's it waits in P's queue,
        // past what the budget allows.
        gw.budgets.tx.add(floor / 2);
        assert!(p.tx_queue.push_past_budget(done(floor), floor));
        assert!(!p.tx_queue.schedule(), "the plug holds P's claim");
        assert!(!gw.budgets.tx.fits(3));
        // Q's group in the same read needs room only P's flush can make.
        let now = gw.now().as_nanos() as u64;
        fq::enqueue(c, &q, packets(3), now);
    });
    assert_eq!(gw.stats.total(|s| &s.tx_fq_overflow), 0);
    assert_eq!(gw.stats.total(|s| &s.tx_dropped), 0);
}
