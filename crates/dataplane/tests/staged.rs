//! Packets sent before a session exists are staged, and the session that the handshake
//! they began makes usable sends them, first. The sender here is held just after its
//! initiation leaves (the memory port's hook runs after delivery), so the gateway
//! answers and the client's handshake thread completes the session while the sender
//! has not yet returned from the step that found no session. Staged after that step,
//! as before, the packet found the session's `SendStaged` already done and waited for
//! the next handshake, minutes away: nothing arrived.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wirelane_dataplane::exec::Model;
use wirelane_dataplane::memory::rig::Rig;
use wirelane_dataplane::memory::Hook;

/// Far beyond the handshake's few milliseconds here, and far below the next retry
/// (5 s), which would otherwise resend the staged packet by chance.
const HOLD: Duration = Duration::from_millis(300);

/// How long the test waits for the packets: liveness, not a rate.
const PATIENCE: Duration = Duration::from_secs(4);

fn hold_first_send() -> Hook {
    let calls = Arc::new(AtomicUsize::new(0));
    Arc::new(move || {
        // The first packet to cross any port is the client's initiation.
        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            std::thread::sleep(HOLD);
        }
    })
}

#[test]
fn staged_packets_go_first_when_the_session_arrives_before_staging_ends() {
    for model in Model::ALL {
        let rig = Rig::new(model, 2, 1, Some(hold_first_send())).unwrap();
        let client = &rig.clients[0];
        client.send(rig.gateway.inner, 1, 200);
        // Sent once the first is staged or on its way: numbered after it, so the
        // gateway's sink sees them out of order if the staged packet goes late.
        std::thread::sleep(HOLD * 2);
        client.send(rig.gateway.inner, 5, 200);
        let started = Instant::now();
        while rig.delivered().0 < 6 && started.elapsed() < PATIENCE {
            std::thread::sleep(Duration::from_millis(5));
        }
        let staged: usize = client
            .iface
            .table()
            .by_id
            .values()
            .map(|p| p.staged_len())
            .sum();
        assert_eq!(
            rig.delivered(),
            (6, 0),
            "{model}: (delivered, out of order); still staged at the client: {staged}"
        );
    }
}
