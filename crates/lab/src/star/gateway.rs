//! The gateway under test, from the outside: its configuration for N peers, and the
//! counters of its namespace that say where a lost packet was lost (the listening
//! socket's drops, the TUN device's packets and drops).
//!
//! A gateway may write many inner packets to its TUN device as one (UDP segmentation
//! offload: one header, the payloads back to back), and the device counts that once.
//! The packets it wrote are therefore counted from bytes: every packet of a run has
//! the same size, so a write of `k` packets of one family takes `k` payloads and one
//! header, and the IPv6 share comes from the namespace's IPv6 counters (the only IPv6
//! in that namespace is the inner traffic).

use super::emulated::EmulatedPeer;
use super::{inner, GATEWAY_PORT};
use crate::netns::Netns;
use crate::Result;
use inner::{IPV4_HEADER, IPV6_HEADER, UDP_HEADER};

/// The gateway namespace's counters that place losses.
#[derive(Debug, Clone, Copy, Default)]
pub struct GatewayCounters {
    /// Writes to the TUN device, and their bytes.
    pub tun_rx: u64,
    pub tun_rx_bytes: u64,
    /// IPv6 packets the namespace received, and their bytes (`Ip6InReceives`,
    /// `Ip6InOctets`): the IPv6 share of the TUN writes.
    pub ip6_in: u64,
    pub ip6_in_bytes: u64,
    pub tun_tx: u64,
    pub tun_tx_dropped: u64,
    pub listen_drops: u64,
}

impl GatewayCounters {
    /// The counters of the gateway's tunnels `tuns` (summed) and of its listening
    /// sockets (tunnel t listens on `GATEWAY_PORT + t`).
    pub fn read(ns: &Netns, tuns: &[String]) -> Result<GatewayCounters> {
        let stat = |dev: &str, name: &str| format!("/sys/class/net/{dev}/statistics/{name}");
        let files: Vec<String> = tuns
            .iter()
            .flat_map(|t| {
                ["rx_packets", "rx_bytes", "tx_packets", "tx_dropped"].map(|f| stat(t, f))
            })
            .collect();
        let out = ns.run(&format!(
            "cat {}; cat /proc/net/udp /proc/net/udp6 /proc/net/snmp6",
            files.join(" ")
        ))?;
        let mut lines = out.lines();
        let mut next = || -> Result<u64> {
            Ok(lines
                .next()
                .and_then(|l| l.trim().parse().ok())
                .ok_or("unreadable interface statistics")?)
        };
        let (mut tun_rx, mut tun_rx_bytes, mut tun_tx, mut tun_tx_dropped) = (0, 0, 0, 0);
        for _ in tuns {
            tun_rx += next()?;
            tun_rx_bytes += next()?;
            tun_tx += next()?;
            tun_tx_dropped += next()?;
        }
        let snmp6 = |name: &str| -> Result<u64> {
            Ok(out
                .lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .ok_or_else(|| format!("no {name} in /proc/net/snmp6"))?)
        };
        let (ip6_in, ip6_in_bytes) = (snmp6("Ip6InReceives")?, snmp6("Ip6InOctets")?);
        let ports: Vec<String> = (0..tuns.len())
            .map(|t| format!(":{:04X}", GATEWAY_PORT as usize + t))
            .collect();
        let listen_drops = out
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let ours = f.len() > 12 && ports.iter().any(|p| f[1].ends_with(p));
                ours.then(|| f.last()?.parse::<u64>().ok())?
            })
            .sum();
        Ok(GatewayCounters {
            tun_rx,
            tun_rx_bytes,
            ip6_in,
            ip6_in_bytes,
            tun_tx,
            tun_tx_dropped,
            listen_drops,
        })
    }

    pub fn since(&self, b: &GatewayCounters) -> GatewayCounters {
        GatewayCounters {
            tun_rx: self.tun_rx.saturating_sub(b.tun_rx),
            tun_rx_bytes: self.tun_rx_bytes.saturating_sub(b.tun_rx_bytes),
            ip6_in: self.ip6_in.saturating_sub(b.ip6_in),
            ip6_in_bytes: self.ip6_in_bytes.saturating_sub(b.ip6_in_bytes),
            tun_tx: self.tun_tx.saturating_sub(b.tun_tx),
            tun_tx_dropped: self.tun_tx_dropped.saturating_sub(b.tun_tx_dropped),
            listen_drops: self.listen_drops.saturating_sub(b.listen_drops),
        }
    }
}

impl GatewayCounters {
    /// The `size`-byte inner packets the gateway wrote to its TUN device over these
    /// counters' span, however it grouped them into writes.
    pub fn tun_rx_packets(&self, size: usize) -> u64 {
        let (writes6, bytes6) = (self.ip6_in.min(self.tun_rx), self.ip6_in_bytes);
        let (writes4, bytes4) = (
            self.tun_rx - writes6,
            self.tun_rx_bytes.saturating_sub(bytes6),
        );
        // A write of k packets: one IP and UDP header, k payloads.
        let packets = |writes: u64, bytes: u64, header: usize| {
            let payload = size.saturating_sub(header + UDP_HEADER).max(1) as u64;
            let headers = writes * (header + UDP_HEADER) as u64;
            (bytes.saturating_sub(headers) + payload / 2) / payload
        };
        packets(writes4, bytes4, IPV4_HEADER) + packets(writes6, bytes6, IPV6_HEADER)
    }
}

