//! CPU accounting from two independent sources, as seed 001 advises: per-core time from
//! /proc/stat, and per-thread run time from /proc/PID/task/*/schedstat. The two are
//! compared: kernel work done in softirq context on behalf of nobody (or accounted as
//! idle, when IRQ time accounting is off) shows up as a gap between them.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Jiffies of one core, by /proc/stat column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreTicks {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

/// Parses the per-core lines (`cpu0`, `cpu1`, …) of /proc/stat.
pub fn parse_proc_stat(text: &str) -> Vec<CoreTicks> {
    text.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let f: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            let g = |i: usize| f.get(i).copied().unwrap_or(0);
            CoreTicks {
                user: g(0),
                nice: g(1),
                system: g(2),
                idle: g(3),
                iowait: g(4),
                irq: g(5),
                softirq: g(6),
                steal: g(7),
            }
        })
        .collect()
}

/// Share of one core's time in each state over an interval (fractions summing to 1).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CoreSplit {
    pub user: f64,
    pub sys: f64,
    pub softirq: f64,
    pub irq: f64,
    pub idle: f64,
    /// Time the hypervisor gave the virtual core's host CPU to another guest while
    /// this one had work: not this machine's work, so not busy (records before
    /// 2026-11-28 counted it in `sys`).
    #[serde(default)]
    pub steal: f64,
}

impl CoreSplit {
    /// The share of the interval the core was busy with this machine's work (0..1).
    pub fn busy(&self) -> f64 {
        let total = self.user + self.sys + self.softirq + self.irq + self.idle + self.steal;
        if total > 0.0 {
            (self.user + self.sys + self.softirq + self.irq) / total
        } else {
            0.0
        }
    }
}

/// The busiest core's busy share minus the idlest one's (0..1), from each core's busy
/// share: seed 000's imbalance, one core near saturation while the others idle.
pub fn spread(busy: &[f64]) -> Option<f64> {
    let max = busy.iter().copied().fold(f64::NAN, f64::max);
    let min = busy.iter().copied().fold(f64::NAN, f64::min);
    (!busy.is_empty()).then_some(max - min)
}

pub fn core_splits(before: &[CoreTicks], after: &[CoreTicks]) -> Vec<CoreSplit> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let d = |x: u64, y: u64| y.saturating_sub(x) as f64;
            let user = d(b.user, a.user) + d(b.nice, a.nice);
            let sys = d(b.system, a.system);
            let steal = d(b.steal, a.steal);
            let softirq = d(b.softirq, a.softirq);
            let irq = d(b.irq, a.irq);
            let idle = d(b.idle, a.idle) + d(b.iowait, a.iowait);
            let total = (user + sys + softirq + irq + idle + steal).max(1.0);
            CoreSplit {
                user: user / total,
                sys: sys / total,
                softirq: softirq / total,
                irq: irq / total,
                idle: idle / total,
                steal: steal / total,
            }
        })
        .collect()
}

pub fn read_cores() -> Vec<CoreTicks> {
    std::fs::read_to_string("/proc/stat")
        .map(|t| parse_proc_stat(&t))
        .unwrap_or_default()
}

/// What schedstat says of one thread: ns on a CPU, and ns runnable but waiting for one
/// (run_delay).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedTimes {
    pub run_ns: u64,
    pub wait_ns: u64,
}

/// Scheduler times of each thread of `pid`, keyed by thread id, with its name.
pub fn read_threads(pid: u32) -> HashMap<u32, (String, SchedTimes)> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let base = e.path();
        let comm = std::fs::read_to_string(base.join("comm"))
            .unwrap_or_default()
            .trim()
            .to_string();
        out.insert(tid, (comm, read_schedstat(&base.join("schedstat"))));
    }
    out
}

/// [`read_threads`], and one more entry, [`EXITED_THREADS`], for the threads that
/// ended: what CPU deltas are taken over.
pub fn read_threads_and_ended(pid: u32) -> HashMap<u32, (String, SchedTimes)> {
    let mut out = read_threads(pid);
    // Threads that ended (a per-peer serial thread retiring, a storm's helpers) leave
    // /proc/PID/task with their time; the process's own total keeps it. Their share is
    // the total less the live threads', as one more entry, so a delta over a window in
    // which threads ended still counts their CPU. The total is in clock ticks (10 ms),
    // which bounds this entry's error.
    if let Some(total) = process_run_ns(pid) {
        let live: u64 = out.values().map(|(_, t)| t.run_ns).sum();
        let exited = SchedTimes {
            run_ns: total.saturating_sub(live),
            wait_ns: 0,
        };
        out.insert(EXITED_THREADS, (EXITED_THREADS_NAME.to_string(), exited));
    }
    out
}

/// The key of [`read_threads`]' entry for the threads that ended (no thread has id 0).
pub const EXITED_THREADS: u32 = 0;
pub const EXITED_THREADS_NAME: &str = "(ended threads)";

