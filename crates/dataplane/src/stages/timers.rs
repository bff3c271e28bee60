//! Timer stage. Input: the device's timer queue. Output: every due peer's protocol
//! timers run (retransmits, keepalives, rekeys, key zeroing) and re-armed. A handshake
//! the timers start (a retry, or one after data went unanswered) leaves from the
//! route's choice of source: the sticky one may be why the peer stopped answering, as
//! kernel WireGuard reasons when it clears it there too.

use super::nonce::step;
use super::StageCtx;
use crate::timer_queue::take;
use wirelane_proto::Output;

pub fn run_due(c: StageCtx<'_>) {
    let dev = c.iface;
    for (at, id) in dev.due_timers() {
        let Some(peer) = dev.table().by_id.get(&id).cloned() else {
            continue;
        };
        // This entry is spent; the step arms the peer's next deadline.
        take(&peer.timer_at, at);
        step(c, &peer, |state, ctx, out| {
            state.tick(ctx, out);
            if out.iter().any(|o| matches!(o, Output::Initiation { .. })) {
                peer.forget_source();
            }
        });
    }
}
