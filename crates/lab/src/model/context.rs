//! What the simulation's scheduler (`engine`) schedules: contexts (threads, softirqs,
//! background work), the cores they run on, and the events that drive the run. Kept
//! apart from the event loop and its rules so that each stays readable on its own.

use super::pipeline::Work;
use std::collections::VecDeque;

pub type Ns = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prio {
    High,
    Normal,
}

/// What a context is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The host's softirq on a core: its host queue and, where the reader stage runs in
    /// softirq (the kernel), the peers' NAPI polls.
    Softirq(usize),
    /// wirelane's `softirq`-model poller number i (pinned, high priority).
    Poller(usize),
    Reader(usize),
    Worker(usize),
    /// A `threaded`-model serial thread, by index.
    SerialThread(usize),
    /// Other work on a core (the load generator on this machine).
    Background(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Sleeping,
    Waking,
    Queued,
    Running,
}

pub struct Ctx {
    pub role: Role,
    pub prio: Prio,
    pub pinned: Option<usize>,
    pub state: State,
    pub last_core: Option<usize>,
    /// A preempted step and its remaining cost.
    pub resume: Option<(Work, f64)>,
    /// Wake-ups this context paid for, added to its next step (scheduling overhead).
    pub debt_ns: f64,
    /// Stage work it did on the side (per-item reader work, items run by the idle
    /// shortcut), added to its next step.
    pub work_debt_ns: f64,
    pub busy_ns: u64,
    /// Softirq and pollers: packets handled since the run began.
    pub run_packets: usize,
    /// A serial drain this context is in the middle of (its next step continues it).
    pub continuation: Option<u32>,
    /// Of `busy_ns`, what scheduling cost it: switches, migrations, wake-ups paid,
    /// preemptions, looking for work before sleeping.
    pub overhead_ns: u64,
    /// It has looked for work once since it last found some: next time it sleeps.
    pub spun: bool,
    /// Woken from sleep and not yet run: the scheduler favours it (see `enqueue`).
    pub woken: bool,
    /// When it last joined a run queue (see `dispatch`).
    pub queued_at: Ns,
}

impl Ctx {
    /// Whether this is a thread of the daemon's, which spins briefly before it sleeps.
    pub fn is_thread(&self) -> bool {
        matches!(
            self.role,
            Role::Reader(_) | Role::Worker(_) | Role::SerialThread(_) | Role::Poller(_)
        )
    }
}

pub(super) struct Running {
    pub(super) ctx: usize,
    pub(super) work: Work,
    pub(super) prio: Prio,
    pub(super) started: Ns,
}

#[derive(Default)]
pub struct Core {
    pub(super) running: Option<Running>,
    pub(super) high: VecDeque<usize>,
    pub(super) normal: VecDeque<usize>,
    pub(super) epoch: u64,
    pub(super) last_ctx: Option<usize>,
    pub(super) slice_start: Ns,
    /// Set while a finished step's effects apply, so that they do not start another.
    pub(super) finishing: bool,
    pub busy_high_ns: u64,
    pub busy_normal_ns: u64,
    pub invocations: u64,
    pub serial_packets: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event {
    StepEnd {
        core: usize,
        epoch: u64,
    },
    Wake(usize),
    /// Packets of a peer leave the link for the host.
    Arrive {
        peer: u32,
        packets: u32,
    },
    /// A sleeping context's own timer (a reader polling for room).
    Timer(usize),
    Acked {
        peer: u32,
        packets: u32,
    },
    Lost {
        peer: u32,
        packets: u32,
        /// Found by the retransmission timer rather than by acknowledgements.
        timeout: bool,
    },
    Background(usize),
}
