//! Rekeying under sustained traffic, in real time: a paced, content-checked UDP stream
//! through a wirelane pair tunnel for long enough that the session is replaced several
//! times (REKEY_AFTER_TIME is 120 s), and what the receiver saw across the rekeys.

use crate::impls::{self, Tunnel};
use crate::relay::Impairment;
use crate::topology::{Testbed, Topology};
use crate::workload::udp::{self, UdpResult};
use crate::{uapi, Result};
use std::time::Duration;

#[derive(Debug, Default)]
pub struct RekeyOutcome {
    pub seconds: f64,
    pub pps: u64,
    pub udp: UdpResult,
    /// Handshakes each side completed during the stream.
    pub handshakes_a: u64,
    pub handshakes_b: u64,
}

/// Streams `pps` datagrams per second from A to B for `dur` and counts the handshakes
/// each side completed meanwhile.
pub fn rekey_scenario(dur: Duration, pps: u64) -> Result<RekeyOutcome> {
    let bed = Testbed::build(Topology::Pair, Impairment::default())?;
    let tun = Tunnel::up(impls::WIRELANE, &bed)?;
    let (a, b) = (bed.hosts[0].ns.name.clone(), bed.hosts[1].ns.name.clone());
    bed.hosts[0]
        .ns
        .run(&format!("ping -c 1 -W 2 {}", tun.addr_b))?; // the first handshake
    let completed = |i: usize| -> Result<u64> {
        let s = uapi::stats(&tun.daemons[i].ifname)?;
        Ok(s.get("handshakes_completed").copied().unwrap_or(0))
    };
    let before = (completed(0)?, completed(1)?);
    let udp = udp::stream(&a, &b, tun.addr_b, 1_000, Some(pps), dur)?;
    Ok(RekeyOutcome {
        seconds: dur.as_secs_f64(),
        pps,
        udp,
        handshakes_a: completed(0)? - before.0,
        handshakes_b: completed(1)? - before.1,
    })
}

pub fn print_rekey(o: &RekeyOutcome) {
    println!("| figure | value |\n|---|---|");
    println!("| stream | {:.0} s at {} datagrams/s |", o.seconds, o.pps);
    println!(
        "| handshakes completed, A / B | {} / {} |",
        o.handshakes_a, o.handshakes_b
    );
    println!(
        "| sent / delivered / lost / duplicates / reordered / corrupted | {} / {} / {} / {} / {} / {} |",
        o.udp.sent, o.udp.received, o.udp.lost, o.udp.duplicates, o.udp.reordered, o.udp.corrupted
    );
}
