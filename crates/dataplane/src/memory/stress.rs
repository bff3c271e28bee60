//! The scheduling stress run: a model with few workers, many peers and traffic both
//! ways through the real runtime over in-memory ports, with yields and short sleeps
//! injected at random into the ports (so serial stages are delayed while crypt work
//! completes, and the reverse), round after round. A lost wake-up (a serial stage that
//! stopped at an undone head and was never run again) leaves packets queued for good:
//! the watchdog reports a stall when nothing moves for `stall` while packets are
//! outstanding. The test (`tests/wakeup.rs`) and `wirelane-lab wakeup` both run it.

use super::rig::Rig;
use super::Hook;
use crate::exec::Model;
use crate::stats::DROP_REASONS;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct Stress {
    pub model: Model,
    pub workers: usize,
    pub peers: usize,
    pub rounds: usize,
    /// Packets each way per peer per round.
    pub per_round: usize,
    /// How long nothing may move before it counts as a stall.
    pub stall: Duration,
    /// Whether packets the daemon dropped and counted (a reader that waited
    /// `BACKPRESSURE_WAIT` for room under overload gives up, as a qdisc would) are
    /// allowed. Either way a packet lost without a count, one misdelivered, or one
    /// left queued fails the run: those are what a lost wake-up leaves.
    pub allow_counted_drops: bool,
}

/// What happened.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub packets: u64,
    /// Serial-stage invocations at the gateway.
    pub invocations: u64,
    /// The longest a round took to drain after its last packet was handed in.
    pub slowest_drain: Duration,
    /// Packets dropped and counted by a drop reason, at every end.
    pub counted_drops: u64,
    /// The same by reason, where not zero.
    pub drops_by_reason: Vec<(String, u64)>,
}

