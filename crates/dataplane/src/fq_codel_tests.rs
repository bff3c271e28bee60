//! FQ-CoDel on a simulated nanosecond clock.

use super::*;
use crate::codel::CodelParams;

const MS: u64 = 1_000_000;

/// A stand-in packet: its flow, a sequence number, size and ECN capability.
#[derive(Debug, Clone, PartialEq)]
struct P {
    flow: u32,
    seq: u32,
    bytes: usize,
    ect: bool,
    ce: bool,
    /// Ends its run (`Queued::ends_run`).
    ends: bool,
}

impl Queued for P {
    fn bytes(&self) -> usize {
        self.bytes
    }
    fn mark_ce(&mut self) -> bool {
        self.ce |= self.ect;
        self.ect
    }
    fn ends_run(&self) -> bool {
        self.ends
    }
}

fn p(flow: u32, seq: u32, ect: bool) -> P {
    P {
        flow,
        seq,
        bytes: 1400,
        ect,
        ce: false,
        ends: true,
    }
}

/// Keeps a standing queue of `depth` packets of one flow, arriving and leaving at one
/// packet per `gap` ns, for `until` ns; returns the verdicts and the time each drop or
/// mark happened.
fn standing(
    q: &mut FlowQueues<P>,
    params: &CodelParams,
    depth: u32,
    gap: u64,
    from: u64,
    until: u64,
    ect: bool,
) -> (Verdicts, Vec<u64>) {
    let mut v = Verdicts::default();
    let mut events = Vec::new();
    let mut seq = 0;
    while q.len() < depth as usize {
        q.enqueue(1, p(1, seq, ect), from);
        seq += 1;
    }
    let mut now = from;
    while now < until {
        now += gap;
        q.enqueue(1, p(1, seq, ect), now);
        seq += 1;
        let before = (v.dropped, v.marked);
        let _ = q.dequeue(params, now, &mut v);
        if (v.dropped, v.marked) != before {
            events.push(now);
        }
    }
    (v, events)
}

#[test]
fn codel_leaves_a_queue_below_target_alone() {
    let mut q = FlowQueues::default();
    // 10 packets at one per 100 µs: a sojourn of about 1 ms, under the 5 ms target.
    let (v, _) = standing(&mut q, &CodelParams::RFC, 10, 100_000, 0, 2_000 * MS, false);
    assert_eq!((v.dropped, v.marked), (0, 0));
    assert!(v.delivered > 19_000);
}

#[test]
fn codel_drops_after_an_interval_above_target_then_faster() {
    let mut q = FlowQueues::default();
    // 100 packets at one per 100 µs: 10 ms of sojourn, twice the target.
    let (v, events) = standing(
        &mut q,
        &CodelParams::RFC,
        100,
        100_000,
        0,
        1_000 * MS,
        false,
    );
    assert_eq!(v.marked, 0);
    // Nothing before the first interval has passed above target.
    assert!(events[0] >= 100 * MS, "first drop at {} ns", events[0]);
    assert!(events[0] < 120 * MS);
    // The spacing shrinks as interval / sqrt(count).
    let gaps: Vec<u64> = events.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.len() >= 5, "{gaps:?}");
    assert!(gaps[0] > gaps[4], "{gaps:?}");
    let expect = |n: u64| (100.0 * MS as f64 / (n as f64).sqrt()) as u64;
    for (k, g) in gaps.iter().take(5).enumerate() {
        let want = expect(k as u64 + 1);
        assert!(g.abs_diff(want) <= 200_000, "gap {k}: {g} vs {want}");
    }
}

