//! Anonymous memory mapped for one owner: receive areas that cost resident memory only
//! where the kernel has written into them.
//!
//! Why not a `Vec<u8>`: a reader's receive buffers are sized for the largest batch
//! (with UDP GRO, 16 runs of 64 KiB; without, 64 messages of 9 KiB), and the allocator
//! zeroes a heap allocation page by page, so every reader held all of it resident from
//! its start, used or not. A tunnel has six UDP readers, of which the handshake, proof
//! and unused-family ones rarely receive anything: about 4 MiB resident per tunnel
//! before its first packet. A fresh anonymous mapping reads as zeros and takes a page
//! only when first written, and `munmap` gives it back to the system at once, where a
//! freed heap block would stay in the process.

use std::ptr::NonNull;

/// `len` bytes of private anonymous memory, zero until written, unmapped on drop.
///
/// Invariant: `ptr` is the start of a live mapping of exactly `len` bytes (`len > 0`)
/// that only this value refers to.
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Region` owns its mapping as a `Vec<u8>` owns its heap block; access goes
// through `&self` / `&mut self`, so the usual borrow rules keep it race-free.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes (at least one). Failing to map is running out of memory, and
    /// ends the process as a failed allocation of a `Vec` would.
    pub fn new(len: usize) -> Region {
        let len = len.max(1);
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        match NonNull::new(p.cast::<u8>()).filter(|_| p != libc::MAP_FAILED) {
            Some(ptr) => {
                // Transparent huge pages would make one written byte take 2 MiB. Only
                // advice: without it the region still works.
                // SAFETY: advice on the mapping just made.
                unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
                Region { ptr, len }
            }
            None => std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(len, 1).expect("a byte layout"),
            ),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is live, `len` bytes long and readable (see Invariant).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value owns, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident pages of `r`, as `mincore` reports them.
    fn resident_pages(r: &Region) -> usize {
        let page = 4096;
        let mut vec = vec![0u8; r.len().div_ceil(page)];
        // SAFETY: the region is a live mapping of `len` bytes; `vec` has a byte for each
        // of its pages.
        let rc = unsafe {
            libc::mincore(
                r.as_slice().as_ptr() as *mut libc::c_void,
                r.len(),
                vec.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn reads_as_zeros_and_takes_only_the_pages_written() {
        let mut r = Region::new(1 << 20);
        assert_eq!(r.len(), 1 << 20);
        assert_eq!(resident_pages(&r), 0);
        r.as_mut_slice()[0] = 1;
        r.as_mut_slice()[70_000] = 2;
        assert_eq!(resident_pages(&r), 2);
        // The rest reads as zeros.
        let s = r.as_slice();
        assert_eq!((s[0], s[70_000]), (1, 2));
        assert_eq!(s.iter().map(|&b| b as usize).sum::<usize>(), 3);
    }

    #[test]
    fn a_zero_length_region_is_one_byte() {
        let r = Region::new(0);
        assert_eq!(r.as_slice(), &[0]);
    }
}
