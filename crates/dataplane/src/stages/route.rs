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
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
/// Cost: a port comparison per packet; the endpoint scan (each peer's state locked, in
/// the table-then-peer order every path takes) only for packets from our port and a
/// host address, which outside a loop are rare.
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
    let dport = u16::from_be_bytes([ports[2], ports[3]]);
    sport == port
        && dev.netwatch.tun_beside_sockets()
        && dev.netwatch.is_host_address(&src) == Some(true)
        && table.by_id.values().any(|p| {
            let endpoint = p.state().endpoint();
            endpoint.is_some_and(|e| e.ip() == dst && e.port() == dport)
        })
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
