//! `AlignedBuf`: a heap buffer whose start is 4 KiB-aligned, as O_DIRECT
//! needs. Invariant: the allocation is at least `len` bytes, rounded up to
//! 4 KiB, and always initialised (zeroed on growth), so it can be handed out
//! as `&[u8]` at any time.

use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

const ALIGN: usize = 4096;

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let mut b = AlignedBuf {
            ptr: NonNull::dangling(),
            cap: 0,
            len: 0,
        };
        b.set_len(len);
        b
    }

    /// A copy of `data`, written once instead of zeroed and then written
    /// (an O_DIRECT bounce of a 1 MiB write would otherwise touch 2 MiB).
    pub fn copy_of(data: &[u8]) -> Self {
        if data.is_empty() {
            return AlignedBuf::zeroed(0);
        }
        let cap = data.len().div_ceil(ALIGN) * ALIGN;
        let layout = Layout::from_size_align(cap, ALIGN).expect("buffer layout");
        // SAFETY: layout has non-zero size (data is not empty).
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: `ptr` is valid for `cap` bytes, distinct from `data`; the
        // copy initialises the first `data.len()` and the fill the rest, so
        // the whole allocation is initialised (the type's invariant).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), data.len());
            std::ptr::write_bytes(ptr.as_ptr().add(data.len()), 0, cap - data.len());
        }
        AlignedBuf {
            ptr,
            cap,
            len: data.len(),
        }
    }

    /// Changes the length; growing keeps the old contents and zeroes the
    /// rest of a new allocation (bytes beyond the old length but within the
    /// old capacity keep whatever they held).
    pub fn set_len(&mut self, len: usize) {
        if len > self.cap {
            let cap = len.div_ceil(ALIGN).max(1) * ALIGN;
            let layout = Layout::from_size_align(cap, ALIGN).expect("buffer layout");
            // SAFETY: layout has non-zero size.
            let raw = unsafe { alloc_zeroed(layout) };
            let Some(ptr) = NonNull::new(raw) else {
                std::alloc::handle_alloc_error(layout)
            };
            if self.cap > 0 {
                // SAFETY: both regions are valid for self.len bytes and distinct.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), ptr.as_ptr(), self.len);
                    dealloc(
                        self.ptr.as_ptr(),
                        Layout::from_size_align_unchecked(self.cap, ALIGN),
                    );
                }
            }
            self.ptr = ptr;
            self.cap = cap;
        }
        self.len = len;
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.cap > 0 {
            // SAFETY: allocated in set_len with exactly this layout.
            unsafe {
                dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align_unchecked(self.cap, ALIGN),
                )
            }
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.cap == 0 {
            return &[];
        }
        // SAFETY: ptr is valid and initialised for cap >= len bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        if self.cap == 0 {
            return &mut [];
        }
        // SAFETY: as above, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf(len={})", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_growable() {
        let mut b = AlignedBuf::zeroed(100);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert!(b.iter().all(|&x| x == 0));
        b[..3].copy_from_slice(b"abc");
        b.set_len(10_000);
        assert_eq!(&b[..3], b"abc");
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert!(b[3..].iter().all(|&x| x == 0));
        let e = AlignedBuf::zeroed(0);
        assert!(e.is_empty());
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8 | 1).collect();
        let mut c = AlignedBuf::copy_of(&data);
        assert_eq!(c.as_ptr() as usize % ALIGN, 0);
        assert_eq!(&c[..], &data[..]);
        c.set_len(8192);
        assert!(c[5000..].iter().all(|&x| x == 0), "the tail is initialised");
        assert!(AlignedBuf::copy_of(&[]).is_empty());
    }
}
