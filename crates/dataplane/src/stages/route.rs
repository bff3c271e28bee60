//! Stage TX-2, route (cryptokey routing). Input: plaintext packets from the TUN.
//! Output: per-peer groups, each keeping the packets' relative order. Packets whose
//! destination no peer's AllowedIPs cover are dropped and counted, and answered with an
//! ICMP destination-unreachable error written back into the TUN (see `icmp`). Our own
//! outer datagrams, routed back into the TUN, are dropped (see `is_own_outer`). Where a route
//! through the device has an MTU of its own (rare), each packet notes it here, where
//! its destination is parsed anyway, for the padding at encryption.

use super::StageCtx;
use crate::icmp;
use crate::inner;
use crate::interface::{Interface, PeerTable};
use crate::packet::Packet;
use crate::peer::Peer;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Writes an ICMP error about `packet` back into the TUN, within the rate limit: for a
/// packet no peer routes, and one for a peer without an endpoint (`nonce`).
pub(crate) fn answer_unreachable(dev: &Interface, packet: &[u8]) {
    let Some(h) = inner::parse(packet) else {
        return;
    };
    let Some(error) = icmp::unreachable(&packet[..h.total_len]) else {
        return;
    };
    let local = dev.netwatch.tun_addrs().contains(&h.src);
    if !dev.icmp_limit.allow(h.src, local, dev.now()) {
        dev.stats
            .tx_icmp_rate_limited
            .fetch_add(1, Ordering::Relaxed);
        return;
    }
    if dev.tun.write_packet(&error).is_ok() {
        dev.stats
            .tx_icmp_unreachable
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether `packet` is one of this tunnel's own outer datagrams, which a route through
/// the tunnel itself (a peer's endpoint inside its own AllowedIPs, or reached through
/// the tunnel) has brought back: UDP from our listen port, from one of the host's
/// addresses, to a peer's endpoint, read from a TUN in the sockets' namespace.
/// Encapsulating it again would loop for ever, each round 32 bytes larger and, past
/// the MTU, in more fragments. (The kernel's WireGuard refuses such a send, `ELOOP`,
/// when it finds its route leads into the device; a user-space daemon sees the route's
/// result only here.)
///
/// Why the endpoint: in one namespace only our sockets send from our port on the host's
/// addresses, but a packet masqueraded into the tunnel (`-o wg0 -j MASQUERADE`, a router
/// sharing the tunnel with its LAN) gets the tunnel's own address as its source and
/// keeps its source port: a LAN host's WireGuard, NTP or IKE traffic on the port we
/// listen on. Its destination is a host behind the tunnel, not a peer's endpoint. What
/// this cannot see is a loop through a second tunnel (ours inside theirs inside ours):
/// that is bounded only by packets outgrowing the largest datagram.
///
/// Cost: a port comparison per packet. Which destinations are endpoints is found by a
/// scan of the peers (each one's state locked, in the table-then-peer order every path
/// takes), and kept for a second per destination (`OuterVerdicts`): a masqueraded flow
/// or a loop pays one scan a second, not one per packet.
fn is_own_outer(dev: &Interface, table: &PeerTable, packet: &[u8], port: u16) -> bool {
    let (src, dst, ports) = match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= 20 && packet[9] == 17 => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            let first_fragment = u16::from_be_bytes([packet[6], packet[7]]) & 0x1fff == 0;
            let Some(ports) = packet.get(ihl..ihl + 4).filter(|_| first_fragment) else {
                return false;
            };
            let src: [u8; 4] = packet[12..16].try_into().unwrap();
            let dst: [u8; 4] = packet[16..20].try_into().unwrap();
            (IpAddr::from(src), IpAddr::from(dst), ports)
        }
        Some(6) if packet.len() >= 44 && packet[6] == 17 => {
            let src: [u8; 16] = packet[8..24].try_into().unwrap();
            let dst: [u8; 16] = packet[24..40].try_into().unwrap();
            (IpAddr::from(src), IpAddr::from(dst), &packet[40..44])
        }
        _ => return false,
    };
    let sport = u16::from_be_bytes([ports[0], ports[1]]);
    if sport != port
        || !dev.netwatch.tun_beside_sockets()
        || dev.netwatch.is_host_address(&src) != Some(true)
    {
        return false;
    }
    let to = SocketAddr::new(dst, u16::from_be_bytes([ports[2], ports[3]]));
    let now = dev.now();
    if let Some(verdict) = dev.outer_verdicts.get(to, now) {
        return verdict;
    }
    // An endpoint given as an IPv4-mapped address is sent to over IPv4.
    let verdict = table.by_id.values().any(|p| {
        let endpoint = p.state().endpoint();
        endpoint.is_some_and(|e| e.ip().to_canonical() == dst && e.port() == to.port())
    });
    dev.outer_verdicts.put(to, verdict, now);
    verdict
}

