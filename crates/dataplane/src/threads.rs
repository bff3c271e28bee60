//! The runtime's threads: spawned by name, registered with their kernel thread id
//! while they run, so that `stats=1` can report each one's CPU time (its busy time:
//! an idle thread sleeps) and context switches from /proc; and the priority and
//! placement helpers the models and loops use.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// One thread's figures, read from `/proc/self/task/TID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadStats {
    pub name: String,
    pub tid: i32,
    /// Nanoseconds it has run on a CPU (schedstat).
    pub busy_ns: u64,
    pub voluntary_switches: u64,
    /// Times it was preempted while runnable: a worker preempted by a poller, or by
    /// another thread on a crowded core.
    pub involuntary_switches: u64,
}

/// The runtime's live threads by kernel thread id.
#[derive(Default)]
pub struct Registry {
    live: Mutex<HashMap<i32, String>>,
}

/// Removes a thread from the registry when its body returns or unwinds.
struct Registered<'a>(&'a Registry, i32);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.1);
    }
}

pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

impl Registry {
    /// Spawns `f` on a thread named `name`, registered while it runs.
    pub fn spawn(
        self: &Arc<Self>,
        name: String,
        f: impl FnOnce() + Send + 'static,
    ) -> io::Result<JoinHandle<()>> {
        let reg = self.clone();
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let tid = gettid();
                reg.live
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(tid, name);
                let _registered = Registered(&reg, tid);
                f();
            })
    }

    /// Every live thread's figures, by name.
    pub fn snapshot(&self) -> Vec<ThreadStats> {
        let live: Vec<(i32, String)> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(t, n)| (*t, n.clone()))
            .collect();
        let mut out: Vec<ThreadStats> = live
            .into_iter()
            .filter_map(|(tid, name)| read(tid, name))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name).then(a.tid.cmp(&b.tid)));
        out
    }
}

/// Reads one thread's figures; None if it has just exited.
fn read(tid: i32, name: String) -> Option<ThreadStats> {
    let dir = format!("/proc/self/task/{tid}");
    let schedstat = std::fs::read_to_string(format!("{dir}/schedstat")).ok()?;
    let busy_ns = schedstat.split_whitespace().next()?.parse().ok()?;
    let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
    let field = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    Some(ThreadStats {
        name,
        tid,
        busy_ns,
        voluntary_switches: field("voluntary_ctxt_switches:"),
        involuntary_switches: field("nonvoluntary_ctxt_switches:"),
    })
}

/// Sets this thread's nice value; false if the kernel refused (raising priority needs
/// CAP_SYS_NICE).
pub fn set_nice(nice: libc::c_int) -> bool {
    // SAFETY: setpriority on this thread's own id (a thread is a process id for it).
    unsafe { libc::setpriority(libc::PRIO_PROCESS, gettid() as libc::id_t, nice) == 0 }
}

/// Puts this thread under SCHED_FIFO at `priority` (1..=99), or back under
/// SCHED_OTHER with 0; false if refused.
pub fn set_fifo(priority: libc::c_int) -> bool {
    let policy = if priority > 0 {
        libc::SCHED_FIFO
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: sched_setscheduler on this thread's own id with a valid parameter.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

/// Pins this thread to CPU `cpu`; false if refused.
pub fn pin_to(cpu: usize) -> bool {
    // SAFETY: cpu_set_t is plain data; the CPU_* macros stay within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// The CPU this thread runs on now.
pub fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    c.max(0) as usize
}

/// The CPUs the calling thread may run on (its affinity mask: a cpuset, `taskset`),
/// in order; all online CPUs if the mask cannot be read.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills at most its size, and
    // the CPU_* macros stay within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..cpus()).collect();
        }
        let all = 8 * std::mem::size_of::<libc::cpu_set_t>();
        let allowed: Vec<usize> = (0..all).filter(|&c| libc::CPU_ISSET(c, &set)).collect();
        if allowed.is_empty() {
            (0..cpus()).collect()
        } else {
            allowed
        }
    }
}

/// Online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinning follows the mask the thread was given (a cpuset), not CPU numbers
    /// from 0: a thread allowed only its last CPU is told that one, and pins to it.
    #[test]
    fn the_cpus_allowed_are_those_of_the_affinity_mask() {
        let all = allowed_cpus();
        assert!(!all.is_empty());
        let last = *all.last().unwrap();
        std::thread::spawn(move || {
            assert!(pin_to(last));
            assert_eq!(allowed_cpus(), [last]);
            assert_eq!(current_cpu(), last);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn spawned_threads_are_listed_while_they_run() {
        let reg = Arc::new(Registry::default());
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (ready, started) = std::sync::mpsc::channel();
        let h = reg
            .spawn("wl-test-0".into(), move || {
                ready.send(gettid()).unwrap();
                let _ = wait.recv();
            })
            .unwrap();
        let tid = started.recv().unwrap();
        let snap = reg.snapshot();
        assert_eq!(snap.len(), 1);
        assert_eq!((snap[0].name.as_str(), snap[0].tid), ("wl-test-0", tid));
        go.send(()).unwrap();
        h.join().unwrap();
        assert!(reg.snapshot().is_empty());
    }
}
