//! The tunnel's view of the host's network, kept current by rtnetlink notifications
//! rather than polling:
//!
//! - where the TUN device lives (it may be moved to another namespace while its
//!   sockets stay here, the container pattern), its MTU and its addresses;
//! - the routes through it that carry an MTU of their own, which padding follows;
//! - whether the device is up: set down after it was up (`ip link set down`), the
//!   interface stops as the kernel's `wg_stop` does (`config::link_changed`);
//! - a generation number of the sockets' namespace's addresses and routes, which tells
//!   a peer's sticky source (the local address its packets arrive at) when it must be
//!   checked again, as kernel WireGuard re-checks `src4` and `src_if4` on a route
//!   lookup.
//!
//! Who calls what: the runtime owns one `Monitor` for every interface (opened before
//! privileges are dropped: hearing other namespaces needs CAP_NET_BROADCAST at that
//! moment); its timer thread drains it and hands the events to each interface's
//! [`NetWatch::handle`]. The data path only reads (`mtu_routes`, `generation`,
//! `source_usable`). Refreshing takes a few netlink round trips and never runs on the
//! data path, except a source check, once per peer per generation.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use wirelane_io::netlink::{Change, Event, Route, Rtnl};
use wirelane_io::tun::Tun;
use wirelane_io::udp::LocalAddr;
use wirelane_proto::{AllowedIps, Prefix};

/// Where the TUN device is and what it carries.
#[derive(Debug, Clone, Default)]
struct TunView {
    /// The namespace id ours gives the device's namespace; None while it is ours.
    nsid: Option<i32>,
    ifindex: u32,
    addrs: Vec<IpAddr>,
}

/// Host addresses of the sockets' namespace, as of one generation.
#[derive(Default)]
struct HostAddrs {
    generation: u64,
    addrs: Arc<HashSet<IpAddr>>,
}

pub struct NetWatch {
    rtnl: Option<Mutex<Rtnl>>,
    generation: AtomicU64,
    mtu: AtomicU32,
    tun: Mutex<TunView>,
    /// Routes through the device with an MTU metric, by prefix; None (the usual case)
    /// when there are none, so padding reads one pointer and uses the device's MTU.
    mtu_routes: RwLock<Option<Arc<AllowedIps<u32>>>>,
    /// The routes behind `mtu_routes`, with the namespace each was seen in. In the
    /// sockets' namespace they are read by a dump; in another, where route dumps cannot
    /// reach, from notifications, which is complete because moving a device flushes
    /// its routes: every route through it there was added, and announced, after.
    mtu_route_list: Mutex<Vec<(Option<i32>, Route)>>,
    host_addrs: Mutex<HostAddrs>,
    /// The device's administrative state: [`NEVER_UP`], [`UP`] or [`DOWN`]. Written by
    /// the timer thread alone (`refresh_tun`).
    admin: AtomicU8,
}

/// Not up since it was made: a new device is down until `ip link set up`, and a
/// tunnel configured before that (as wg-quick configures it) runs as it always did.
const NEVER_UP: u8 = 0;
const UP: u8 = 1;
/// Set down after it was up.
const DOWN: u8 = 2;

impl NetWatch {
    /// Opens a netlink request socket and reads the device's state. Without netlink the
    /// tunnel still runs, with the MTU it starts with; without a real device (an
    /// in-memory one) there is nothing to watch.
    pub fn new(tun: Option<&Tun>) -> NetWatch {
        let Some(tun) = tun else {
            return NetWatch::unwatched();
        };
        let rtnl = Rtnl::open()
            .inspect_err(|e| tracing::warn!(error = %e, "no rtnetlink requests"))
            .ok()
            .map(Mutex::new);
        let watch = NetWatch {
            rtnl,
            generation: AtomicU64::new(1),
            mtu: AtomicU32::new(tun.mtu().unwrap_or(wirelane_io::tun::DEFAULT_MTU)),
            tun: Mutex::default(),
            mtu_routes: RwLock::new(None),
            mtu_route_list: Mutex::default(),
            host_addrs: Mutex::default(),
            admin: AtomicU8::new(NEVER_UP),
        };
        let _ = watch.refresh_tun(tun);
        watch
    }

