//! The execution-order signatures of design.md §4, as wirelane counts them (`stats=1`)
//! and the lab records them per run: how many packets each serial-stage invocation
//! handled (mean and histogram), how many invocations found nothing ready ("empty
//! polls"), how many stopped at a head batch not yet decrypted or sealed, and each of
//! the daemon's threads' busy time and involuntary context switches, all as growth over
//! the measured interval. The busiest/idlest core spread comes from the run's per-core
//! CPU (see `record`).

use crate::uapi;
use crate::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Counters read at one moment.
pub type Snapshot = BTreeMap<String, u64>;

/// Reads a wirelane daemon's counters.
pub fn snapshot(ifname: &str) -> Result<Snapshot> {
    uapi::stats(ifname)
}

/// Reads the counters of several interfaces one wirelane process serves, as one: the
/// interfaces' own counters summed, the process's (its threads, its worker count)
/// once.
pub fn snapshot_tunnels(ifnames: &[String]) -> Result<Snapshot> {
    let mut all = Snapshot::new();
    for (k, name) in ifnames.iter().enumerate() {
        for (key, v) in snapshot(name)? {
            let process_wide = key.starts_with("thread.") || key == "workers";
            if k == 0 || !process_wide {
                *all.entry(key).or_default() += v;
            }
        }
    }
    Ok(all)
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadSig {
    pub name: String,
    pub busy_s: f64,
    pub involuntary_switches: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Signatures {
    /// Which tunnel end: "a" (sends in one-way cells) or "b".
    pub side: String,
    pub invocations: u64,
    pub batches: u64,
    pub packets: u64,
    pub empty_polls: u64,
    pub head_pending: u64,
    pub budget_exhausted: u64,
    /// Transmit flushes run inside a TUN reader's plug, and the sends the plugs made
    /// (absent from older builds' records: none).
    #[serde(default)]
    pub plugged: u64,
    #[serde(default)]
    pub plug_sends: u64,
    /// Invocations by packets handled: bucket 0 none, bucket i in [2^(i-1), 2^i).
    pub hist: Vec<u64>,
    pub threads: Vec<ThreadSig>,
    /// What the queues did (absent from records of older builds).
    #[serde(default)]
    pub queues: crate::queues::QueueSig,
    /// Handshake initiations the daemon sent, by the rule that started them (the
    /// `initiations_REASON` counters that grew; absent from older builds' records).
    #[serde(default)]
    pub initiations: BTreeMap<String, u64>,
}

impl Signatures {
    /// Growth of the counters from `before` to `after`.
    pub fn between(side: &str, before: &Snapshot, after: &Snapshot) -> Signatures {
        let d = |k: &str| uapi::delta(before, after, k);
        let hist = (0..)
            .map(|i: u32| match i {
                0 => "serial_packets_hist_0".to_string(),
                i => format!("serial_packets_hist_{}", 1u64 << (i - 1)),
            })
            .take_while(|k| after.contains_key(k))
            .map(|k| d(&k))
            .collect();
        let mut threads: BTreeMap<&str, ThreadSig> = BTreeMap::new();
        for (k, _) in after.iter() {
            let Some(rest) = k.strip_prefix("thread.") else {
                continue;
            };
            let Some((name, field)) = rest.rsplit_once('.') else {
                continue;
            };
            let t = threads.entry(name).or_insert_with(|| ThreadSig {
                name: name.to_string(),
                ..ThreadSig::default()
            });
            match field {
                "busy_ns" => t.busy_s = d(k) as f64 / 1e9,
                "involuntary_switches" => t.involuntary_switches = d(k),
                _ => {}
            }
        }
        Signatures {
            side: side.to_string(),
            invocations: d("serial_invocations"),
            batches: d("serial_batches"),
            packets: d("serial_packets"),
            empty_polls: d("serial_empty_polls"),
            head_pending: d("serial_head_pending"),
            budget_exhausted: d("serial_budget_exhausted"),
            plugged: d("serial_plugged"),
            plug_sends: d("serial_plug_sends"),
            hist,
            threads: threads.into_values().collect(),
            queues: crate::queues::QueueSig::between(before, after),
            initiations: after
                .keys()
                .filter_map(|k| Some((k.strip_prefix("initiations_")?, d(k))))
                .filter(|&(_, n)| n > 0)
                .map(|(reason, n)| (reason.to_string(), n))
                .collect(),
        }
    }

    /// The initiations by reason, as "12 no_session, 3 retry"; empty if none.
    pub fn initiations_summary(&self) -> String {
        let parts: Vec<String> = self
            .initiations
            .iter()
            .map(|(reason, n)| format!("{n} {reason}"))
            .collect();
        parts.join(", ")
    }

    /// Packets handled per serial-stage invocation.
    pub fn packets_per_invocation(&self) -> f64 {
        self.packets as f64 / self.invocations.max(1) as f64
    }

    /// Share of invocations that found nothing ready.
    pub fn empty_share(&self) -> f64 {
        self.empty_polls as f64 / self.invocations.max(1) as f64
    }

    /// Share of invocations that stopped at an unfinished head batch.
    pub fn head_pending_share(&self) -> f64 {
        self.head_pending as f64 / self.invocations.max(1) as f64
    }

    /// Involuntary context switches of all the daemon's threads.
    pub fn involuntary_switches(&self) -> u64 {
        self.threads.iter().map(|t| t.involuntary_switches).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_of_counters_histogram_and_threads() {
        let snap = |n: u64| -> Snapshot {
            [
                ("serial_invocations", 10 * n),
                ("serial_packets", 300 * n),
                ("serial_empty_polls", n),
                ("serial_packets_hist_0", n),
                ("serial_packets_hist_1", 2 * n),
                ("serial_packets_hist_2", 3 * n),
                ("thread.wl-worker-0.busy_ns", 1_000_000_000 * n),
                ("thread.wl-worker-0.involuntary_switches", 7 * n),
                ("thread.wl-peer-0-1.busy_ns", 500_000_000 * n),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
        };
        let s = Signatures::between("b", &snap(1), &snap(3));
        assert_eq!((s.invocations, s.packets, s.empty_polls), (20, 600, 2));
        assert_eq!(s.hist, [2, 4, 6]);
        assert_eq!(s.packets_per_invocation(), 30.0);
        assert_eq!(s.threads.len(), 2);
        let w = s.threads.iter().find(|t| t.name == "wl-worker-0").unwrap();
        assert_eq!((w.busy_s, w.involuntary_switches), (2.0, 14));
    }
}
