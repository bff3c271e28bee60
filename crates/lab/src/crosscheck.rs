//! Cross-check of the lab's TCP figure against iperf3 on the same topology and tunnel:
//! interleaved runs (lab, iperf3, lab, iperf3, …), compared by their medians.

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