    fn unwatched() -> NetWatch {
        NetWatch {
            rtnl: None,
            generation: AtomicU64::new(1),
            mtu: AtomicU32::new(wirelane_io::tun::DEFAULT_MTU),
            tun: Mutex::default(),
            mtu_routes: RwLock::new(None),
            mtu_route_list: Mutex::default(),
            host_addrs: Mutex::default(),
            admin: AtomicU8::new(NEVER_UP),
        }
    }

    /// Whether the device was set down after it was up: the interface is stopped.
    pub fn is_down(&self) -> bool {
        self.admin.load(Ordering::Relaxed) == DOWN
    }

    /// Records the device's administrative state; Some(up) when it went up after it
    /// was set down, or down after it was up.
    fn note_admin(&self, up: bool) -> Option<bool> {
        let prev = self.admin.load(Ordering::Relaxed);
        let next = match (prev, up) {
            (_, true) => UP,
            (NEVER_UP, false) => NEVER_UP,
            (_, false) => DOWN,
        };
        self.admin.store(next, Ordering::Relaxed);
        match (prev, next) {
            (UP, DOWN) => Some(false),
            (DOWN, UP) => Some(true),
            _ => None,
        }
    }

    /// The device's MTU.
    pub fn mtu(&self) -> usize {
        self.mtu.load(Ordering::Relaxed) as usize
    }

