//! End-to-end run of the lab (as root): the smoke matrix over `none`, `wireguard-go`
//! and `wirelane` at 2 s per cell, the report, and the iperf3 cross-check.

use std::process::Command;
use wirelane_lab::record::RunRecord;

fn lab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_wirelane-lab"))
}

#[test]
fn smoke_matrix_results_and_report() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the lab needs root for namespaces"
    );
    let wirelane =
        std::path::Path::new(env!("CARGO_BIN_EXE_wirelane-lab")).with_file_name("wirelane");
    assert!(
        wirelane.is_file(),
        "build the daemon first: {}",
        wirelane.display()
    );
    let out = std::env::temp_dir().join(format!("wirelane-lab-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let matrix = concat!(env!("CARGO_MANIFEST_DIR"), "/../../lab/smoke.toml");
    let st = lab()
        .args(["run", matrix, "--out"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());

    let text = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    let recs: Vec<RunRecord> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 4 * 3, "4 cells × 3 implementations");
    for r in &recs {
        let na = r.implementation == "none" && r.cell_id.contains('[');
        assert_eq!(
            r.error.is_some(),
            na,
            "{} {}: {:?}",
            r.cell_id,
            r.implementation,
            r.error
        );
        assert!(!r.env.kernel.is_empty() && r.env.cores > 0 && !r.env.commit.is_empty());
        assert!(r.env.versions.contains_key(&r.implementation));
        if r.implementation != "none" && !na {
            assert!(!r.peak_rss_kib.is_empty() && r.cpu.daemon_s > 0.0, "{r:?}");
            assert!(!r.cpu.cores.is_empty() && !r.cpu.threads.is_empty());
        }
    }
    // Every implementation moved intact data. How fast is the lab's question, not the
    // test's: figures on a busy machine say nothing about the code.
    for imp in ["none", "wirelane", "wireguard-go"] {
        let r = recs
            .iter()
            .find(|r| r.implementation == imp && r.cell_id.starts_with("tcp"))
            .unwrap();
        assert!(
            !r.tcp.is_empty() && r.tcp.iter().all(|t| t.bytes > 0 && t.corrupt_bytes == 0),
            "{imp}: {:?}",
            r.tcp
        );
    }
    for r in recs.iter().filter(|r| r.cell_id.starts_with("rr")) {
        let l = r.latency.unwrap();
        assert!(
            l.transactions > 100 && l.p50_us > 0.0 && l.p99_us >= l.p50_us,
            "{l:?}"
        );
    }
    // The 10% loss set on the relay is what it drew (±2 points over thousands of
    // draws), and what the UDP receiver observes of the datagrams that reached the
    // tunnel (±3 points): losses the kernel counted at either host, which a busy
    // machine adds, are set aside.
    for r in recs
        .iter()
        .filter(|r| r.cell_id.contains("loss10%") && r.error.is_none())
    {
        let u = r.udp.unwrap();
        let relay = &r.relay[0];
        let dropped = relay.dropped as f64 * 100.0 / relay.received as f64;
        assert!((8.0..=12.0).contains(&dropped), "relay dropped {dropped}%");
        let entered = u.sent.saturating_sub(u.sender_drops).max(1);
        let in_tunnel = u.lost.saturating_sub(u.sender_drops + u.receiver_drops);
        let loss = in_tunnel as f64 * 100.0 / entered as f64;
        assert!(
            (dropped - 3.0..=dropped + 3.0).contains(&loss),
            "{}: {loss:.1}% lost in the tunnel, the relay dropped {dropped:.1}%: {u:?}",
            r.implementation
        );
        assert_eq!(u.duplicates, 0);
    }
    // Unimpaired UDP through a tunnel: nothing reordered or duplicated.
    for r in recs
        .iter()
        .filter(|r| r.cell_id.starts_with("udp") && !r.cell_id.contains('['))
    {
        let u = r.udp.unwrap();
        assert!(
            u.received > 0 && u.duplicates == 0,
            "{}: {u:?}",
            r.implementation
        );
    }

    let st = lab().arg("report").arg(&out).status().unwrap();
    assert!(st.success());
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.matches("<svg").count() >= 8, "charts missing");
    assert!(html.contains("History") && html.contains("wireguard-go"));
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        md.contains("| tcp 1x a→b | wirelane | goodput Gbit/s |"),
        "{md}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_matrix_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("wirelane-lab-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = dir.join("m.toml");
    std::fs::write(&m, "name = \"x\"\nimplementations = [\"warp\"]\nbaseline = \"warp\"\n[[workload]]\nkind = \"tcp\"\n").unwrap();
    let o = lab().arg("run").arg(&m).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown implementation 'warp'"));
    let o = lab()
        .arg("run")
        .arg(dir.join("missing.toml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.toml"));
    let o = lab().args(["report"]).arg(&dir).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every implementation's tunnel runs at the same MTU, 1,420: boringtun left its TUN at
/// 1,500, where its outer datagrams were fragmented on the lab's 1,500-byte links.
#[test]
fn every_implementation_gets_the_same_tunnel_mtu() {
    use wirelane_lab::impls::{Impl, Tunnel, TUNNEL_MTU, WIRELANE};
    use wirelane_lab::relay::Impairment;
    use wirelane_lab::topology::{Testbed, Topology};
    for which in [WIRELANE, Impl::WireguardGo, Impl::Boringtun] {
        if let Err(why) = which.available() {
            panic!(
                "{}: {why} (scripts/install-deps.sh installs it)",
                which.name()
            );
        }
        let bed = Testbed::build(Topology::Pair, Impairment::default()).unwrap();
        let tun = Tunnel::up(which, &bed).unwrap();
        for (host, d) in bed.hosts.iter().zip(&tun.daemons) {
            let shown = host
                .ns
                .run(&format!("cat /sys/class/net/{}/mtu", d.ifname))
                .unwrap();
            assert_eq!(
                shown.trim(),
                TUNNEL_MTU.to_string(),
                "{}: {}",
                which.name(),
                d.ifname
            );
        }
    }
}
