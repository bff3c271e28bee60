//! The model's parameters: the platform (cores, how the host delivers packets, queue
//! limits), what each pipeline stage costs per direction, and what scheduling costs.
//! A parameter set is a TOML file with its provenance: `lab/model/*.toml`. The
//! wirelane sets are fitted by `model calibrate` from lab runs; the kernel set is read
//! off seed 000, line by line (see `lab/model/kernel-seed000.toml`).

use crate::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Which way the traffic goes through the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Peers → gateway: decapsulate/classify, decrypt, serial delivery to the TUN.
    Rx,
    /// Gateway → peers: TUN read and route, encrypt, serial flush to the UDP socket.
    Tx,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Rx => "rx",
            Direction::Tx => "tx",
        }
    }
}

impl std::str::FromStr for Direction {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "rx" => Ok(Direction::Rx),
            "tx" => Ok(Direction::Tx),
            _ => Err(format!("unknown direction '{s}' (rx or tx)")),
        }
    }
}

/// What one direction's stages cost, in nanoseconds of one core.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageCosts {
    /// Share of each core that other work takes while traffic goes this way (on the
    /// lab machine: the generator, the sink, the kernel's delivery to them).
    pub background_share: f64,
    /// The host's own delivery of a packet to the daemon (softirq: NIC or veth, UDP
    /// socket; or the TUN path), charged outside the daemon.
    pub host_packet_ns: f64,
    /// Reader stage: per read batch and per packet (RX: decapsulate and classify by
    /// receiver index; TX: route by AllowedIPs and assign the nonce).
    pub reader_batch_ns: f64,
    pub reader_packet_ns: f64,
    /// Reader stage, per crypt item it hands on (a peer's group: nonces, queueing).
    pub reader_item_ns: f64,
    /// Crypt stage: per item, per packet and per byte (decrypt or encrypt).
    pub crypt_item_ns: f64,
    pub crypt_packet_ns: f64,
    pub crypt_byte_ns: f64,
    /// Serial stage (RX: replay check, coalesce, TUN write; TX: UDP send): per
    /// invocation, per batch drained and per packet.
    pub serial_invocation_ns: f64,
    pub serial_batch_ns: f64,
    pub serial_packet_ns: f64,
    /// Serial stage, per send call (TX: a flush's own, or one for all the flushes a
    /// reader's plug holds); 0 where `serial_invocation_ns` carries it, as in the
    /// sets fitted before the daemon counted its plugs.
    #[serde(default)]
    pub serial_send_ns: f64,
}

/// What scheduling costs, in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedCosts {
    /// CPU the waker spends waking a sleeping thread (futex wake, IPI).
    pub wakeup_ns: f64,
    /// From the wake-up until the woken thread can run.
    pub wakeup_latency_ns: f64,
    /// A core switching from one thread to another.
    pub switch_ns: f64,
    /// A thread resuming on another core than last time (cold caches).
    pub migration_ns: f64,
    /// What a preemption costs the preempted item when it resumes.
    pub preempt_ns: f64,
    /// How long a thread keeps its core while others of its priority wait.
    pub timeslice_ns: f64,
    /// CPU a daemon thread spends looking for work before it sleeps (the channel's
    /// backoff); a wake-up meanwhile costs nothing.
    pub spin_ns: f64,
}

/// Who runs the crypt stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pool {
    /// wirelane: one FIFO shared by floating workers (`workqueue`, `threaded`); the
    /// `softirq` model still pins a worker per core and deals items round robin.
    Shared,
    /// The kernel: a bound worker per core, items dealt round robin over the cores,
    /// and work queued from a core runs on that core.
    PerCore,
}

/// What a reader does with an item whose peer's ordered queue is full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueFull {
    /// Waits until the serial stage has drained room, holding the rest of its read
    /// (wirelane's backpressure: `OrderedQueue::wait_for_room`, woken by the drain).
    #[default]
    Wait,
    /// Drops the item after paying to read it (the kernel's full `ptr_ring`).
    Drop,
}

