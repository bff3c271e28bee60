//! A gateway and its clients in memory, on one runtime: the gateway interface has one
//! peer per client, each client interface has the gateway as its only peer, and every
//! datagram crosses a [`MemoryNet`]. Real keys, real handshakes, real stages and the
//! chosen execution model; no system call on the data path.
//!
//! Traffic is IPv4/UDP between the tunnels' inner addresses, each packet numbered per
//! sender. Every TUN sink checks what it receives: from the right sender, in order,
//! once, intact. The pipeline benchmark and the scheduling stress test use it.

use super::{Hook, MemoryNet, MemoryTun, MemoryUdp};
use crate::config::{self, DeviceUpdate, PeerUpdate};
use crate::exec::Model;
use crate::fq_codel::QueuePolicy;
use crate::interface::Interface;
use crate::ports::UdpPort;
use crate::runtime::Runtime;
use crate::sockets::Sockets;
use crate::stats::DROP_REASONS;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use wirelane_proto::{LocalIdentity, Prefix};

/// What a TUN sink has seen.
#[derive(Default)]
pub struct Seen {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    /// Packets out of order, repeated, or with contents other than their sender's.
    pub wrong: AtomicU64,
    /// Packets missing before one that came in order after them (a drop, not a
    /// misdelivery: what came is still in order).
    pub gaps: AtomicU64,
    /// Next number expected from each sender (by inner address).
    next: Mutex<HashMap<Ipv4Addr, u64>>,
}

impl Seen {
    fn check(&self, pkt: &[u8]) {
        let ok = (|| {
            let src = Ipv4Addr::new(pkt[12], pkt[13], pkt[14], pkt[15]);
            let seq = u64::from_le_bytes(pkt.get(28..36)?.try_into().ok()?);
            let fill = seq as u8;
            if pkt.get(36..)? != &fills()[usize::from(fill)][..pkt.len() - 36] {
                return None;
            }
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let n = next.entry(src).or_insert(0);
            if seq < *n {
                return None; // Repeated, or overtaken by a later one.
            }
            self.gaps.fetch_add(seq - *n, Ordering::Relaxed);
            *n = seq + 1;
            Some(())
        })();
        if ok.is_none() {
            self.wrong.fetch_add(1, Ordering::Relaxed);
        }
        self.packets.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(pkt.len() as u64, Ordering::Relaxed);
    }
}

/// Each fill byte repeated over a packet's largest payload, to compare contents with
/// one `memcmp` per packet (a byte loop here would cost more than the pipeline).
fn fills() -> &'static [Vec<u8>] {
    static FILLS: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    FILLS.get_or_init(|| (0..=255u8).map(|b| vec![b; 65536]).collect())
}

/// One end of the rig: an interface, its TUN and what its sink saw.
pub struct End {
    pub iface: Arc<Interface>,
    pub tun: Arc<MemoryTun>,
    pub seen: Arc<Seen>,
    pub inner: Ipv4Addr,
    /// Next number this end sends to each destination (by inner address).
    sent: Mutex<HashMap<Ipv4Addr, u64>>,
}

impl End {
    /// Hands `count` numbered packets of `len` bytes to `dst` into this end's TUN.
    pub fn send(&self, dst: Ipv4Addr, count: usize, len: usize) {
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        let first = sent.entry(dst).or_insert(0);
        let packets: Vec<Vec<u8>> = (0..count as u64)
            .map(|i| packet(self.inner, dst, *first + i, len))
            .collect();
        *first += count as u64;
        drop(sent);
        self.tun.inject(packets);
    }
}

