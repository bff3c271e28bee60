//! wirelane's data plane: the pipeline stages of design.md §4, per-peer ordered queues,
//! packet batches, and the execution models that run the stages.

pub mod config;
pub mod device;
pub mod exec;
pub mod icmp;
pub mod inner;
pub mod netwatch;
pub mod packet;
pub mod peer;
pub mod pool;
pub mod queue;
pub mod stages;
pub mod stats;

pub use config::{DeviceSnapshot, DeviceUpdate, PeerSnapshot, PeerUpdate};
pub use device::{Device, Sockets};
