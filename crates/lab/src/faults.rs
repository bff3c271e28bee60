//! Fault scenarios: the relay impairs the outer path of a wirelane tunnel (pair-router
//! topology) and each scenario checks what reached the far end's TUN, with the
//! receiving daemon's counters (UAPI `stats=1`) and the relay's as evidence:
//!
//! - loss: fresh handshakes complete and TCP keeps moving;
//! - duplication: no duplicate reaches the TUN (the replay window refuses them);
//! - reorder: nothing is refused as a replay that the window should accept;
//! - corruption: nothing corrupted is delivered (authentication refuses it);
//! - link down: traffic resumes once the path returns.
//!
//! Each scenario builds its own testbed, removed on return even on error.

use crate::impls::{self, Tunnel};
use crate::relay::{CounterSnapshot, Impairment};
use crate::topology::{Testbed, Topology};
use crate::uapi::delta;
use crate::workload::udp::{self, UdpResult};
use crate::workload::{in_ns, join, port_from, tcp};
use crate::{uapi, Result};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Paced rate for the UDP streams: high enough to exercise batching, low enough that
/// the unoptimised CI build drops nothing for lack of CPU.
const UDP_PPS: u64 = 5_000;
const UDP_SIZE: usize = 1_200;

/// A wirelane tunnel across the relay with `imp` applied in both directions.
pub struct Bed {
    pub bed: Testbed,
    pub tun: Tunnel,
}

impl Bed {
    pub fn up(imp: Impairment) -> Result<Bed> {
        let bed = Testbed::build(Topology::PairRouter, imp)?;
        let tun = Tunnel::up(impls::WIRELANE, &bed)?;
        Ok(Bed { bed, tun })
    }

    pub fn ns(&self, i: usize) -> String {
        self.bed.hosts[i].ns.name.clone()
    }

    /// Receiver B's counters.
    pub fn stats_b(&self) -> Result<BTreeMap<String, u64>> {
        uapi::stats(&self.tun.daemons[1].ifname)
    }

    fn relay_a_to_b(&self) -> CounterSnapshot {
        self.bed
            .relay
            .as_ref()
            .map(|r| r.a_to_b.snapshot())
            .unwrap_or_default()
    }

    /// Seconds until a ping from A through the tunnel is answered, within `limit`.
    pub fn ping_until_answered(&self, limit: Duration) -> Option<f64> {
        let start = Instant::now();
        let cmd = format!("ping -c 1 -W 1 {}", self.tun.addr_b);
        while start.elapsed() < limit {
            if self.bed.hosts[0].ns.run(&cmd).is_ok() {
                return Some(start.elapsed().as_secs_f64());
            }
        }
        None
    }

    fn udp(&self, dur: Duration) -> Result<UdpResult> {
        udp::stream(
            &self.ns(0),
            &self.ns(1),
            self.tun.addr_b,
            UDP_SIZE,
            Some(UDP_PPS),
            dur,
        )
    }
}

/// What one impaired UDP stream showed: the inner receiver's view, the relay's work on
/// the A→B direction, and B's refusals.
#[derive(Debug, Default)]
pub struct StreamFault {
    pub udp: UdpResult,
    pub relay: CounterSnapshot,
    pub rx_replayed: u64,
    pub rx_auth_failed: u64,
    /// Datagrams B dropped before authentication: not WireGuard, or an index it does
    /// not know (a corrupted header).
    pub rx_dropped_early: u64,
}

/// A paced, content-checked UDP stream from A to B for `dur` under `imp`.
pub fn stream_scenario(imp: Impairment, dur: Duration) -> Result<StreamFault> {
    let b = Bed::up(imp)?;
    b.ping_until_answered(Duration::from_secs(20))
        .ok_or("the tunnel never came up")?;
    let (before, relay_before) = (b.stats_b()?, b.relay_a_to_b());
    let udp = b.udp(dur)?;
    let (after, relay_after) = (b.stats_b()?, b.relay_a_to_b());
    let d = |k| delta(&before, &after, k);
    Ok(StreamFault {
        udp,
        relay: relay_after.since(&relay_before),
        rx_replayed: d("rx_replayed"),
        rx_auth_failed: d("rx_auth_failed"),
        rx_dropped_early: d("rx_malformed") + d("rx_unknown_index"),
    })
}

#[derive(Debug, Default)]
pub struct LossFault {
    /// Seconds each fresh handshake took until a ping was answered (`None`: never).
    pub handshakes_s: Vec<Option<f64>>,
    pub tcp: tcp::TcpResult,
}

