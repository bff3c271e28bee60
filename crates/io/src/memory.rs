//! How much memory this process may use: the tightest of its cgroup's `memory.max`
//! (cgroup v2, as systemd and containers set it), its address-space rlimit and the
//! machine's RAM. The daemon sizes its peer limit from it, so that a configuration too
//! large to hold is refused when it is set, rather than killed for it later.
//!
//! Also how many allocator arenas its threads share ([`limit_allocator_arenas`]).

use std::io;

/// The limit in bytes and where it comes from, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    pub bytes: u64,
    pub source: &'static str,
}

/// The tightest limit that applies; the RAM always does.
pub fn memory_limit() -> io::Result<MemoryLimit> {
    let mut limit = MemoryLimit {
        bytes: ram_bytes(&std::fs::read_to_string("/proc/meminfo")?)?,
        source: "the machine's RAM",
    };
    let mut tighten = |bytes: Option<u64>, source| {
        if let Some(b) = bytes.filter(|&b| b < limit.bytes) {
            limit = MemoryLimit { bytes: b, source };
        }
    };
    tighten(cgroup_max(), "the cgroup's memory.max");
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rl) } == 0
        && rl.rlim_cur != libc::RLIM_INFINITY
    {
        tighten(Some(rl.rlim_cur), "the address-space rlimit");
    }
    Ok(limit)
}

/// `MemTotal` of /proc/meminfo, in bytes.
fn ram_bytes(meminfo: &str) -> io::Result<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no MemTotal in /proc/meminfo"))
}

/// Caps glibc's allocator at `arenas` arenas (`M_ARENA_MAX`), unless the operator set
/// `MALLOC_ARENA_MAX`, whose choice stands; returns whether the cap was set. Call it
/// before the threads start.
///
/// Why: glibc lets up to eight arenas per core form, one for each thread that finds
/// the others busy, and each keeps the memory freed into it. The daemon runs a dozen
/// threads or more (readers, workers, handshake, timers), and at 10,000 peers the
/// keypairs that rekeying makes and frees leave most of them holding some. With one
/// arena per core, threads that run at the same time still each find one free.
/// Measured at 10,000 peers under overload with rekeys every 60 s, 300 s (BENCHMARKS.md,
/// "One allocator arena per core"): peak RSS 63.4 and 64.1 MiB with glibc's default,
/// 57.6 with two arenas, at the same goodput.
pub fn limit_allocator_arenas(arenas: usize) -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    set_arena_max(arenas)
}

#[cfg(target_env = "gnu")]
fn set_arena_max(arenas: usize) -> bool {
    let n = libc::c_int::try_from(arenas.max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt takes two integers and changes only the allocator's settings.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, n) == 1 }
}

#[cfg(not(target_env = "gnu"))]
fn set_arena_max(_arenas: usize) -> bool {
    false // Other allocators have no such setting.
}

/// Our cgroup v2's `memory.max`, if it has a number there ("max" means none).
fn cgroup_max() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let max = std::fs::read_to_string(format!("/sys/fs/cgroup{}/memory.max", path.trim())).ok()?;
    max.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_is_read_from_meminfo_and_bad_input_is_an_error() {
        let m = "MemTotal:       24576000 kB\nMemFree:  1 kB\n";
        assert_eq!(ram_bytes(m).unwrap(), 24_576_000 * 1024);
        assert!(ram_bytes("MemFree: 1 kB\n").is_err());
        assert!(ram_bytes("MemTotal: lots kB\n").is_err());
    }

    /// What the cap does is measured in the lab (peak RSS); here, that the call stands
    /// aside for the operator and answers alike each time. Whether it is taken depends
    /// on the allocator: glibc's takes it, AddressSanitizer's (CI) refuses it.
    #[test]
    fn the_arena_cap_stands_aside_for_the_operator_and_answers_alike() {
        let first = limit_allocator_arenas(64);
        assert_eq!(limit_allocator_arenas(0), first, "0 asks for one arena");
        if std::env::var_os("MALLOC_ARENA_MAX").is_some() || !cfg!(target_env = "gnu") {
            assert!(!first, "set although the operator or the platform decides");
        }
    }

    #[test]
    fn the_limit_is_at_most_the_ram() {
        let l = memory_limit().unwrap();
        let ram = ram_bytes(&std::fs::read_to_string("/proc/meminfo").unwrap()).unwrap();
        assert!(l.bytes > 0 && l.bytes <= ram, "{l:?}");
    }
}
