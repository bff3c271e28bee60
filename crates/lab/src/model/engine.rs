//! The simulation's scheduler: cores, the threads (contexts) that run on them, and the
//! event loop. Flow: an event (a step ending, a wake-up, a burst arriving) changes the
//! pipeline's state (`pipeline`), which may make contexts runnable; a core that is free
//! takes its next context (high priority first, then normal in FIFO order) and asks it
//! for its next step; the step's effects apply when it ends.
//!
//! The rules, as on Linux:
//! - A high-priority context (softirq, a SCHED_FIFO poller) preempts a normal one on
//!   its core at once; the preempted step resumes later, `preempt_ns` dearer.
//! - Normal contexts on one core share it in time slices: after a step, a context that
//!   has used `timeslice_ns` yields to the next runnable one. A woken one goes first,
//!   but one that has waited `timeslice_ns` goes before it (EEVDF's deadlines).
//! - A woken context that is not pinned goes to its last core if that core is idle,
//!   else to any idle core (a migration, if it had run elsewhere), else to the core
//!   with the shortest run queue.
//! - Waking a sleeping thread costs the waker `wakeup_ns` and the wakee
//!   `wakeup_latency_ns`; a core switching threads pays `switch_ns`. Raising the
//!   softirq of a core is free and immediate (it is an interrupt or a flag).
//!
//! Invariant: a core runs at most one step at a time, and a context is in exactly one
//! of: sleeping, waking, queued on one core, running on one core.

use super::context::Running;
pub use super::context::{Core, Ctx, Event, Ns, Prio, Role, State};
use super::pipeline::{Pipeline, Signature, Work};
use super::source::{Schedule, Window};
use super::{Outcome, Scenario};
use crate::hist::Histogram;
use crate::model::params::{Direction, Params};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Scheduling counters.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SchedCounts {
    pub wakeups: u64,
    pub switches: u64,
    pub involuntary: u64,
    pub migrations: u64,
    pub preemptions: u64,
    pub events: u64,
}

/// How often background work claims its share of a core.
const BACKGROUND_PERIOD_NS: Ns = 1_000_000;

pub struct Sim {
    pub now: Ns,
    pub end: Ns,
    pub warmup: Ns,
    pub params: Params,
    pub scenario: Scenario,
    heap: BinaryHeap<Reverse<(Ns, u64, Event)>>,
    seq: u64,
    pub cores: Vec<Core>,
    /// When each core's running step ends.
    step_end: Vec<Ns>,
    pub ctxs: Vec<Ctx>,
    pub pipe: Pipeline,
    schedule: Schedule,
    /// Windowed peers (TCP-like), when the scenario has them.
    pub windows: Vec<Window>,
    pub rtt: Ns,
    pub counts: SchedCounts,
    pub latency: Histogram,
    background_pending: Vec<f64>,
    /// The counters when the measured interval began (each core's invocations and
    /// packets, then the pipeline's), so that the outcome counts that interval only.
    pub at_warmup: Option<(Vec<(u64, u64)>, Signature)>,
}

impl Sim {
    pub(super) fn new(mut params: Params, scenario: Scenario, schedule: Schedule) -> Sim {
        let cores = params.platform.cores;
        let plat = &mut params.platform;
        if plat.tun_queue_per_worker && scenario.direction == Direction::Tx {
            plat.reader_threads = scenario.workers.clamp(1, wirelane_io::tun::MAX_QUEUES);
        }
        let end = (scenario.seconds * 1e9) as Ns;
        let warmup = (scenario.warmup_s * 1e9) as Ns;
        let rtt = scenario.tcp_rtt_us.map_or(0, |us| (us * 1e3) as Ns);
        let windows = if scenario.tcp_rtt_us.is_some() {
            vec![Window::default(); scenario.peers]
        } else {
            Vec::new()
        };
        let mut sim = Sim {
            now: 0,
            end,
            warmup,
            pipe: Pipeline::new(&params, &scenario),
            params,
            scenario,
            heap: BinaryHeap::new(),
            seq: 0,
            cores: (0..cores).map(|_| Core::default()).collect(),
            step_end: vec![0; cores],
            ctxs: Vec::new(),
            schedule,
            windows,
            rtt,
            counts: SchedCounts::default(),
            latency: Histogram::default(),
            background_pending: vec![0.0; cores],
            at_warmup: None,
        };
        sim.pipe
            .spawn_contexts(&mut sim.ctxs, &sim.params, &sim.scenario);
        if sim.params.costs(sim.scenario.direction).background_share > 0.0 {
            for c in 0..cores {
                sim.push(0, Event::Background(c));
            }
        }
        sim
    }

