//! The gateway under test, from the outside: its configuration for N peers, and the
//! counters of its namespace that say where a lost packet was lost (the listening
//! socket's drops, the TUN device's packets and drops).

use super::emulated::EmulatedPeer;
use super::{inner, GATEWAY_PORT};
use crate::netns::Netns;
use crate::Result;

/// The gateway namespace's counters that place losses.
#[derive(Debug, Clone, Copy, Default)]
pub struct GatewayCounters {
    pub tun_rx: u64,
    pub tun_tx: u64,
    pub tun_tx_dropped: u64,
    pub listen_drops: u64,
}

impl GatewayCounters {
    pub fn read(ns: &Netns, tun: &str) -> Result<GatewayCounters> {
        let stat = |dev: &str, name: &str| format!("/sys/class/net/{dev}/statistics/{name}");
        let out = ns.run(&format!(
            "cat {} {} {}; cat /proc/net/udp /proc/net/udp6",
            stat(tun, "rx_packets"),
            stat(tun, "tx_packets"),
            stat(tun, "tx_dropped"),
        ))?;
        let mut lines = out.lines();
        let mut next = || -> Result<u64> {
            Ok(lines
                .next()
                .and_then(|l| l.trim().parse().ok())
                .ok_or("unreadable interface statistics")?)
        };
        let (tun_rx, tun_tx, tun_tx_dropped) = (next()?, next()?, next()?);
        let port = format!(":{GATEWAY_PORT:04X}");
        let listen_drops = out
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() > 12 && f[1].ends_with(&port)).then(|| f.last()?.parse::<u64>().ok())?
            })
            .sum();
        Ok(GatewayCounters {
            tun_rx,
            tun_tx,
            tun_tx_dropped,
            listen_drops,
        })
    }

    pub fn since(&self, b: &GatewayCounters) -> GatewayCounters {
        GatewayCounters {
            tun_rx: self.tun_rx.saturating_sub(b.tun_rx),
            tun_tx: self.tun_tx.saturating_sub(b.tun_tx),
            tun_tx_dropped: self.tun_tx_dropped.saturating_sub(b.tun_tx_dropped),
            listen_drops: self.listen_drops.saturating_sub(b.listen_drops),
        }
    }
}

/// Gives the gateway its key, the N peers (each its inner /32) by `wg setconf`, its
/// inner address and a route to the peers' prefix.
pub fn configure_gateway(
    ns: &Netns,
    tun: &str,
    private: &[u8; 32],
    peers: &[EmulatedPeer],
) -> Result<()> {
    let mut conf = format!(
        "[Interface]\nPrivateKey = {}\nListenPort = {GATEWAY_PORT}\n",
        wirelane_proto::base64_key(private)
    );
    for (i, p) in peers.iter().enumerate() {
        conf.push_str(&format!(
            "\n[Peer]\nPublicKey = {}\nAllowedIPs = {}/32\n",
            wirelane_proto::base64_key(&p.public()),
            inner::peer_inner(i)
        ));
    }
    let path = std::env::temp_dir().join(format!("{tun}-star.conf"));
    std::fs::write(&path, conf)?;
    let r = ns.run(&format!(
        "wg setconf {tun} {path} && ip addr add {gw}/32 dev {tun} && ip link set {tun} up \
         && ip route add {prefix} dev {tun}",
        path = path.display(),
        gw = inner::GATEWAY_INNER,
        prefix = inner::PEERS_PREFIX,
    ));
    let _ = std::fs::remove_file(&path);
    r?;
    Ok(())
}
