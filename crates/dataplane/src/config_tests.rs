//! What applying a configuration does beyond storing it, as the kernel does it.

use super::*;
use crate::packet::Packet;
use crate::sched::Idle;
use crate::stages::nonce::{assign_and_enqueue, Budget};
use std::net::{IpAddr, Ipv4Addr};
use wirelane_io::udp::LocalAddr;

/// A peer at the discard port of loopback, where an initiation goes nowhere.
fn peer_update(endpoint: SocketAddr) -> PeerUpdate {
    PeerUpdate {
        endpoint: Some(endpoint),
        ..PeerUpdate::new([5; 32])
    }
}

#[test]
fn a_new_fwmark_or_endpoint_forgets_the_peers_source() {
    let iface = Interface::for_tests();
    let c = StageCtx {
        iface: &iface,
        sched: &Idle,
    };
    let ep: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let add = DeviceUpdate {
        peers: vec![peer_update(ep)],
        ..DeviceUpdate::default()
    };
    apply(c, &add).unwrap();
    let peer = iface.table().by_key[&[5; 32]].clone();
    let learn = || {
        let local = LocalAddr {
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            ifindex: 1,
        };
        peer.learn_source(ep, Some(local));
        assert!(peer.sticky_source(ep).is_some());
    };
    learn();
    let mark = DeviceUpdate {
        fwmark: Some(7),
        ..DeviceUpdate::default()
    };
    apply(c, &mark).unwrap();
    assert!(peer.sticky_source(ep).is_none(), "a new fwmark");
    learn();
    apply(c, &add).unwrap();
    assert!(peer.sticky_source(ep).is_none(), "the endpoint set again");
    learn();
    apply(c, &DeviceUpdate::default()).unwrap();
    assert!(peer.sticky_source(ep).is_some(), "nothing changed");
}

#[test]
fn packets_staged_without_a_private_key_begin_a_handshake_when_it_comes() {
    let iface = Interface::for_tests();
    let c = StageCtx {
        iface: &iface,
        sched: &Idle,
    };
    let add = DeviceUpdate {
        peers: vec![peer_update("127.0.0.1:9".parse().unwrap())],
        ..DeviceUpdate::default()
    };
    apply(c, &add).unwrap();
    let peer = iface.table().by_key[&[5; 32]].clone();
    let packets = (0..2).map(|_| Packet::with_capacity(4)).collect();
    assign_and_enqueue(c, &peer, packets, Budget::Bypassed);
    assert_eq!(peer.staged_len(), 2, "no key, no session: staged");
    let initiations = || -> u64 {
        let fields = iface.stats.fields();
        let begun = fields.iter().filter(|(f, _)| f.starts_with("initiations_"));
        begun.map(|(_, n)| n).sum()
    };
    assert_eq!(initiations(), 0);
    let key = DeviceUpdate {
        private_key: Some([9; 32]),
        ..DeviceUpdate::default()
    };
    apply(c, &key).unwrap();
    assert!(initiations() >= 1, "the staged packets' handshake began");
    assert_eq!(peer.staged_len(), 2, "waiting for it, in order");
}
