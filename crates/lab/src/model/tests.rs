//! The simulation against theory and against its own invariants. Deterministic: every
//! run is seeded, and nothing here reads a clock.

use super::calibrate;
use super::params::{Platform, Pool, QueueFull, SchedCosts, StageCosts};
use super::*;

/// A platform with nothing in the way: huge queues, no scheduling costs.
pub(super) fn bare(cores: usize, pool: Pool, readers: usize) -> Params {
    Params {
        provenance: vec!["test".into()],
        platform: Platform {
            cores,
            pool,
            reader_threads: readers,
            tun_queue_per_worker: false,
            group_by_peer: readers > 0,
            reader_batch: 64,
            rx_item_packets: 0,
            reader_runs: 0,
            poll_budget: 64,
            softirq_budget: 300,
            host_queue_packets: 1 << 20,
            socket_packets: 1 << 20,
            crypt_ring_packets: 0,
            peer_queue_packets: 1 << 20,
            tx_peer_queue_packets: 0,
            tx_ring_limit: false,
            peer_queue_full: QueueFull::Drop,
            inflight_packets: 0,
            inflight_min_packets: 0,
            inflight_target_us: 0.0,
            serial_threads_max: 1024,
            rss_skew: 0.0,
            line_gbit: 0.0,
            line_buffer_packets: 0,
        },
        sched: SchedCosts {
            timeslice_ns: 3e6,
            ..SchedCosts::default()
        },
        rx: StageCosts::default(),
        tx: StageCosts::default(),
    }
}

/// A star run offered 20 Gbit/s, far more than any test platform carries, for 0.2 s.
fn overloaded(model: Model, workers: usize, peers: usize, dir: Direction) -> Scenario {
    Scenario {
        offered_gbit: 20.0,
        seconds: 0.2,
        warmup_s: 0.05,
        ..Scenario::star(model, workers, peers, dir)
    }
}

/// M/D/1: one core, one stage of fixed cost D, Poisson arrivals at rate λ. Utilisation
/// is ρ = λD and the mean wait before service ρD / (2(1 − ρ)) (Pollaczek–Khinchine).
#[test]
fn one_core_one_stage_matches_m_d_1() {
    let d_ns = 1000.0;
    for rho in [0.5, 0.8] {
        let mut p = bare(1, Pool::PerCore, 0);
        p.platform.poll_budget = 1;
        p.platform.softirq_budget = usize::MAX;
        p.rx.host_packet_ns = d_ns;
        let size = 1000;
        let pps = rho / (d_ns * 1e-9);
        let sc = Scenario {
            model: Model::Softirq,
            workers: 1,
            peers: 1,
            direction: Direction::Rx,
            size,
            offered_gbit: pps * size as f64 * 8.0 / 1e9,
            burst: 1,
            poisson: true,
            tcp_rtt_us: None,
            seconds: 4.0,
            warmup_s: 0.1,
            seed: 42,
        };
        let o = simulate(&p, &sc).unwrap();
        let wait_theory_us = rho * d_ns / (2.0 * (1.0 - rho)) / 1e3;
        let util = o.core_busy[0];
        assert!(
            (util / rho - 1.0).abs() < 0.02,
            "ρ {rho}: utilisation {util}"
        );
        let w = o.host_wait_mean_us;
        assert!(
            (w / wait_theory_us - 1.0).abs() < 0.02,
            "ρ {rho}: wait {w} µs, theory {wait_theory_us} µs"
        );
    }
}

fn light(model: Model, direction: Direction, peers: usize) -> Scenario {
    Scenario {
        offered_gbit: 1.0,
        seconds: 0.05,
        warmup_s: 0.0,
        ..Scenario::star(model, 2, peers, direction)
    }
}

fn costed(mut p: Params) -> Params {
    let c = StageCosts {
        background_share: 0.0,
        host_packet_ns: 300.0,
        reader_batch_ns: 2000.0,
        reader_packet_ns: 200.0,
        reader_item_ns: 100.0,
        crypt_item_ns: 500.0,
        crypt_packet_ns: 100.0,
        crypt_byte_ns: 0.5,
        serial_invocation_ns: 1000.0,
        serial_batch_ns: 200.0,
        serial_packet_ns: 400.0,
        serial_send_ns: 0.0,
    };
    p.rx = c.clone();
    p.tx = c;
    p.sched = SchedCosts {
        wakeup_ns: 2000.0,
        wakeup_latency_ns: 10_000.0,
        switch_ns: 1500.0,
        migration_ns: 3000.0,
        preempt_ns: 1000.0,
        timeslice_ns: 3e6,
        spin_ns: 3000.0,
    };
    p
}