/// How long a verdict of [`is_own_outer`] on a destination is kept. An endpoint that
/// changes meanwhile (a roaming peer, a `wg set`) is seen within it.
const VERDICT_KEPT: Duration = Duration::from_secs(1);

/// The last few destinations [`is_own_outer`] judged, with the verdict and when.
#[derive(Debug, Default)]
pub(crate) struct OuterVerdicts(Mutex<[Option<(SocketAddr, bool, Duration)>; 4]>);

impl OuterVerdicts {
    fn get(&self, to: SocketAddr, now: Duration) -> Option<bool> {
        let v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        v.iter().flatten().find_map(|&(d, verdict, at)| {
            (d == to && now.saturating_sub(at) < VERDICT_KEPT).then_some(verdict)
        })
    }

    /// Forgets every verdict (the peers' endpoints changed).
    pub(crate) fn clear(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Default::default();
    }

    /// Keeps `verdict` on `to` in place of the oldest entry.
    fn put(&self, to: SocketAddr, verdict: bool, now: Duration) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let oldest = (0..v.len())
            .min_by_key(|&i| v[i].map_or(Duration::ZERO, |(_, _, at)| at))
            .unwrap_or(0);
        v[oldest] = Some((to, verdict, now));
    }
}

/// Takes every packet out of `packets` (leaving its allocation for the next read).
pub fn route(c: StageCtx<'_>, packets: &mut Vec<Packet>) -> Vec<(Arc<Peer>, Vec<Packet>)> {
    let dev = c.iface;
    // Pass one finds each packet's peer; pass two moves the packets into groups of
    // exactly their size. Sized in one pass, each new group had to guess: room for the
    // whole read (a 64-packet allocation for one packet, at many peers) or a little
    // (five regrowths, at one).
    let mut peers: Vec<(u32, Arc<Peer>, usize)> = Vec::new();
    let mut group_of: Vec<Option<usize>> = Vec::with_capacity(packets.len());
    {
        let table = dev.table();
        let mtu_routes = dev.netwatch.mtu_routes();
        let port = dev.sockets().port;
        for p in packets.iter_mut() {
            group_of.push(None);
            if is_own_outer(dev, &table, p.plaintext(), port) {
                dev.stats.tx_routing_loop.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let dst = inner::parse(p.plaintext()).map(|h| h.dst);
            if let (Some(routes), Some(dst)) = (&mtu_routes, dst) {
                p.route_mtu = routes.lookup(dst).unwrap_or(0);
            }
            let Some(peer) = dst.and_then(|d| table.route(d)) else {
                dev.stats.tx_no_route.fetch_add(1, Ordering::Relaxed);
                answer_unreachable(dev, p.plaintext());
                continue;
            };
            // Few peers per read in practice: a linear probe over their ids (no
            // pointer to follow) beats hashing.
            let g = match peers.iter().position(|(id, _, _)| *id == peer.id) {
                Some(g) => g,
                None => {
                    peers.push((peer.id, peer.clone(), 0));
                    peers.len() - 1
                }
            };
            peers[g].2 += 1;
            *group_of.last_mut().expect("pushed above") = Some(g);
        }
    }
    let mut groups: Vec<(Arc<Peer>, Vec<Packet>)> = peers
        .into_iter()
        .map(|(_, peer, n)| (peer, Vec::with_capacity(n)))
        .collect();
    for (p, g) in packets.drain(..).zip(group_of) {
        if let Some(g) = g {
            groups[g].1.push(p);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verdict is kept for a second per destination; four destinations at once.
    #[test]
    fn verdicts_are_kept_a_second_for_the_last_four_destinations() {
        let v = OuterVerdicts::default();
        let at = |ms: u64| Duration::from_millis(ms);
        let to = |port: u16| SocketAddr::from(([10, 0, 0, 1], port));
        v.put(to(1), true, at(1_000));
        assert_eq!(v.get(to(1), at(1_999)), Some(true));
        assert_eq!(
            v.get(to(1), at(2_000)),
            None,
            "a second later: judged again"
        );
        assert_eq!(v.get(to(2), at(1_500)), None);
        for p in 2..=5 {
            v.put(to(p), false, at(1_000 + u64::from(p)));
        }
        assert_eq!(v.get(to(1), at(1_010)), None, "the oldest made room");
        assert_eq!(v.get(to(5), at(1_010)), Some(false));
    }
}