/// Under `loss_pct` loss each way: `handshakes` fresh sessions (A forgets B and
/// re-learns it, so each needs a new handshake), then TCP for `dur`.
pub fn loss_scenario(loss_pct: f64, handshakes: usize, dur: Duration) -> Result<LossFault> {
    let imp = Impairment {
        loss: loss_pct,
        ..Default::default()
    };
    let b = Bed::up(imp)?;
    let (a_if, b_if) = (&b.tun.daemons[0].ifname, &b.tun.daemons[1].ifname);
    let a = &b.bed.hosts[0].ns;
    let peer = b.bed.hosts[1]
        .ns
        .run(&format!("wg show {b_if} public-key"))?
        .trim()
        .to_string();
    let endpoint = b.bed.links[0].a_sends_to;
    let mut o = LossFault::default();
    for i in 0..handshakes {
        if i > 0 {
            a.run(&format!(
                "wg set {a_if} peer {peer} remove && wg set {a_if} peer {peer} endpoint {endpoint} allowed-ips {}/32",
                b.tun.addr_b
            ))?;
        }
        o.handshakes_s
            .push(b.ping_until_answered(Duration::from_secs(60)));
    }
    o.tcp = tcp::bulk(&b.ns(0), &b.ns(1), b.tun.addr_b, 1, dur)?;
    Ok(o)
}

#[derive(Debug, Default)]
pub struct LinkDownFault {
    pub down_s: f64,
    /// Datagrams A sent into the tunnel while the link was down, and how many arrived.
    pub sent_while_down: u64,
    pub arrived_while_down: u64,
    /// Seconds from the link's return to the first datagram arriving at B.
    pub resumed_after_s: Option<f64>,
    /// And until B's reply direction worked again (a ping from B).
    pub reverse_after_s: Option<f64>,
}