/// Under a load the platform carries, every model delivers every packet offered: no
/// drop, and nothing left behind but what was still in flight at the end.
#[test]
fn every_model_delivers_everything_it_can_carry() {
    for (p, name) in [
        (costed(bare(4, Pool::Shared, 1)), "wirelane-like"),
        (costed(bare(4, Pool::PerCore, 0)), "kernel-like"),
    ] {
        for model in Model::ALL {
            for dir in [Direction::Rx, Direction::Tx] {
                for peers in [1, 100] {
                    let sc = light(model, dir, peers);
                    let o = simulate(&p, &sc).unwrap();
                    let what = format!("{name} {model} {dir:?} {peers} peers");
                    let d = &o.drops;
                    assert_eq!(d.host + d.socket + d.crypt_ring + d.peer_queue, 0, "{what}");
                    assert!(o.signature.packets > 0, "{what}");
                    let in_flight = (o.offered_gbit - o.goodput_gbit) / o.offered_gbit;
                    assert!(
                        in_flight < 0.05,
                        "{what}: {in_flight} of the offered load still in flight"
                    );
                }
            }
        }
    }
}

#[test]
fn runs_are_reproducible_and_seeds_matter() {
    let p = costed(bare(4, Pool::PerCore, 0));
    let sc = light(Model::Softirq, Direction::Rx, 100);
    let a = simulate(&p, &sc).unwrap();
    let b = simulate(&p, &sc).unwrap();
    assert_eq!(a.sched.events, b.sched.events);
    assert_eq!(a.latency_p99_us, b.latency_p99_us);
    let c = simulate(&p, &Scenario { seed: 2, ..sc }).unwrap();
    assert_ne!(a.sched.events, c.sched.events);
}

#[test]
fn bad_scenarios_and_parameters_are_refused() {
    let p = bare(2, Pool::Shared, 1);
    let good = light(Model::Workqueue, Direction::Rx, 10);
    for bad in [
        Scenario {
            peers: 0,
            ..good.clone()
        },
        Scenario {
            workers: 0,
            ..good.clone()
        },
        Scenario {
            offered_gbit: f64::NAN,
            ..good.clone()
        },
        Scenario {
            burst: 0,
            ..good.clone()
        },
        Scenario {
            seconds: 0.0,
            ..good.clone()
        },
        Scenario {
            tcp_rtt_us: Some(-1.0),
            ..good.clone()
        },
    ] {
        assert!(simulate(&p, &bad).is_err(), "{bad:?}");
    }
    let mut q = p.clone();
    q.platform.cores = 0;
    assert!(simulate(&q, &good).is_err());
    let mut q = p.clone();
    q.rx.crypt_byte_ns = -1.0;
    assert!(simulate(&q, &good).is_err());
    assert!(toml::from_str::<Params>("provenance = []\n[platform]\ncores = 2").is_err());
}

/// With one peer, delivery cannot exceed one core's serial rate whatever the worker
/// count; a serial stage on a thread of its own (`threaded`, with a core to spare)
/// reaches it.
#[test]
fn one_peer_is_bounded_by_its_serial_stage() {
    let mut p = bare(4, Pool::Shared, 1);
    p.rx.serial_packet_ns = 2000.0; // 500 kpps at most
    p.rx.crypt_byte_ns = 0.1;
    let sc = overloaded(Model::Threaded, 2, 1, Direction::Rx);
    let o = simulate(&p, &sc).unwrap();
    assert!(o.delivered_pps <= 500_000.0 * 1.001, "{}", o.delivered_pps);
    assert!(o.delivered_pps > 450_000.0, "{}", o.delivered_pps);
}

/// Threads that keep waking each other (a reader dealing single packets to pinned
/// workers) go ahead of a thread that has been running, but never starve one that
/// waits: background work still gets its share of the cores, as under EEVDF.
#[test]
fn threads_that_keep_waking_do_not_starve_background_work() {
    let mut p = bare(2, Pool::Shared, 1);
    p.tx.background_share = 0.3;
    p.tx.reader_packet_ns = 1000.0;
    p.tx.crypt_item_ns = 3000.0;
    p.tx.serial_packet_ns = 1000.0;
    let sc = overloaded(Model::Softirq, 2, 1000, Direction::Tx);
    let o = simulate(&p, &sc).unwrap();
    let share = o.busy.background_s / (2.0 * (sc.seconds - sc.warmup_s));
    assert!(share > 0.25, "background got {share:.3} of the cores");
}