/// Yields on one packet in 16 and sleeps 100 µs on one in 1,024.
pub fn chaos() -> Hook {
    Arc::new(|| {
        thread_local! {
            static STATE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
        }
        let r = STATE.with(|s| {
            // Seeded per thread by the state's address, so threads draw differently.
            let mut x = match s.get() {
                0 => s as *const _ as u64 | 1,
                x => x,
            };
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

/// Each queue that holds something, with its state: a peer's ordered queues
/// (`OrderedQueue::describe`) and its staged packets.
fn queue_states(rig: &Rig) -> Vec<String> {
    let mut v = Vec::new();
    for (name, end) in rig.named_ends() {
        for p in end.iface.table().by_id.values() {
            let at = format!("{name} {} peer {}", end.inner, p.id);
            for (dir, q) in [("tx", &p.tx_queue), ("rx", &p.rx_queue)] {
                let (batches, scheduled, head_done) = q.describe();
                if batches > 0 {
                    v.push(format!(
                        "{at} {dir}: {batches} batches, scheduled {scheduled}, head done \
                         {head_done:?}"
                    ));
                }
            }
            // Packets staged for a session: not in any queue, and stranded if no
            // handshake is under way to send them.
            let staged = p.staged_len();
            if staged > 0 {
                v.push(format!("{at} staged: {staged} packets"));
            }
        }
    }
    v
}

/// Every end's counters that count a packet lost, where not zero, and the queues that
/// hold something in the same state twice, `settle` apart: where a stall's packets
/// went. A queue seen once may only be a keepalive passing (the 10 s keepalive timer
/// fires about when a 10 s watchdog does); one that stays put is stuck.
fn loss_counters(rig: &Rig, settle: Duration) -> String {
    let before = queue_states(rig);
    std::thread::sleep(settle);
    let mut seen: Vec<String> = queue_states(rig)
        .into_iter()
        .filter(|q| before.contains(q))
        .collect();
    for (name, end) in rig.named_ends() {
        let b = &end.iface.budgets;
        if b.rx.used() + b.tx.used() > 0 {
            seen.push(format!(
                "{name} {} budget used rx={} tx={} (limit {})",
                end.inner,
                b.rx.used(),
                b.tx.used(),
                b.rx.limit()
            ));
        }
        for (field, n) in end.iface.stats.fields() {
            if n > 0 && DROP_REASONS.contains(&field.as_str()) {
                seen.push(format!("{name} {} {field}={n}", end.inner));
            }
        }
    }
    if seen.is_empty() {
        "none".to_string()
    } else {
        seen.join(", ")
    }
}

/// Waits until the rig has delivered `want` packets, or with `allow_drops` until
/// what it delivered and what it counted as dropped make `want`; Err on a stall, a
/// misdelivered packet, or (without `allow_drops`) a missing one.
fn wait_for(
    rig: &Rig,
    want: u64,
    stall: Duration,
    allow_drops: bool,
    what: &str,
) -> Result<(), String> {
    let progress = || {
        let got = rig.delivered().0;
        got + if allow_drops { rig.counted_drops() } else { 0 }
    };
    let mut last = (progress(), Instant::now());
    loop {
        let (got, wrong) = rig.delivered();
        if wrong > 0 {
            return Err(format!("{what}: {wrong} packets misdelivered"));
        }
        let gaps = rig.gaps();
        if gaps > 0 && !allow_drops {
            return Err(format!(
                "{what}: {gaps} packets missing; loss counters: {}",
                loss_counters(rig, Duration::ZERO)
            ));
        }
        let now = progress();
        if got == want || (allow_drops && now >= want) {
            return Ok(());
        }
        if got > want {
            return Err(format!(
                "{what}: {got} delivered, more than the {want} sent"
            ));
        }
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > stall {
            return Err(format!(
                "{what}: stalled at {got} of {want} packets ({} counted as dropped), {} still \
                 queued; loss counters and stuck queues: {}",
                rig.counted_drops(),
                rig.queued(),
                loss_counters(rig, Duration::from_secs(1))
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn run(s: Stress) -> Result<Outcome, String> {
    let rig = Rig::new(s.model, s.workers, s.peers, Some(chaos())).map_err(|e| e.to_string())?;
    let gw = rig.gateway.inner;
    // Sessions first, client-initiated: when both ends of a tunnel initiate at once,
    // each overwrites its own handshake with the other's (as in every WireGuard), and
    // the retry 5 s later settles it; rounds should measure the pipeline, not that.
    for c in &rig.clients {
        c.send(gw, 1, 100);
    }
    let mut want = s.peers as u64;
    wait_for(&rig, want, s.stall, s.allow_counted_drops, "handshakes")?;
    let mut slowest = Duration::ZERO;
    for round in 0..s.rounds {
        // Small and full-size packets alternate between rounds.
        let len = if round % 2 == 0 { 200 } else { 1400 };
        for c in &rig.clients {
            c.send(gw, s.per_round, len);
            rig.gateway.send(c.inner, s.per_round, len);
        }
        want += (2 * s.peers * s.per_round) as u64;
        let handed = Instant::now();
        let what = format!("{}, round {round}", s.model);
        wait_for(&rig, want, s.stall, s.allow_counted_drops, &what)?;
        slowest = slowest.max(handed.elapsed());
    }
    if rig.queued() != 0 {
        return Err(format!("{}: {} packets left queued", s.model, rig.queued()));
    }
    // Every packet missing must be one the daemon counted: a drop the reader chose.
    let (gaps, counted_drops) = (rig.gaps(), rig.counted_drops());
    if gaps > counted_drops {
        return Err(format!(
            "{}: {gaps} packets missing but {counted_drops} counted as dropped",
            s.model
        ));
    }
    let invocations = rig.gateway.iface.stats.total(|c| &c.serial_invocations);
    Ok(Outcome {
        packets: want,
        invocations,
        slowest_drain: slowest,
        counted_drops,
        drops_by_reason: rig.drops_by_reason(),
    })
}
