//! Scheduling costs measured on this machine, for the model's calibration: two threads
//! hand a token back and forth through futex wake-ups (`park`/`unpark`), on one core
//! and on two, and one thread times a 256 KiB working set warm, after another thread
//! has used the core, and after it moved to another core.
//!
//! What each figure is:
//! - `wakeup_ns`: the waker's CPU per hand-off across cores (half a round's CPU: one
//!   futex wake, one futex wait);
//! - `wakeup_latency_ns`: a hand-off across cores (wall) less the waker's share;
//! - `switch_ns`: a hand-off on one core, where each one is a context switch, less the
//!   two system calls around it (a futex wake that finds no waiter and a futex wait
//!   that returns at once). Not less the cross-core wake-up: that one pays for an
//!   inter-processor interrupt, on a VM an exit to the hypervisor (7 µs of the
//!   waker's CPU here against 2 µs for a whole hand-off on one core), and subtracting
//!   it left the switch at 0 on every run;
//! - `preempt_ns`: refilling the working set after another thread used the core;
//! - `migration_ns`: refilling it on another core.
//! - `spin_ns`: what a thread spends in a channel receive (crossbeam, as the daemon's
//!   models use) before it parks, less a plain futex wait: the partner answers only
//!   after 200 µs, so the receiver spins its whole backoff and then sleeps;
//! - `timeslice_ns`: EEVDF's base slice as Linux sizes it, 0.75 ms × (1 + log2 of the
//!   CPU count, at most 8).

use super::params::SchedCosts;
use crate::Result;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

fn pin(cpu: usize) -> Result<()> {
    // SAFETY: the set is a local we own; the call pins the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!(
                "cannot pin to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            )
            .into());
        }
    }
    Ok(())
}

fn thread_cpu_ns() -> f64 {
    crate::star::generator::thread_cpu_s() * 1e9
}

/// Hands a token back and forth `rounds` times between a thread on `cpu_a` and one on
/// `cpu_b`; returns (wall ns per hand-off, the first thread's CPU ns per round).
fn ping_pong(cpu_a: usize, cpu_b: usize, rounds: u64) -> Result<(f64, f64)> {
    pin(cpu_a)?;
    let turn = Arc::new(AtomicU64::new(0));
    let main = std::thread::current();
    let t = turn.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let b = std::thread::spawn(move || {
        let pinned = pin(cpu_b).map_err(|e| e.to_string());
        let ok = pinned.is_ok();
        let _ = ready_tx.send(pinned);
        if !ok {
            return;
        }
        for i in 0..rounds {
            while t.load(Ordering::Acquire) != 2 * i + 1 {
                std::thread::park();
            }
            t.store(2 * i + 2, Ordering::Release);
            main.unpark();
        }
    });
    if let Err(e) = ready_rx.recv().map_err(|e| e.to_string()).and_then(|r| r) {
        let _ = b.join();
        return Err(e.into());
    }
    let (start, cpu0) = (Instant::now(), thread_cpu_ns());
    for i in 0..rounds {
        turn.store(2 * i + 1, Ordering::Release);
        b.thread().unpark();
        while turn.load(Ordering::Acquire) != 2 * i + 2 {
            std::thread::park();
        }
    }
    let wall = start.elapsed().as_nanos() as f64 / (2 * rounds) as f64;
    let cpu = (thread_cpu_ns() - cpu0) / rounds as f64;
    b.join().map_err(|_| "probe thread panicked")?;
    Ok((wall, cpu))
}

/// ns of one futex wake that finds no waiter plus one futex wait whose word does not
/// match (both return at once): the system calls of a hand-off without the switch.
fn futex_calls_ns(rounds: u64) -> f64 {
    let word = std::sync::atomic::AtomicU32::new(0);
    let start = Instant::now();
    for _ in 0..rounds {
        // SAFETY: both calls only read the word, a live local; with no waiter and a
        // value that does not match, neither sleeps.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            );
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                1u32,
                std::ptr::null::<libc::timespec>(),
            );
        }
    }
    start.elapsed().as_nanos() as f64 / rounds as f64
}

/// CPU ns per round of a thread that receives on a crossbeam channel an answer that
/// comes only after `delay_us`, on another core.
fn channel_wait(cpu_a: usize, cpu_b: usize, rounds: u64, delay_us: u64) -> Result<f64> {
    pin(cpu_a)?;
    let (to_b, b_rx) = crossbeam_channel::bounded::<u64>(1);
    let (to_a, a_rx) = crossbeam_channel::bounded::<u64>(1);
    let b = std::thread::spawn(move || {
        let _ = pin(cpu_b);
        while let Ok(i) = b_rx.recv() {
            std::thread::sleep(std::time::Duration::from_micros(delay_us));
            if to_a.send(i).is_err() {
                return;
            }
        }
    });
    let cpu0 = thread_cpu_ns();
    for i in 0..rounds {
        to_b.send(i).map_err(|_| "probe thread gone")?;
        a_rx.recv().map_err(|_| "probe thread gone")?;
    }
    let cpu = (thread_cpu_ns() - cpu0) / rounds as f64;
    drop(to_b);
    b.join().map_err(|_| "probe thread panicked")?;
    Ok(cpu)
}

const SET: usize = 256 * 1024;

fn touch(buf: &mut [u8]) -> f64 {
    let start = Instant::now();
    for i in (0..buf.len()).step_by(64) {
        buf[i] = buf[i].wrapping_add(1);
    }
    black_box(&buf);
    start.elapsed().as_nanos() as f64
}

/// (warm, after another thread's working set on this core, after moving cores) ns.
fn refill(cpus: usize) -> Result<(f64, f64, f64)> {
    let mut mine = vec![0u8; SET];
    let mut other = vec![0u8; SET];
    let (mut warm, mut polluted, mut moved) = (f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..50 {
        pin(0)?;
        touch(&mut mine);
        warm = warm.min(touch(&mut mine));
        touch(&mut other);
        polluted = polluted.min(touch(&mut mine));
        if cpus > 1 {
            pin(1)?;
            moved = moved.min(touch(&mut mine));
        }
    }
    if cpus <= 1 {
        moved = polluted;
    }
    Ok((warm, polluted, moved))
}

/// Measures the scheduling costs (about a second). Runs on a thread of its own, so
/// the caller's affinity is untouched.
pub fn measure() -> Result<SchedCosts> {
    std::thread::spawn(|| -> Result<SchedCosts> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let rounds = 20_000;
        let (same_wall, _) = ping_pong(0, 0, rounds)?;
        let (cross_wall, cross_cpu) = if cpus > 1 {
            ping_pong(0, 1, rounds)?
        } else {
            (same_wall, same_wall)
        };
        let wakeup_ns = cross_cpu / 2.0;
        let other = if cpus > 1 { 1 } else { 0 };
        let spin_ns = (channel_wait(0, other, 2000, 200)? - cross_cpu).max(0.0);
        let (warm, polluted, moved) = refill(cpus)?;
        let log2 = (cpus.min(8) as f64).log2().floor();
        Ok(SchedCosts {
            wakeup_ns,
            wakeup_latency_ns: (cross_wall - wakeup_ns).max(0.0),
            switch_ns: (same_wall - futex_calls_ns(rounds)).max(0.0),
            migration_ns: (moved - warm).max(0.0),
            preempt_ns: (polluted - warm).max(0.0),
            timeslice_ns: 0.75e6 * (1.0 + log2),
            spin_ns,
        })
    })
    .join()
    .map_err(|_| "scheduling probe panicked")?
}
