//! Cryptokey routing table: AllowedIPs as a path-compressed binary trie per address
//! family, mapping prefixes to a peer identifier with longest-prefix match.
//!
//! Invariants: every node's `key` has no bits set past `len`; a child's prefix extends
//! its parent's; a node without a value has two children (otherwise it is merged away).
//! Values are small `Copy` identifiers so the trie stays compact at 10^5 prefixes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    #[error("'{0}' is not an address/prefix-length pair")]
    Syntax(String),
    #[error("prefix length {len} is too long for {addr}")]
    TooLong { addr: IpAddr, len: u8 },
}

impl Prefix {
    /// Builds a prefix, clearing host bits (10.0.0.1/24 becomes 10.0.0.0/24).
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, PrefixError> {
        let max = max_len(&addr);
        if len > max {
            return Err(PrefixError::TooLong { addr, len });
        }
        let key = mask(to_bits(&addr), len, max);
        Ok(Prefix {
            addr: from_bits(key, &addr),
            len,
        })
    }
}

impl std::str::FromStr for Prefix {
    type Err = PrefixError;
    /// Parses `addr/len`; a bare address means a host prefix.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().map_err(|_| PrefixError::Syntax(s.to_string()))?;
        let len = match l {
            Some(l) if !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()) && l.len() <= 3 => l
                .parse::<u8>()
                .map_err(|_| PrefixError::Syntax(s.to_string()))?,
            Some(_) => return Err(PrefixError::Syntax(s.to_string())),
            None => max_len(&addr),
        };
        Prefix::new(addr, len)
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

