//! wirelane's data plane: the pipeline stages of design.md §4, per-peer ordered queues,
//! packet batches, the scheduling seam and the execution models behind it, and the
//! runtime that serves one or many interfaces with one set of threads.
//!
//! Layering (each module uses only those above it in this list, never back):
//! `queue`, `packet`, `pool`, `peer`, `stats`, `inner`, `icmp`, `underload`, `socket_buffer` → `ports`, `sockets`,
//! `netwatch` → `interface` → `sched` → `stages` (which call only `sched`'s trait) →
//! `exec` (one module per execution model), and `loops`, `shared_readers`,
//! `tun_readers` and `udp_readers` (the I/O loops no model owns) → `runtime`. `config` applies UAPI updates through the stages.
//!
//! With `--cfg loom`, only the ordered queue is built, for its model checks.

/// The interface-wide bound on the packets its peers' queues hold together.
pub mod budget;
#[cfg(not(loom))]
pub mod codel;
#[cfg(not(loom))]
pub mod config;
#[cfg(not(loom))]
pub mod cookie_slot;
#[cfg(not(loom))]
pub mod exec;
/// FQ-CoDel: flow fairness and a sojourn-time controller before the nonce stage.
#[cfg(not(loom))]
pub mod fq_codel;
#[cfg(not(loom))]
pub mod icmp;
#[cfg(not(loom))]
pub mod idmap;
#[cfg(not(loom))]
pub mod inner;
#[cfg(not(loom))]
pub mod interface;
#[cfg(not(loom))]
pub mod loops;
#[cfg(not(loom))]
pub mod memory;
#[cfg(not(loom))]
pub mod netwatch;
#[cfg(not(loom))]
pub mod packet;
#[cfg(not(loom))]
pub mod peer;
#[cfg(not(loom))]
pub mod pool;
#[cfg(not(loom))]
pub mod ports;
pub mod queue;
/// The adaptive byte limit on each peer's transmit ring.
#[cfg(not(loom))]
pub mod ring_limit;
#[cfg(not(loom))]
pub mod runtime;
#[cfg(not(loom))]
pub mod sched;
#[cfg(not(loom))]
mod shared_readers;
/// The data socket's receive buffer, sized by the sojourn of what waits in it.
#[cfg(not(loom))]
pub mod socket_buffer;
#[cfg(not(loom))]
pub mod sockets;
#[cfg(not(loom))]
pub mod stages;
#[cfg(not(loom))]
pub mod stats;
#[cfg(not(loom))]
pub mod threads;
#[cfg(not(loom))]
pub mod timer_queue;
#[cfg(not(loom))]
pub mod tun_readers;
#[cfg(not(loom))]
pub mod udp_readers;
#[cfg(not(loom))]
pub mod underload;

#[cfg(not(loom))]
pub use config::{DeviceSnapshot, DeviceUpdate, PeerSnapshot, PeerUpdate};
#[cfg(not(loom))]
pub use interface::Interface;
#[cfg(not(loom))]
pub use runtime::Runtime;
#[cfg(not(loom))]
pub use sockets::Sockets;
