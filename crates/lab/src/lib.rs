//! wirelane lab: a reproducible network-namespace testbed that measures and compares
//! WireGuard implementations (wirelane, wireguard-go, boringtun, kernel) against the
//! plain veth path, with built-in workloads, an impairment relay, a run matrix, and
//! HTML/Markdown reports.

pub mod capture;
pub mod churn;
pub mod cpu;
pub mod crosscheck;
pub mod faults;
pub mod flood;
pub mod hist;
pub mod impls;
pub mod interrupt;
pub mod matrix;
pub mod model;
pub mod netns;
pub mod peers;
pub mod queues;
pub mod record;
pub mod rekey;
pub mod relay;
pub mod report;
pub mod robust;
pub mod run;
pub mod signatures;
pub mod star;
pub mod stats;
pub mod summary;
pub mod testbed;
pub mod topology;
pub mod uapi;
pub mod workload;

pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
