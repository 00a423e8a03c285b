//! Free-extent set: a bitmap of physical extents that are free and durably
//! zero. Extents just released are not in it: the engine adds them back
//! only after their release is durable and their zeroing is flushed, and
//! takes extents out of it only to reserve them (space.rs).

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

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn contains(&self, phys: u32) -> bool {
        phys < self.total && self.bits[phys as usize / 64] & (1 << (phys % 64)) != 0
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