/// RFC 8289's maxpacket is at least a packet as large as any queued: with 9,000-byte
/// packets (a jumbo-frame tunnel), a bucket holding one behind its head is no standing
/// queue, however old its head; with two behind it, it is.
#[test]
fn a_queue_of_one_large_packet_is_no_standing_queue() {
    for (behind, drops) in [(1, false), (2, true)] {
        let mut q = FlowQueues::default();
        let params = CodelParams::RFC;
        let mut v = Verdicts::default();
        let jumbo = |seq| P {
            bytes: 9000,
            ..p(1, seq, false)
        };
        for seq in 0..behind {
            q.enqueue(1, jumbo(seq), 0);
        }
        // Each packet waits 8 ms, above target, for 300 ms.
        let mut now = 0;
        for seq in behind..behind + 300 {
            q.enqueue(1, jumbo(seq), now);
            now += MS;
            let _ = q.dequeue(&params, now + 8 * MS, &mut v);
        }
        assert_eq!(v.dropped > 0, drops, "{behind} behind: {v:?}");
    }
}

/// And at least the device's MTU: a peer sending only small packets (a download's
/// acknowledgements) with two of them behind an old head has no standing queue.
#[test]
fn a_queue_below_one_mtu_is_no_standing_queue() {
    let mut q = FlowQueues::default();
    let params = CodelParams::RFC;
    let mut v = Verdicts::default();
    let ack = |seq| P {
        bytes: 52,
        ..p(1, seq, false)
    };
    for seq in 0..3 {
        q.enqueue(1, ack(seq), 0);
    }
    let mut now = 0;
    for seq in 3..303 {
        q.enqueue(1, ack(seq), now);
        q.note_mtu(1420);
        now += MS;
        let _ = q.dequeue(&params, now + 8 * MS, &mut v);
    }
    assert_eq!(v.dropped, 0, "{v:?}");
}

#[test]
fn codel_stops_when_the_sojourn_recovers() {
    let mut q = FlowQueues::default();
    let (_, events) = standing(&mut q, &CodelParams::RFC, 100, 100_000, 0, 500 * MS, false);
    assert!(!events.is_empty());
    // Drain to a short queue, then keep it short: no more drops.
    let mut v = Verdicts::default();
    let mut now = 500 * MS;
    while q.len() > 5 {
        now += 10_000;
        q.dequeue(&CodelParams::RFC, now, &mut v);
    }
    let (v, events) = standing(
        &mut q,
        &CodelParams::RFC,
        5,
        100_000,
        now,
        now + 1_000 * MS,
        false,
    );
    assert_eq!(v.dropped, 0, "{events:?}");
}

#[test]
fn ecn_capable_packets_are_marked_and_others_dropped() {
    let mut q = FlowQueues::default();
    let (v, _) = standing(&mut q, &CodelParams::RFC, 100, 100_000, 0, 1_000 * MS, true);
    assert!(v.marked > 0);
    assert_eq!(v.dropped, 0);
    let mut q = FlowQueues::default();
    let (v, _) = standing(
        &mut q,
        &CodelParams::RFC,
        100,
        100_000,
        0,
        1_000 * MS,
        false,
    );
    assert!(v.dropped > 0);
    assert_eq!(v.marked, 0);
    // With ECN off, even capable packets are dropped.
    let params = CodelParams {
        ecn: false,
        ..CodelParams::default()
    };
    let mut q = FlowQueues::default();
    let (v, _) = standing(&mut q, &params, 100, 100_000, 0, 1_000 * MS, true);
    assert!(v.dropped > 0);
    assert_eq!(v.marked, 0);
}

#[test]
fn a_sparse_flow_passes_a_bulk_flow() {
    let mut q = FlowQueues::default();
    let mut v = Verdicts::default();
    for seq in 0..500 {
        q.enqueue(1, p(1, seq, false), 0);
    }
    // The bulk flow has used its first quantum (it is an old flow now)...
    for _ in 0..QUANTUM as usize / 1400 + 2 {
        assert_eq!(
            q.dequeue(&CodelParams::RFC, MS, &mut v).map(|x| x.flow),
            Some(1)
        );
    }
    // ...so a request that arrives now leaves next, ahead of ~450 bulk packets.
    q.enqueue(2, p(2, 0, false), MS);
    assert_eq!(
        q.dequeue(&CodelParams::RFC, MS, &mut v).map(|x| x.flow),
        Some(2)
    );
    assert_eq!(
        q.dequeue(&CodelParams::RFC, MS, &mut v).map(|x| x.flow),
        Some(1)
    );
}

