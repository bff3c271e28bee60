//! A stage that panics (a bug) costs its batch and nothing more, under every model: the
//! panic is caught where the model runs the item, counted in `stage_panics`, the peer's
//! ordered stage is claimed again, and what follows is delivered in order. Uncaught,
//! the panic took a worker with it and left the peer's stage claimed for good, so the
//! tunnel stopped. The panic is injected through the memory ports' hook, which runs on
//! every datagram sent and every packet written to a TUN: inside the ordered stages.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wirelane_dataplane::exec::Model;
use wirelane_dataplane::memory::rig::Rig;
use wirelane_dataplane::memory::Hook;
use wirelane_dataplane::packet::{Batch, Packet};
use wirelane_dataplane::sched::{Crypt, Direction};
use wirelane_dataplane::stages;

/// How long the test waits for packets: liveness, not a rate.
const PATIENCE: Duration = Duration::from_secs(10);

/// A hook that panics once, the first time it runs after `armed` is set.
fn panic_once(armed: Arc<AtomicBool>) -> Hook {
    Arc::new(move || {
        if armed.swap(false, Ordering::SeqCst) {
            panic!("injected by the test");
        }
    })
}

/// Waits until the gateway's sink has seen `last` packets or the gaps before them.
fn wait_for(rig: &Rig, seen: u64) {
    let started = Instant::now();
    while rig.delivered().0 + rig.gaps() < seen && started.elapsed() < PATIENCE {
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_panicking_stage_costs_its_batch_only() {
    for model in Model::ALL {
        let armed = Arc::new(AtomicBool::new(false));
        let rig = Rig::new(model, 2, 1, Some(panic_once(armed.clone()))).unwrap();
        let (client, gw) = (&rig.clients[0], rig.gateway.inner);
        client.send(gw, 1, 200);
        wait_for(&rig, 1);
        assert_eq!(rig.delivered(), (1, 0), "{model}: the session first");

        armed.store(true, Ordering::SeqCst);
        client.send(gw, 64, 200);
        wait_for(&rig, 65);
        assert!(
            !armed.load(Ordering::SeqCst),
            "{model}: no stage ran the hook"
        );
        // After the panic, the same peer's stages go on.
        client.send(gw, 64, 1400);
        wait_for(&rig, 129);

        let (delivered, wrong) = rig.delivered();
        assert_eq!(
            delivered + rig.gaps(),
            129,
            "{model}: delivered {delivered}, lost {}",
            rig.gaps()
        );
        assert_eq!(wrong, 0, "{model}: what came after it came in order");
        assert!(rig.gaps() <= 64, "{model}: more than one batch lost");
        // Nothing is left held: every queue drained.
        assert_eq!(rig.queued(), 0, "{model}: packets left queued");
        assert_eq!(
            panics_once_counted(&rig),
            1,
            "{model}: the panic is counted once"
        );
    }
}

fn panics(rig: &Rig) -> u64 {
    let ends = std::iter::once(&rig.gateway).chain(&rig.clients);
    ends.map(|e| e.iface.stats.total(|c| &c.stage_panics)).sum()
}

/// The panics counted, once at least one is or the patience ran out. A thread counts
/// its panic after unwinding, and printing the backtrace first (`RUST_BACKTRACE` is
/// set in CI) can outlast the delivery of everything sent after it: when the hook
/// first runs on the gateway's handshake thread, as the response leaves (the client's
/// initiation was delivered before its own hook ran), nothing waits for that thread.
fn panics_once_counted(rig: &Rig) -> u64 {
    let started = Instant::now();
    while panics(rig) == 0 && started.elapsed() < PATIENCE {
        std::thread::sleep(Duration::from_millis(5));
    }
    panics(rig)
}

/// A crypt item that panics midway leaves its batch marked done with its packets
/// dropped and counted, so the peer's delivery passes it and goes on; unfinished, the
/// batch held everything behind it in the peer's ordered queue.
#[test]
fn a_panicking_crypt_item_does_not_hold_its_peer() {
    for model in Model::ALL {
        let rig = Rig::new(model, 2, 1, None).unwrap();
        let (client, gw) = (&rig.clients[0], &rig.gateway.iface);
        client.send(rig.gateway.inner, 1, 200);
        wait_for(&rig, 1);
        assert_eq!(rig.delivered(), (1, 0), "{model}: the session first");

        // A packet that claims more bytes than its buffer: opening it panics.
        let peer = gw.table().by_id.values().next().unwrap().clone();
        let keypair = peer.state().current_keypair().unwrap().clone();
        let mut bad = Packet::with_capacity(0);
        bad.len = bad.buf.len() + 1;
        let batch = Batch::new(keypair, vec![bad]);
        assert!(peer.rx_queue.push(batch.clone(), 1));
        let c = rig.runtime.ctx(gw);
        let item = Crypt {
            iface: gw,
            peer: &peer,
            batch: batch.clone(),
            dir: Direction::Rx,
        };
        stages::run_crypt(c.sched, item);
        assert!(batch.is_done(), "{model}: the batch was finished");

        client.send(rig.gateway.inner, 64, 200);
        wait_for(&rig, 65);
        assert_eq!(rig.delivered(), (65, 0), "{model}: what came after it");
        assert_eq!(rig.queued(), 0, "{model}: packets left queued");
        assert_eq!(
            panics_once_counted(&rig),
            1,
            "{model}: the panic is counted once"
        );
        let lost = gw.stats.total(|c| &c.crypt_panic_dropped);
        assert_eq!(lost, 1, "{model}: its packet counted as lost to the panic");
        let failed = gw.stats.total(|c| &c.rx_auth_failed);
        assert_eq!(failed, 0, "{model}: and not as failed authentication");
    }
}

/// A panic on a reader thread costs that read's work, not the reader: here the first
/// packet's initiation panics as it leaves the client's TUN reader (after it was sent,
/// and after the packet was staged), and the tunnel still comes up and carries what
/// the same reader reads next. Uncaught, the reader died and nothing more was read.
/// (The hook runs after the datagram is delivered, so on a loaded machine the gateway
/// may answer first and its handshake thread takes the panic instead; it too goes on.)
#[test]
fn a_panicking_reader_goes_on_reading() {
    for model in Model::ALL {
        let armed = Arc::new(AtomicBool::new(true));
        let rig = Rig::new(model, 2, 1, Some(panic_once(armed.clone()))).unwrap();
        let (client, gw) = (&rig.clients[0], rig.gateway.inner);
        client.send(gw, 1, 200);
        wait_for(&rig, 1);
        assert!(
            !armed.load(Ordering::SeqCst),
            "{model}: no stage ran the hook"
        );
        client.send(gw, 64, 200);
        wait_for(&rig, 65);
        assert_eq!(rig.delivered(), (65, 0), "{model}: delivered, out of order");
        assert_eq!(
            panics_once_counted(&rig),
            1,
            "{model}: the panic is counted once"
        );
    }
}
