//! Packet buffer pool: every packet buffer of the common size comes from here and goes
//! back here when its packet is dropped, so the data path neither allocates nor zeroes
//! memory per packet once it has warmed up.
//!
//! Shape: each thread keeps a small cache of free buffers and trades with one shared
//! store in chunks of [`CHUNK`]. Readers mostly take and workers mostly give back, so
//! buffers flow worker → shared store → reader a chunk at a time, and a thread takes the
//! shared lock about once per [`CHUNK`] packets.
//!
//! Bounds: a thread cache holds at most `2 * CHUNK` buffers and the shared store at
//! most [`SHARED_CHUNKS`] chunks; anything beyond is freed. Buffers in flight are
//! bounded elsewhere (the per-peer queues and the staging limit), not here.
//!
//! Invariant: a pooled buffer is exactly [`BUF_LEN`] long. Its contents are stale bytes
//! of an earlier packet; every stage writes before it reads (the encrypt stage zeroes
//! its padding explicitly).

use std::cell::RefCell;
use std::sync::Mutex;

/// Size class of pooled buffers: header room, a 1500-byte-MTU payload and tail room,
/// with margin. Larger requests (jumbo MTUs) are plain allocations and are not pooled.
pub const BUF_LEN: usize = 2048;
/// Buffers moved between a thread cache and the shared store at a time.
pub const CHUNK: usize = 64;
/// Most chunks the shared store keeps (32 × 64 × 2 KiB = 4 MiB).
pub const SHARED_CHUNKS: usize = 32;

static SHARED: Mutex<Vec<Vec<Vec<u8>>>> = Mutex::new(Vec::new());

struct Cache(Vec<Vec<u8>>);

impl Drop for Cache {
    // A thread that ends hands its buffers back rather than freeing them.
    fn drop(&mut self) {
        while self.0.len() >= CHUNK {
            let rest = self.0.split_off(self.0.len() - CHUNK);
            give_chunk(rest);
        }
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = const { RefCell::new(Cache(Vec::new())) };
}

fn shared() -> std::sync::MutexGuard<'static, Vec<Vec<Vec<u8>>>> {
    SHARED.lock().unwrap_or_else(|p| p.into_inner())
}

fn give_chunk(chunk: Vec<Vec<u8>>) {
    let mut s = shared();
    if s.len() < SHARED_CHUNKS {
        s.push(chunk);
    }
}

/// A buffer of [`BUF_LEN`] bytes (contents unspecified).
pub fn take() -> Vec<u8> {
    let cached = CACHE.try_with(|c| {
        let mut c = c.borrow_mut();
        if c.0.is_empty() {
            if let Some(chunk) = shared().pop() {
                c.0 = chunk;
            }
        }
        c.0.pop()
    });
    cached.ok().flatten().unwrap_or_else(|| vec![0; BUF_LEN])
}

/// Returns a buffer; buffers not of the pooled size are simply freed.
pub fn give(buf: Vec<u8>) {
    if buf.len() != BUF_LEN || buf.capacity() != BUF_LEN {
        return;
    }
    // During thread teardown the cache may be gone; the buffer is then freed.
    let _ = CACHE.try_with(|c| {
        let mut c = c.borrow_mut();
        c.0.push(buf);
        if c.0.len() >= 2 * CHUNK {
            let rest = c.0.split_off(CHUNK);
            give_chunk(rest);
        }
    });
}

/// Fills the shared store with `chunks` chunks of fresh buffers (at start-up, so the
/// first traffic does not pay for allocation).
pub fn prefill(chunks: usize) {
    let chunks = chunks.min(SHARED_CHUNKS);
    while shared().len() < chunks {
        give_chunk((0..CHUNK).map(|_| vec![0; BUF_LEN]).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_and_wrong_sizes_are_not_kept() {
        let b = take();
        assert_eq!(b.len(), BUF_LEN);
        let ptr = b.as_ptr();
        give(b);
        // The same thread gets its own buffer back first.
        let again = take();
        assert_eq!(again.as_ptr(), ptr);
        give(vec![0; 100]);
        give(Vec::with_capacity(BUF_LEN));
        assert_eq!(take().len(), BUF_LEN);
    }

    #[test]
    fn caches_and_shared_store_stay_bounded() {
        let many: Vec<Vec<u8>> = (0..(SHARED_CHUNKS + 4) * CHUNK * 2)
            .map(|_| take())
            .collect();
        for b in many {
            give(b);
        }
        assert!(CACHE.with(|c| c.borrow().0.len()) < 2 * CHUNK);
        assert!(shared().len() <= SHARED_CHUNKS);
        // Buffers given on one thread are taken on another through the shared store.
        let from_other = std::thread::spawn(|| {
            let b = take();
            b.len()
        });
        assert_eq!(from_other.join().unwrap(), BUF_LEN);
    }
}