/// The host and the daemon's fixed arrangement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Platform {
    pub cores: usize,
    pub pool: Pool,
    /// Reader threads (wirelane: one per socket or TUN queue). 0: the reader stage runs
    /// in the host's softirq, as the kernel's receive path does.
    pub reader_threads: usize,
    /// On transmit, one reader per worker instead (wirelane's TUN, multi-queue with a
    /// queue per worker by default), each running every small item it reads under the
    /// `workqueue` model (`loops::shortcuts_per_read`).
    #[serde(default)]
    pub tun_queue_per_worker: bool,
    /// Whether the reader gathers packets per peer into one crypt item (wirelane: on
    /// receive each run of one peer's consecutive packets, on transmit all of a peer's
    /// packets in the read) or queues every packet alone (the kernel's per-packet ring).
    pub group_by_peer: bool,
    /// On receive, the most packets of a run of one peer's packets that one crypt item
    /// takes ([`RX_BATCH_MAX`](wirelane_dataplane::packet::RX_BATCH_MAX)); 0: no bound,
    /// as in wirelane before that bound, whose calibrations lack the field.
    #[serde(default)]
    pub rx_item_packets: usize,
    /// Packets one read takes at most (on receive, datagrams: see `reader_runs`).
    pub reader_batch: usize,
    /// On receive, coalesced datagrams (GRO runs) one read takes at most: wirelane
    /// receives into [`GRO_RECV_BUFFERS`](wirelane_dataplane::stages::udp_recv::GRO_RECV_BUFFERS)
    /// buffers. 0: `reader_batch`.
    #[serde(default)]
    pub reader_runs: usize,
    /// Packets one poll of a peer's serial stage takes at most in the `softirq` model
    /// (NAPI's weight), and one poll of a host queue.
    pub poll_budget: usize,
    /// Packets a softirq run handles at high priority before the rest waits at normal
    /// priority (`netdev_budget`; wirelane's `SOFTIRQ_PACKETS`).
    pub softirq_budget: usize,
    /// Capacity of each host queue (NIC ring, or the per-core backlog of veth), packets.
    pub host_queue_packets: usize,
    /// Capacity of each reader's socket (or TUN) queue, packets; 0 when the reader runs
    /// in softirq.
    pub socket_packets: usize,
    /// The device-wide crypt queue's capacity, packets (the kernel's 1,024); 0: none.
    pub crypt_ring_packets: usize,
    /// Each peer's ordered queue, packets.
    pub peer_queue_packets: usize,
    /// On transmit, each peer's ordered queue instead, packets (wirelane: the ring
    /// behind the flow queues, `fq::RING_PACKETS`). 0: `peer_queue_packets`.
    #[serde(default)]
    pub tx_peer_queue_packets: usize,
    /// On transmit, whether that ring is also bounded in bytes by the daemon's
    /// adaptive limit (`ring_limit::RingLimit`, one per peer): it starts at its floor,
    /// grows when a flush finds the ring dry while packets wait in the flow queues, and
    /// falls by the slack it did not need. false: the packet bound alone.
    #[serde(default)]
    pub tx_ring_limit: bool,
    /// What a reader does with an item its peer's queue has no room for.
    #[serde(default)]
    pub peer_queue_full: QueueFull,
    /// Packets in flight between reader and serial stage over all peers before the
    /// reader waits for room (wirelane's interface budget), at most; 0: no such bound.
    pub inflight_packets: usize,
    /// The budget's floor when it is sized by drain rate, packets.
    #[serde(default)]
    pub inflight_min_packets: usize,
    /// The work the budget holds at its drain rate, µs (wirelane's
    /// `budget::BUDGET_TARGET`), re-sized every timer tick; 0: the bound stays at
    /// `inflight_packets`.
    #[serde(default)]
    pub inflight_target_us: f64,
    /// Most serial threads the `threaded` model starts; past it peers share them.
    pub serial_threads_max: usize,
    /// Extra share of the first host queue over the others (RSS hash imbalance): 1.0
    /// gives it twice the packets of each other queue.
    pub rss_skew: f64,
    /// The link's rate, Gbit/s: offered load above it never reaches the host. 0: none.
    pub line_gbit: f64,
    /// The switch port's buffer ahead of the link, packets: where the peers' bursts
    /// (and a TCP-like peer's retransmissions) wait while together they exceed
    /// `line_gbit`; what does not fit is lost there. 0: no such queue, the link only
    /// caps the offered load.
    #[serde(default)]
    pub line_buffer_packets: usize,
}

/// A whole parameter set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Where these figures come from: the machine, the runs, the fit.
    pub provenance: Vec<String>,
    pub platform: Platform,
    pub sched: SchedCosts,
    pub rx: StageCosts,
    pub tx: StageCosts,
}

