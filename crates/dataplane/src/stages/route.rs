//! Stage TX-2, route (cryptokey routing). Input: plaintext packets from the TUN.
//! Output: per-peer groups, each keeping the packets' relative order. Packets whose
//! destination no peer's AllowedIPs cover are dropped and counted. Where a route
//! through the device has an MTU of its own (rare), each packet notes it here, where
//! its destination is parsed anyway, for the padding at encryption.

use crate::device::Device;
use crate::inner;
use crate::packet::Packet;
use crate::peer::Peer;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub fn route(dev: &Device, packets: Vec<Packet>) -> Vec<(Arc<Peer>, Vec<Packet>)> {
    let mut groups: Vec<(Arc<Peer>, Vec<Packet>)> = Vec::new();
    let table = dev.table();
    let mtu_routes = dev.netwatch.mtu_routes();
    for mut p in packets {
        let dst = inner::parse(p.plaintext()).map(|h| h.dst);
        if let (Some(routes), Some(dst)) = (&mtu_routes, dst) {
            p.route_mtu = routes.lookup(dst).unwrap_or(0);
        }
        let peer = dst.and_then(|d| table.route(d));
        let Some(peer) = peer else {
            dev.stats.tx_no_route.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        // Few peers per batch in practice: a linear probe beats hashing here.
        match groups.iter_mut().find(|(q, _)| q.id == peer.id) {
            Some((_, v)) => v.push(p),
            None => groups.push((peer.clone(), vec![p])),
        }
    }
    groups
}
