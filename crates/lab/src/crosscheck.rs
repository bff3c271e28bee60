//! Checks of the lab's TCP meter.
//!
//! - [`meter`]: against an independent meter of the *same* transfer, the receiving
//!   tunnel interface's kernel byte counter. The two count different things (the lab
//!   what the application read, the kernel every IP packet it delivered, with its
//!   headers and any retransmission), so they agree to within the headers: a check that
//!   holds on a busy machine as on an idle one, which the tests use.
//! - [`run`]: against iperf3 on the same topology and tunnel, interleaved runs (lab,
//!   iperf3, lab, iperf3, …) compared by their medians. Two different transfers on a
//!   machine whose figures swing between runs: a command for users, not a test.

use crate::impls::{find_tool, Impl, Tunnel};
use crate::relay::Impairment;
use crate::stats::median;
use crate::topology::{Testbed, Topology};
use crate::workload::tcp;
use crate::Result;
use std::time::Duration;

pub struct CrossCheck {
    pub lab_bps: Vec<f64>,
    pub iperf3_bps: Vec<f64>,
}

impl CrossCheck {
    /// Relative difference of the medians, |lab − iperf3| / iperf3.
    pub fn difference(&self) -> f64 {
        let (l, i) = (
            median(&self.lab_bps).unwrap_or(0.0),
            median(&self.iperf3_bps).unwrap_or(0.0),
        );
        if i == 0.0 {
            f64::INFINITY
        } else {
            (l - i).abs() / i
        }
    }
}

fn iperf3_bps(bed: &Testbed, addr: std::net::IpAddr, secs: f64) -> Result<f64> {
    let (a, b) = (&bed.hosts[0].ns, &bed.hosts[1].ns);
    let port = 5201 + (std::process::id() % 1000) as u16;
    let mut server = b
        .command("iperf3")
        .args(["-s", "-1", "-p", &port.to_string(), "-B", &addr.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(300));
    let out = a.run(&format!(
        "timeout {} iperf3 -J -c {addr} -p {port} -t {secs}",
        secs as u64 + 20
    ));
    let _ = server.kill();
    let _ = server.wait();
    let v: serde_json::Value = serde_json::from_str(&out?)?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| "iperf3 reported no throughput".into())
}

pub fn run(which: Impl, secs: f64, repeats: usize) -> Result<CrossCheck> {
    find_tool("iperf3")
        .ok_or("iperf3 is not installed (apt-get install --no-install-recommends iperf3)")?;
    let bed = Testbed::build(Topology::Pair, Impairment::default())?;
    let tun = Tunnel::up(which, &bed)?;
    let (a, b) = (bed.hosts[0].ns.name.clone(), bed.hosts[1].ns.name.clone());
    // Warm-up transfer completes the handshake and fills caches for both tools alike.
    tcp::bulk(&a, &b, tun.addr_b, 1, Duration::from_millis(500))?;
    let mut c = CrossCheck {
        lab_bps: Vec::new(),
        iperf3_bps: Vec::new(),
    };
    for _ in 0..repeats {
        c.lab_bps
            .push(tcp::bulk(&a, &b, tun.addr_b, 1, Duration::from_secs_f64(secs))?.goodput_bps);
        c.iperf3_bps.push(iperf3_bps(&bed, tun.addr_b, secs)?);
    }
    Ok(c)
}

/// One lab transfer and the receiving interface's count of it.
#[derive(Debug, Clone, Copy)]
pub struct MeterCheck {
    /// Bytes the lab's receivers read.
    pub lab_bytes: u64,
    /// Bytes the tunnel interface of the receiving host took in meanwhile, headers and
    /// retransmissions included.
    pub interface_bytes: u64,
    /// Segments the senders retransmitted.
    pub retransmits: u64,
}

impl MeterCheck {
    /// The lab's bytes as a share of the interface's: below 1 by the headers (about
    /// 52 bytes per segment of 1,368 at this MTU, fewer where segments are coalesced)
    /// and retransmissions.
    pub fn ratio(&self) -> f64 {
        self.lab_bytes as f64 / self.interface_bytes.max(1) as f64
    }
}

/// The interface's received-bytes counter in namespace `ns`.
fn rx_bytes(ns: &crate::netns::Netns, ifname: &str) -> Result<u64> {
    let out = ns.run(&format!("cat /sys/class/net/{ifname}/statistics/rx_bytes"))?;
    Ok(out.trim().parse()?)
}

/// Runs one lab TCP transfer of `secs` through a tunnel of `which` and reads the
/// receiving interface's counter around it.
pub fn meter(which: Impl, secs: f64) -> Result<MeterCheck> {
    let bed = Testbed::build(Topology::Pair, Impairment::default())?;
    let tun = Tunnel::up(which, &bed)?;
    let (a, b) = (bed.hosts[0].ns.name.clone(), bed.hosts[1].ns.name.clone());
    let receiver = tun
        .daemons
        .get(1)
        .map(|d| d.ifname.clone())
        .ok_or("the meter check needs a tunnel")?;
    // The handshake first, so the counter sees only the transfer.
    tcp::bulk(&a, &b, tun.addr_b, 1, Duration::from_millis(300))?;
    let before = rx_bytes(&bed.hosts[1].ns, &receiver)?;
    let t = tcp::bulk(&a, &b, tun.addr_b, 1, Duration::from_secs_f64(secs))?;
    // Whatever is still in flight has been read by the receivers before bulk returns.
    let after = rx_bytes(&bed.hosts[1].ns, &receiver)?;
    Ok(MeterCheck {
        lab_bytes: t.bytes,
        interface_bytes: after - before,
        retransmits: t.retransmits,
    })
}