/// A process's CPU time, its live and ended threads', from `/proc/PID/stat`.
fn process_run_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    process_ticks(&stat).map(|t| t * 1_000_000_000 / ticks_per_second() as u64)
}

/// utime + stime of a `/proc/PID/stat` line: its 14th and 15th fields, counted after
/// the command's closing parenthesis (the command may hold spaces and parentheses).
fn process_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// A thread's scheduler times from its `schedstat` file (zero where it is missing).
fn read_schedstat(path: &std::path::Path) -> SchedTimes {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let mut fields = stat.split_whitespace().map(|x| x.parse().unwrap_or(0));
    SchedTimes {
        run_ns: fields.next().unwrap_or(0),
        wait_ns: fields.next().unwrap_or(0),
    }
}

/// The calling thread's own scheduler times (zero where schedstat is missing).
pub fn read_thread_self() -> SchedTimes {
    read_schedstat(std::path::Path::new("/proc/thread-self/schedstat"))
}

/// Run and run-queue nanoseconds of the lab's workload threads (the test applications)
/// that have ended, summed: each adds its own schedstat as it ends
/// ([`add_finished_workload_thread`]), since an ended thread leaves no trace in /proc.
static WORKLOAD_RUN_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static WORKLOAD_WAIT_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Adds the calling workload thread's scheduler times to the sum; its last act.
pub fn add_finished_workload_thread() {
    use std::sync::atomic::Ordering::Relaxed;
    let t = read_thread_self();
    WORKLOAD_RUN_NS.fetch_add(t.run_ns, Relaxed);
    WORKLOAD_WAIT_NS.fetch_add(t.wait_ns, Relaxed);
}

