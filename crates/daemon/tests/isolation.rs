//! Tunnels of one process under a handshake flood at one of them. The tunnels share
//! the handshake and proof socket readers and the handshake threads, but not their
//! under-load state: a flood at one tunnel must put that one under load (cookie
//! replies instead of Diffie-Hellman work) and leave every other tunnel's handshakes
//! and data alone.

use std::net::{IpAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use wirelane_lab::flood::{self, FloodKind, FloodSpec};
use wirelane_lab::impls::start_wirelane;
use wirelane_lab::robust::{spoof_sink_commands, SPOOF_NET};
use wirelane_lab::testbed::*;
use wirelane_lab::uapi::{self, counter};
use wirelane_lab::workload::{in_ns, join};

/// Ends the flood when the test ends, however it ends.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn a_flood_at_one_tunnel_leaves_the_others_alone() {
    require_root();
    let pair = Pair::new(false);
    let names: Vec<String> = (0..2).map(|_| unique("fl")).collect();
    let a = start_wirelane(WIRELANE, &pair.a, &names, &[]).unwrap_or_else(|e| panic!("{e}"));
    let b: Vec<Daemon> = (0..2)
        .map(|_| Daemon::start(Impl::WireguardGo, &pair.b))
        .collect();
    let inner: Vec<IpAddr> = (0..2)
        .map(|i| configure_tunnel(&pair, &a[i], &b[i], i as u8 + 1))
        .collect();
    // Cookie replies to the spoofed sources leave host A and end in a sink.
    pair.a.run_ok(&spoof_sink_commands());
    // The flooded tunnel has a session before the flood; the other gets its first
    // during it.
    tcp_transfer(&pair.a, &pair.b, inner[0], 1 << 20, Duration::from_secs(30));

    let IpAddr::V4(addr_a) = pair.addr_a else {
        unreachable!("an IPv4 pair")
    };
    let spec = FloodSpec {
        kind: FloodKind::Spoofed,
        // Tunnel 1's listen port (`configure_tunnel`).
        target: SocketAddrV4::new(addr_a, 52001),
        responder_public: wirelane_proto::parse_base64_key(a[0].wg("show IF public-key").trim())
            .expect("a public key"),
        source: SPOOF_NET,
        duration: Duration::from_secs(30),
        rate: None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_drop = StopOnDrop(stop.clone());
    let flood = {
        let stop = stop.clone();
        in_ns(&pair.b.name, move || flood::run(&spec, &stop))
    };
    let stats = |d: &Daemon| uapi::stats(&d.ifname).unwrap_or_else(|e| panic!("{e}"));
    wait_until(
        "the flooded tunnel under load",
        Duration::from_secs(20),
        || counter(&stats(&a[0]), "under_load") == 1,
    );

    // During the flood: the other tunnel's first handshake and verified bulk traffic,
    // and the flooded tunnel's established session still carrying data.
    tcp_transfer(&pair.a, &pair.b, inner[1], 4 << 20, Duration::from_secs(60));
    tcp_transfer(&pair.a, &pair.b, inner[0], 4 << 20, Duration::from_secs(60));
    let (flooded, other) = (stats(&a[0]), stats(&a[1]));
    stop.store(true, Ordering::Relaxed);
    let sent = join(flood).expect("flood").sent;

    let shown = [
        "under_load",
        "cookie_replies_sent",
        "handshake_dh",
        "handshake_socket_drops",
    ];
    for (name, st) in [("flooded", &flooded), ("other", &other)] {
        let figures: Vec<String> = shown
            .iter()
            .map(|k| format!("{k} {}", counter(st, k)))
            .collect();
        eprintln!(
            "{name} tunnel, {sent} spoofed initiations sent: {}",
            figures.join(", ")
        );
    }
    assert!(sent > 0);
    assert_eq!(counter(&flooded, "under_load"), 1, "{flooded:?}");
    assert!(counter(&flooded, "cookie_replies_sent") > 0, "{flooded:?}");
    assert!(a[1].dump_peers()[0].latest_handshake > 0);
    for k in ["under_load", "cookie_replies_sent", "handshake_queue_full"] {
        assert_eq!(counter(&other, k), 0, "{k} on the other tunnel: {other:?}");
    }
}