/// A reader whose peer's queue is full waits for the drain (wirelane) instead of
/// dropping what it paid to read (the kernel): overloaded, the waiting reader loses
/// nothing at the peer's queue and leaves the excess in the socket, and reads of many
/// runs, larger than the whole peer queue, still get through.
#[test]
fn a_reader_waits_for_room_in_a_full_peer_queue_or_drops_as_told() {
    let run = |full: QueueFull| {
        let mut p = bare(2, Pool::Shared, 1);
        p.platform.peer_queue_packets = 256;
        p.platform.socket_packets = 4096;
        p.platform.peer_queue_full = full;
        p.rx.serial_packet_ns = 1000.0;
        p.rx.reader_packet_ns = 200.0;
        p.rx.crypt_byte_ns = 0.5;
        let sc = overloaded(Model::Workqueue, 1, 1, Direction::Rx);
        simulate(&p, &sc).unwrap()
    };
    let waits = run(QueueFull::Wait);
    assert_eq!(waits.drops.peer_queue, 0);
    assert!(waits.drops.socket > 0, "{:?}", waits.drops);
    assert!(waits.delivered_pps > 0.0);
    let drops = run(QueueFull::Drop);
    assert!(drops.drops.peer_queue > 0, "{:?}", drops.drops);
}

/// On receive, a read's run of one peer's packets becomes crypt items of at most the
/// platform's bound (wirelane's `RX_BATCH_MAX`), and one item without it.
#[test]
fn a_long_run_of_one_peer_is_cut_into_bounded_crypt_items() {
    let run = |bound: usize| {
        let mut p = costed(bare(2, Pool::Shared, 1));
        p.platform.reader_runs = 16;
        p.platform.rx_item_packets = bound;
        // Each read costs about what the offered load brings in 0.4 ms, so that reads
        // find the socket full: 16 runs of 45.
        p.rx.reader_batch_ns = 400_000.0;
        let sc = overloaded(Model::Workqueue, 2, 1, Direction::Rx);
        let o = simulate(&p, &sc).unwrap();
        o.signature.packets as f64 / o.signature.crypt_items as f64
    };
    let bounded = run(64);
    assert!(bounded <= 64.0 * 1.01, "{bounded} packets per item");
    let whole = run(0);
    assert!(whole > 128.0, "{whole} packets per item");
}

