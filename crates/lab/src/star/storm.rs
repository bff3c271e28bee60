//! A handshake storm during the timed phase: peers the gateway knows but that have no
//! session yet all initiate at once, as after a restart of the gateway's clients,
//! while the established peers carry the phase's traffic. The run's goodput, loss and
//! delay are then those of the established peers during the storm, to set beside the
//! same run without one.
//!
//! Flow: the storm's generator binds its peers' sockets before the phase (each peer its
//! own outer address, after the established peers' addresses) → waits for the phase's
//! start → every storm peer initiates at once and retries as the protocol says, until
//! all have sessions or the limit passes → its handshake report.

use super::emulated::EmulatedPeer;
use super::generator::{Generator, HandshakeReport, MAX_PEERS};
use crate::Result;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The storm's thread in the generator's namespace `ns`, and the sender that starts it
/// (None calls it off). Storm peer i sends from the address after the `established`
/// peers' (`peer_source(established + i)`), so the two generators never share one, to
/// its tunnel among the gateway's `tunnels`.
pub fn spawn(
    ns: &str,
    established: usize,
    tunnels: usize,
    peers: Vec<EmulatedPeer>,
    limit: Duration,
) -> (
    JoinHandle<Result<Option<HandshakeReport>>>,
    mpsc::Sender<Option<Instant>>,
) {
    let (go_tx, go_rx) = mpsc::channel::<Option<Instant>>();
    let h = crate::workload::in_ns(ns, move || -> Result<Option<HandshakeReport>> {
        let source = move |i: usize| super::peer_source(established + i);
        let gateway = move |i: usize| super::endpoint(established + i, tunnels);
        let mut g = Generator::new(peers, &gateway, Some(&source))?;
        let Some(t0) = go_rx.recv().ok().flatten() else {
            return Ok(None);
        };
        std::thread::sleep(t0.saturating_duration_since(Instant::now()));
        Ok(Some(g.handshake(None, limit)?))
    });
    (h, go_tx)
}

/// The storm peers' outer addresses must stay inside the sources' prefix.
pub fn check(established: usize, storm: usize) -> Result<()> {
    if storm > 0 && storm > MAX_PEERS.saturating_sub(established) {
        return Err(format!(
            "star: {established} established and {storm} storming peers exceed {MAX_PEERS}"
        )
        .into());
    }
    Ok(())
}
