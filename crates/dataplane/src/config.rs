//! Configuration of a running device: the validated update the UAPI `set` produces,
//! applied all at once, and the snapshot `get` reports.
//!
//! Atomicity: an update is fully parsed and validated before it gets here. The steps
//! that can still fail, the peer limit and binding a new listen port, run first; after
//! they succeed everything else is applied under the peer-table write lock, so readers
//! never see a half-applied update. Updates of one interface are serialized
//! (`apply_lock`): the peer count checked is the one the update changes.

use crate::interface::{Interface, PeerTable};
use crate::peer::Peer;
use crate::sockets::Sockets;
use crate::stages::nonce::{send_staged, step};
use crate::stages::StageCtx;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use wirelane_proto::{LocalIdentity, Prefix};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeviceUpdate {
    /// `Some([0; 32])` removes the private key.
    pub private_key: Option<[u8; 32]>,
    pub listen_port: Option<u16>,
    pub fwmark: Option<u32>,
    pub replace_peers: bool,
    pub peers: Vec<PeerUpdate>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerUpdate {
    pub public_key: [u8; 32],
    pub remove: bool,
    pub update_only: bool,
    pub preshared_key: Option<[u8; 32]>,
    pub endpoint: Option<SocketAddr>,
    pub persistent_keepalive: Option<u16>,
    pub replace_allowed_ips: bool,
    /// Prefixes to add (`true`) or remove (`false`), in order.
    pub allowed_ips: Vec<(Prefix, bool)>,
}

impl PeerUpdate {
    pub fn new(public_key: [u8; 32]) -> Self {
        PeerUpdate {
            public_key,
            remove: false,
            update_only: false,
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("cannot bind UDP port {port}: {source}")]
    Bind { port: u16, source: std::io::Error },
    #[error("cannot set fwmark {mark}: {source}")]
    Fwmark { mark: u32, source: std::io::Error },
    #[error("the update would leave {wanted} peers, more than this interface's limit of {limit} (--max-peers); nothing was changed")]
    TooManyPeers { wanted: usize, limit: usize },
    #[error("the update could leave {wanted} allowed IPs, more than this interface's limit of {limit} (--max-allowed-ips); nothing was changed")]
    TooManyAllowedIps { wanted: usize, limit: usize },
}

/// How many peers `table` holds once `update` is applied (the rules of step 2 below);
/// a peer named with the interface's own key, which step 2 ignores, counts, so this
/// may be one too many, never too few.
fn peers_after(table: &PeerTable, update: &DeviceUpdate) -> usize {
    let mut count = if update.replace_peers {
        0
    } else {
        table.by_key.len()
    };
    // Whether each key the update names is in the table at that point of the update.
    let mut present: HashMap<[u8; 32], bool> = HashMap::new();
    for pu in &update.peers {
        let now = *present
            .entry(pu.public_key)
            .or_insert_with(|| !update.replace_peers && table.by_key.contains_key(&pu.public_key));
        if pu.remove && now {
            count -= 1;
            present.insert(pu.public_key, false);
        } else if !pu.remove && !pu.update_only && !now {
            count += 1;
            present.insert(pu.public_key, true);
        }
    }
    count
}

/// At most how many AllowedIPs prefixes `table` holds once `update` is applied: those
/// it keeps (all but a replaced table's, a removed peer's or one whose prefixes are
/// replaced) and every prefix the update adds, as if each were new. An upper bound:
/// a prefix added twice, or moved between peers, counts twice.
fn allowed_ips_bound(table: &PeerTable, update: &DeviceUpdate) -> usize {
    if update.replace_peers {
        return update.peers.iter().map(added_prefixes).sum();
    }
    let mut count = table.allowed.len();
    let mut cleared: HashSet<u32> = HashSet::new();
    for pu in &update.peers {
        if pu.remove || pu.replace_allowed_ips {
            if let Some(p) = table.by_key.get(&pu.public_key) {
                if cleared.insert(p.id) {
                    count -= table.allowed.owned_count(p.id);
                }
            }
        }
        count += added_prefixes(pu);
    }
    count
}

fn added_prefixes(pu: &PeerUpdate) -> usize {
    if pu.remove {
        return 0;
    }
    pu.allowed_ips.iter().filter(|(_, add)| *add).count()
}

/// What `get` reports about one peer.
#[derive(Debug, Clone)]
pub struct PeerSnapshot {
    pub public_key: [u8; 32],
    pub preshared_key: [u8; 32],
    pub endpoint: Option<SocketAddr>,
    pub last_handshake: Option<Duration>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub persistent_keepalive: u16,
    pub allowed_ips: Vec<Prefix>,
}

#[derive(Debug, Clone)]
pub struct DeviceSnapshot {
    pub private_key: Option<[u8; 32]>,
    pub listen_port: u16,
    pub fwmark: u32,
    pub peers: Vec<PeerSnapshot>,
}

/// The device was set down after it was up (`up` false), or up again (`up` true), as
/// the kernel's `wg_stop` and `wg_open` take it. Down: every peer's sessions,
/// handshake and timers go and what it had staged is dropped; while down nothing is
/// sent and handshake messages are not answered (`NetWatch::is_down`; the kernel closes
/// its sockets, wirelane keeps its port). Up: each peer sends what it staged since, and
/// a peer with a persistent keepalive sends one, which begins its handshake.
pub fn link_changed(c: StageCtx<'_>, up: bool) {
    let peers: Vec<Arc<Peer>> = c.iface.table().by_id.values().cloned().collect();
    for p in peers {
        if up {
            let keepalive = p.state().persistent_keepalive() > 0;
            send_staged(c, &p, keepalive);
            continue;
        }
        let staged = p.take_staged().len() as u64;
        if staged > 0 {
            c.iface
                .stats
                .tx_dropped
                .fetch_add(staged, Ordering::Relaxed);
        }
        step(c, &p, |st, ctx, _out| st.interface_down(ctx));
    }
    match up {
        true => tracing::info!("interface up: peers send again"),
        false => tracing::info!("interface down: sessions cleared, nothing sent until up"),
    }
}

/// Applies a validated update to `c.iface` (see the module comment); peers that join or
/// leave are announced to the scheduler.
pub fn apply(c: StageCtx<'_>, update: &DeviceUpdate) -> Result<(), ApplyError> {
    c.iface.apply(c, update)
}

impl Interface {
    fn apply(&self, c: StageCtx<'_>, update: &DeviceUpdate) -> Result<(), ApplyError> {
        let _serial = self.apply_lock.lock().unwrap_or_else(|p| p.into_inner());
        // Step 1, the fallible ones. The peer limit: a table that would outgrow it
        // (the memory the daemon may use, or the kernel's bound) is refused whole.
        // The same for AllowedIPs prefixes, which cost memory too (about 100–270 bytes
        // each here).
        let (wanted, held, wanted_ips, held_ips) = {
            let table = self.table();
            (
                peers_after(&table, update),
                table.by_key.len(),
                allowed_ips_bound(&table, update),
                table.allowed.len(),
            )
        };
        let limit = self.max_peers();
        if wanted > limit && wanted > held {
            return Err(ApplyError::TooManyPeers { wanted, limit });
        }
        let limit = self.max_allowed_ips();
        if wanted_ips > limit && wanted_ips > held_ips {
            return Err(ApplyError::TooManyAllowedIps {
                wanted: wanted_ips,
                limit,
            });
        }
        // New sockets if the port changes. Port 0 keeps an
        // existing binding (wg setconf sends listen_port=0 when a file names none).
        let (cur_port, cur_mark) = {
            let s = self.sockets();
            (s.port, s.fwmark)
        };
        let mark = update.fwmark.unwrap_or(cur_mark);
        let new_sockets = match update.listen_port {
            Some(p) if p != 0 && p != cur_port => Some(
                Sockets::bind(p, mark).map_err(|source| ApplyError::Bind { port: p, source })?,
            ),
            _ => None,
        };
        if new_sockets.is_none() && mark != cur_mark {
            self.sockets()
                .apply_fwmark(mark)
                .map_err(|source| ApplyError::Fwmark { mark, source })?;
        }

        // Step 2: everything else, under the table lock.
        let mut touched: Vec<(Arc<Peer>, Option<u16>)> = Vec::new();
        let mut added: Vec<Arc<Peer>> = Vec::new();
        let mut removed: Vec<Arc<Peer>> = Vec::new();
        let had_identity = self.identity().is_some();
        {
            let mut table = self.table_mut();
            let rebound = new_sockets.is_some() || mark != cur_mark;
            if let Some(s) = new_sockets {
                self.replace_sockets(s);
            } else if mark != cur_mark {
                self.set_sockets_fwmark(mark);
            }
            // New sockets or a new mark can route a peer's replies another way: every
            // remembered source is forgotten and learnt again from what arrives, as
            // the kernel clears each peer's source on a port or fwmark change (a
            // source checked under the old mark would otherwise be kept until some
            // unrelated address or route event).
            if rebound {
                for p in table.by_id.values() {
                    p.forget_source();
                }
            }
            if let Some(k) = update.private_key {
                removed.extend(self.change_identity(c, &mut table, k));
            }
            if update.replace_peers {
                let all: Vec<_> = table.by_id.values().cloned().collect();
                for p in all {
                    self.forget_peer(&mut table, &p);
                    removed.push(p);
                }
            }
            let own = self.identity().map(|i| i.public);
            for pu in &update.peers {
                if Some(pu.public_key) == own {
                    continue; // A peer with our own key is meaningless; ignore it.
                }
                let existing = table.by_key.get(&pu.public_key).cloned();
                if pu.remove {
                    if let Some(p) = existing {
                        self.forget_peer(&mut table, &p);
                        removed.push(p);
                    }
                    continue;
                }
                let peer = match existing {
                    Some(p) => p,
                    None if pu.update_only => continue,
                    None => {
                        let id = table.take_id();
                        let p = Arc::new(Peer::new(id, pu.public_key, [0; 32], &self.budgets));
                        table.by_key.insert(pu.public_key, p.clone());
                        table.by_id.insert(id, p.clone());
                        added.push(p.clone());
                        p
                    }
                };
                {
                    let mut st = peer.state();
                    if let Some(psk) = pu.preshared_key {
                        st.set_psk(psk);
                    }
                    if let Some(ep) = pu.endpoint {
                        // Set from outside, even to the address it had, the endpoint
                        // comes without a source, as in the kernel: the next packet
                        // from the peer teaches it again.
                        st.set_endpoint(ep);
                        peer.forget_source();
                    }
                }
                if pu.replace_allowed_ips {
                    table.allowed.remove_value(peer.id);
                }
                for (prefix, add) in &pu.allowed_ips {
                    if *add {
                        table.allowed.insert(*prefix, peer.id);
                    } else {
                        table.allowed.remove_if_owned(*prefix, peer.id);
                    }
                }
                touched.push((peer, pu.persistent_keepalive));
            }
        }
        // The routing-loop filter judges destinations by the peers' endpoints: whatever
        // it kept is judged again.
        self.outer_verdicts.clear();
        // Step 3: effects that send packets, and the scheduler's news, run outside the
        // table lock.
        for p in &removed {
            c.sched.peer_removed(c.iface, p);
        }
        for p in added.iter().filter(|p| !p.is_removed()) {
            c.sched.peer_added(c.iface, p);
        }
        for (peer, keepalive) in touched {
            if let Some(secs) = keepalive {
                if !peer.is_removed() {
                    step(c, &peer, |st, _ctx, out| {
                        st.set_persistent_keepalive(secs, out)
                    });
                }
            }
        }
        // Packets staged while the interface had no private key began no handshake
        // (there was nothing to make one with); with the first key they go, or their
        // handshake begins, as the kernel sends every peer's staged packets then.
        if !had_identity && self.identity().is_some() {
            let waiting: Vec<Arc<Peer>> = (self.table().by_id.values())
                .filter(|p| p.staged_len() > 0)
                .cloned()
                .collect();
            for p in waiting {
                send_staged(c, &p, false);
            }
        }
        Ok(())
    }

    /// Installs a new private key; returns the peer it removed, if one had the new
    /// public key (it would be talking to itself).
    fn change_identity(
        &self,
        c: StageCtx<'_>,
        table: &mut PeerTable,
        key: [u8; 32],
    ) -> Option<Arc<Peer>> {
        // Keys are kept clamped; setting the unclamped form of the current key changes
        // nothing, as in the kernel.
        let key = if key == [0; 32] {
            key
        } else {
            wirelane_proto::crypto::clamp_private(key)
        };
        let current = self.identity().map(|i| i.private_bytes());
        if current == Some(key) || (current.is_none() && key == [0; 32]) {
            return None;
        }
        let identity = (key != [0; 32]).then(|| Arc::new(LocalIdentity::new(key)));
        let mut removed = None;
        if let Some(id) = &identity {
            // A peer whose key is now our own would be talking to itself.
            if let Some(p) = table.by_key.get(&id.public).cloned() {
                self.forget_peer(table, &p);
                removed = Some(p);
            }
        }
        self.set_identity(identity);
        let peers: Vec<_> = table.by_id.values().cloned().collect();
        for p in peers {
            step(c, &p, |st, ctx, _| st.local_identity_changed(ctx));
        }
        removed
    }

    pub fn snapshot(&self) -> DeviceSnapshot {
        let table = self.table();
        let mut peers: Vec<&Arc<Peer>> = table.by_id.values().collect();
        peers.sort_by_key(|p| p.id);
        let peers = peers
            .into_iter()
            .map(|p| {
                let st = p.state();
                PeerSnapshot {
                    public_key: p.public_key,
                    preshared_key: *st.psk(),
                    endpoint: st.endpoint(),
                    last_handshake: st.last_handshake(),
                    rx_bytes: p.rx_bytes.load(Ordering::Relaxed),
                    tx_bytes: p.tx_bytes.load(Ordering::Relaxed),
                    persistent_keepalive: st.persistent_keepalive(),
                    allowed_ips: table.allowed.owned_by(p.id).collect(),
                }
            })
            .collect();
        let s = self.sockets();
        DeviceSnapshot {
            private_key: self.identity().map(|i| i.private_bytes()),
            listen_port: s.port,
            fwmark: s.fwmark,
            peers,
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
