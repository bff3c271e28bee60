//! Timer stage. Input: the device's timer queue. Output: every due peer's protocol
//! timers run (retransmits, keepalives, rekeys, key zeroing) and re-armed.

use crate::device::Device;
use std::sync::atomic::Ordering;

pub fn run_due(dev: &Device) {
    for id in dev.due_timers() {
        let Some(peer) = dev.table().by_id.get(&id).cloned() else {
            continue;
        };
        // This entry is spent; with_peer re-registers the peer's next deadline.
        peer.timer_at.store(u64::MAX, Ordering::Relaxed);
        dev.with_peer(&peer, |state, ctx, out| state.tick(ctx, out));
    }
}
