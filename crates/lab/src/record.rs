//! One JSON line per run: what ran, on what, and every figure measured.

use crate::cpu::{CoreSplit, ThreadCpu};
use crate::matrix::Cell;
use crate::relay::CounterSnapshot;
use crate::workload::{rr::Latency, tcp::TcpResult, udp::UdpResult};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const SCHEMA: u32 = 1;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Env {
    pub kernel: String,
    pub cpu_model: String,
    pub cores: usize,
    pub commit: String,
    pub versions: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuReport {
    pub cores: Vec<CoreSplit>,
    pub threads: Vec<ThreadCpu>,
    /// Busy core-seconds according to /proc/stat.
    pub busy_core_s: f64,
    /// CPU-seconds according to the daemons' threads (schedstat) and the lab's own
    /// workload threads (getrusage).
    pub thread_s: f64,
    /// Daemon threads only, both tunnel ends.
    pub daemon_s: f64,
    /// The lab's workload threads (the test applications: senders, receivers, request
    /// clients and servers) that ran in the cell: CPU seconds, and seconds runnable
    /// but waiting for a CPU. 0 in records from before the lab counted them.
    #[serde(default)]
    pub apps_s: f64,
    #[serde(default)]
    pub apps_wait_s: f64,
    /// True when the two views differ by more than 20%: kernel work outside any thread
    /// (softirq, or time accounted as idle) is large enough to matter.
    pub disagree: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    pub schema: u32,
    /// Result-set label: start time and commit of the `lab run` this belongs to.
    pub set: String,
    pub timestamp: String,
    pub env: Env,
    pub matrix: String,
    /// Implementation the matrix compares against.
    #[serde(default)]
    pub baseline: String,
    pub cell_id: String,
    pub cell: Cell,
    pub implementation: String,
    pub version: String,
    pub repeat: usize,
    pub seconds: f64,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub tcp: Vec<TcpResult>,
    #[serde(default)]
    pub udp: Option<UdpResult>,
    #[serde(default)]
    pub latency: Option<Latency>,
    #[serde(default)]
    pub cpu: CpuReport,
    /// Peak resident set per host (a, then b), its daemon processes' peaks summed;
    /// records before 2026-11-28 held one entry per process.
    #[serde(default)]
    pub peak_rss_kib: Vec<u64>,
    #[serde(default)]
    pub cycles_per_byte: Option<f64>,
    #[serde(default)]
    pub relay: Vec<CounterSnapshot>,
    /// wirelane's execution-order signatures over the run, per tunnel end.
    #[serde(default)]
    pub signatures: Vec<crate::signatures::Signatures>,
    /// Threads of every daemon process at the end of the run (both hosts).
    #[serde(default)]
    pub daemon_threads: usize,
    /// A star:N cell's figures.
    #[serde(default)]
    pub star: Option<crate::star::StarRecord>,
}

impl CpuReport {
    /// The busiest core's busy share minus the idlest one's (`cpu::spread`).
    pub fn core_spread(&self) -> Option<f64> {
        let busy: Vec<f64> = self.cores.iter().map(|c| c.busy()).collect();
        crate::cpu::spread(&busy)
    }
}

impl RunRecord {
    /// Jain's fairness index over the TCP transfers (one per tunnel and direction):
    /// 1 when all carried the same, 1/n when one carried everything.
    pub fn jain_fairness(&self) -> Option<f64> {
        let xs: Vec<f64> = self.tcp.iter().map(|t| t.goodput_bps).collect();
        crate::stats::jain(&xs)
    }

    /// Total TCP goodput over all directions.
    pub fn goodput_bps(&self) -> Option<f64> {
        if let Some(s) = &self.star {
            return Some(s.goodput_bps);
        }
        (!self.tcp.is_empty()).then(|| self.tcp.iter().map(|t| t.goodput_bps).sum())
    }

    /// Payload bytes delivered during the run (for CPU per GB).
    pub fn delivered_bytes(&self) -> u64 {
        if let Some(s) = &self.star {
            return s.delivered * s.spec.as_ref().map_or(0, |p| p.size as u64);
        }
        let tcp: u64 = self.tcp.iter().map(|t| t.bytes).sum();
        let udp = self.udp.map_or(0, |u| u.delivered_bytes());
        tcp + udp
    }
}

/// UTC timestamp in RFC 3339 form, from the system clock.
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Formats Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days conversion).
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The CPU's model name (`/proc/cpuinfo`), empty if unknown: every table names it.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default()
}

/// Reads the machine and build facts recorded with every run.
pub fn collect_env(implementations: &[crate::impls::Impl]) -> Env {
    let cpu_model = cpu_model();
    let commit = crate::netns::sh("git rev-parse --short=12 HEAD 2>/dev/null")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| option_env!("WIRELANE_COMMIT").map(String::from))
        .unwrap_or_else(|| "unknown".into());
    Env {
        kernel: crate::netns::sh("uname -r")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        cpu_model,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        commit,
        versions: implementations
            .iter()
            .map(|i| (i.name().to_string(), i.version()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_301_999), "2026-11-21T22:59:59Z");
    }
}