    /// The routes through the device with an MTU of their own, by prefix (the most
    /// specific decides a packet's padding); None, the usual case, when there are
    /// none and the device's MTU applies to every packet.
    pub fn mtu_routes(&self) -> Option<Arc<AllowedIps<u32>>> {
        self.mtu_routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The addresses of the device (ICMP errors written back into it come from one).
    pub fn tun_addrs(&self) -> Vec<IpAddr> {
        self.tun
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .addrs
            .clone()
    }

    /// Moves whenever an address, link or route changes in the sockets' namespace. Each
    /// move costs every peer with a sticky source one check at its next send (one
    /// netlink query for IPv4): the price of following a route that takes over as soon
    /// as the kernel does.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Follows a batch of notifications (the runtime's timer thread drains its
    /// monitor and hands every interface the same batch); Some(up) when the device
    /// went down after it was up, or up again after that (`note_admin`).
    pub fn handle(&self, events: &[Event], tun: Option<&Tun>) -> Option<bool> {
        let tun = tun?;
        let tun_nsid = self.tun.lock().unwrap_or_else(|p| p.into_inner()).nsid;
        let mut changed_here = false;
        let mut refresh = false;
        let mut routes_changed = false;
        for e in events {
            // Any change here, a rule's included, may change a datagram's route: the
            // sticky sources are checked again (`source_usable`).
            changed_here |= e.nsid.is_none();
            // Any link change may be the device moving or changing its MTU; address
            // changes matter where the device lives.
            refresh |= matches!(e.change, Change::Link | Change::Unknown)
                || e.change == Change::Address && e.nsid == tun_nsid;
            if let Some((route, deleted)) = e.route {
                routes_changed |= self.note_route(e.nsid, route, deleted);
            }
        }
        if changed_here {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        if refresh {
            return self.refresh_tun(tun);
        }
        if routes_changed {
            self.rebuild_mtu_routes();
        }
        None
    }

    /// Follows one route notification in the list of MTU routes; true if it changed.
    /// A route without an MTU replacing one with it removes it, as a deletion does.
    fn note_route(&self, nsid: Option<i32>, route: Route, deleted: bool) -> bool {
        let mut list = self
            .mtu_route_list
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let same = |(n, r): &(Option<i32>, Route)| {
            *n == nsid
                && r.oif == route.oif
                && r.table == route.table
                && r.dst == route.dst
                && r.prefix_len == route.prefix_len
        };
        let before = list.len();
        list.retain(|e| !same(e));
        let added = !deleted && route.mtu.is_some();
        if added {
            list.push((nsid, route));
        }
        added || list.len() != before
    }

    /// Rebuilds the lookup table from the routes through the device where it is now,
    /// forgetting any seen elsewhere (a device moved away has none left there).
    fn rebuild_mtu_routes(&self) {
        let (nsid, ifindex) = {
            let view = self.tun.lock().unwrap_or_else(|p| p.into_inner());
            (view.nsid, view.ifindex)
        };
        let mut list = self
            .mtu_route_list
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        list.retain(|(n, r)| *n == nsid && r.oif == ifindex);
        let table = mtu_table(list.iter().map(|(_, r)| r));
        *self.mtu_routes.write().unwrap_or_else(|p| p.into_inner()) = table;
    }

    /// Reads where the device lives now, its MTU, addresses and MTU routes.
    fn refresh_tun(&self, tun: &Tun) -> Option<bool> {
        let rtnl = self.rtnl.as_ref()?;
        let rtnl = rtnl.lock().unwrap_or_else(|p| p.into_inner());
        let mut up = None;
        let located = (|| -> std::io::Result<TunView> {
            let nsid = if tun.in_own_netns()? {
                None
            } else {
                Some(rtnl.namespace_id(std::os::fd::AsFd::as_fd(&tun.netns()?))?)
            };
            let link = rtnl.link(nsid, &tun.current_name()?)?;
            self.mtu.store(link.mtu, Ordering::Relaxed);
            up = Some(link.up);
            Ok(TunView {
                nsid,
                ifindex: link.ifindex,
                addrs: rtnl.addresses(nsid, Some(link.ifindex))?,
            })
        })();
        let view = match located {
            Ok(v) => v,
            // The device is being deleted; the TUN reader notices and stops.
            Err(e) => {
                tracing::debug!(error = %e, "interface state not read");
                return None;
            }
        };
        // Route dumps cannot name another namespace; there the notifications keep the
        // list (see `mtu_route_list`).
        if view.nsid.is_none() {
            let dumped = rtnl.mtu_routes(view.ifindex).unwrap_or_default();
            let mut list = self
                .mtu_route_list
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            list.retain(|(n, _)| n.is_some());
            list.extend(dumped.into_iter().map(|r| (None, r)));
        }
        drop(rtnl);
        *self.tun.lock().unwrap_or_else(|p| p.into_inner()) = view;
        self.rebuild_mtu_routes();
        up.and_then(|up| self.note_admin(up))
    }

    /// Whether a peer may keep sending from `local` to `endpoint`: the address must
    /// still be one of ours, and for IPv4 the route from it must still leave by the
    /// interface the peer's packets arrive on (else a newer route took over, and the
    /// route's own choice of source is the right one). The kernel checks the same.
    /// `port` is the sockets' own: the question is asked for the datagram as it will
    /// be sent, ports included.
    pub fn source_usable(
        &self,
        endpoint: &SocketAddr,
        local: &LocalAddr,
        port: u16,
        fwmark: u32,
    ) -> bool {
        let Some(rtnl) = &self.rtnl else { return true };
        match self.is_host_address(&local.ip) {
            Some(false) => return false,
            None => return true, // cannot tell: the send falls back if it must
            Some(true) => {}
        }
        if local.ip.is_ipv6() {
            return true;
        }
        let rtnl = rtnl.lock().unwrap_or_else(|p| p.into_inner());
        rtnl.route_oif(endpoint.ip(), local.ip, (port, endpoint.port()), fwmark)
            .is_ok_and(|oif| oif == local.ifindex)
    }
}

impl NetWatch {
    /// Whether `ip` is an address of the sockets' namespace (None: cannot tell). The
    /// address list is read once per generation.
    pub fn is_host_address(&self, ip: &IpAddr) -> Option<bool> {
        let rtnl = self.rtnl.as_ref()?;
        let generation = self.generation();
        let mut cache = self.host_addrs.lock().unwrap_or_else(|p| p.into_inner());
        if cache.generation != generation {
            let all = rtnl
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .addresses(None, None)
                .ok()?;
            *cache = HostAddrs {
                generation,
                addrs: Arc::new(all.into_iter().collect()),
            };
        }
        Some(cache.addrs.contains(ip))
    }

    /// Whether the TUN device is in the sockets' namespace (where a datagram of ours
    /// could be routed back into it).
    pub fn tun_beside_sockets(&self) -> bool {
        self.tun
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .nsid
            .is_none()
    }
}

/// The lookup table of MTU routes, or None when there are none.
fn mtu_table<'a>(routes: impl Iterator<Item = &'a Route>) -> Option<Arc<AllowedIps<u32>>> {
    let mut t = AllowedIps::default();
    for r in routes {
        if let (Ok(p), Some(mtu)) = (Prefix::new(r.dst, r.prefix_len), r.mtu) {
            t.insert(p, mtu);
        }
    }
    (!t.is_empty()).then(|| Arc::new(t))
}
