//! The data of a write as it travels: shared, immutable, and 4 KiB-aligned
//! when made here.
//!
//! Job: let one client write reach the local store and every replica link
//! without a copy. A [`Payload`] is a reference-counted byte buffer
//! ([`bytes::Bytes`]): the primary's disk operation and each link's
//! stream entry hold the same bytes, and cloning one is a counter
//! increment, not a 1 MiB `memcpy` per replica.
//!
//! Invariant: a payload made by [`aligned`] starts on a 4 KiB boundary, so a
//! store opened with O_DIRECT writes it as it is instead of bouncing it
//! through an aligned copy. Payloads made any other way (`Bytes::from(vec)`,
//! a read turned into a resync copy) are valid too; the store bounces those.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;

pub use bytes::Bytes as Payload;

/// Alignment of the payloads [`aligned`] makes: what O_DIRECT needs on any
/// device Basalt supports.
pub const ALIGN: usize = 4096;

/// A copy of `data` in a fresh 4 KiB-aligned allocation (the one copy a
/// write's bytes take between the socket buffer they arrived in and the
/// disk).
pub fn aligned(data: &[u8]) -> Payload {
    if data.is_empty() {
        return Payload::new();
    }
    Payload::from_owner(AlignedCopy::new(data))
}

/// The owner of an aligned allocation holding exactly `len` initialised
/// bytes (the rest of the last 4 KiB is never exposed).
struct AlignedCopy {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the allocation is owned exclusively and never mutated after
// `new`, like a `Box<[u8]>`.
unsafe impl Send for AlignedCopy {}
unsafe impl Sync for AlignedCopy {}

impl AlignedCopy {
    fn new(data: &[u8]) -> Self {
        let cap = data.len().div_ceil(ALIGN) * ALIGN;
        let Ok(layout) = Layout::from_size_align(cap, ALIGN) else {
            // Only a length near usize::MAX fails here; no slice has one.
            handle_alloc_error(Layout::new::<u8>())
        };
        // SAFETY: `cap > 0` (data is not empty), so the layout has a
        // non-zero size.
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        // SAFETY: `ptr` is valid for `cap >= data.len()` bytes and cannot
        // overlap `data`, a live borrow of other memory.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), data.len()) };
        AlignedCopy {
            ptr,
            len: data.len(),
            layout,
        }
    }
}

impl AsRef<[u8]> for AlignedCopy {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were initialised in `new` and live
        // until `drop`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedCopy {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_copies_are_aligned_equal_and_shared() {
        for len in [1usize, 511, 4096, 4097, 1 << 20] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let p = aligned(&data);
            assert_eq!(p.as_ptr() as usize % ALIGN, 0, "len {len}");
            assert_eq!(&p[..], &data[..]);
            let q = p.clone();
            assert_eq!(q.as_ptr(), p.as_ptr(), "a clone shares the bytes");
            drop(p);
            assert_eq!(&q[..], &data[..], "the last clone keeps them alive");
        }
        assert!(aligned(&[]).is_empty());
    }
}