/// Gives each of the gateway's tunnels `tuns` its key (`privates[t]`), its listening
/// port (`GATEWAY_PORT + t`) and its peers (peer i on tunnel i mod T, each with its
/// inner /32, /128 or both, as `family` says) by `wg setconf`, the gateway's inner
/// addresses, and routes to the peers: one route to the peers' prefix with one tunnel,
/// a route per peer to its tunnel with several (as `wg-quick` routes each peer's
/// AllowedIPs). With `blackhole`, the blackhole sink's addresses are routed to nowhere
/// and the namespace forwards: the kernel then drops what the gateway writes to them
/// silently after one route lookup (without forwarding, it would answer each with an
/// ICMP error back into the tunnel).
pub fn configure_gateway(
    ns: &Netns,
    tuns: &[String],
    privates: &[[u8; 32]],
    peers: &[EmulatedPeer],
    family: inner::Family,
    blackhole: bool,
) -> Result<()> {
    let n = tuns.len();
    let mut routes = String::new();
    let mut script = Vec::new();
    for (t, (tun, private)) in tuns.iter().zip(privates).enumerate() {
        let mut conf = format!(
            "[Interface]\nPrivateKey = {}\nListenPort = {}\n",
            wirelane_proto::base64_key(private),
            GATEWAY_PORT as usize + t
        );
        for (i, p) in peers.iter().enumerate().skip(t).step_by(n) {
            let mut allowed = Vec::new();
            if family.has_v4() {
                allowed.push(format!("{}/32", inner::peer_inner(i)));
                if n > 1 {
                    routes.push_str(&format!(
                        "route add {}/32 dev {tun}\n",
                        inner::peer_inner(i)
                    ));
                }
            }
            if family.has_v6() {
                allowed.push(format!("{}/128", inner::peer_inner6(i)));
                if n > 1 {
                    // A batch line takes no family option; the address says it.
                    routes.push_str(&format!(
                        "route add {}/128 dev {tun}\n",
                        inner::peer_inner6(i)
                    ));
                }
            }
            conf.push_str(&format!(
                "\n[Peer]\nPublicKey = {}\nAllowedIPs = {}\n",
                wirelane_proto::base64_key(&p.public()),
                allowed.join(", ")
            ));
        }
        let path = std::env::temp_dir().join(format!("{tun}-star.conf"));
        std::fs::write(&path, conf)?;
        script.push(format!("wg setconf {tun} {}", path.display()));
        if family.has_v6() {
            // Before the link is up: no router solicitations into the tunnel, whose
            // packets the transmit direction's counters would take for the load's.
            script.push(format!(
                "sysctl -qw net.ipv6.conf.{tun}.router_solicitations=0 \
                 net.ipv6.conf.{tun}.accept_ra=0"
            ));
        }
        script.push(format!(
            "ip link set {tun} mtu {} up",
            crate::impls::TUNNEL_MTU
        ));
        // Every tunnel has the gateway's inner addresses, as each of a concentrator's
        // interfaces would: the sink's, and the transmit sender's source.
        if family.has_v4() {
            script.push(format!("ip addr add {}/32 dev {tun}", inner::GATEWAY_INNER));
            if n == 1 {
                script.push(format!("ip route add {} dev {tun}", inner::PEERS_PREFIX));
            }
        }
        if family.has_v6() {
            script.push(format!(
                "ip -6 addr add {}/128 dev {tun} nodad",
                inner::GATEWAY_INNER6
            ));
            if n == 1 {
                script.push(format!(
                    "ip -6 route add {} dev {tun}",
                    inner::PEERS6_PREFIX
                ));
            }
        }
    }
    let routes_path = std::env::temp_dir().join(format!("{}-star.routes", tuns[0]));
    if n > 1 {
        std::fs::write(&routes_path, routes)?;
        script.push(format!("ip -batch {}", routes_path.display()));
    }
    if blackhole {
        script.push(format!(
            "sysctl -qw net.ipv4.conf.all.forwarding=1 net.ipv6.conf.all.forwarding=1 \
             && ip route add blackhole {}/32 && ip -6 route add blackhole {}/128",
            inner::BLACKHOLE_INNER,
            inner::BLACKHOLE_INNER6
        ));
    }
    let r = ns.run(&script.join(" && "));
    for tun in tuns {
        let _ = std::fs::remove_file(std::env::temp_dir().join(format!("{tun}-star.conf")));
    }
    let _ = std::fs::remove_file(&routes_path);
    r?;
    Ok(())
}
