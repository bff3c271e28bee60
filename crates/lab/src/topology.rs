//! Testbeds: hosts in namespaces, joined by veth, optionally through a router namespace
//! that carries the impairment relay. A testbed lists its hosts and the tunnels to
//! build between them, so star:N (one gateway, N peers) and multi:T (T tunnels between
//! two hosts) fit the same shape.

use crate::netns::{unique, Netns};
use crate::relay::{Impairment, Relay};
use crate::Result;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// Two hosts, one veth, one tunnel.
    Pair,
    /// Two hosts behind a router namespace running the impairment relay.
    PairRouter,
    /// Two hosts, one veth, T tunnels between them, each with its own ports and inner
    /// addresses.
    Multi(u16),
    /// One gateway and N peers the lab emulates (`crate::star` builds it).
    Star(u32),
}

impl std::str::FromStr for Topology {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "pair" => Ok(Topology::Pair),
            "pair-router" => Ok(Topology::PairRouter),
            _ if s.starts_with("multi:") => s[6..]
                .parse::<u16>()
                .ok()
                .filter(|t| (1..=crate::matrix::MAX_TUNNELS as u16).contains(t))
                .map(Topology::Multi)
                .ok_or_else(|| {
                    format!(
                        "topology '{s}': T must be 1..={}",
                        crate::matrix::MAX_TUNNELS
                    )
                }),
            _ if s.starts_with("star:") => s[5..]
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=crate::star::generator::MAX_PEERS as u32).contains(n))
                .map(Topology::Star)
                .ok_or_else(|| {
                    format!(
                        "topology '{s}': N must be 1..={}",
                        crate::star::generator::MAX_PEERS
                    )
                }),
            _ => Err(format!(
                "unknown topology '{s}' (available: pair, pair-router, multi:T, star:N)"
            )),
        }
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Topology::Pair => f.write_str("pair"),
            Topology::PairRouter => f.write_str("pair-router"),
            Topology::Multi(t) => write!(f, "multi:{t}"),
            Topology::Star(n) => write!(f, "star:{n}"),
        }
    }
}

/// One tunnel end: a host, its outer address and the UDP port its tunnel listens on.
pub struct Host {
    pub ns: Netns,
    pub underlay: IpAddr,
    pub port: u16,
}

/// A tunnel to build: indices into `hosts`, the UDP port each side listens on, and
/// the outer endpoint each side should send to (the other host, or the relay in
/// between).
pub struct Link {
    pub a: usize,
    pub b: usize,
    pub a_port: u16,
    pub b_port: u16,
    pub a_sends_to: SocketAddr,
    pub b_sends_to: SocketAddr,
}

pub struct Testbed {
    // Drop order: the relay thread stops before its namespace disappears.
    pub relay: Option<Relay>,
    pub hosts: Vec<Host>,
    pub links: Vec<Link>,
    pub router: Option<Netns>,
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

const PORT_A: u16 = 51820;
const PORT_B: u16 = 51821;
const RELAY_A: u16 = 40000;
const RELAY_B: u16 = 40001;

/// Joins namespaces `a` and `b` with a new veth pair and gives each end its address
/// (with prefix length). Duplicate address detection is off for IPv6 ends.
pub fn veth(a: &Netns, a_addr: &str, b: &Netns, b_addr: &str) -> Result<()> {
    let (va, vb) = (unique("lv"), unique("lv"));
    crate::netns::sh(&format!(
        "ip link add {va} netns {} type veth peer name {vb} netns {}",
        a.name, b.name
    ))?;
    for (ns, addr, dev) in [(a, a_addr, &va), (b, b_addr, &vb)] {
        let nodad = if addr.contains(':') { " nodad" } else { "" };
        ns.run(&format!(
            "ip addr add {addr} dev {dev}{nodad} && ip link set {dev} up"
        ))?;
    }
    Ok(())
}

/// Host A on PORT_A and host B on PORT_B.
fn two_hosts(a: Netns, ua: IpAddr, b: Netns, ub: IpAddr) -> Vec<Host> {
    vec![
        Host {
            ns: a,
            underlay: ua,
            port: PORT_A,
        },
        Host {
            ns: b,
            underlay: ub,
            port: PORT_B,
        },
    ]
}

impl Testbed {
    pub fn build(topology: Topology, impairment: Impairment) -> Result<Testbed> {
        let a = Netns::new("lab")?;
        let b = Netns::new("lab")?;
        match topology {
            Topology::Star(_) => {
                Err("star:N builds its own namespaces (crate::star), not a testbed".into())
            }
            Topology::Multi(t) => {
                veth(&a, "192.168.81.1/24", &b, "192.168.81.2/24")?;
                let (ua, ub) = (v4(192, 168, 81, 1), v4(192, 168, 81, 2));
                let links = (0..t)
                    .map(|i| {
                        let (pa, pb) = (PORT_A + 2 * i, PORT_B + 2 * i);
                        Link {
                            a: 0,
                            b: 1,
                            a_port: pa,
                            b_port: pb,
                            a_sends_to: SocketAddr::new(ub, pb),
                            b_sends_to: SocketAddr::new(ua, pa),
                        }
                    })
                    .collect();
                Ok(Testbed {
                    relay: None,
                    links,
                    hosts: two_hosts(a, ua, b, ub),
                    router: None,
                })
            }
            Topology::Pair => {
                if !impairment.is_none() {
                    return Err(
                        "impairments need the pair-router topology (the relay runs in the router)"
                            .into(),
                    );
                }
                veth(&a, "192.168.81.1/24", &b, "192.168.81.2/24")?;
                let (ua, ub) = (v4(192, 168, 81, 1), v4(192, 168, 81, 2));
                Ok(Testbed {
                    relay: None,
                    links: vec![Link {
                        a: 0,
                        b: 1,
                        a_port: PORT_A,
                        b_port: PORT_B,
                        a_sends_to: SocketAddr::new(ub, PORT_B),
                        b_sends_to: SocketAddr::new(ua, PORT_A),
                    }],
                    hosts: two_hosts(a, ua, b, ub),
                    router: None,
                })
            }
            Topology::PairRouter => {
                let r = Netns::new("labr")?;
                veth(&a, "192.168.81.1/24", &r, "192.168.81.254/24")?;
                veth(&b, "192.168.82.1/24", &r, "192.168.82.254/24")?;
                a.run("ip route add 192.168.82.0/24 via 192.168.81.254")?;
                b.run("ip route add 192.168.81.0/24 via 192.168.82.254")?;
                r.run("sysctl -qw net.ipv4.ip_forward=1")?;
                let (ua, ub) = (v4(192, 168, 81, 1), v4(192, 168, 82, 1));
                let (ra, rb) = (
                    SocketAddr::new(v4(192, 168, 81, 254), RELAY_A),
                    SocketAddr::new(v4(192, 168, 82, 254), RELAY_B),
                );
                let relay = Relay::start(
                    &r.name,
                    ra,
                    rb,
                    SocketAddr::new(ua, PORT_A),
                    SocketAddr::new(ub, PORT_B),
                    impairment,
                )?;
                Ok(Testbed {
                    relay: Some(relay),
                    links: vec![Link {
                        a: 0,
                        b: 1,
                        a_port: PORT_A,
                        b_port: PORT_B,
                        a_sends_to: ra,
                        b_sends_to: rb,
                    }],
                    hosts: two_hosts(a, ua, b, ub),
                    router: Some(r),
                })
            }
        }
    }
}
