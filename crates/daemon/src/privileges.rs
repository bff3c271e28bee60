//! Dropping capabilities once the interface, sockets and UAPI socket exist.
//!
//! After setup the daemon still needs two capabilities:
//! - CAP_NET_ADMIN, for `fwmark` (SO_MARK) and forced socket buffer sizes when the UAPI
//!   rebinds the UDP sockets;
//! - CAP_NET_BIND_SERVICE, for a UAPI `listen_port` below 1024;
//! - with `--model softirq` only, CAP_SYS_NICE, with which its pollers take SCHED_FIFO
//!   (the model exists to reproduce the kernel's priorities).
//!
//! Everything else leaves the effective, permitted and inheritable sets, the ambient set
//! and the bounding set, and no_new_privs is set, so nothing exec'd later could regain it.
//!
//! Invariant: capabilities are per thread, so this must run before the daemon spawns any
//! thread; threads inherit the caller's sets. The daemon calls it before starting the
//! workers and the UAPI server.

use std::io;

pub const CAP_NET_BIND_SERVICE: u32 = 10;
pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_SYS_NICE: u32 = 23;
const CAP_SETPCAP: u32 = 8;

/// What the daemon keeps.
pub const KEPT: [u32; 2] = [CAP_NET_ADMIN, CAP_NET_BIND_SERVICE];
/// What it keeps under the `softirq` model.
pub const KEPT_SOFTIRQ: [u32; 3] = [CAP_NET_ADMIN, CAP_NET_BIND_SERVICE, CAP_SYS_NICE];

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// prctl is variadic: unused arguments go as full-width zeros, since the kernel refuses
/// these options unless they are exactly zero.
const NIL: libc::c_ulong = 0;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The calling thread's (effective, permitted) sets as 64-bit masks.
fn current() -> io::Result<(u64, u64)> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData entries for version 3; both are ours.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok((
        join(data[0].effective, data[1].effective),
        join(data[0].permitted, data[1].permitted),
    ))
}

fn mask(caps: &[u32]) -> u64 {
    caps.iter().fold(0, |m, c| m | (1u64 << c))
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        // Unknown: try every possible capability; the kernel refuses those it lacks.
        .unwrap_or(63)
        .min(63)
}

/// Reduces the calling thread (and so every thread it spawns) to `keep`, intersected
/// with what it holds now. Returns the mask it kept.
pub fn drop_all_but(keep: &[u32]) -> io::Result<u64> {
    let (effective, permitted) = current()?;
    let kept = mask(keep) & permitted;
    // The bounding set needs CAP_SETPCAP; a daemon started with only the kept
    // capabilities (file capabilities, systemd AmbientCapabilities) has a bounding set
    // someone else chose, and its other sets are still reduced below.
    if effective & (1 << CAP_SETPCAP) != 0 {
        for cap in 0..=last_cap() {
            if kept & (1 << cap) == 0 {
                // SAFETY: plain prctl; EINVAL for a capability this kernel lacks is fine.
                let r = unsafe {
                    libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, NIL, NIL, NIL)
                };
                if r != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                    return Err(io::Error::last_os_error());
                }
            }
        }
    }
    // SAFETY: plain prctl calls with constant arguments. Clearing the ambient set cannot
    // fail in a way that matters: capset below empties it anyway (inheritable = 0).
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            NIL,
            NIL,
            NIL,
        );
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, NIL, NIL, NIL) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: kept as u32,
            permitted: kept as u32,
            inheritable: 0,
        },
        CapData {
            effective: (kept >> 32) as u32,
            permitted: (kept >> 32) as u32,
            inheritable: 0,
        },
    ];
    // SAFETY: capset reads two CapData entries for version 3.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(mask(&KEPT), 0x1400);
        assert!(last_cap() >= CAP_NET_ADMIN);
    }
}