#[test]
fn drr_shares_equally_between_backlogged_flows_and_keeps_each_in_order() {
    let mut q = FlowQueues::default();
    let mut v = Verdicts::default();
    // Three flows of 1,400-byte packets, backlogged over 9 quanta each.
    let per_quantum = QUANTUM as u32 / 1400 + 1;
    for seq in 0..10 * per_quantum {
        for flow in [1u32, 2, 3] {
            q.enqueue(flow, p(flow, seq, false), 0);
        }
    }
    let mut counts = [0u32; 4];
    let mut last = [None::<u32>; 4];
    for _ in 0..27 * per_quantum {
        let x = q
            .dequeue(&CodelParams::RFC, MS, &mut v)
            .expect("backlogged");
        counts[x.flow as usize] += 1;
        assert!(last[x.flow as usize].is_none_or(|l| l < x.seq), "reordered");
        last[x.flow as usize] = Some(x.seq);
    }
    // Equal shares, to within one quantum's packets.
    for flow in 1..=3 {
        assert!(
            counts[flow].abs_diff(9 * per_quantum) <= per_quantum,
            "{counts:?}"
        );
    }
}

/// Two bulk flows whose packets come in runs of 45 segments (a super-packet's, with
/// quanta that end inside a run): every turn ends at a run's end, the shares stay
/// equal, and a sparse flow still passes in the middle of a run.
#[test]
fn drr_turns_end_only_at_a_runs_end_and_stay_fair() {
    const RUN: u32 = 45;
    let mut q = FlowQueues::default();
    let mut v = Verdicts::default();
    for seq in 0..20 * RUN {
        for flow in [1u32, 2] {
            let mut x = p(flow, seq, false);
            x.ends = seq % RUN == RUN - 1;
            q.enqueue(flow, x, 0);
        }
    }
    let mut out = Vec::new();
    for _ in 0..30 * RUN + 10 {
        out.push(
            q.dequeue(&CodelParams::RFC, MS, &mut v)
                .expect("backlogged"),
        );
    }
    for w in out.windows(2) {
        if w[0].flow != w[1].flow {
            assert!(w[0].ends, "a turn ended inside a run at {:?}", w[0]);
        }
    }
    let ones = out.iter().filter(|x| x.flow == 1).count() as i64;
    assert!((ones - 15 * RUN as i64).abs() <= 2 * RUN as i64, "{ones}");
    // Mid-run, a new flow's packet still goes first.
    assert!(!out.last().unwrap().ends);
    let running = out.last().unwrap().flow;
    q.enqueue(3, p(3, 0, false), MS);
    assert_eq!(
        q.dequeue(&CodelParams::RFC, MS, &mut v).map(|x| x.flow),
        Some(3)
    );
    assert_eq!(
        q.dequeue(&CodelParams::RFC, MS, &mut v).map(|x| x.flow),
        Some(running)
    );
}

#[test]
fn overflow_drops_from_the_fattest_flow() {
    let mut q = FlowQueues::default();
    for seq in 0..10 {
        q.enqueue(1, p(1, seq, false), 0);
    }
    q.enqueue(2, p(2, 0, false), 0);
    assert!(q.drop_from_fattest());
    assert_eq!(q.len(), 10);
    let mut v = Verdicts::default();
    let all: Vec<P> = std::iter::from_fn(|| q.dequeue(&CodelParams::RFC, 0, &mut v)).collect();
    assert!(all.iter().any(|x| x.flow == 2));
    assert_eq!(all.iter().filter(|x| x.flow == 1).count(), 9);
    assert!(!all.iter().any(|x| x.flow == 1 && x.seq == 0));
}

#[test]
fn an_empty_queue_dequeues_nothing_and_counts_nothing() {
    let mut q: FlowQueues<P> = FlowQueues::default();
    let mut v = Verdicts::default();
    assert!(q.dequeue(&CodelParams::RFC, 0, &mut v).is_none());
    assert!(!q.drop_from_fattest());
    assert_eq!(v, Verdicts::default());
}