/// The sum so far of the workload threads that ended; a cell's share is the
/// difference between a reading after it and one before.
pub fn finished_workload_threads() -> SchedTimes {
    use std::sync::atomic::Ordering::Relaxed;
    SchedTimes {
        run_ns: WORKLOAD_RUN_NS.load(Relaxed),
        wait_ns: WORKLOAD_WAIT_NS.load(Relaxed),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ThreadCpu {
    pub process: String,
    pub thread: String,
    pub cpu_s: f64,
    /// Seconds it was runnable but waited for a CPU: on an oversubscribed host, time
    /// every packet the thread holds spends waiting too.
    #[serde(default)]
    pub wait_s: f64,
}

/// Per-thread CPU and run-queue seconds between two readings (threads that appeared
/// count from 0).
///
/// A thread that ended between the readings moved all its time into the ended
/// threads' entry, including what it had used before the first reading; that part
/// is taken off the entry's delta, or the window would be charged for it.
pub fn thread_deltas(
    process: &str,
    before: &HashMap<u32, (String, SchedTimes)>,
    after: &HashMap<u32, (String, SchedTimes)>,
) -> Vec<ThreadCpu> {
    let ended_meanwhile_ns: u64 = before
        .iter()
        .filter(|(tid, _)| **tid != EXITED_THREADS && !after.contains_key(tid))
        .map(|(_, (_, t))| t.run_ns)
        .sum();
    let mut v: Vec<ThreadCpu> = after
        .iter()
        .map(|(tid, (name, now))| {
            let start = before.get(tid).map(|(_, t)| *t).unwrap_or_default();
            let mut run_ns = now.run_ns.saturating_sub(start.run_ns);
            if *tid == EXITED_THREADS {
                run_ns = run_ns.saturating_sub(ended_meanwhile_ns);
            }
            ThreadCpu {
                process: process.to_string(),
                thread: name.clone(),
                cpu_s: run_ns as f64 / 1e9,
                wait_s: now.wait_ns.saturating_sub(start.wait_ns) as f64 / 1e9,
            }
        })
        .filter(|t| t.cpu_s > 0.0)
        .collect();
    v.sort_by(|a, b| {
        b.cpu_s
            .partial_cmp(&a.cpu_s)
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    v
}

/// Peak resident set (VmHWM) of a process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// Resident set (VmRSS) of a process now, in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    kib_field(&format!("/proc/{pid}/status"), field)
}

/// The memory the kernel reckons it can give without swapping (MemAvailable), KiB.
pub fn mem_available_kib() -> Option<u64> {
    kib_field("/proc/meminfo", "MemAvailable:")
}

/// A "Name: N kB" line's N from a /proc file.
fn kib_field(path: &str, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    s.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Clock ticks per second for /proc/stat.
pub fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread with 200 ms before the window that ends after 50 ms more in it: the
    /// window is charged 50 ms, not the 250 ms the ended threads' entry grew by.
    #[test]
    fn a_thread_ending_in_the_window_is_charged_only_its_time_in_it() {
        let t = |name: &str, ms: u64| {
            let run = SchedTimes {
                run_ns: ms * 1_000_000,
                wait_ns: 0,
            };
            (name.to_string(), run)
        };
        let before = HashMap::from([(7, t("worker", 200)), (EXITED_THREADS, t("", 1_000))]);
        let after = HashMap::from([(EXITED_THREADS, t("", 1_250))]);
        let total: f64 = thread_deltas("p", &before, &after)
            .iter()
            .map(|d| d.cpu_s)
            .sum();
        assert!((total - 0.05).abs() < 1e-9, "{total}");
    }

    /// Stolen time is the hypervisor's, not this machine's work.
    #[test]
    fn steal_is_not_busy() {
        let t = |user, steal, idle| CoreTicks {
            user,
            steal,
            idle,
            ..CoreTicks::default()
        };
        let split = core_splits(&[t(0, 0, 0)], &[t(30, 50, 20)]);
        assert!((split[0].busy() - 0.3).abs() < 1e-12, "{split:?}");
        assert_eq!(core_splits(&[t(0, 0, 0)], &[t(0, 80, 20)])[0].busy(), 0.0);
    }

    #[test]
    fn a_finished_workload_thread_adds_its_run_time() {
        if !std::path::Path::new("/proc/thread-self/schedstat").exists() {
            return; // A kernel without schedstat: nothing to add.
        }
        let before = finished_workload_threads();
        // A stream's helper thread (`spawn_counted`), as the TCP readers and writers
        // are: it adds itself as it ends, with nothing to call.
        crate::workload::spawn_counted(|| {
            // Work until the kernel has counted some; bounded, and no time is asserted.
            let mut x = 0u64;
            for _ in 0..1_000_000 {
                if read_thread_self().run_ns > 0 {
                    break;
                }
                x = std::hint::black_box(x.wrapping_add(1));
            }
        })
        .join()
        .unwrap();
        assert!(finished_workload_threads().run_ns > before.run_ns);
    }

    const STAT: &str = "cpu  10 0 10 100 0 0 0 0 0 0\n\
cpu0 5 1 4 50 2 1 3 0 0 0\n\
cpu1 5 0 6 50 0 0 0 0 0 0\n\
intr 12345\nctxt 99\n";

    #[test]
    fn parses_cores_only() {
        let c = parse_proc_stat(STAT);
        assert_eq!(c.len(), 2);
        assert_eq!(
            c[0],
            CoreTicks {
                user: 5,
                nice: 1,
                system: 4,
                idle: 50,
                iowait: 2,
                irq: 1,
                softirq: 3,
                steal: 0
            }
        );
    }

    #[test]
    fn splits_sum_to_one() {
        let before = parse_proc_stat(STAT);
        let mut after = before.clone();
        after[0].user += 30;
        after[0].softirq += 10;
        after[0].idle += 60;
        let s = core_splits(&before, &after);
        assert!((s[0].user - 0.3).abs() < 1e-9);
        assert!((s[0].softirq - 0.1).abs() < 1e-9);
        assert!((s[0].idle - 0.6).abs() < 1e-9);
        let total = s[0].user + s[0].sys + s[0].softirq + s[0].irq + s[0].idle;
        assert!((total - 1.0).abs() < 1e-9);
        assert_eq!(s[1].idle, 0.0, "no ticks at all is not 100% idle");
    }

    #[test]
    fn thread_deltas_of_this_process() {
        let pid = std::process::id();
        let before = read_threads(pid);
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let after = read_threads(pid);
        let d = thread_deltas("self", &before, &after);
        assert!(d.iter().map(|t| t.cpu_s).sum::<f64>() >= 0.02, "{d:?}");
        assert!(peak_rss_kib(pid).unwrap() > 0);
        assert!(rss_kib(pid).unwrap() > 0);
    }

    /// A thread that burns CPU and ends between two readings still counts. (No bound
    /// on how much: only that the ended thread's work is not lost, which was 0.)
    #[test]
    fn an_ended_thread_keeps_its_cpu() {
        let pid = std::process::id();
        let before = read_threads_and_ended(pid);
        std::thread::spawn(|| {
            let t0 = std::time::Instant::now();
            let mut x = 0u64;
            while t0.elapsed() < std::time::Duration::from_millis(200) {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
            std::hint::black_box(x);
        })
        .join()
        .unwrap();
        let after = read_threads_and_ended(pid);
        let d = thread_deltas("self", &before, &after);
        let ended: f64 = d
            .iter()
            .filter(|t| t.thread == EXITED_THREADS_NAME)
            .map(|t| t.cpu_s)
            .sum();
        assert!(ended > 0.0, "{d:?}");
    }

    #[test]
    fn process_ticks_are_read_past_the_command() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 3 0";
        assert_eq!(process_ticks(stat), Some(22));
        assert_eq!(process_ticks("42 (x) S 1"), None);
    }
}
