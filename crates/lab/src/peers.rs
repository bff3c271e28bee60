//! Configuration scale: how long `wg setconf` takes to load N peers (each with its own
//! /32 and /128) into an implementation and `wg show dump` to list them, what each idle
//! peer costs in resident memory,
//! and, for a wirelane serving metrics (`+metrics`), the daemon CPU one scrape of all
//! N peers costs. Implementations run interleaved, each in a fresh namespace.

use crate::impls::{scrape_once, start, Daemon, Flavor, Impl};
use crate::netns::Netns;
use crate::stats::{median, summarize};
use crate::Result;
use std::time::Instant;

pub struct PeerLoad {
    pub implementation: Impl,
    pub seconds: Vec<f64>,
    /// `wg show IF dump` of all N peers, seconds.
    pub dump_seconds: Vec<f64>,
    pub bytes_per_peer: Vec<f64>,
    /// Daemon CPU milliseconds per scrape of `/metrics` (`+metrics` only).
    pub scrape_ms: Vec<f64>,
}

/// Scrapes per measurement of the scrape cost: the CPU clock counts in ticks of 10 ms.
const SCRAPES: u32 = 20;

/// CPU time a process has used (user and system), in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which may hold spaces, start at its ')'.
    let rest = stat.rsplit_once(')').ok_or("malformed /proc stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64> {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| "malformed /proc stat".into())
    };
    let ticks = field(11)? + field(12)?;
    // SAFETY: sysconf has no memory preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / per_second)
}

/// Daemon CPU per scrape of all its peers, in milliseconds, over [`SCRAPES`] scrapes
/// one after another (the background scraper stopped first).
fn scrape_cost(d: &mut Daemon, pid: u32) -> Result<f64> {
    d.stop_scraping();
    let ns = d.ns.clone();
    let before = cpu_seconds(pid)?;
    std::thread::spawn(move || -> std::result::Result<(), String> {
        crate::netns::enter(&ns).map_err(|e| e.to_string())?;
        for _ in 0..SCRAPES {
            scrape_once().map_err(|e| format!("scrape: {e}"))?;
        }
        Ok(())
    })
    .join()
    .map_err(|_| "the scraping thread panicked")??;
    Ok((cpu_seconds(pid)? - before) * 1e3 / f64::from(SCRAPES))
}

/// Resident memory of a process, in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "no VmRSS".into())
}

/// A config with `n` peers whose public keys are derived from a counter (any 32 bytes
/// are a valid X25519 public key for configuration purposes).
pub fn config(n: usize, private: &str) -> String {
    let mut conf = format!("[Interface]\nPrivateKey = {private}\nListenPort = 51820\n");
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..n {
        let mut key = [0u8; 32];
        for chunk in key.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes());
        }
        conf.push_str(&format!(
            "\n[Peer]\nPublicKey = {}\nAllowedIPs = 10.{}.{}.{}/32, fd10::{:x}:{:x}/128\n",
            wirelane_proto::base64_key(&key),
            64 + i / 65536,
            (i / 256) % 256,
            i % 256,
            i >> 16,
            i & 0xffff
        ));
    }
    conf
}

pub fn run(impls: &[Impl], n: usize, repeats: usize) -> Result<Vec<PeerLoad>> {
    let private = crate::netns::sh("wg genkey")?.trim().to_string();
    let path = std::env::temp_dir().join(format!("wirelane-lab-peers-{}.conf", std::process::id()));
    std::fs::write(&path, config(n, &private))?;
    let mut out: Vec<PeerLoad> = impls
        .iter()
        .map(|i| PeerLoad {
            implementation: *i,
            seconds: Vec::new(),
            dump_seconds: Vec::new(),
            bytes_per_peer: Vec::new(),
            scrape_ms: Vec::new(),
        })
        .collect();
    for _ in 0..repeats {
        for r in out.iter_mut() {
            let ns = Netns::new("labp")?;
            let mut d = start(r.implementation, &ns)?;
            let pid = d.pid.ok_or("implementation has no daemon process")?;
            std::thread::sleep(std::time::Duration::from_millis(300));
            let before = rss_kib(pid)?;
            let t = Instant::now();
            ns.run(&format!("wg setconf {} {}", d.ifname, path.display()))?;
            r.seconds.push(t.elapsed().as_secs_f64());
            let peers = ns.run(&format!("wg show {} peers | wc -l", d.ifname))?;
            if peers.trim() != n.to_string() {
                return Err(format!(
                    "{} holds {} peers after setconf, not {n}",
                    r.implementation.name(),
                    peers.trim()
                )
                .into());
            }
            let after = rss_kib(pid)?;
            let t = Instant::now();
            ns.run(&format!("wg show {} dump > /dev/null", d.ifname))?;
            r.dump_seconds.push(t.elapsed().as_secs_f64());
            r.bytes_per_peer
                .push(after.saturating_sub(before) as f64 * 1024.0 / n as f64);
            if let Impl::Wirelane(Flavor { scraped: true, .. }) = r.implementation {
                r.scrape_ms.push(scrape_cost(&mut d, pid)?);
            }
        }
    }
    let _ = std::fs::remove_file(path);
    Ok(out)
}

/// Markdown table of the medians.
pub fn table(results: &[PeerLoad], n: usize) -> String {
    let mut s = format!("| implementation | `wg setconf` of {n} peers, s (min–max) | `wg show dump`, s (min–max) | resident memory per peer, bytes | daemon CPU per scrape of /metrics, ms |\n|---|---|---|---|---|\n");
    let spread = |v: &[f64]| {
        summarize(v).map_or("—".to_string(), |s| {
            format!("{:.3} ({:.3}–{:.3})", s.median, s.min, s.max)
        })
    };
    for r in results {
        let scrape = median(&r.scrape_ms).map_or("—".to_string(), |m| format!("{m:.1}"));
        s.push_str(&format!(
            "| {} | {} | {} | {:.0} | {scrape} |\n",
            r.implementation.name(),
            spread(&r.seconds),
            spread(&r.dump_seconds),
            median(&r.bytes_per_peer).unwrap_or(0.0)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    /// Past 65,536 peers the IPv6 prefixes need a second group: every address of a
    /// large configuration must parse, and each must be distinct.
    #[test]
    fn every_allowed_ip_of_a_large_config_is_valid_and_distinct() {
        let conf = super::config(70_000, "unused");
        let mut seen = std::collections::HashSet::new();
        for line in conf.lines().filter(|l| l.starts_with("AllowedIPs = ")) {
            for prefix in line["AllowedIPs = ".len()..].split(", ") {
                let (addr, _) = prefix.split_once('/').expect("a prefix length");
                let ip: std::net::IpAddr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
                assert!(seen.insert(ip), "{ip} twice");
            }
        }
        assert_eq!(seen.len(), 2 * 70_000);
    }
}
