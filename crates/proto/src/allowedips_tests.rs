//! AllowedIPs: prefix parsing, longest-prefix match, a differential test against a
//! plain list, and the host-route hasher.

use super::*;
use std::collections::HashSet;

/// Small deterministic generator so the differential test is reproducible.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn p(s: &str) -> Prefix {
    s.parse().unwrap()
}

#[test]
fn parse_and_mask() {
    assert_eq!(p("10.0.0.1/24").to_string(), "10.0.0.0/24");
    assert_eq!(p("10.0.0.1").to_string(), "10.0.0.1/32");
    assert_eq!(p("fd00::1/64").to_string(), "fd00::/64");
    assert_eq!(p("0.0.0.0/0").to_string(), "0.0.0.0/0");
    assert!("10.0.0.0/33".parse::<Prefix>().is_err());
    assert!("10.0.0.0/".parse::<Prefix>().is_err());
    assert!("10.0.0.0/-1".parse::<Prefix>().is_err());
    assert!("fd00::/129".parse::<Prefix>().is_err());
    assert!("nonsense/8".parse::<Prefix>().is_err());
}

#[test]
fn longest_prefix_wins() {
    let mut t = AllowedIps::default();
    t.insert(p("0.0.0.0/0"), 1);
    t.insert(p("10.0.0.0/8"), 2);
    t.insert(p("10.1.0.0/16"), 3);
    t.insert(p("10.1.2.3/32"), 4);
    t.insert(p("::/0"), 5);
    t.insert(p("fd00::/8"), 6);
    let l = |s: &str| t.lookup(s.parse().unwrap());
    assert_eq!(l("192.168.1.1"), Some(1));
    assert_eq!(l("10.2.0.1"), Some(2));
    assert_eq!(l("10.1.9.9"), Some(3));
    assert_eq!(l("10.1.2.3"), Some(4));
    assert_eq!(l("fd12::1"), Some(6));
    assert_eq!(l("2001:db8::1"), Some(5));
    assert!(t.remove_if_owned(p("10.1.0.0/16"), 3));
    assert!(!t.remove_if_owned(p("10.0.0.0/8"), 9));
    assert_eq!(t.lookup("10.1.9.9".parse().unwrap()), Some(2));
    assert_eq!(t.remove_value(1), 1);
    assert_eq!(t.lookup("192.168.1.1".parse().unwrap()), None);
    assert_eq!(t.len(), 4);
}

/// Randomised differential test against a linear scan, including removals.
#[test]
fn differential_against_linear_reference() {
    let mut rng = XorShift(0x9e3779b97f4a7c15);
    for round in 0..20 {
        let mut trie = AllowedIps::default();
        let mut reference: Vec<(Prefix, u32)> = Vec::new();
        let mut seen: Vec<Prefix> = Vec::new();
        let v6 = round % 2 == 1;
        // Concentrate addresses in a small space so prefixes overlap a lot.
        let gen_addr = |r: &mut XorShift| -> IpAddr {
            let x = r.next();
            if v6 {
                let hi = 0xfd00_0000_0000_0000_0000_0000_0000_0000u128;
                IpAddr::V6((hi | ((x as u128 & 0xffff) << 100) | (x as u128 >> 16)).into())
            } else {
                IpAddr::V4((0x0a00_0000 | (x as u32 & 0x00ff_ffff)).into())
            }
        };
        for _ in 0..400 {
            let addr = gen_addr(&mut rng);
            let max = if v6 { 128 } else { 32 };
            // One prefix in four a host route, as a gateway's peers mostly have.
            let len = match rng.next() % 4 {
                0 => max,
                _ => (rng.next() % (max as u64 + 1)) as u8,
            };
            // Half the time a prefix seen before, so that removals and changes of
            // owner hit prefixes the table holds.
            let prefix = match seen.get(rng.next() as usize % (2 * seen.len() + 1)) {
                Some(q) => *q,
                None => Prefix::new(addr, len).unwrap(),
            };
            let value = (rng.next() % 50) as u32;
            match rng.next() % 5 {
                0 => {
                    let removed = trie.remove_value(value);
                    let before = reference.len();
                    reference.retain(|(_, v)| *v != value);
                    assert_eq!(removed, before - reference.len());
                }
                1 => {
                    let owned = reference.iter().any(|(q, v)| *q == prefix && *v == value);
                    assert_eq!(trie.remove_if_owned(prefix, value), owned);
                    reference.retain(|(q, v)| !(*q == prefix && *v == value));
                }
                _ => {
                    seen.push(prefix);
                    trie.insert(prefix, value);
                    reference.retain(|(q, _)| *q != prefix);
                    reference.push((prefix, value));
                }
            }
            assert_eq!(trie.len(), reference.len());
            // Random addresses, and addresses of prefixes inserted so far, in the
            // table or removed since (host routes among them, which the lookup
            // finds without the trie, and must not find once removed).
            for i in 0..20 {
                let probe = match seen.get(rng.next() as usize % (seen.len() + 1)) {
                    Some(q) if i % 2 == 0 => q.addr,
                    _ => gen_addr(&mut rng),
                };
                let expect = reference
                    .iter()
                    .filter(|(q, _)| Prefix::new(probe, q.len).unwrap().addr == q.addr)
                    .max_by_key(|(q, _)| q.len)
                    .map(|(_, v)| *v);
                assert_eq!(trie.lookup(probe), expect, "probe {probe}");
            }
        }
        let mut listed = Vec::new();
        trie.for_each(|q, v| listed.push((q, v)));
        let mut by_owner: Vec<(Prefix, u32)> = (0..50u32)
            .flat_map(|v| trie.owned_by(v).map(move |q| (q, v)))
            .collect();
        by_owner.sort();
        listed.sort();
        reference.sort();
        assert_eq!(listed, reference);
        assert_eq!(by_owner, reference);
    }
}

