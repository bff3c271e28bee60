//! The wake-up must never be lost (design.md §4; CVE-2026-52945). Each execution model
//! runs with 2 workers, 32 peers and traffic in both directions through the real
//! runtime, stages and handshakes over in-memory ports, with yields and short sleeps
//! injected at random into the ports (so serial stages are delayed while crypt work
//! completes, and the reverse) for `ROUNDS` rounds. A stall, a serial stage that
//! stopped at an undone head and was never run again, would leave packets in a queue
//! for good: the watchdog fails the test when nothing moves for `STALL` while packets
//! are outstanding, and at the end every queue must be empty and every packet
//! delivered once, in order, intact.
//!
//! How long: `ROUNDS` rounds of 64 packets each way per peer, about 400,000 packets
//! per model, a few seconds each on two cores. `STALL` is far beyond any pause a busy
//! machine causes; a lost wake-up stalls for ever. The lab's `wakeup` scenario runs
//! the same for longer against a release build.

use std::sync::Arc;
use std::time::{Duration, Instant};
use wirelane_dataplane::exec::Model;
use wirelane_dataplane::memory::rig::Rig;
use wirelane_dataplane::memory::Hook;

const PEERS: usize = 32;
const ROUNDS: usize = 100;
const PER_ROUND: usize = 64;
const STALL: Duration = Duration::from_secs(20);

/// Yields on one packet in 16 and sleeps 100 µs on one in 1,024.
fn chaos() -> Hook {
    Arc::new(|| {
        thread_local! {
            static STATE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
        }
        let r = STATE.with(|s| {
            // Seeded per thread by the state's address, so threads draw differently.
            let seed = s as *const _ as u64;
            let mut x = if s.get() == 0 { seed | 1 } else { s.get() };
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.set(x);
            x
        });
        if r.is_multiple_of(1024) {
            std::thread::sleep(Duration::from_micros(100));
        } else if r.is_multiple_of(16) {
            std::thread::yield_now();
        }
    })
}

/// Waits until the rig has delivered `want` packets; panics on a stall.
fn wait_for(rig: &Rig, want: u64, what: &str) {
    let mut last = (rig.delivered().0, Instant::now());
    loop {
        let (got, wrong) = rig.delivered();
        assert_eq!(wrong, 0, "{what}: misdelivered packets");
        if got == want {
            return;
        }
        assert!(
            got < want,
            "{what}: {got} delivered, more than the {want} sent"
        );
        if got != last.0 {
            last = (got, Instant::now());
        } else if last.1.elapsed() > STALL {
            panic!(
                "{what}: stalled at {got} of {want} packets, {} still queued",
                rig.queued()
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn stress(model: Model) {
    let rig = Rig::new(model, 2, PEERS, Some(chaos())).expect("rig");
    let gw = rig.gateway.inner;
    let mut want = 0;
    for round in 0..ROUNDS {
        // Small and full-size packets alternate between rounds.
        let len = if round % 2 == 0 { 200 } else { 1400 };
        for c in &rig.clients {
            c.send(gw, PER_ROUND, len);
            rig.gateway.send(c.inner, PER_ROUND, len);
        }
        want += (2 * PEERS * PER_ROUND) as u64;
        wait_for(&rig, want, &format!("{model}, round {round}"));
    }
    assert_eq!(rig.queued(), 0, "{model}: packets left queued");
    let gw_stats = &rig.gateway.iface.stats;
    let invocations = gw_stats
        .serial_invocations
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(invocations > 0);
    println!("{model}: {want} packets, {invocations} serial invocations at the gateway");
}

#[test]
fn workqueue_never_loses_a_wake_up() {
    stress(Model::Workqueue);
}

#[test]
fn threaded_never_loses_a_wake_up() {
    stress(Model::Threaded);
}

#[test]
fn softirq_never_loses_a_wake_up() {
    stress(Model::Softirq);
}