/// Calibration recovers known stage costs from runs the model itself made with them:
/// every figure the runs identify is within 5% of the truth. Where items per packet
/// barely vary, a per-item cost cannot be told from a per-packet one, so their sum at
/// the runs' items per packet is what is compared.
///
/// Everything is held to it but receive's cost per invocation: there every item is
/// one 45-packet GSO run and invocations per packet vary only with the peer count, so
/// the fit leaves part of it in the per-packet cost (it recovers 2,504 ns of 3,000 with
/// 5 ms interface budgets, 189 with 1 ms ones). For the same reason the per-packet figure
/// compared includes the invocations' share at the runs' invocations per packet.
/// On transmit a flush costs a per-invocation and a per-send share, and a reader's
/// plug sends many flushes at once: only the plugged runs tell the two apart, so what
/// is held to 5% is a flush's whole cost with a send of its own, and the send's share
/// alone to 8%.
#[test]
fn calibration_recovers_known_parameters_from_synthetic_runs() {
    use super::calibrate::{fit, lab_scenario, observe_outcome, wirelane_platform};
    let sched = SchedCosts {
        wakeup_ns: 1500.0,
        wakeup_latency_ns: 3000.0,
        switch_ns: 500.0,
        migration_ns: 2000.0,
        preempt_ns: 500.0,
        timeslice_ns: 1.5e6,
        spin_ns: 5000.0,
    };
    let rx = StageCosts {
        background_share: 0.2,
        reader_packet_ns: 500.0,
        reader_item_ns: 300.0,
        crypt_item_ns: 2000.0,
        crypt_byte_ns: 0.55,
        serial_invocation_ns: 3000.0,
        serial_packet_ns: 800.0,
        ..StageCosts::default()
    };
    // On transmit a flush also pays a send, once per plug when a reader runs it.
    let tx = StageCosts {
        reader_packet_ns: 1500.0,
        serial_packet_ns: 1200.0,
        serial_invocation_ns: 1500.0,
        serial_send_ns: 3000.0,
        ..rx.clone()
    };
    let truth = Params {
        provenance: vec!["synthetic".into()],
        platform: wirelane_platform(2),
        sched: sched.clone(),
        rx,
        tx,
    };
    let mut obs = Vec::new();
    for model in Model::ALL {
        for workers in [1, 2] {
            for peers in [1, 10, 300] {
                for direction in [Direction::Rx, Direction::Tx] {
                    let shape = calibrate::Observation {
                        model,
                        workers,
                        cores: 2,
                        peers,
                        direction,
                        size: 1420,
                        offered_gbit: (direction == Direction::Rx).then_some(8.0),
                        seconds: 0.0,
                        goodput_gbit: 0.0,
                        cpu_s_per_gb: 0.0,
                        packets: 0,
                        batches: 0,
                        invocations: 0,
                        plugged: 0,
                        plug_sends: 0,
                        reader_s: 0.0,
                        stages_s: 0.0,
                        aead_floor_s_per_gb: 0.55,
                        spread: 0.0,
                        background_share: 0.0,
                    };
                    let sc = lab_scenario(&shape, 0.4);
                    let o = simulate(&truth, &sc).unwrap();
                    obs.push(observe_outcome(&sc, 2, 0.55, &o));
                }
            }
        }
    }
    let fitted = fit(&obs, sched, vec![], 0.4).unwrap();
    let mut misses = Vec::new();
    for (dir, want, got) in [("rx", &truth.rx, &fitted.rx), ("tx", &truth.tx, &fitted.tx)] {
        let mine: Vec<_> = obs.iter().filter(|o| o.direction.name() == dir).collect();
        let mean_per_packet = |count: fn(&calibrate::Observation) -> u64| {
            mine.iter()
                .map(|o| count(o) as f64 / o.packets as f64)
                .sum::<f64>()
                / mine.len() as f64
        };
        let items = mean_per_packet(|o| o.batches);
        let invocations = mean_per_packet(|o| o.invocations);
        // A reader's plug makes one send call for all the flushes it ran.
        let sends = mean_per_packet(|o| o.serial_calls());
        let reader = |c: &StageCosts| c.reader_packet_ns + c.reader_item_ns * items;
        let flush = |c: &StageCosts| c.serial_invocation_ns + c.serial_send_ns;
        let stages = |c: &StageCosts| {
            c.serial_packet_ns
                + c.crypt_item_ns * items
                + c.serial_invocation_ns * invocations
                + c.serial_send_ns * sends
        };
        for (name, w, g) in [
            ("reader per packet", reader(want), reader(got)),
            ("crypt_byte_ns", want.crypt_byte_ns, got.crypt_byte_ns),
            ("crypt and serial per packet", stages(want), stages(got)),
            // What a flush with its own send costs, and what a plug saves a flush: the
            // runs tell these apart. Only plugged runs separate the two terms, so each
            // share alone is held within 8%, not 5% (the per-flush one comes out
            // 7% off; the send's, 5.4% with the ring's byte limit, which makes the
            // one-peer flushes smaller and more numerous).
            (
                "serial_invocation_ns + serial_send_ns",
                flush(want),
                flush(got),
            ),
            ("serial_send_ns", want.serial_send_ns, got.serial_send_ns),
        ] {
            let held = match dir {
                "rx" => !name.starts_with("serial_"),
                _ => true,
            };
            let bound = if name == "serial_send_ns" { 0.08 } else { 0.05 };
            if held && (g / w - 1.0).abs() >= bound {
                misses.push(format!("{dir} {name}: fitted {g:.1}, truth {w:.1}"));
            }
        }
    }
    assert!(misses.is_empty(), "{misses:#?}");
}

/// When the runs cannot tell items from invocations (the two-column fit makes one cost
/// negative), the fit keeps the column that explains them better, whichever it is:
/// here the cost is per invocation, and items track packets, not invocations.
#[test]
fn a_one_column_fit_keeps_the_column_that_explains_the_runs() {
    use super::calibrate::fit_nonneg;
    // (items, invocations) per packet, as transmit's cells give them.
    let shapes = [
        (0.05, 0.015),
        (0.2, 0.05),
        (1.0, 0.33),
        (1.0, 1.0),
        (0.3, 0.25),
        (1.0, 0.5),
    ];
    let rows: Vec<_> = shapes
        .iter()
        .map(|&(items, inv)| (500.0 - 80.0 * items + 6000.0 * inv, [items, inv, 0.0]))
        .collect();
    let weights = vec![1.0; rows.len()];
    let [per_packet, per_item, per_invocation, _] = fit_nonneg(&rows, &weights);
    assert_eq!(per_item, 0.0);
    assert!(
        (per_invocation / 6000.0 - 1.0).abs() < 0.05,
        "{per_invocation}"
    );
    assert!(per_packet > 0.0);
}

