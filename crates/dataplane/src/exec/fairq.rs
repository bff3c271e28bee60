//! The workqueue model's queue: one FIFO per interface, served deficit round robin
//! (Shreedhar and Varghese), so that under overload each tunnel gets an equal share of
//! the workers, counted in packets, whatever its offered load. With one interface, or
//! with work to spare, it is a plain FIFO.
//!
//! Each interface with work waits in a ring; the worker at the front's turn takes its
//! oldest item if the interface's deficit covers the item's cost, or else adds a
//! quantum to the deficit and passes the turn on. An interface whose FIFO empties
//! leaves the ring and forgets its deficit; one that joins starts with a quantum.
//!
//! Waiting: workers sleep on a condvar only when every FIFO is empty; a push signals it
//! only when a worker sleeps (a `futex` wake per push would cost a system call each).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Packets an interface may have served per turn, beyond its deficit.
pub const QUANTUM: usize = 64;

struct Lane<T> {
    items: VecDeque<(T, usize)>,
    deficit: usize,
}

struct State<T> {
    lanes: HashMap<u32, Lane<T>>,
    ring: VecDeque<u32>,
    sleeping: usize,
    stopped: bool,
}

pub struct FairQueue<T> {
    state: Mutex<State<T>>,
    wake: Condvar,
    len: AtomicUsize,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        FairQueue {
            state: Mutex::new(State {
                lanes: HashMap::new(),
                ring: VecDeque::new(),
                sleeping: 0,
                stopped: false,
            }),
            wake: Condvar::new(),
            len: AtomicUsize::new(0),
        }
    }
}

impl<T> FairQueue<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `item` of interface `lane`, costing `cost` packets.
    pub fn push(&self, lane: u32, item: T, cost: usize) {
        let mut st = self.lock();
        // A lane joins with its first quantum in hand, as DRR grants it at the start
        // of a turn: with none, its first turn only earned one and passed, and a
        // tunnel that became active waited a whole round more behind the busy ones.
        let l = st.lanes.entry(lane).or_insert_with(|| Lane {
            items: VecDeque::new(),
            deficit: QUANTUM,
        });
        if l.items.is_empty() {
            st.ring.push_back(lane);
        }
        st.lanes
            .get_mut(&lane)
            .expect("just inserted")
            .items
            .push_back((item, cost.max(1)));
        self.len.fetch_add(1, Ordering::Relaxed);
        if st.sleeping > 0 {
            self.wake.notify_one();
        }
    }

    /// The next item by deficit round robin, waiting for one; None once stopped.
    pub fn pop(&self) -> Option<T> {
        let mut st = self.lock();
        loop {
            if st.stopped {
                return None;
            }
            if let Some(item) = Self::take(&mut st) {
                self.len.fetch_sub(1, Ordering::Relaxed);
                return Some(item);
            }
            st.sleeping += 1;
            st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            st.sleeping -= 1;
        }
    }

    fn take(st: &mut State<T>) -> Option<T> {
        loop {
            let &key = st.ring.front()?;
            let lane = st.lanes.get_mut(&key).expect("a lane in the ring exists");
            let cost = lane.items.front().map_or(0, |(_, c)| *c);
            if lane.deficit < cost {
                lane.deficit += QUANTUM;
                st.ring.rotate_left(1);
                continue;
            }
            let (item, cost) = lane.items.pop_front().expect("a lane in the ring has work");
            lane.deficit -= cost;
            if lane.items.is_empty() {
                st.ring.pop_front();
                st.lanes.remove(&key);
            }
            return Some(item);
        }
    }

    /// Items queued, over every interface.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items queued for interface `lane`.
    pub fn len_of(&self, lane: u32) -> usize {
        self.lock().lanes.get(&lane).map_or(0, |l| l.items.len())
    }

    /// Wakes every waiting worker and makes `pop` return None from now on.
    pub fn stop(&self) {
        self.lock().stopped = true;
        self.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tunnel flooding the queue does not starve one that queues little: each gets
    /// turns of QUANTUM packets.
    #[test]
    fn an_overloaded_lane_does_not_starve_a_light_one() {
        let q = FairQueue::default();
        for i in 0..1000 {
            q.push(1, (1, i), 64); // heavy: full batches
        }
        for i in 0..10 {
            q.push(2, (2, i), 64);
        }
        let first_20: Vec<u32> = (0..20).map(|_| q.pop().unwrap().0).collect();
        let light = first_20.iter().filter(|&&l| l == 2).count();
        assert_eq!(light, 10, "{first_20:?}");
        // Within a lane, order is kept.
        let mut last = None;
        while let Some((l, i)) = (!q.is_empty()).then(|| q.pop().unwrap()) {
            assert_eq!(l, 1);
            assert!(last.is_none_or(|p| p < i));
            last = Some(i);
        }
        assert_eq!(q.len(), 0);
    }

    /// Shares follow packets, not items: a lane of small items gets as many packets
    /// per round as a lane of big ones.
    #[test]
    fn shares_are_counted_in_packets() {
        let q = FairQueue::default();
        for _ in 0..200 {
            q.push(1, 1u32, 64);
        }
        for _ in 0..200 * 16 {
            q.push(2, 2u32, 4);
        }
        let mut packets = [0usize; 3];
        for _ in 0..400 {
            let l = q.pop().unwrap();
            packets[l as usize] += if l == 1 { 64 } else { 4 };
        }
        let (a, b) = (packets[1] as f64, packets[2] as f64);
        assert!((a / b - 1.0).abs() < 0.2, "{packets:?}");
    }

    /// A tunnel that becomes active is served at its first turn, after at most one
    /// item of each busy tunnel ahead of it, not a round later.
    #[test]
    fn a_lane_that_joins_is_served_at_its_first_turn() {
        let q = FairQueue::default();
        for lane in 1..=3 {
            for i in 0..100 {
                q.push(lane, (lane, i), 64);
            }
        }
        for _ in 0..7 {
            q.pop().unwrap();
        }
        q.push(9, (9, 0), 64);
        let before = (0..10).position(|_| q.pop().unwrap().0 == 9).unwrap();
        assert!(before <= 3, "{before} items went first");
    }

    #[test]
    fn stop_wakes_a_waiting_worker() {
        let q = std::sync::Arc::new(FairQueue::<u32>::default());
        let w = {
            let q = q.clone();
            std::thread::spawn(move || q.pop())
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        q.stop();
        assert_eq!(w.join().unwrap(), None);
    }
}