fn max_len(a: &IpAddr) -> u8 {
    match a {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// Addresses as left-aligned 128-bit keys, so both families share one trie type.
fn to_bits(a: &IpAddr) -> u128 {
    match a {
        IpAddr::V4(v) => (u32::from(*v) as u128) << 96,
        IpAddr::V6(v) => u128::from(*v),
    }
}

fn from_bits(k: u128, like: &IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(((k >> 96) as u32).into()),
        IpAddr::V6(_) => IpAddr::V6(k.into()),
    }
}

fn mask(k: u128, len: u8, _max: u8) -> u128 {
    if len == 0 {
        0
    } else {
        k & (u128::MAX << (128 - len as u32))
    }
}

fn bit(k: u128, i: u8) -> usize {
    ((k >> (127 - i as u32)) & 1) as usize
}

fn common_len(a: u128, b: u128, max: u8) -> u8 {
    ((a ^ b).leading_zeros() as u8).min(max)
}

struct Node<T> {
    key: u128,
    len: u8,
    value: Option<T>,
    children: [Option<Box<Node<T>>>; 2],
}

impl<T> Node<T> {
    fn leaf(key: u128, len: u8, value: T) -> Box<Self> {
        Box::new(Node {
            key,
            len,
            value: Some(value),
            children: [None, None],
        })
    }
}

/// One family's trie.
struct Trie<T> {
    root: Option<Box<Node<T>>>,
    max: u8,
}

impl<T: Copy + Eq> Trie<T> {
    fn new(max: u8) -> Self {
        Trie { root: None, max }
    }

    fn insert(&mut self, key: u128, len: u8, value: T) -> Option<T> {
        let mut slot = &mut self.root;
        loop {
            let Some(node) = slot else {
                *slot = Some(Node::leaf(key, len, value));
                return None;
            };
            let common = common_len(node.key, key, node.len.min(len));
            if common == node.len && node.len == len {
                return node.value.replace(value);
            }
            if common == node.len {
                // The new prefix lies strictly below this node.
                let b = bit(key, node.len);
                slot = &mut slot.as_mut().expect("checked above").children[b];
                continue;
            }
            // Split: the new prefix diverges from (or is shorter than) this node.
            let old = slot.take().expect("checked above");
            let new_node = if common == len {
                let mut n = Node::leaf(key, len, value);
                let b = bit(old.key, len);
                n.children[b] = Some(old);
                n
            } else {
                let mut parent = Box::new(Node {
                    key: mask(key, common, self.max),
                    len: common,
                    value: None,
                    children: [None, None],
                });
                let b_old = bit(old.key, common);
                parent.children[b_old] = Some(old);
                parent.children[1 - b_old] = Some(Node::leaf(key, len, value));
                parent
            };
            *slot = Some(new_node);
            return None;
        }
    }

    fn lookup(&self, key: u128) -> Option<T> {
        let mut best = None;
        let mut cur = self.root.as_deref();
        while let Some(n) = cur {
            if mask(key, n.len, self.max) != n.key {
                break;
            }
            if n.value.is_some() {
                best = n.value;
            }
            if n.len >= self.max {
                break;
            }
            cur = n.children[bit(key, n.len)].as_deref();
        }
        best
    }

    fn exact(&self, key: u128, len: u8) -> Option<T> {
        let mut cur = self.root.as_deref();
        while let Some(n) = cur {
            if n.len > len || mask(key, n.len, self.max) != n.key {
                return None;
            }
            if n.len == len {
                return n.value;
            }
            cur = n.children[bit(key, n.len)].as_deref();
        }
        None
    }

    /// Removes one exact prefix, merging away nodes the removal leaves redundant on the
    /// way back up; touches only the path to the prefix.
    fn remove(&mut self, key: u128, len: u8) -> Option<T> {
        fn walk<T>(slot: &mut Option<Box<Node<T>>>, key: u128, len: u8, max: u8) -> Option<T> {
            let node = slot.as_mut()?;
            if node.len > len || mask(key, node.len, max) != node.key {
                return None;
            }
            let removed = if node.len == len {
                node.value.take()
            } else {
                walk(&mut node.children[bit(key, node.len)], key, len, max)
            };
            if removed.is_some() && node.value.is_none() {
                match (node.children[0].is_some(), node.children[1].is_some()) {
                    (false, false) => *slot = None,
                    (true, false) => *slot = node.children[0].take(),
                    (false, true) => *slot = node.children[1].take(),
                    (true, true) => {}
                }
            }
            removed
        }
        walk(&mut self.root, key, len, self.max)
    }

    fn for_each(&self, f: &mut dyn FnMut(u128, u8, T)) {
        fn walk<T: Copy>(n: &Option<Box<Node<T>>>, f: &mut dyn FnMut(u128, u8, T)) {
            if let Some(n) = n {
                if let Some(v) = n.value {
                    f(n.key, n.len, v);
                }
                walk(&n.children[0], f);
                walk(&n.children[1], f);
            }
        }
        walk(&self.root, f)
    }
}

/// Hashes a host route's address bits: a multiply by 2^64 / φ of the folded halves,
/// then the product's high half folded onto its low half. Addresses are not secret and
/// a gateway's are often sequential; what matters is that both ends of the hash depend
/// on every address bit: the table picks the bucket from the low bits and the control
/// byte from the high ones. Without the final fold an IPv4 key (its 32 bits at the top
/// of the u128) hashed to a multiple of 2^32: every host route shared one bucket's
/// probe sequence, loading N of them took O(N²) and a lookup probed past all of them.
#[derive(Default, Clone, Copy)]
struct HostHasher(u64);

impl Hasher for HostHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u128(&mut self, n: u128) {
        self.write_u64(n as u64);
        self.write_u64((n >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

type HostMap<T> = HashMap<u128, T, BuildHasherDefault<HostHasher>>;

/// AllowedIPs for both address families, with each owner's prefixes listed so that
/// removing one owner costs O(its prefixes), not a walk over the whole table.
///
/// Host routes (/32, /128), a gateway's usual AllowedIPs for each of its peers, are
/// also kept in a hash map per family: a host route is the longest match there can
/// be, so a lookup that finds one is done without the trie. Why: at a thousand peers
/// the trie's walk was a dozen dependent loads, the most expensive step of routing a
/// packet after the TUN read. Invariant: `hosts4`/`hosts6` hold exactly the tries'
/// full-length prefixes, with the same owners.
pub struct AllowedIps<T> {
    v4: Trie<T>,
    v6: Trie<T>,
    hosts4: HostMap<T>,
    hosts6: HostMap<T>,
    owned: HashMap<T, Owned>,
    len: usize,
}

/// The prefixes one owner holds, in the order they were added (`wg show` lists them
/// so, as the kernel and wireguard-go keep them). Past [`Owned::INDEXED_FROM`] of them,
/// a position index makes taking one away O(1): a `set` that removed or moved N of one
/// peer's N prefixes searched its list for each, O(N²) under the peer table's write
/// lock, which stops every packet of the interface meanwhile. Below it, a search of a
/// few entries is cheaper than an index, and a gateway's peers (a prefix or two each)
/// pay 8 bytes.
#[derive(Default)]
struct Owned {
    /// With an index, a prefix taken away leaves [`GONE`] in its place until half the
    /// list is gone and it is compacted, so the others keep their order and places.
    list: Vec<Prefix>,
    #[allow(clippy::box_collection)]
    index: Option<Box<Index>>,
}

/// Where each prefix sits in a long [`Owned::list`]. Invariant: `at[list[i]] == i` for
/// every i whose entry is not [`GONE`], it holds nothing else, and `gone` counts the
/// [`GONE`] entries. Boxed so that the field takes 8 bytes, not a `HashMap`'s 48, in
/// every owner that never needs it.
struct Index {
    at: HashMap<Prefix, usize>,
    gone: usize,
}

/// The mark of a place a prefix left: no real prefix is this long.
const GONE: Prefix = Prefix {
    addr: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
    len: u8::MAX,
};

impl Owned {
    const INDEXED_FROM: usize = 32;

    fn len(&self) -> usize {
        self.list.len() - self.index.as_ref().map_or(0, |i| i.gone)
    }

    fn iter(&self) -> impl Iterator<Item = Prefix> + '_ {
        self.list.iter().copied().filter(|p| *p != GONE)
    }

    fn push(&mut self, prefix: Prefix) {
        self.list.push(prefix);
        match &mut self.index {
            Some(index) => {
                index.at.insert(prefix, self.list.len() - 1);
            }
            None if self.list.len() > Self::INDEXED_FROM => {
                let at = self.list.iter().enumerate().map(|(i, p)| (*p, i));
                self.index = Some(Box::new(Index {
                    at: at.collect(),
                    gone: 0,
                }));
            }
            None => {}
        }
    }

    /// Takes `prefix` away; the others keep their order.
    fn remove(&mut self, prefix: &Prefix) {
        let Some(index) = &mut self.index else {
            if let Some(at) = self.list.iter().position(|p| p == prefix) {
                self.list.remove(at);
            }
            return;
        };
        let Some(at) = index.at.remove(prefix) else {
            return;
        };
        self.list[at] = GONE;
        index.gone += 1;
        // Compacted when half is gone: each removal costs O(1) amortised.
        if index.gone * 2 > self.list.len() {
            self.list.retain(|p| *p != GONE);
            index.gone = 0;
            for (i, p) in self.list.iter().enumerate() {
                index.at.insert(*p, i);
            }
        }
    }
}

impl<T: Copy + Eq + Hash> Default for AllowedIps<T> {
    fn default() -> Self {
        AllowedIps {
            v4: Trie::new(32),
            v6: Trie::new(128),
            hosts4: HostMap::default(),
            hosts6: HostMap::default(),
            owned: HashMap::new(),
            len: 0,
        }
    }
}

impl<T: Copy + Eq + Hash> AllowedIps<T> {
    fn trie(&mut self, a: &IpAddr) -> &mut Trie<T> {
        match a {
            IpAddr::V4(_) => &mut self.v4,
            IpAddr::V6(_) => &mut self.v6,
        }
    }

    /// The host-route map of `prefix`'s family, if `prefix` is a host route.
    fn hosts_of(&mut self, prefix: &Prefix) -> Option<&mut HostMap<T>> {
        match prefix.addr {
            IpAddr::V4(_) if prefix.len == 32 => Some(&mut self.hosts4),
            IpAddr::V6(_) if prefix.len == 128 => Some(&mut self.hosts6),
            _ => None,
        }
    }

    fn unlist(&mut self, prefix: Prefix, owner: T) {
        if let Some(owned) = self.owned.get_mut(&owner) {
            owned.remove(&prefix);
            if owned.len() == 0 {
                self.owned.remove(&owner);
            }
        }
    }

    /// Maps `prefix` to `value`, taking it from any previous owner (returned).
    pub fn insert(&mut self, prefix: Prefix, value: T) -> Option<T> {
        let key = to_bits(&prefix.addr);
        let prev = self.trie(&prefix.addr).insert(key, prefix.len, value);
        if let Some(hosts) = self.hosts_of(&prefix) {
            hosts.insert(key, value);
        }
        match prev {
            None => self.len += 1,
            Some(p) if p == value => {
                // Named again by its owner: it goes last in the owner's list, as the
                // kernel's `list_move_tail` and wireguard-go move it.
                if let Some(owned) = self.owned.get_mut(&value) {
                    owned.remove(&prefix);
                    owned.push(prefix);
                }
                return prev;
            }
            Some(p) => self.unlist(prefix, p),
        }
        self.owned.entry(value).or_default().push(prefix);
        prev
    }

    /// Removes one prefix if `value` owns it.
    pub fn remove_if_owned(&mut self, prefix: Prefix, value: T) -> bool {
        let key = to_bits(&prefix.addr);
        let t = self.trie(&prefix.addr);
        if t.exact(key, prefix.len) == Some(value) {
            t.remove(key, prefix.len);
            if let Some(hosts) = self.hosts_of(&prefix) {
                hosts.remove(&key);
            }
            self.len -= 1;
            self.unlist(prefix, value);
            true
        } else {
            false
        }
    }

    /// Longest-prefix match.
    pub fn lookup(&self, addr: IpAddr) -> Option<T> {
        let key = to_bits(&addr);
        let (hosts, trie) = match addr {
            IpAddr::V4(_) => (&self.hosts4, &self.v4),
            IpAddr::V6(_) => (&self.hosts6, &self.v6),
        };
        // An empty map is skipped without hashing: most clients route no host.
        if !hosts.is_empty() {
            if let Some(v) = hosts.get(&key) {
                return Some(*v);
            }
        }
        trie.lookup(key)
    }

    /// Removes every prefix owned by `value`.
    pub fn remove_value(&mut self, value: T) -> usize {
        let owned = self.owned.remove(&value).unwrap_or_default();
        for p in owned.iter() {
            let key = to_bits(&p.addr);
            self.trie(&p.addr).remove(key, p.len);
            if let Some(hosts) = self.hosts_of(&p) {
                hosts.remove(&key);
            }
        }
        self.len -= owned.len();
        owned.len()
    }

    /// The prefixes `value` owns, in the order they were added.
    pub fn owned_by(&self, value: T) -> impl Iterator<Item = Prefix> + '_ {
        self.owned.get(&value).into_iter().flat_map(Owned::iter)
    }

    /// How many prefixes `value` owns.
    pub fn owned_count(&self, value: T) -> usize {
        self.owned.get(&value).map_or(0, Owned::len)
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Visits every prefix with its owner.
    pub fn for_each(&self, mut f: impl FnMut(Prefix, T)) {
        let v4 = IpAddr::V4(0.into());
        let v6 = IpAddr::V6(0u128.into());
        self.v4.for_each(&mut |k, l, v| {
            f(
                Prefix {
                    addr: from_bits(k, &v4),
                    len: l,
                },
                v,
            )
        });
        self.v6.for_each(&mut |k, l, v| {
            f(
                Prefix {
                    addr: from_bits(k, &v6),
                    len: l,
                },
                v,
            )
        });
    }
}

#[cfg(test)]
#[path = "allowedips_tests.rs"]
mod tests;
