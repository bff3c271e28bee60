//! Execution models: who runs the stages, on which threads. Each model is one module
//! and the only place that spawns threads for it.

pub mod workqueue;

use crate::packet::Batch;
use crate::peer::Peer;
use std::sync::Arc;

/// A unit of work on the shared queue. Crypt items and serial-stage items share one
/// FIFO and one priority, so a serial stage never preempts the crypt work before it:
/// the execution-order inversion of seed 000 cannot happen by construction.
pub enum Work {
    Encrypt(Arc<Batch>),
    Decrypt(Arc<Batch>),
    FlushTx(Arc<Peer>),
    DeliverRx(Arc<Peer>),
}

/// Execution models selectable at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    Workqueue,
}

impl std::str::FromStr for Model {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "workqueue" => Ok(Model::Workqueue),
            other => Err(format!(
                "unknown execution model '{other}' (available: workqueue)"
            )),
        }
    }
}