/// Sequential host routes, as a gateway numbers its peers, spread over a table's
/// buckets (low bits) and control bytes (high seven bits) in both families.
#[test]
fn host_routes_spread_over_buckets_and_control_bytes() {
    use std::hash::BuildHasher;
    let h = BuildHasherDefault::<HostHasher>::default();
    for first in [p("10.0.0.1/32"), p("fd00::1/128")] {
        let base = to_bits(&first.addr);
        let step = if first.addr.is_ipv4() { 1u128 << 96 } else { 1 };
        let hashes: Vec<u64> = (0..4096u128).map(|i| h.hash_one(base + i * step)).collect();
        let buckets: HashSet<u64> = hashes.iter().map(|x| x & 4095).collect();
        let controls: HashSet<u64> = hashes.iter().map(|x| x >> 57).collect();
        // A random function fills 1 - 1/e of them (about 2,590); the unfolded hash, one.
        assert!(
            buckets.len() > 2048,
            "{first:?}: {} buckets of 4096",
            buckets.len()
        );
        assert_eq!(controls.len(), 128, "{first:?}: control bytes");
    }
}

/// One owner with thousands of prefixes (past the point where its list is indexed)
/// loses them in a scrambled order, some removed, some taken by another owner: its
/// listed prefixes stay exactly those it still routes.
#[test]
fn an_owner_with_many_prefixes_loses_them_in_any_order() {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut t = AllowedIps::default();
    let all: Vec<Prefix> = (0..5000u32)
        .map(|i| Prefix::new(IpAddr::V4((0x0a00_0000 | i << 8).into()), 24).unwrap())
        .collect();
    for q in &all {
        t.insert(*q, 1u32);
    }
    let mut order = all.clone();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.next() as usize % (i + 1));
    }
    let mut kept: HashSet<Prefix> = all.iter().copied().collect();
    let mut moved: HashSet<Prefix> = HashSet::new();
    for (n, q) in order.iter().enumerate() {
        if n % 2 == 0 {
            assert!(t.remove_if_owned(*q, 1));
        } else {
            assert_eq!(t.insert(*q, 2), Some(1));
            moved.insert(*q);
        }
        kept.remove(q);
        if n % 997 == 0 || kept.len() < 40 {
            let listed: HashSet<Prefix> = t.owned_by(1).collect();
            assert_eq!(listed.len(), t.owned_count(1), "listed twice");
            assert_eq!(listed, kept, "after {n}");
        }
    }
    assert_eq!(t.owned_by(1).next(), None);
    let listed: HashSet<Prefix> = t.owned_by(2).collect();
    assert_eq!(listed, moved);
    assert_eq!(t.len(), moved.len());
    assert_eq!(t.remove_value(2), moved.len());
    assert_eq!(t.len(), 0);
}

/// An owner's prefixes keep the order they were added in when some are taken away or
/// moved to another owner, short list or long (indexed, compacted once half is gone),
/// and one added again goes last, as `wg show` lists them from the kernel and
/// wireguard-go.
#[test]
fn an_owners_prefixes_keep_their_order() {
    for n in [5u32, 100] {
        let mut t = AllowedIps::default();
        let prefixes: Vec<Prefix> = (0..n)
            .map(|i| p(&format!("10.{}.{}.0/24", i / 256, i % 256)))
            .collect();
        for q in &prefixes {
            t.insert(*q, 1);
        }
        let mut want = prefixes.clone();
        // Take away every third, moving half of those to owner 2.
        for (k, q) in prefixes.iter().enumerate().filter(|(k, _)| k % 3 == 0) {
            if k % 2 == 0 {
                t.insert(*q, 2);
            } else {
                assert!(t.remove_if_owned(*q, 1));
            }
            want.retain(|w| w != q);
            assert_eq!(t.owned_by(1).collect::<Vec<_>>(), want, "n={n} after {k}");
            assert_eq!(t.owned_count(1), want.len());
        }
        // One named again by its owner goes last, as in the kernel.
        let again = want.remove(0);
        t.insert(again, 1);
        want.push(again);
        assert_eq!(t.owned_by(1).collect::<Vec<_>>(), want, "n={n} re-added");
        // Past the compaction too: all but the last two.
        let last = want.split_off(want.len() - 2);
        for q in &want {
            assert!(t.remove_if_owned(*q, 1));
        }
        assert_eq!(t.owned_by(1).collect::<Vec<_>>(), last, "n={n}");
        for (i, q) in last.iter().enumerate() {
            assert_eq!(t.lookup(q.addr), Some(1), "n={n} {i}");
        }
    }
}