/// The kernel's NAPI re-poll (`NAPIF_STATE_MISSED`): a completion on another core while
/// a peer's poll is scheduled makes the poll run once more, on the core it ran on, even
/// when the first poll already took every packet; wirelane's serial stage does not.
#[test]
fn a_kernel_poll_that_missed_a_completion_runs_again_where_it_ran() {
    use super::engine::Sim;
    use super::pipeline::{Entry, Pipeline};
    use super::source::{Rng, Schedule};
    for (readers, polls, empty) in [(0, 2, 1), (1, 1, 0)] {
        let mut p = bare(2, Pool::PerCore, readers);
        p.rx.serial_packet_ns = 1000.0;
        let sc = Scenario {
            seconds: 0.001,
            warmup_s: 0.0,
            ..Scenario::star(Model::Softirq, 2, 1, Direction::Rx)
        };
        // One burst in a period far longer than the run: the peer sends nothing itself.
        let quiet = Schedule::new(1, 1e15, false, &mut Rng::new(1));
        let mut sim = Sim::new(p, sc, quiet);
        let pe = &mut sim.pipe.peers[0];
        pe.queue.push_back(Entry {
            packets: 1,
            done: true,
            arrived: 0,
        });
        pe.queued = 1;
        // Core 0 completes the packet and its poll starts there; core 1 then completes
        // one the poll has taken already (as a later packet's schedule call would).
        let waker = sim.pipe.worker_ctx[0];
        Pipeline::schedule_serial(&mut sim, 0, 0, waker);
        let waker = sim.pipe.worker_ctx[1];
        Pipeline::schedule_serial(&mut sim, 0, 1, waker);
        let o = sim.run();
        let s = &o.signature;
        assert_eq!((s.invocations, s.packets, s.empty_polls), (polls, 1, empty));
        assert_eq!(o.core_packets_per_poll[1], 0.0, "core 1 never polled");
    }
}

/// Seed 000's collapsed state (MODEL.md): with the clients' first round unpaced and the
/// receive interrupts' core taking three times another's share, the kernel baseline's
/// polls converge on one core, which saturates and polls many packets at a time while
/// the others idle; the same start under `workqueue`, whose polls run at the workers'
/// priority, overloads every core alike instead.
#[test]
fn the_kernel_baseline_converges_on_one_core_and_workqueue_does_not() {
    use super::studies::{busiest_and_rest, seed000_scenario};
    let mut p: Params = toml::from_str(cli::KERNEL_PARAMS).unwrap();
    p.platform.line_buffer_packets = 0;
    p.platform.rss_skew = 2.0;
    let run = |m| simulate(&p, &seed000_scenario(&p, m, 1000, 0.5)).unwrap();
    let base = run(Model::Softirq);
    let (busiest, rest, ppp_busiest, ppp_rest) = busiest_and_rest(&base);
    assert!(busiest > 0.95 && rest < 0.2, "{busiest} {rest}");
    assert!(ppp_busiest > 3.0 * ppp_rest, "{ppp_busiest} {ppp_rest}");
    let wq = run(Model::Workqueue);
    let (busiest, rest, _, _) = busiest_and_rest(&wq);
    assert!(busiest - rest < 0.1 && rest > 0.9, "{busiest} {rest}");
    assert!(wq.goodput_gbit > 2.0 * base.goodput_gbit);
}

/// Parameter files and scenarios a simulation cannot run are refused before it starts:
/// a cost past a second (time overflowed), an infinite in-flight target (a panic), a
/// rate no run could finish.
#[test]
fn unrunnable_parameters_and_scenarios_are_refused() {
    let ok = bare(4, Pool::Shared, 1);
    assert!(ok.check().is_ok());
    let mut p = ok.clone();
    p.rx.crypt_byte_ns = 1e300;
    assert!(p.check().is_err());
    let mut p = ok.clone();
    p.platform.inflight_target_us = f64::INFINITY;
    assert!(p.check().is_err());
    let mut p = ok.clone();
    p.platform.reader_threads = 10_000_000_000;
    assert!(p.check().is_err());
    let base = Scenario::star(Model::Workqueue, 2, 10, Direction::Rx);
    assert!(base.check().is_ok());
    let sc = Scenario {
        offered_gbit: 1e7,
        ..base.clone()
    };
    assert!(sc.check().is_err());
    let sc = Scenario {
        tcp_rtt_us: Some(1e300),
        ..base
    };
    assert!(sc.check().is_err());
}
