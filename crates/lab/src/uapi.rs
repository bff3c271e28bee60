//! A minimal client for the cross-platform WireGuard UAPI socket, for reading what `wg`
//! does not show: wirelane's `stats=1` counters, and `get=1` fields by name.

use crate::Result;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Sends `op` (`get=1`, `stats=1`) to IFNAME's socket and returns the answer's
/// `key=value` lines in order, failing on a non-zero errno.
pub fn request(ifname: &str, op: &str) -> Result<Vec<(String, String)>> {
    let path = format!("/var/run/wireguard/{ifname}.sock");
    let mut s = UnixStream::connect(&path).map_err(|e| format!("{path}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{op}\n\n").as_bytes())?;
    let mut out = Vec::new();
    for line in BufReader::new(s).lines() {
        let line = line?;
        if line.is_empty() {
            break;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("UAPI answered a line without '=': {line}"))?;
        if k == "errno" {
            if v != "0" {
                return Err(format!("UAPI {op} failed: errno={v}").into());
            }
            return Ok(out);
        }
        out.push((k.to_string(), v.to_string()));
    }
    Err(format!("UAPI {op}: the answer ended without errno").into())
}

/// One counter from a `stats` answer (0 when absent).
pub fn counter(s: &BTreeMap<String, u64>, k: &str) -> u64 {
    s.get(k).copied().unwrap_or(0)
}

/// How much counter `k` grew from `before` to `after`.
pub fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, k: &str) -> u64 {
    counter(after, k).saturating_sub(counter(before, k))
}

/// wirelane's interface counters by name (the answer's numeric lines; `model=` and
/// the like are left out).
pub fn stats(ifname: &str) -> Result<BTreeMap<String, u64>> {
    Ok(request(ifname, "stats=1")?
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
        .collect())
}