    pub fn push(&mut self, at: Ns, ev: Event) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
    }

    /// Runs the simulation to its end and gathers the outcome.
    pub fn run(mut self) -> Outcome {
        loop {
            let t_src = self.schedule.peek();
            let t_ev = self.heap.peek().map_or(Ns::MAX, |Reverse((t, _, _))| *t);
            let t = t_src.min(t_ev);
            if t > self.end {
                break;
            }
            if t >= self.warmup && self.at_warmup.is_none() {
                let cores = self
                    .cores
                    .iter()
                    .map(|c| (c.invocations, c.serial_packets))
                    .collect();
                self.at_warmup = Some((cores, self.pipe.sig.clone()));
            }
            self.now = t;
            self.counts.events += 1;
            if t_src <= t_ev {
                let (_, peer) = self.schedule.pop();
                self.app_send(peer);
                continue;
            }
            let Some(Reverse((_, _, ev))) = self.heap.pop() else {
                break;
            };
            match ev {
                Event::StepEnd { core, epoch } if self.cores[core].epoch == epoch => {
                    self.finish_step(core)
                }
                Event::StepEnd { .. } => {}
                Event::Wake(ctx) => self.enqueue(ctx),
                Event::Arrive { peer, packets } => {
                    let now = self.now;
                    Pipeline::arrive(&mut self, peer, packets, now);
                }
                Event::Timer(ctx) => self.raise(ctx),
                Event::Acked { peer, packets } => {
                    let n = self.windows[peer as usize].acked(packets);
                    self.inject(peer, n);
                }
                Event::Lost {
                    peer,
                    packets,
                    timeout,
                } => {
                    let w = &mut self.windows[peer as usize];
                    let n = w.lost(packets, timeout, self.now, self.rtt);
                    self.inject(peer, n);
                }
                Event::Background(core) => {
                    self.background_pending[core] +=
                        self.params.costs(self.scenario.direction).background_share
                            * BACKGROUND_PERIOD_NS as f64;
                    let ctx = self.pipe.background_ctx[core];
                    self.raise(ctx);
                    self.push(self.now + BACKGROUND_PERIOD_NS, Event::Background(core));
                }
            }
        }
        self.now = self.end;
        for core in 0..self.cores.len() {
            if let Some(r) = self.cores[core].running.take() {
                self.account(core, r.ctx, r.prio, r.started);
            }
        }
        super::outcome::gather(&self)
    }

    /// A peer's application has a burst ready: open-loop peers send it whole.
    fn app_send(&mut self, peer: u32) {
        let burst = self.scenario.burst as u32;
        let n = match self.windows.get_mut(peer as usize) {
            Some(w) => w.offer(burst),
            None => burst,
        };
        self.inject(peer, n);
    }

    fn inject(&mut self, peer: u32, n: u32) {
        if n == 0 {
            return;
        }
        let plat = &self.params.platform;
        if plat.line_gbit > 0.0 && plat.line_buffer_packets > 0 {
            Pipeline::queue_on_link(self, peer, n);
        } else {
            let now = self.now;
            Pipeline::arrive(self, peer, n, now);
        }
    }

    /// Work that a background context has pending on `core`, taken.
    pub fn take_background(&mut self, core: usize) -> f64 {
        std::mem::take(&mut self.background_pending[core])
    }

    /// Makes a sleeping context runnable at once (a raised softirq, background work).
    pub fn raise(&mut self, ctx: usize) {
        if self.ctxs[ctx].state == State::Sleeping {
            self.enqueue(ctx);
        }
    }

    /// Wakes a sleeping thread: the waker (if any) pays for it, and the wakee becomes
    /// runnable after the wake-up latency.
    pub fn wake(&mut self, ctx: usize, waker: Option<usize>) {
        if self.ctxs[ctx].state != State::Sleeping {
            return;
        }
        let s = &self.params.sched;
        if let Some(w) = waker {
            self.ctxs[w].debt_ns += s.wakeup_ns;
        }
        self.counts.wakeups += 1;
        self.ctxs[ctx].state = State::Waking;
        let at = self.now + s.wakeup_latency_ns as Ns;
        self.push(at, Event::Wake(ctx));
    }

    fn core_idle(&self, c: usize) -> bool {
        let core = &self.cores[c];
        core.running.is_none() && core.high.is_empty() && core.normal.is_empty()
    }

    fn place(&self, ctx: usize) -> usize {
        let c = &self.ctxs[ctx];
        if let Some(p) = c.pinned {
            return p;
        }
        let n = self.cores.len();
        let last = c.last_core.unwrap_or(ctx % n);
        if self.core_idle(last) {
            return last;
        }
        if let Some(idle) = (1..n).map(|i| (last + i) % n).find(|&i| self.core_idle(i)) {
            return idle;
        }
        (0..n)
            .map(|i| (last + i) % n)
            .min_by_key(|&i| self.cores[i].normal.len() + self.cores[i].high.len())
            .unwrap_or(last)
    }

    /// Puts a runnable context on a core's run queue, preempting a normal step there if
    /// it has high priority.
    ///
    /// A thread woken from sleep goes to the head of its core's normal queue, and the
    /// thread running there yields to it at the end of its step: EEVDF gives a sleeper
    /// an earlier deadline than a thread that has been running (wake-up preemption).
    fn enqueue(&mut self, ctx: usize) {
        let core = self.place(ctx);
        let woken = self.ctxs[ctx].state == State::Waking;
        self.ctxs[ctx].state = State::Queued;
        self.ctxs[ctx].woken = woken;
        self.ctxs[ctx].queued_at = self.now;
        let prio = self.ctxs[ctx].prio;
        match prio {
            Prio::High => self.cores[core].high.push_back(ctx),
            Prio::Normal if woken => self.cores[core].normal.push_front(ctx),
            Prio::Normal => self.cores[core].normal.push_back(ctx),
        }
        let preempt = prio == Prio::High
            && !self.cores[core].finishing
            && self.cores[core]
                .running
                .as_ref()
                .is_some_and(|r| r.prio == Prio::Normal);
        if preempt {
            self.preempt(core);
        }
        self.dispatch(core);
    }

    fn preempt(&mut self, core: usize) {
        let Some(r) = self.cores[core].running.take() else {
            return;
        };
        self.cores[core].epoch += 1;
        self.counts.preemptions += 1;
        let ends = self.step_end[core];
        self.account(core, r.ctx, r.prio, r.started);
        let remaining = ends.saturating_sub(self.now) as f64 + self.params.sched.preempt_ns;
        let c = &mut self.ctxs[r.ctx];
        c.resume = Some((r.work, remaining));
        c.state = State::Queued;
        c.queued_at = self.now;
        self.cores[core].normal.push_front(r.ctx);
    }

    /// Charges a step's time to its core and context, within the measured interval.
    fn account(&mut self, core: usize, ctx: usize, prio: Prio, started: Ns) {
        let from = started.max(self.warmup);
        if self.now <= from {
            return;
        }
        let d = self.now - from;
        match prio {
            Prio::High => self.cores[core].busy_high_ns += d,
            Prio::Normal => self.cores[core].busy_normal_ns += d,
        }
        self.ctxs[ctx].busy_ns += d;
    }

    /// Starts the next step on a free core, if any context there has one.
    fn dispatch(&mut self, core: usize) {
        if self.cores[core].finishing {
            return;
        }
        let slice = self.params.sched.timeslice_ns as Ns;
        while self.cores[core].running.is_none() {
            let (now, ctxs) = (self.now, &self.ctxs);
            let c = &mut self.cores[core];
            // Woken threads go first (`enqueue`), but a thread that has waited a whole
            // slice runs next: EEVDF's deadlines never let a runnable thread starve
            // behind others that keep waking, however often they do.
            let starved = || {
                let i = c
                    .normal
                    .iter()
                    .position(|&x| now - ctxs[x].queued_at >= slice);
                i.and_then(|i| c.normal.remove(i))
            };
            let local = c
                .high
                .pop_front()
                .or_else(starved)
                .or_else(|| c.normal.pop_front());
            let Some(ctx) = local.or_else(|| self.pull(core)) else {
                return;
            };
            let resumed = self.ctxs[ctx].resume.take();
            let was_resumed = resumed.is_some();
            let step = match resumed {
                Some(s) => Some(s),
                None => Pipeline::next_step(self, ctx),
            };
            let spin = self.params.sched.spin_ns;
            let c = &mut self.ctxs[ctx];
            let (work, cost, mut overhead) = match step {
                Some((w, cost)) => {
                    c.spun = false;
                    (w, cost, 0.0)
                }
                // A thread looks for work a while (the channel's backoff) before it
                // parks; a wake-up in that window finds it awake.
                None if spin > 0.0 && !c.spun && c.is_thread() => {
                    c.spun = true;
                    (Work::Spin, spin, spin)
                }
                None => {
                    c.spun = false;
                    self.sleep(ctx);
                    continue;
                }
            };
            let s = &self.params.sched;
            if was_resumed {
                overhead += s.preempt_ns;
            }
            let debt = std::mem::take(&mut self.ctxs[ctx].debt_ns);
            overhead += debt;
            let mut cost = cost + debt + std::mem::take(&mut self.ctxs[ctx].work_debt_ns);
            if self.cores[core].last_ctx != Some(ctx) {
                cost += s.switch_ns;
                overhead += s.switch_ns;
                self.counts.switches += 1;
                self.cores[core].slice_start = self.now;
                self.cores[core].last_ctx = Some(ctx);
            }
            if self.ctxs[ctx].last_core.is_some_and(|l| l != core) {
                cost += s.migration_ns;
                overhead += s.migration_ns;
                self.counts.migrations += 1;
            }
            let c = &mut self.ctxs[ctx];
            if self.now >= self.warmup {
                c.overhead_ns += overhead.round() as u64;
            }
            c.state = State::Running;
            c.woken = false;
            c.last_core = Some(core);
            let prio = c.prio;
            let ends = self.now + cost.max(0.0).round() as Ns;
            self.step_end[core] = ends;
            self.cores[core].running = Some(Running {
                ctx,
                work,
                prio,
                started: self.now,
            });
            let epoch = self.cores[core].epoch;
            self.push(ends, Event::StepEnd { core, epoch });
        }
    }

    /// Idle balancing: a core with nothing to run takes a waiting thread that is not
    /// pinned from the core with the longest run queue, as Linux's newidle balance does.
    fn pull(&mut self, core: usize) -> Option<usize> {
        let n = self.cores.len();
        let from = (1..n)
            .map(|i| (core + i) % n)
            .filter(|&j| {
                self.cores[j]
                    .normal
                    .iter()
                    .any(|&x| self.ctxs[x].pinned.is_none())
            })
            .max_by_key(|&j| self.cores[j].normal.len())?;
        let q = &mut self.cores[from].normal;
        let i = q.iter().rposition(|&x| self.ctxs[x].pinned.is_none())?;
        q.remove(i)
    }

    fn sleep(&mut self, ctx: usize) {
        let c = &mut self.ctxs[ctx];
        c.state = State::Sleeping;
        if matches!(c.role, Role::Softirq(_) | Role::Poller(_)) {
            // A softirq run ends: the next one starts at high priority again.
            c.prio = Prio::High;
            c.run_packets = 0;
        }
    }

    fn finish_step(&mut self, core: usize) {
        let Some(r) = self.cores[core].running.take() else {
            return;
        };
        self.account(core, r.ctx, r.prio, r.started);
        self.cores[core].finishing = true;
        Pipeline::complete(self, r.ctx, r.work, core);
        self.cores[core].finishing = false;
        let ctx = r.ctx;
        let slice_used = self.now - self.cores[core].slice_start;
        let timeslice = self.params.sched.timeslice_ns as Ns;
        let c = &mut self.cores[core];
        self.ctxs[ctx].state = State::Queued;
        self.ctxs[ctx].queued_at = self.now;
        match self.ctxs[ctx].prio {
            Prio::High => c.high.push_front(ctx),
            Prio::Normal if !c.high.is_empty() => c.normal.push_front(ctx),
            Prio::Normal if c.normal.front().is_some_and(|&f| self.ctxs[f].woken) => {
                self.counts.involuntary += 1;
                c.normal.insert(1, ctx);
            }
            Prio::Normal if !c.normal.is_empty() && slice_used >= timeslice => {
                self.counts.involuntary += 1;
                c.normal.push_back(ctx);
            }
            Prio::Normal => c.normal.push_front(ctx),
        }
        // If another context runs now, `dispatch` pays the switch and starts its slice.
        self.dispatch(core);
        self.kick_idle(core);
    }

    /// A core that keeps a thread waiting while another core idles has that core pull
    /// it, as Linux's busy core kicks an idle one into balancing (`nohz_balancer_kick`
    /// when a run queue holds two or more). Without it, a thread that yielded its slice
    /// behind a pinned one would wait on its core with the other core free.
    fn kick_idle(&mut self, core: usize) {
        let waiting = self.cores[core]
            .normal
            .iter()
            .any(|&x| self.ctxs[x].pinned.is_none());
        if !waiting {
            return;
        }
        if let Some(idle) = (0..self.cores.len()).find(|&c| c != core && self.core_idle(c)) {
            self.dispatch(idle);
        }
    }
}