/// An IPv4/UDP packet of `len` bytes (at least 37) carrying `seq` and a fill derived
/// from it. Its checksums are not computed: no kernel sees these packets.
pub fn packet(src: Ipv4Addr, dst: Ipv4Addr, seq: u64, len: usize) -> Vec<u8> {
    let len = len.max(37);
    let mut p = vec![seq as u8; len];
    p[..20].copy_from_slice(&[
        0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    p[20..22].copy_from_slice(&1000u16.to_be_bytes());
    p[22..24].copy_from_slice(&2000u16.to_be_bytes());
    p[24..26].copy_from_slice(&((len - 20) as u16).to_be_bytes());
    p[26..28].copy_from_slice(&[0, 0]);
    p[28..36].copy_from_slice(&seq.to_le_bytes());
    p
}

pub struct Rig {
    pub runtime: Arc<Runtime>,
    pub gateway: End,
    pub clients: Vec<End>,
    _net: Arc<MemoryNet>,
}

fn end(
    runtime: &Runtime,
    net: &Arc<MemoryNet>,
    name: &str,
    inner: Ipv4Addr,
    outer: SocketAddr,
    hook: Option<Hook>,
) -> std::io::Result<(End, Arc<MemoryUdp>)> {
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let tun = MemoryTun::new(name, move |p| s.check(p), hook.clone())?;
    let udp = net.socket(outer, hook)?;
    let port: Arc<dyn UdpPort> = udp.clone();
    let sockets = Sockets {
        v4: Some(port),
        port: outer.port(),
        ..Sockets::default()
    };
    let iface = Interface::new(Box::new(tun.clone()), sockets, QueuePolicy::default())?;
    runtime.serve(&iface)?;
    Ok((
        End {
            iface,
            tun,
            seen,
            inner,
            sent: Mutex::default(),
        },
        udp,
    ))
}

/// A private key per end, distinct after clamping (which clears byte 0's low bits).
fn key(seed: u32) -> [u8; 32] {
    let mut k = [0x5au8; 32];
    k[1..5].copy_from_slice(&seed.to_le_bytes());
    k
}

impl Rig {
    /// A gateway with `clients` clients on a new runtime running `model` with
    /// `workers` workers; `hook` runs on every packet crossing a port.
    pub fn new(
        model: Model,
        workers: usize,
        clients: usize,
        hook: Option<Hook>,
    ) -> std::io::Result<Rig> {
        let runtime = Arc::new(Runtime::start(model, workers, None)?);
        let net = Arc::new(MemoryNet::default());
        let outer = |i: u32| SocketAddr::from((Ipv4Addr::from(0x0a00_0000 + i), 51820));
        let inner = |i: u32| Ipv4Addr::from(0x0a80_0000 + i);
        let (gateway, _) = end(&runtime, &net, "gw", inner(0), outer(0), hook.clone())?;
        let gw_key = key(0);
        let gw_public = LocalIdentity::new(gw_key).public;
        let mut gw_update = DeviceUpdate {
            private_key: Some(gw_key),
            ..DeviceUpdate::default()
        };
        let mut ends = Vec::new();
        for i in 1..=clients as u32 {
            let (client, udp) = end(
                &runtime,
                &net,
                &format!("c{i}"),
                inner(i),
                outer(i),
                hook.clone(),
            )?;
            let k = key(i);
            let mut to_gateway = PeerUpdate::new(gw_public);
            to_gateway.endpoint = Some(outer(0));
            to_gateway.allowed_ips = vec![(prefix(inner(0)), true)];
            let update = DeviceUpdate {
                private_key: Some(k),
                peers: vec![to_gateway],
                ..DeviceUpdate::default()
            };
            config::apply(runtime.ctx(&client.iface), &update).map_err(std::io::Error::other)?;
            let mut to_client = PeerUpdate::new(LocalIdentity::new(k).public);
            to_client.endpoint = Some(udp.addr());
            to_client.allowed_ips = vec![(prefix(inner(i)), true)];
            gw_update.peers.push(to_client);
            ends.push(client);
        }
        config::apply(runtime.ctx(&gateway.iface), &gw_update).map_err(std::io::Error::other)?;
        Ok(Rig {
            runtime,
            gateway,
            clients: ends,
            _net: net,
        })
    }

    /// Packets every sink has taken, and those wrongly delivered.
    pub fn delivered(&self) -> (u64, u64) {
        self.ends().fold((0, 0), |(p, w), e| {
            (
                p + e.seen.packets.load(Ordering::Relaxed),
                w + e.seen.wrong.load(Ordering::Relaxed),
            )
        })
    }

    /// Packets every sink found missing before later ones (see [`Seen::gaps`]).
    pub fn gaps(&self) -> u64 {
        self.ends()
            .map(|e| e.seen.gaps.load(Ordering::Relaxed))
            .sum()
    }

    /// Packets every end dropped and counted, by any of the daemon's drop reasons.
    pub fn counted_drops(&self) -> u64 {
        self.drops_by_reason().iter().map(|(_, n)| n).sum()
    }

    /// The drop reasons that counted packets at some end, with their totals.
    pub fn drops_by_reason(&self) -> Vec<(String, u64)> {
        let mut totals: Vec<(String, u64)> = Vec::new();
        for e in self.ends() {
            for (field, n) in e.iface.stats.fields() {
                if n == 0 || !DROP_REASONS.contains(&field.as_str()) {
                    continue;
                }
                match totals.iter_mut().find(|(f, _)| *f == field) {
                    Some((_, t)) => *t += n,
                    None => totals.push((field, n)),
                }
            }
        }
        totals
    }

    fn ends(&self) -> impl Iterator<Item = &End> {
        self.named_ends().map(|(_, e)| e)
    }

    /// Every end, with what it is: "gateway" or "client".
    pub(crate) fn named_ends(&self) -> impl Iterator<Item = (&'static str, &End)> {
        let clients = self.clients.iter().map(|c| ("client", c));
        std::iter::once(("gateway", &self.gateway)).chain(clients)
    }

    /// Packets still in some peer's ordered queue.
    pub fn queued(&self) -> usize {
        self.ends()
            .map(|e| {
                e.iface
                    .table()
                    .by_id
                    .values()
                    .map(|p| p.tx_queue.queued_packets() + p.rx_queue.queued_packets())
                    .sum::<usize>()
            })
            .sum()
    }
}

fn prefix(a: Ipv4Addr) -> Prefix {
    Prefix::new(a.into(), 32).expect("a /32 is a prefix")
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.runtime.stop();
    }
}