/// The transmit budget counts exactly what the flow queues hold once each lock is
/// released, whatever changed it (enqueue, CoDel's drops at dequeue, overflow, clear),
/// and gets it back when they go; a reader finds room only within it.
#[test]
fn the_budget_follows_what_the_flow_queues_hold() {
    let budget = Arc::new(QueueBudget::new(100));
    let params = CodelParams::default();
    let a = SharedFlowQueues::with_budget(budget.clone());
    let b = SharedFlowQueues::with_budget(budget.clone());
    {
        let mut q = a.lock();
        for s in 0..60 {
            q.enqueue(s % 3, p(s % 3, s, false), 0);
        }
        assert_eq!(budget.used(), 0, "settled when the lock goes");
    }
    assert_eq!(budget.used(), 60);
    {
        let q = b.lock_with_room(10, Duration::ZERO);
        assert_eq!(q.budget_room(), 40);
    }
    {
        let mut q = b.lock();
        for s in 0..30 {
            q.enqueue(7, p(7, s, false), 0);
        }
        assert!(q.drop_from_fattest());
    }
    assert_eq!(budget.used(), 89);
    {
        // Dequeued long after: CoDel drops some and delivers others; both leave.
        let mut q = a.lock();
        let mut v = Verdicts::default();
        let mut out = 0;
        for _ in 0..20 {
            out += usize::from(q.dequeue(&params, 500 * MS, &mut v).is_some());
        }
        q.settle();
        assert_eq!(budget.used(), 29 + q.len());
        assert_eq!(q.len(), 60 - out - v.dropped as usize);
    }
    b.lock().clear();
    assert_eq!(budget.used(), a.lock().len());
    drop(a);
    assert_eq!(budget.used(), 0);
}

/// A peer's flow state lives only while it is needed: the buckets go when the last
/// packet leaves, but a bucket whose controller just ended a dropping episode stays,
/// without its packets, until that memory lapses (16 intervals on), so a flow that
/// comes back at once resumes near its old drop rate (RFC 8289 §5.4).
#[test]
fn idle_buckets_are_released_once_their_controllers_have_nothing_to_remember() {
    let params = CodelParams::RFC;
    let mut q: FlowQueues<P> = FlowQueues::default();
    let mut v = Verdicts::default();
    for s in 0..3 {
        q.enqueue(s, p(s, 0, false), 0);
    }
    assert_eq!(q.buckets_held(), 3);
    for _ in 0..3 {
        assert!(q.dequeue(&params, MS, &mut v).is_some());
    }
    assert_eq!(q.buckets_held(), 0, "nothing queued and nothing remembered");

    // A standing queue until CoDel has dropped several times, then a drain.
    let (drops, _) = standing(&mut q, &params, 40, MS, 0, 600 * MS, false);
    assert!(drops.dropped >= 3, "{drops:?}");
    let mut now = 600 * MS;
    while !q.is_empty() {
        now += MS / 10;
        q.dequeue(&params, now, &mut v);
    }
    assert_eq!(q.buckets_held(), 1, "the dropping episode is remembered");

    // Back at once, still above target: the first drop comes after one interval, and
    // the second at the resumed rate, sooner than a fresh controller's interval.
    let back = now + MS;
    let (_, events) = standing(&mut q, &params, 40, MS, back, back + 300 * MS, false);
    assert!(events.len() >= 2, "{events:?}");
    assert!(events[1] - events[0] < params.interval / 2, "{events:?}");
    while !q.is_empty() {
        now = back + 300 * MS;
        q.dequeue(&params, now, &mut v);
    }

    // Refilled and drained once more after the memory lapsed: all released.
    let later = now + 17 * params.interval;
    q.enqueue(1, p(1, 0, false), later);
    assert!(q.dequeue(&params, later, &mut v).is_some());
    assert_eq!(q.buckets_held(), 0);
    assert_eq!(q.len(), 0);
}
