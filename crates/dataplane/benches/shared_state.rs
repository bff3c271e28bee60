//! What touching an interface's shared state costs when every thread does at once, as
//! every packet's protocol step and flush do:
//! - a read of read-mostly state (its identity, its sockets): through a read-write
//!   lock with a reference taken (as before), and through an `ArcSwap` guard
//!   (`Interface::identity_now`, `Interface::sockets`);
//! - a count: one shared atomic (as before), and the thread's shard of `Stats`.
//!
//! The threads do the same in a loop; the figure is nanoseconds per operation, the
//! median of five repeats, interleaved.
//!
//!   cargo bench -p wirelane-dataplane --bench shared_state [-- THREADS]

use arc_swap::ArcSwapOption;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, RwLock};
use std::time::Instant;
use wirelane_dataplane::stats::Stats;

const READS: u64 = 2_000_000;
const REPEATS: usize = 5;

/// Nanoseconds per operation with `threads` threads each doing `READS` of them.
fn per_op(threads: usize, read: &(dyn Fn() + Sync)) -> f64 {
    let start = Barrier::new(threads);
    let took = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let t = Instant::now();
                    for _ in 0..READS {
                        read();
                    }
                    t.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reader"))
            .max()
            .expect("a thread")
    });
    took.as_nanos() as f64 / READS as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let threads: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2);
    let value = Arc::new([7u8; 64]);
    let locked = RwLock::new(Some(value.clone()));
    let swapped = ArcSwapOption::new(Some(value));
    let lock_read = || {
        let v = locked.read().unwrap().clone();
        black_box(v.as_deref().map(|b| b[0]));
    };
    let guard_read = || {
        let g = swapped.load();
        black_box(g.as_deref().map(|b| b[0]));
    };
    let shared = AtomicU64::new(0);
    let stats = Stats::default();
    let shared_add = || {
        shared.fetch_add(1, Ordering::Relaxed);
    };
    let sharded_add = || stats.tx_timed.fetch_add(1, Ordering::Relaxed);
    let mut figures = [const { Vec::new() }; 4];
    for _ in 0..REPEATS {
        figures[0].push(per_op(threads, &lock_read));
        figures[1].push(per_op(threads, &guard_read));
        figures[2].push(per_op(threads, &shared_add));
        figures[3].push(per_op(threads, &sharded_add));
    }
    let [lock, guard, shared, sharded] = figures.map(median);
    println!("{threads} threads at once, ns per operation (median of {REPEATS}):");
    println!("  read:  RwLock read + Arc clone {lock:6.1}   ArcSwap guard {guard:6.1}");
    println!("  count: shared atomic           {shared:6.1}   Stats shard   {sharded:6.1}");
}
