//! The test matrix: implementations × workloads × directions × streams × impairments ×
//! repeats, read from TOML, expanded into cells, and ordered so that implementations
//! alternate (A B A B …) and slow drift hits them all alike.

use crate::impls::Impl;
use crate::relay::Impairment;
use crate::topology::Topology;
use crate::workload::rr::Proto;
use crate::Result;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixFile {
    pub name: String,
    pub implementations: Vec<String>,
    pub baseline: String,
    #[serde(default = "default_repeats")]
    pub repeats: usize,
    #[serde(default = "default_duration")]
    pub duration_s: f64,
    #[serde(rename = "workload")]
    pub workloads: Vec<WorkloadSpec>,
}

fn default_repeats() -> usize {
    3
}
fn default_duration() -> f64 {
    5.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    #[serde(rename = "a-b")]
    AToB,
    #[serde(rename = "b-a")]
    BToA,
    #[serde(rename = "both")]
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Load {
    Idle,
    Bulk,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum WorkloadSpec {
    Tcp {
        #[serde(default = "one")]
        streams: Vec<usize>,
        #[serde(default = "a_to_b")]
        direction: Vec<Direction>,
        /// Tunnels between the two hosts (the `multi:T` topology), each carrying the
        /// streams at once.
        #[serde(default = "one")]
        tunnels: Vec<usize>,
        #[serde(default)]
        impairment: Option<Impairment>,
    },
    Udp {
        #[serde(default = "default_size")]
        size: usize,
        /// Packets per second; absent means unlimited.
        #[serde(default)]
        pps: Option<u64>,
        #[serde(default = "a_to_b")]
        direction: Vec<Direction>,
        #[serde(default)]
        impairment: Option<Impairment>,
    },
    Rr {
        #[serde(default = "tcp_proto")]
        proto: Vec<Proto>,
        #[serde(default = "idle")]
        load: Vec<Load>,
        /// Under bulk: how many TCP streams the bulk transfer runs, and which way it
        /// goes (the requests always go a→b; b→a bulk loads their replies' path).
        #[serde(default = "one")]
        bulk_streams: Vec<usize>,
        #[serde(default = "a_to_b")]
        bulk_direction: Vec<Direction>,
        /// Whether both hosts ask for ECN on their TCP connections
        /// (`net.ipv4.tcp_ecn=1`; the default, 2, only answers a request for it).
        #[serde(default = "no_ecn")]
        ecn: Vec<bool>,
        #[serde(default)]
        impairment: Option<Impairment>,
    },
    /// star:N (`crate::star`): one gateway, N emulated peers, for each N, direction
    /// and offered load (Gbit/s of inner packets over all peers; absent: unlimited).
    Star {
        peers: Vec<usize>,
        #[serde(default = "rx_only")]
        direction: Vec<crate::star::Way>,
        #[serde(default = "unlimited")]
        offered_gbit: Vec<Option<f64>>,
        #[serde(default = "full_mtu")]
        size: usize,
        /// Initiations per second before the timed phase (0: all at once).
        #[serde(default = "paced_handshakes")]
        handshake_rate: f64,
        #[serde(default)]
        shared_source: bool,
        /// Inner address families: "ipv4", "ipv6" or "dual".
        #[serde(default)]
        family: crate::star::inner::Family,
        /// Receive direction's sink: "socket" (checks every packet) or "blackhole".
        #[serde(default)]
        sink: crate::star::sink::SinkKind,
        /// Light peers among the N, each at `light_mbit` (`StarSpec::light_peers`).
        #[serde(default)]
        light_peers: usize,
        #[serde(default = "one_mbit")]
        light_mbit: f64,
        /// Tunnels on the gateway to spread the peers over (`StarSpec::tunnels`).
        #[serde(default = "one")]
        tunnels: Vec<usize>,
    },
}

fn one_mbit() -> f64 {
    1.0
}

fn rx_only() -> Vec<crate::star::Way> {
    vec![crate::star::Way::Rx]
}
fn unlimited() -> Vec<Option<f64>> {
    vec![None]
}
fn full_mtu() -> usize {
    1420
}
fn paced_handshakes() -> f64 {
    2000.0
}

fn no_ecn() -> Vec<bool> {
    vec![false]
}
fn one_way() -> Direction {
    Direction::AToB
}

fn one() -> Vec<usize> {
    vec![1]
}
fn one_tunnel() -> usize {
    1
}
fn a_to_b() -> Vec<Direction> {
    vec![Direction::AToB]
}
fn default_size() -> usize {
    1380
}
fn tcp_proto() -> Vec<Proto> {
    vec![Proto::Tcp]
}
fn idle() -> Vec<Load> {
    vec![Load::Idle]
}

/// One concrete workload configuration (a row of the results table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Cell {
    Tcp {
        streams: usize,
        direction: Direction,
        #[serde(default = "one_tunnel")]
        tunnels: usize,
        impairment: Impairment,
    },
    Udp {
        size: usize,
        pps: Option<u64>,
        direction: Direction,
        impairment: Impairment,
    },
    Rr {
        proto: Proto,
        load: Load,
        #[serde(default = "one_tunnel")]
        bulk_streams: usize,
        #[serde(default = "one_way")]
        bulk_direction: Direction,
        #[serde(default)]
        ecn: bool,
        impairment: Impairment,
    },
    Star {
        peers: usize,
        way: crate::star::Way,
        offered_gbit: Option<f64>,
        size: usize,
        handshake_rate: f64,
        shared_source: bool,
        #[serde(default)]
        family: crate::star::inner::Family,
        #[serde(default)]
        sink: crate::star::sink::SinkKind,
        #[serde(default)]
        light_peers: usize,
        #[serde(default = "one_mbit")]
        light_mbit: f64,
        #[serde(default = "one_tunnel")]
        tunnels: usize,
    },
}

impl Cell {
    /// The star run this cell asks for, with phases of `seconds`.
    pub fn star_spec(&self, seconds: f64) -> Option<crate::star::StarSpec> {
        let Cell::Star {
            peers,
            way,
            offered_gbit,
            size,
            handshake_rate,
            shared_source,
            family,
            sink,
            light_peers,
            light_mbit,
            tunnels,
        } = *self
        else {
            return None;
        };
        Some(crate::star::StarSpec {
            peers,
            way,
            size,
            offered_pps: offered_gbit.map(|g| g * 1e9 / (8.0 * size as f64)),
            seconds,
            handshake_rate: (handshake_rate > 0.0).then_some(handshake_rate),
            sealed_max_mib: crate::star::DEFAULT_SEALED_MAX_MIB,
            shared_source,
            sample_every: 64,
            storm_peers: 0,
            family,
            sink,
            light_peers,
            light_mbit,
            rekey_after_s: None,
            tunnels,
        })
    }

    pub fn impairment(&self) -> Impairment {
        match self {
            Cell::Tcp { impairment, .. }
            | Cell::Udp { impairment, .. }
            | Cell::Rr { impairment, .. } => *impairment,
            Cell::Star { .. } => Impairment::default(),
        }
    }

    pub fn topology(&self) -> Topology {
        match self {
            Cell::Tcp { tunnels, .. } if *tunnels > 1 => Topology::Multi(*tunnels as u16),
            Cell::Star { peers, .. } => Topology::Star(*peers as u32),
            _ if self.impairment().is_none() => Topology::Pair,
            _ => Topology::PairRouter,
        }
    }

    /// Tunnels the cell runs over at once.
    pub fn tunnels(&self) -> usize {
        match self {
            Cell::Tcp { tunnels, .. } | Cell::Star { tunnels, .. } => *tunnels,
            _ => 1,
        }
    }

    /// Stable, readable identifier used to group repeats and compare result sets.
    pub fn id(&self) -> String {
        let imp = self.impairment();
        let imp = if imp.is_none() {
            String::new()
        } else {
            let mut parts = Vec::new();
            for (n, v) in [
                ("loss", imp.loss),
                ("reorder", imp.reorder),
                ("dup", imp.duplicate),
                ("corrupt", imp.corrupt),
            ] {
                if v > 0.0 {
                    parts.push(format!("{n}{v}%"));
                }
            }
            if imp.delay_ms > 0.0 {
                parts.push(format!("delay{}±{}ms", imp.delay_ms, imp.jitter_ms));
            }
            format!(" [{}]", parts.join(","))
        };
        let dir = |d: &Direction| match d {
            Direction::AToB => "a→b",
            Direction::BToA => "b→a",
            Direction::Both => "a⇄b",
        };
        match self {
            Cell::Tcp {
                streams,
                direction,
                tunnels,
                ..
            } => {
                let multi = match tunnels {
                    1 => String::new(),
                    t => format!(" multi:{t}"),
                };
                format!("tcp {streams}x {}{multi}{imp}", dir(direction))
            }
            Cell::Udp {
                size,
                pps,
                direction,
                ..
            } => {
                let rate = pps.map_or("unlimited".to_string(), |p| format!("{p}pps"));
                format!("udp {size}B {rate} {}{imp}", dir(direction))
            }
            Cell::Rr {
                proto,
                load,
                bulk_streams,
                bulk_direction,
                ecn,
                ..
            } => {
                let load = match load {
                    Load::Idle => "idle".to_string(),
                    Load::Bulk => {
                        let streams = match bulk_streams {
                            1 => String::new(),
                            n => format!(" {n}x"),
                        };
                        let way = match bulk_direction {
                            Direction::AToB => String::new(),
                            d => format!(" {}", dir(d)),
                        };
                        format!("under bulk{streams}{way}")
                    }
                };
                let ecn = if *ecn { " ecn" } else { "" };
                let proto = if *proto == Proto::Tcp { "tcp" } else { "udp" };
                format!("rr {proto} {load}{ecn}{imp}")
            }
            Cell::Star {
                peers,
                way,
                offered_gbit,
                size,
                handshake_rate,
                shared_source,
                family,
                sink,
                light_peers,
                light_mbit,
                tunnels,
            } => {
                let load = offered_gbit.map_or("unlimited".into(), |g| format!("{g}Gbit/s"));
                let mut id = format!("star:{peers} {way} {load}");
                if *tunnels > 1 {
                    id.push_str(&format!(" over {tunnels} tunnels"));
                }
                if *size != 1420 {
                    id.push_str(&format!(" {size}B"));
                }
                if *handshake_rate <= 0.0 {
                    id.push_str(" storm");
                }
                if *shared_source {
                    id.push_str(" one-source");
                }
                if *family != crate::star::inner::Family::Ipv4 {
                    id.push_str(&format!(" {family}"));
                }
                if *sink != crate::star::sink::SinkKind::Socket {
                    id.push_str(&format!(" {sink}-sink"));
                }
                if *light_peers > 0 {
                    id.push_str(&format!(" +{light_peers} light@{light_mbit}Mbit/s"));
                }
                id
            }
        }
    }
}

pub struct Matrix {
    pub name: String,
    pub implementations: Vec<Impl>,
    pub baseline: Impl,
    pub repeats: usize,
    pub duration: std::time::Duration,
    pub cells: Vec<Cell>,
}

/// One run in execution order.
#[derive(Debug, Clone)]
pub struct Run {
    pub cell: usize,
    pub implementation: Impl,
    pub repeat: usize,
}

impl Matrix {
    pub fn parse(text: &str) -> Result<Matrix> {
        let f: MatrixFile = toml::from_str(text).map_err(|e| format!("matrix: {e}"))?;
        let implementations = f
            .implementations
            .iter()
            .map(|s| s.parse::<Impl>())
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if implementations.is_empty() {
            return Err("matrix: implementations is empty".into());
        }
        let baseline: Impl = f.baseline.parse()?;
        if !implementations.contains(&baseline) {
            return Err(format!(
                "matrix: baseline '{}' is not among the implementations",
                f.baseline
            )
            .into());
        }
        if f.repeats == 0 || f.repeats > 100 {
            return Err("matrix: repeats must be 1..=100".into());
        }
        if !(0.5..=600.0).contains(&f.duration_s) {
            return Err("matrix: duration_s must be 0.5..=600".into());
        }
        let mut cells = Vec::new();
        for w in &f.workloads {
            match w {
                WorkloadSpec::Tcp {
                    streams,
                    direction,
                    tunnels,
                    impairment,
                } => {
                    let imp = impairment.unwrap_or_default();
                    imp.validate()?;
                    for &t in tunnels {
                        if !(1..=MAX_TUNNELS).contains(&t) {
                            return Err(format!(
                                "matrix: tcp tunnels {t} must be 1..={MAX_TUNNELS}"
                            )
                            .into());
                        }
                        if t > 1 && !imp.is_none() {
                            return Err("matrix: multi:T cells take no impairment".into());
                        }
                    }
                    for &s in streams {
                        if !(1..=64).contains(&s) {
                            return Err(format!("matrix: tcp streams {s} must be 1..=64").into());
                        }
                        for &d in direction {
                            for &t in tunnels {
                                cells.push(Cell::Tcp {
                                    streams: s,
                                    direction: d,
                                    tunnels: t,
                                    impairment: imp,
                                });
                            }
                        }
                    }
                }
                WorkloadSpec::Udp {
                    size,
                    pps,
                    direction,
                    impairment,
                } => {
                    let imp = impairment.unwrap_or_default();
                    imp.validate()?;
                    if !(16..=65000).contains(size) {
                        return Err(format!("matrix: udp size {size} must be 16..=65000").into());
                    }
                    // One stream, one way: "both" would run a→b and be labelled a⇄b.
                    if direction.contains(&Direction::Both) {
                        return Err("matrix: a udp workload runs one way: a→b or b→a".into());
                    }
                    for &d in direction {
                        cells.push(Cell::Udp {
                            size: *size,
                            pps: *pps,
                            direction: d,
                            impairment: imp,
                        });
                    }
                }
                WorkloadSpec::Star {
                    peers,
                    direction,
                    offered_gbit,
                    size,
                    handshake_rate,
                    shared_source,
                    family,
                    sink,
                    light_peers,
                    light_mbit,
                    tunnels,
                } => {
                    if !handshake_rate.is_finite() || *handshake_rate < 0.0 {
                        return Err("matrix: star handshake_rate must be 0 or more".into());
                    }
                    for (&n, &t) in peers
                        .iter()
                        .flat_map(|n| tunnels.iter().map(move |t| (n, t)))
                    {
                        for &way in direction {
                            for &offered in offered_gbit {
                                if offered.is_some_and(|g| !(g.is_finite() && g > 0.0)) {
                                    return Err("matrix: star offered_gbit must be positive".into());
                                }
                                cells.push(Cell::Star {
                                    peers: n,
                                    way,
                                    offered_gbit: offered,
                                    size: *size,
                                    handshake_rate: *handshake_rate,
                                    shared_source: *shared_source,
                                    family: *family,
                                    sink: *sink,
                                    light_peers: *light_peers,
                                    light_mbit: *light_mbit,
                                    tunnels: t,
                                });
                            }
                        }
                    }
                }
                WorkloadSpec::Rr {
                    proto,
                    load,
                    bulk_streams,
                    bulk_direction,
                    ecn,
                    impairment,
                } => {
                    let imp = impairment.unwrap_or_default();
                    imp.validate()?;
                    if let Some(s) = bulk_streams.iter().find(|s| !(1..=64).contains(*s)) {
                        return Err(format!("matrix: rr bulk_streams {s} must be 1..=64").into());
                    }
                    if bulk_direction.contains(&Direction::Both) {
                        return Err("matrix: rr bulk_direction is a-b or b-a".into());
                    }
                    // An idle cell has no bulk to vary: one cell per protocol and ECN.
                    let bulk_shapes: Vec<(usize, Direction)> = bulk_streams
                        .iter()
                        .flat_map(|&s| bulk_direction.iter().map(move |&d| (s, d)))
                        .collect();
                    for &p in proto {
                        for &l in load {
                            let shapes = match l {
                                Load::Idle => &[(1, Direction::AToB)][..],
                                Load::Bulk => &bulk_shapes[..],
                            };
                            for &(streams, way) in shapes {
                                for &e in ecn {
                                    cells.push(Cell::Rr {
                                        proto: p,
                                        load: l,
                                        bulk_streams: streams,
                                        bulk_direction: way,
                                        ecn: e,
                                        impairment: imp,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        if cells.is_empty() {
            return Err("matrix: no workloads".into());
        }
        let m = Matrix {
            name: f.name,
            implementations,
            baseline,
            repeats: f.repeats,
            duration: std::time::Duration::from_secs_f64(f.duration_s),
            cells,
        };
        m.check_star_cells()?;
        Ok(m)
    }

    /// Whether every star cell can run at the matrix's duration: its spec is valid and
    /// its sealed packets fit the cap. Checked again after `--duration` changes it.
    pub fn check_star_cells(&self) -> Result<()> {
        for c in &self.cells {
            if let Some(spec) = c.star_spec(self.duration.as_secs_f64()) {
                spec.validate()?;
                if spec.way == crate::star::Way::Rx {
                    spec.per_peer()?;
                }
            }
        }
        Ok(())
    }

    /// Execution order: repeat-major, then cell, then implementation, so that every
    /// cell's implementations run back to back and each repeat revisits them all.
    pub fn schedule(&self) -> Vec<Run> {
        let mut v = Vec::new();
        for repeat in 0..self.repeats {
            for cell in 0..self.cells.len() {
                // Rotate the order each repeat so no implementation always goes first.
                let n = self.implementations.len();
                for k in 0..n {
                    v.push(Run {
                        cell,
                        implementation: self.implementations[(k + repeat) % n],
                        repeat,
                    });
                }
            }
        }
        v
    }
}

/// Most tunnels a `multi:T` cell may ask for (their inner addresses are 10.81.i.x).
pub const MAX_TUNNELS: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    const M: &str = r#"
name = "t"
implementations = ["none", "wireguard-go"]
baseline = "wireguard-go"
repeats = 2
duration_s = 2
[[workload]]
kind = "tcp"
streams = [1, 4]
direction = ["a-b", "b-a"]
[[workload]]
kind = "udp"
[[workload]]
kind = "rr"
load = ["idle", "bulk"]
[[workload]]
kind = "tcp"
impairment = { loss = 1.5, delay_ms = 5, jitter_ms = 1 }
"#;

    #[test]
    fn expands_and_interleaves() {
        let m = Matrix::parse(M).unwrap();
        assert_eq!(m.cells.len(), 4 + 1 + 2 + 1);
        let s = m.schedule();
        assert_eq!(s.len(), 8 * 2 * 2);
        assert_eq!(s[0].implementation, Impl::None);
        assert_eq!(s[1].implementation, Impl::WireguardGo);
        // Second repeat starts with the other implementation.
        assert_eq!(s[16].implementation, Impl::WireguardGo);
        assert_eq!(m.cells[7].topology(), Topology::PairRouter);
        assert_eq!(m.cells[7].id(), "tcp 1x a→b [loss1.5%,delay5±1ms]");
        assert_eq!(m.cells[4].id(), "udp 1380B unlimited a→b");
    }

    #[test]
    fn rejects_bad_matrices() {
        for (bad, needle) in [
            (
                M.replace("\"none\", ", "\"nonsense\", "),
                "unknown implementation",
            ),
            (
                M.replace("baseline = \"wireguard-go\"", "baseline = \"boringtun\""),
                "baseline",
            ),
            (M.replace("repeats = 2", "repeats = 0"), "repeats"),
            (M.replace("streams = [1, 4]", "streams = [0]"), "streams"),
            (M.replace("loss = 1.5", "loss = 150"), "percentage"),
            (
                M.replace("kind = \"udp\"", "kind = \"sctp\""),
                "unknown variant",
            ),
            (
                M.replace("duration_s = 2", "duration_s = 2\ncolour = 1"),
                "unknown field",
            ),
            (
                M.replace(
                    "kind = \"udp\"\n",
                    "kind = \"udp\"\ndirection = [\"both\"]\n",
                ),
                "one way",
            ),
        ] {
            let e = Matrix::parse(&bad).err().expect(needle).to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }

    /// Request/response under bulk varies the bulk's streams and direction and the
    /// hosts' ECN; an idle cell has no bulk to vary.
    #[test]
    fn rr_cells_vary_the_bulk_and_ecn() {
        let text = |extra: &str| {
            format!(
                "name = \"rr\"\nimplementations = [\"wirelane\"]\nbaseline = \"wirelane\"\nrepeats = 1\n\
                 duration_s = 1\n[[workload]]\nkind = \"rr\"\nload = [\"idle\", \"bulk\"]\n{extra}"
            )
        };
        let m = Matrix::parse(&text(
            "bulk_streams = [1, 4]\nbulk_direction = [\"a-b\", \"b-a\"]\necn = [false, true]\n",
        ))
        .unwrap();
        let ids: Vec<String> = m.cells.iter().map(|c| c.id()).collect();
        assert_eq!(ids.len(), 2 + 2 * 2 * 2, "{ids:?}");
        for want in [
            "rr tcp idle",
            "rr tcp idle ecn",
            "rr tcp under bulk",
            "rr tcp under bulk 4x b→a ecn",
        ] {
            assert!(ids.iter().any(|i| i == want), "{want} in {ids:?}");
        }
        let unique: std::collections::BTreeSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len());
        for (extra, needle) in [
            ("bulk_direction = [\"both\"]\n", "a-b or b-a"),
            ("bulk_streams = [0]\n", "bulk_streams"),
        ] {
            let e = Matrix::parse(&text(extra)).err().expect(needle).to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }

    #[test]
    fn star_cells_sweep_peers_directions_and_loads() {
        let text = |extra: &str| {
            format!(
                "name = \"star\"\nimplementations = [\"wirelane\"]\nbaseline = \"wirelane\"\n\
                 repeats = 1\nduration_s = 3\n[[workload]]\nkind = \"star\"\n{extra}"
            )
        };
        let m = Matrix::parse(&text(
            "peers = [1, 1000]\ndirection = [\"rx\", \"tx\"]\noffered_gbit = [2.5]\n",
        ))
        .unwrap();
        let ids: Vec<String> = m.cells.iter().map(|c| c.id()).collect();
        assert_eq!(
            ids,
            [
                "star:1 rx 2.5Gbit/s",
                "star:1 tx 2.5Gbit/s",
                "star:1000 rx 2.5Gbit/s",
                "star:1000 tx 2.5Gbit/s"
            ]
        );
        assert_eq!(m.cells[2].topology(), Topology::Star(1000));
        let spec = m.cells[2].star_spec(3.0).unwrap();
        assert_eq!(spec.offered_pps, Some(2.5e9 / (8.0 * 1420.0)));
        let storm = Matrix::parse(&text("peers = [100]\nhandshake_rate = 0\n")).unwrap();
        assert_eq!(storm.cells[0].id(), "star:100 rx unlimited storm");
        assert_eq!(storm.cells[0].star_spec(3.0).unwrap().handshake_rate, None);
        let dual = Matrix::parse(&text(
            "peers = [100]\nfamily = \"dual\"\nsink = \"blackhole\"\n",
        ))
        .unwrap();
        assert_eq!(
            dual.cells[0].id(),
            "star:100 rx unlimited dual blackhole-sink"
        );
        let spec = dual.cells[0].star_spec(3.0).unwrap();
        assert_eq!(
            (spec.family, spec.sink),
            (
                crate::star::inner::Family::Dual,
                crate::star::sink::SinkKind::Blackhole
            )
        );
        for (extra, needle) in [
            ("peers = [10]\nfamily = \"ipv5\"\n", "ipv5"),
            (
                "peers = [10]\noffered_gbit = [1.0]\nlight_peers = 10\n",
                "at least one heavy peer",
            ),
            ("peers = [10]\nlight_peers = 2\n", "paced"),
            (
                "peers = [10]\noffered_gbit = [1.0]\nlight_peers = 2\nlight_mbit = -1.0\n",
                "light peer's rate",
            ),
            (
                "peers = [10]\ndirection = [\"tx\"]\nsink = \"blackhole\"\n",
                "blackhole",
            ),
            ("peers = [0]\n", "peers"),
            ("peers = [10]\noffered_gbit = [-1.0]\n", "offered_gbit"),
            ("peers = [10]\nsize = 10\n", "size"),
            ("peers = [10]\nhandshake_rate = -1\n", "handshake_rate"),
        ] {
            let e = Matrix::parse(&text(extra)).err().expect(needle).to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }
}
