//! Per-connection pool of 4 KiB-aligned payload buffers.
//!
//! READ and WRITE payloads live in [`AlignedBuf`]s so the store can hand
//! them to O_DIRECT I/O without a bounce copy. Buffers come in power-of-two
//! size classes from 4 KiB to 32 MiB (the largest payload a frontend accepts); a buffer returned to the
//! pool is reused by the next request of its class, so a connection in steady
//! state allocates nothing per I/O. The memory a pool keeps between batches
//! is bounded by [`RETAINED_BYTES`] in total (enough for a batch of 32 x 1 MiB
//! requests); larger batches allocate the excess and free it afterwards.

use basalt_store::AlignedBuf;

const MIN_CLASS_SHIFT: u32 = 12; // 4 KiB
const MAX_CLASS_SHIFT: u32 = 25; // 32 MiB: the largest payload of any frontend
const CLASSES: usize = (MAX_CLASS_SHIFT - MIN_CLASS_SHIFT + 1) as usize;

/// Bytes of free buffers a pool keeps, over all size classes.
pub const RETAINED_BYTES: usize = 32 << 20;

pub struct BufferPool {
    free: [Vec<AlignedBuf>; CLASSES],
    /// Sum of the capacities of the buffers in `free`.
    retained: usize,
}

fn class_of(len: usize) -> Option<usize> {
    let shift = len.max(1).next_power_of_two().trailing_zeros();
    let shift = shift.max(MIN_CLASS_SHIFT);
    (shift <= MAX_CLASS_SHIFT).then(|| (shift - MIN_CLASS_SHIFT) as usize)
}

fn class_bytes(class: usize) -> usize {
    1usize << (class as u32 + MIN_CLASS_SHIFT)
}

impl Default for BufferPool {
    fn default() -> BufferPool {
        BufferPool::new()
    }
}

impl BufferPool {
    pub fn new() -> BufferPool {
        BufferPool {
            free: std::array::from_fn(|_| Vec::new()),
            retained: 0,
        }
    }

    /// A buffer of exactly `len` bytes (contents unspecified). Lengths above
    /// the largest class get a dedicated buffer that the pool will not keep;
    /// the frontend never asks for those because it caps payloads first.
    pub fn take(&mut self, len: usize) -> AlignedBuf {
        let reused =
            class_of(len).map(|class| (class, self.free.get_mut(class).and_then(Vec::pop)));
        let mut buf = match reused {
            Some((_, Some(buf))) => {
                self.retained -= buf.capacity();
                buf
            }
            Some((class, None)) => AlignedBuf::zeroed(class_bytes(class)),
            None => AlignedBuf::zeroed(len),
        };
        // Within the class capacity, so this never reallocates.
        buf.set_len(len);
        buf
    }

    /// Returns a buffer for reuse.
    pub fn give(&mut self, buf: AlignedBuf) {
        let capacity = buf.capacity();
        let Some(class) = class_of(capacity) else {
            return;
        };
        // Only exact class sizes come from `take`; anything else is dropped.
        if class_bytes(class) != capacity {
            return;
        }
        if self.retained + capacity > RETAINED_BYTES {
            return;
        }
        if let Some(list) = self.free.get_mut(class) {
            self.retained += capacity;
            list.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_4k_to_32m() {
        assert_eq!(class_of(0), Some(0));
        assert_eq!(class_of(1), Some(0));
        assert_eq!(class_of(4096), Some(0));
        assert_eq!(class_of(4097), Some(1));
        assert_eq!(class_of(32 << 20), Some(CLASSES - 1));
        assert_eq!(class_of((32 << 20) + 1), None);
    }

    #[test]
    fn buffers_are_reused_and_aligned() {
        let mut pool = BufferPool::new();
        let buf = pool.take(5000);
        assert_eq!(buf.len(), 5000);
        assert_eq!(buf.as_ptr() as usize % 4096, 0);
        let ptr = buf.as_ptr();
        pool.give(buf);
        let again = pool.take(8192);
        assert_eq!(again.as_ptr(), ptr, "same class reuses the buffer");
        assert_eq!(again.len(), 8192);
        let big = pool.take((32 << 20) + 512);
        assert_eq!(big.len(), (32 << 20) + 512);
        pool.give(big); // dropped, not kept
        assert!(pool.free.iter().all(Vec::is_empty));
    }

    #[test]
    fn retention_is_bounded() {
        let mut pool = BufferPool::new();
        let bufs: Vec<_> = (0..9000).map(|_| pool.take(4096)).collect();
        for b in bufs {
            pool.give(b);
        }
        assert_eq!(pool.free[0].len(), RETAINED_BYTES / 4096);
        assert_eq!(pool.retained, RETAINED_BYTES);
        let big = pool.take(1 << 20);
        pool.give(big); // over the total: dropped
        assert!(pool.free[8].is_empty());
        let _ = pool.take(4096);
        assert_eq!(pool.retained, RETAINED_BYTES - 4096);
    }
}