impl Platform {
    /// What one read takes at most in direction `dir`: on receive, GRO runs
    /// (`reader_runs`, or `reader_batch` when that is 0); on transmit, packets.
    pub fn read_limit(&self, dir: Direction) -> usize {
        match dir {
            Direction::Rx if self.reader_runs > 0 => self.reader_runs,
            _ => self.reader_batch,
        }
    }

    /// Packets each peer's ordered queue holds in direction `dir`.
    pub fn peer_queue(&self, dir: Direction) -> usize {
        match dir {
            Direction::Tx if self.tx_peer_queue_packets > 0 => self.tx_peer_queue_packets,
            _ => self.peer_queue_packets,
        }
    }
}

impl Params {
    pub fn costs(&self, dir: Direction) -> &StageCosts {
        match dir {
            Direction::Rx => &self.rx,
            Direction::Tx => &self.tx,
        }
    }

    pub fn load(path: &Path) -> Result<Params> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read parameters {}: {e}", path.display()))?;
        let p: Params =
            toml::from_str(&text).map_err(|e| format!("parameters {}: {e}", path.display()))?;
        p.check()
            .map_err(|e| format!("parameters {}: {e}", path.display()))?;
        Ok(p)
    }

    pub fn to_toml(&self) -> Result<String> {
        Ok(toml::to_string_pretty(self)?)
    }

    /// Rejects sets the simulation cannot run: no cores, negative or non-finite costs,
    /// zero-sized batches.
    pub fn check(&self) -> std::result::Result<(), String> {
        let p = &self.platform;
        if !(1..=4096).contains(&p.cores) {
            return Err(format!("cores must be 1 to 4096, not {}", p.cores));
        }
        if p.reader_batch == 0 || p.poll_budget == 0 || p.softirq_budget == 0 {
            return Err("reader_batch, poll_budget and softirq_budget must be at least 1".into());
        }
        if p.peer_queue_packets == 0 || p.host_queue_packets == 0 {
            return Err("peer_queue_packets and host_queue_packets must be at least 1".into());
        }
        if p.reader_threads > 0 && p.socket_packets == 0 {
            return Err("socket_packets must be at least 1 when reader_threads > 0".into());
        }
        if p.serial_threads_max == 0 {
            return Err("serial_threads_max must be at least 1".into());
        }
        if p.reader_threads > 1024 {
            return Err("reader_threads must be at most 1024".into());
        }
        // Costs and times in ns (or µs) up to a second: beyond it, simulated times
        // added up overflow, and no stage of a packet costs that.
        let finite = |v: f64| v.is_finite() && (0.0..=1e9).contains(&v);
        if !(p.inflight_target_us.is_finite() && (0.0..=1e6).contains(&p.inflight_target_us)) {
            return Err("inflight_target_us must be 0 to 1,000,000".into());
        }
        if !(finite(p.rss_skew) && finite(p.line_gbit)) {
            return Err("rss_skew and line_gbit must be 0 to 10^9".into());
        }
        let s = &self.sched;
        let sched = [
            s.wakeup_ns,
            s.wakeup_latency_ns,
            s.switch_ns,
            s.migration_ns,
            s.preempt_ns,
            s.spin_ns,
        ];
        let slice_ok = finite(s.timeslice_ns) && s.timeslice_ns > 0.0;
        if !(sched.into_iter().all(finite) && slice_ok) {
            return Err("scheduling costs must be 0 to 10^9 ns, the time slice more than 0".into());
        }
        for (dir, c) in [("rx", &self.rx), ("tx", &self.tx)] {
            let all = [
                c.host_packet_ns,
                c.reader_batch_ns,
                c.reader_packet_ns,
                c.reader_item_ns,
                c.crypt_item_ns,
                c.crypt_packet_ns,
                c.crypt_byte_ns,
                c.serial_invocation_ns,
                c.serial_batch_ns,
                c.serial_packet_ns,
                c.serial_send_ns,
            ];
            if !all.into_iter().all(finite) {
                return Err(format!("{dir} stage costs must be 0 to 10^9 ns"));
            }
            if !(0.0..0.95).contains(&c.background_share) {
                return Err(format!("{dir} background_share must be in [0, 0.95)"));
            }
        }
        Ok(())
    }
}
