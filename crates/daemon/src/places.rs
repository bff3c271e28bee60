//! A bound on the connections a server serves at once, each on a thread of its own: a
//! place is taken before the thread starts and given back when the place drops, which
//! is when the thread ends, however it ends (or at once, if it could not start).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// At most `max` places taken at once.
pub struct Places {
    taken: AtomicUsize,
    max: usize,
}

/// One taken place, given back on drop.
pub struct Place(Arc<Places>);

impl Places {
    pub fn new(max: usize) -> Arc<Places> {
        Arc::new(Places {
            taken: AtomicUsize::new(0),
            max,
        })
    }

    /// A place, or None when all `max` are taken.
    pub fn take(self: &Arc<Self>) -> Option<Place> {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Place(self.clone()))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.taken.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_and_given_back() {
        let places = Places::new(3);
        let held: Vec<Place> = std::iter::from_fn(|| places.take()).take(10).collect();
        assert_eq!(held.len(), 3);
        assert!(places.take().is_none());
        drop(held);
        assert!(places.take().is_some());
    }
}