/// Sends a datagram every 50 ms from A to B through the tunnel, takes the path down
/// for `down` (the relay drops everything), brings it back, and times the recovery.
pub fn link_down_scenario(down: Duration) -> Result<LinkDownFault> {
    let b = Bed::up(Impairment::default())?;
    b.ping_until_answered(Duration::from_secs(20))
        .ok_or("the tunnel never came up")?;
    let relay = b.bed.relay.as_ref().ok_or("pair-router has a relay")?;
    let total = down + Duration::from_secs(12);
    let (tx, rx) = std::sync::mpsc::channel();
    let addr_b = b.tun.addr_b;
    let receiver = in_ns(&b.ns(1), move || -> Result<Vec<Instant>> {
        let s = UdpSocket::bind(SocketAddr::new(addr_b, 0))?;
        s.set_read_timeout(Some(Duration::from_millis(100)))?;
        tx.send(s.local_addr()?.port())?;
        let mut arrivals = Vec::new();
        let end = Instant::now() + total + Duration::from_secs(1);
        let mut buf = [0u8; 64];
        while Instant::now() < end {
            if s.recv(&mut buf).is_ok() {
                arrivals.push(Instant::now());
            }
        }
        Ok(arrivals)
    });
    let port = port_from(&rx)?;
    let sender = in_ns(&b.ns(0), move || -> Result<Vec<Instant>> {
        let s = UdpSocket::bind(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0))?;
        s.connect(SocketAddr::new(addr_b, port))?;
        let end = Instant::now() + total;
        let mut sent = Vec::new();
        while Instant::now() < end {
            if s.send(&[0u8; 32]).is_ok() {
                sent.push(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(sent)
    });
    std::thread::sleep(Duration::from_secs(1));
    relay.blackhole.store(true, Ordering::SeqCst);
    let went_down = Instant::now();
    std::thread::sleep(down);
    relay.blackhole.store(false, Ordering::SeqCst);
    let came_back = Instant::now();
    // The reverse direction: a ping from B, retried until answered.
    let mut o = LinkDownFault {
        down_s: (came_back - went_down).as_secs_f64(),
        ..Default::default()
    };
    let ping_b = format!("ping -c 1 -W 1 {}", b.tun.addr_a);
    while came_back.elapsed() < Duration::from_secs(10) {
        if b.bed.hosts[1].ns.run(&ping_b).is_ok() {
            o.reverse_after_s = Some(came_back.elapsed().as_secs_f64());
            break;
        }
    }
    let sent = join(sender)?;
    let arrivals = join(receiver)?;
    // A small margin either side of the outage for datagrams in flight.
    let margin = Duration::from_millis(20);
    let in_outage = |t: &Instant| *t > went_down + margin && *t + margin < came_back;
    o.sent_while_down = sent.iter().filter(|t| in_outage(t)).count() as u64;
    o.arrived_while_down = arrivals.iter().filter(|t| in_outage(t)).count() as u64;
    o.resumed_after_s = arrivals
        .iter()
        .find(|t| **t >= came_back)
        .map(|t| (*t - came_back).as_secs_f64());
    Ok(o)
}

/// Every fault scenario with the parameters, for `wirelane-lab robust faults`.
pub struct AllFaults {
    pub loss: LossFault,
    pub duplicate: StreamFault,
    pub reorder: StreamFault,
    pub corrupt: StreamFault,
    pub link_down: LinkDownFault,
}

pub fn all(stream: Duration, down: Duration) -> Result<AllFaults> {
    let none = Impairment::default;
    Ok(AllFaults {
        loss: loss_scenario(20.0, 5, stream)?,
        duplicate: stream_scenario(
            Impairment {
                duplicate: 100.0,
                ..none()
            },
            stream,
        )?,
        reorder: stream_scenario(
            Impairment {
                reorder: 25.0,
                ..none()
            },
            stream,
        )?,
        corrupt: stream_scenario(
            Impairment {
                corrupt: 1.0,
                ..none()
            },
            stream,
        )?,
        link_down: link_down_scenario(down)?,
    })
}

fn stream_row(name: &str, s: &StreamFault) -> String {
    format!(
        "| {name} | relay A→B: {} received, {} dropped, {} duplicated, {} reordered, {} corrupted \
         | inner UDP: {} sent, {} delivered, {} lost, {} duplicates, {} reordered, {} corrupted \
         | B refused: {} replayed, {} failed authentication, {} before authentication |",
        s.relay.received,
        s.relay.dropped,
        s.relay.duplicated,
        s.relay.reordered,
        s.relay.corrupted,
        s.udp.sent,
        s.udp.received,
        s.udp.lost,
        s.udp.duplicates,
        s.udp.reordered,
        s.udp.corrupted,
        s.rx_replayed,
        s.rx_auth_failed,
        s.rx_dropped_early,
    )
}

pub fn print(f: &AllFaults) {
    println!("| fault | what the relay did | what reached B's TUN | what B refused |");
    println!("|---|---|---|---|");
    let hs: Vec<String> = f
        .loss
        .handshakes_s
        .iter()
        .map(|h| h.map_or("never".into(), |s| format!("{s:.1} s")))
        .collect();
    println!(
        "| 20% loss each way | — | handshakes: {}; TCP {:.2} Gbit/s, {} retransmits, {} corrupt bytes | — |",
        hs.join(", "),
        f.loss.tcp.goodput_bps / 1e9,
        f.loss.tcp.retransmits,
        f.loss.tcp.corrupt_bytes,
    );
    println!("{}", stream_row("100% duplication", &f.duplicate));
    println!("{}", stream_row("25% reorder", &f.reorder));
    println!("{}", stream_row("1% corruption", &f.corrupt));
    let l = &f.link_down;
    println!(
        "| link down {:.0} s | dropped everything | {} of {} datagrams sent during the outage arrived; \
         first after the link returned: {}; reverse ping: {} | — |",
        l.down_s,
        l.arrived_while_down,
        l.sent_while_down,
        l.resumed_after_s
            .map_or("never".into(), |s| format!("{s:.2} s")),
        l.reverse_after_s
            .map_or("never".into(), |s| format!("{s:.2} s")),
    );
}

/// Where B sends A's traffic, per `wg show`; one peer.
fn endpoint_at_b(b: &Bed) -> Result<String> {
    let out = b.bed.hosts[1]
        .ns
        .run(&format!("wg show {} endpoints", b.tun.daemons[1].ifname))?;
    Ok(out
        .split_whitespace()
        .nth(1)
        .ok_or("B has no peer endpoint")?
        .to_string())
}

#[derive(Debug, Default)]
pub struct RoamingOutcome {
    /// The endpoint B holds for A (the relay) before anything is injected.
    pub before: String,
    /// (what was sent from a new address, how many, B's endpoint for A afterwards).
    pub unauthenticated: Vec<(&'static str, usize, String)>,
    /// Whether the tunnel still answered pings after the injections.
    pub still_answers: bool,
    /// A moves to a new path (straight to B, past the relay): B's endpoint afterwards,
    /// and the address A now sends from.
    pub after_authenticated: String,
    pub expected_after_authenticated: String,
}

/// Roaming follows authenticated packets only. From a new address in the router, an
/// attacker sends B garbage, forged and replayed transport data, a forged cookie reply
/// and replayed initiations; B's endpoint for A must not move. Then A really moves (it
/// sends straight to B instead of through the relay), and B's endpoint must follow.
pub fn roaming_scenario() -> Result<RoamingOutcome> {
    let b = Bed::up(Impairment::default())?;
    let relay = b.bed.relay.as_ref().ok_or("pair-router has a relay")?;
    relay.record(400);
    b.ping_until_answered(Duration::from_secs(20))
        .ok_or("the tunnel never came up")?;
    tcp::bulk(
        &b.ns(0),
        &b.ns(1),
        b.tun.addr_b,
        1,
        Duration::from_millis(200),
    )?;
    let (transport, initiation) = (relay.recorded_to_b(4, 64)?, relay.recorded_to_b(1, 148)?);
    let b_index: [u8; 4] = transport[4..8].try_into()?;
    let mut rng = crate::relay::Rng(0x9e37_79b9_7f4a_7c15);
    let mut garbage = Vec::new();
    for _ in 0..200 {
        let mut g = vec![0u8; 1 + (rng.next() % 200) as usize];
        rng.fill(&mut g);
        garbage.push(g);
    }
    let mut forged_transport = vec![4u8, 0, 0, 0];
    forged_transport.extend_from_slice(&b_index);
    forged_transport.extend_from_slice(&u64::MAX.to_le_bytes()[..7]);
    forged_transport.push(0);
    forged_transport.resize(16 + 64, 0);
    rng.fill(&mut forged_transport[16..]);
    let mut cookie_reply = vec![3u8, 0, 0, 0];
    cookie_reply.extend_from_slice(&b_index);
    cookie_reply.resize(64, 0);
    rng.fill(&mut cookie_reply[8..]);
    let attacks: Vec<(&'static str, Vec<Vec<u8>>)> = vec![
        ("garbage", garbage),
        ("forged transport data", vec![forged_transport; 100]),
        ("replayed transport data", vec![transport; 100]),
        ("forged cookie reply", vec![cookie_reply; 100]),
        ("replayed initiation", vec![initiation; 10]),
    ];

    let mut o = RoamingOutcome {
        before: endpoint_at_b(&b)?,
        ..Default::default()
    };
    let router = b.bed.router.as_ref().ok_or("pair-router has a router")?;
    let target = SocketAddr::new(b.bed.hosts[1].underlay, b.bed.hosts[1].port);
    for (what, datagrams) in attacks {
        let n = datagrams.len();
        join(in_ns(&router.name, move || -> Result<()> {
            // A fresh port: an address B has never heard from.
            let s = UdpSocket::bind("0.0.0.0:0")?;
            for d in &datagrams {
                s.send_to(d, target)?;
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(())
        }))?;
        std::thread::sleep(Duration::from_millis(300));
        o.unauthenticated.push((what, n, endpoint_at_b(&b)?));
    }
    o.still_answers = b.ping_until_answered(Duration::from_secs(5)).is_some();

    // A really moves: straight to B through the router's forwarding.
    let a_if = &b.tun.daemons[0].ifname;
    let peer_b = b.bed.hosts[1]
        .ns
        .run(&format!("wg show {} public-key", b.tun.daemons[1].ifname))?;
    b.bed.hosts[0].ns.run(&format!(
        "wg set {a_if} peer {} endpoint {target}",
        peer_b.trim()
    ))?;
    b.ping_until_answered(Duration::from_secs(10))
        .ok_or("no answer after A moved")?;
    o.after_authenticated = endpoint_at_b(&b)?;
    o.expected_after_authenticated =
        SocketAddr::new(b.bed.hosts[0].underlay, b.bed.hosts[0].port).to_string();
    Ok(o)
}

pub fn print_roaming(o: &RoamingOutcome) {
    println!("| sent to B from a new address | count | B's endpoint for A afterwards |");
    println!("|---|---|---|");
    println!("| (nothing yet) | — | {} |", o.before);
    for (what, n, ep) in &o.unauthenticated {
        println!("| {what} | {n} | {ep} |");
    }
    println!(
        "| A moves: authenticated data from {} | — | {} |",
        o.expected_after_authenticated, o.after_authenticated
    );
    println!(
        "\ntunnel still answered after the injections: {}",
        o.still_answers
    );
}
