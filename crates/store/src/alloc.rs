//! Free-extent allocator: a bitmap of physical extents that are free, zeroed
//! and safe to hand out. Extents just unmapped are not in it: the engine adds
//! them back only after their unmap is durable and they were zeroed.

pub(crate) struct FreeExtents {
    bits: Vec<u64>,
    count: u64,
    cursor: usize,
    total: u32,
}

impl FreeExtents {
    pub fn new(total: u32) -> FreeExtents {
        FreeExtents {
            bits: vec![0; (total as usize).div_ceil(64)],
            count: 0,
            cursor: 0,
            total,
        }
    }

    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn release(&mut self, phys: u32) {
        debug_assert!(phys < self.total);
        let (w, b) = (phys as usize / 64, phys % 64);
        if self.bits[w] & (1 << b) == 0 {
            self.bits[w] |= 1 << b;
            self.count += 1;
        }
    }

    /// Takes a free extent, preferring the one after the last taken so that
    /// sequential allocation stays physically contiguous.
    pub fn take(&mut self) -> Option<u32> {
        if self.count == 0 {
            return None;
        }
        let words = self.bits.len();
        for i in 0..=words {
            let w = (self.cursor + i) % words;
            let word = self.bits[w];
            if word != 0 {
                let b = word.trailing_zeros();
                self.bits[w] &= !(1 << b);
                self.count -= 1;
                self.cursor = w;
                return Some(w as u32 * 64 + b);
            }
        }
        None
    }

    /// Contiguous runs of free extents, as (first, count).
    pub fn runs(&self) -> Vec<(u32, u32)> {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for phys in 0..self.total {
            if self.bits[phys as usize / 64] & (1 << (phys % 64)) != 0 {
                match runs.last_mut() {
                    Some((start, n)) if *start + *n == phys => *n += 1,
                    _ => runs.push((phys, 1)),
                }
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_release_runs() {
        let mut f = FreeExtents::new(130);
        for p in 0..130 {
            f.release(p);
        }
        assert_eq!(f.count(), 130);
        assert_eq!(f.take(), Some(0));
        assert_eq!(f.take(), Some(1));
        assert_eq!(f.runs(), vec![(2, 128)]);
        let mut n = 0;
        while f.take().is_some() {
            n += 1;
        }
        assert_eq!(n, 128);
        assert_eq!(f.count(), 0);
        f.release(5);
        assert_eq!(f.take(), Some(5));
    }
}
