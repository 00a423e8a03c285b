//! Data checksums at run time: the CRC32C of every 4 KiB data block, held
//! in memory (4 bytes per block, 0.1% of capacity) and checked on every
//! read; `intent.rs` decides when they are written to the checksum region.
//!
//! Invariants:
//! - Whenever no write to a block is in flight, its value is the CRC32C of
//!   what a read of the block returns, or `CHECKSUM_UNKNOWN`.
//! - A writer stores its block's new value before it stops counting as in
//!   flight, so a read that starts after the write completed sees it.
//! - Two writes to one block in flight at once (legal; which one wins is
//!   undefined) leave it `CHECKSUM_UNKNOWN`, as does a failed write; the
//!   next read adopts what the block holds.
//! - A read reports a mismatch only if no write to the block began or was
//!   in flight from before its device read until the check: a read racing
//!   a write is retried, never reported as corruption.
//!
//! Writes in flight are counted per slot of a hashed table (a collision
//! costs only a spurious `CHECKSUM_UNKNOWN` or a retry). Each slot holds
//! a count (bits 0..14), an overlap flag (bit 15) and a generation that
//! every write start advances (bits 16..31).

use crate::engine::Store;
use crate::error::IoError;
use crate::format::CHECKSUM_UNKNOWN;
use crate::{AlignedBuf, BLOCK_SIZE};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

const COUNT: u32 = 0x7fff;
const OVERLAP: u32 = 0x8000;
const GENERATION: u32 = 0x1_0000;
/// 256 KiB of counters: fits a core's L2, and two of 128 writes in flight
/// collide on a slot about once in 500.
const SLOTS: usize = 1 << 16;

/// The CRC32C of a 4 KiB block of zeros: what every block of a clean
/// extent holds.
pub(crate) fn zero_block_crc() -> u32 {
    static ZERO: OnceLock<u32> = OnceLock::new();
    *ZERO.get_or_init(|| crc32c::crc32c(&[0u8; BLOCK_SIZE as usize]))
}

/// The writers-in-flight state of a block, sampled before a read.
#[derive(Clone, Copy)]
pub(crate) struct WriteSample(u32);

/// What a read's check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The data is what was last written (or the block's value was
    /// unknown and is now taken from it).
    Good,
    /// A write to the block began or was in flight meanwhile: read again.
    Racing,
    /// The block does not hold what was written to it.
    Corrupt { expected: u32, actual: u32 },
}

pub(crate) struct DataChecksums {
    values: Vec<AtomicU32>,
    writers: Box<[AtomicU32]>,
    /// Reads that found a block not holding what was written.
    mismatches: AtomicU64,
}

impl DataChecksums {
    /// `blocks` data blocks, every one holding zeros.
    pub fn new(blocks: u64) -> DataChecksums {
        let zero = zero_block_crc();
        DataChecksums {
            values: (0..blocks).map(|_| AtomicU32::new(zero)).collect(),
            writers: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
            mismatches: AtomicU64::new(0),
        }
    }

    pub fn get(&self, block: u64) -> u32 {
        self.values[block as usize].load(Ordering::Acquire)
    }

    /// Sets a block's value; only where no write to it can be in flight
    /// (at open, or under the volume's exclusive map lock).
    pub fn set(&self, block: u64, value: u32) {
        self.values[block as usize].store(value, Ordering::Release);
    }

    pub fn set_range(&self, first: u64, count: u64, value: u32) {
        for b in first..first + count {
            self.set(b, value);
        }
    }

    /// Counts a block found not holding what was written to it elsewhere
    /// than in `verify` (a packed extent's record).
    pub fn count_mismatch(&self) {
        self.mismatches.fetch_add(1, Ordering::Relaxed);
    }

    pub fn mismatches(&self) -> u64 {
        self.mismatches.load(Ordering::Relaxed)
    }

    fn slot(&self, block: u64) -> &AtomicU32 {
        let h = block.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48;
        &self.writers[h as usize % SLOTS]
    }

    /// Before a write to `block` is submitted: one atomic add (count and
    /// generation), and a second only when another write is in flight.
    pub fn begin_write(&self, block: u64) {
        let slot = self.slot(block);
        let old = slot.fetch_add(GENERATION + 1, Ordering::AcqRel);
        if old & COUNT != 0 {
            slot.fetch_or(OVERLAP, Ordering::AcqRel);
        }
    }

    /// After a write to `block` completed: `crc` is the value of what it
    /// wrote, `None` if it failed (the block's content is then unknown).
    pub fn end_write(&self, block: u64, crc: Option<u32>) {
        self.set(block, crc.unwrap_or(CHECKSUM_UNKNOWN));
        let slot = self.slot(block);
        let old = slot.fetch_sub(1, Ordering::AcqRel);
        if old & OVERLAP != 0 {
            self.set(block, CHECKSUM_UNKNOWN);
            if old & COUNT == 1 {
                // The last of the overlapping writers clears the flag,
                // unless a new writer came meanwhile: then the flag stays
                // and costs that writer an unknown value, never a wrong one.
                let now = old - 1;
                let _ =
                    slot.compare_exchange(now, now & !OVERLAP, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }

    /// Taken before the device read of `block` is submitted.
    pub fn sample(&self, block: u64) -> WriteSample {
        WriteSample(self.slot(block).load(Ordering::Acquire))
    }

    /// Checks `data`, just read from `block`, against the block's value.
    pub fn verify(&self, block: u64, data: &[u8], before: WriteSample) -> Verdict {
        let actual = crc32c::crc32c(data);
        let expected = self.get(block);
        if actual == expected {
            return Verdict::Good;
        }
        let after = self.slot(block).load(Ordering::Acquire);
        let quiet = before.0 == after && after & COUNT == 0;
        if !quiet {
            return Verdict::Racing;
        }
        if expected == CHECKSUM_UNKNOWN {
            // No write could have changed the block since the read: what it
            // holds now is its content. A write that starts meanwhile stores
            // its own value, and this exchange then fails.
            let _ = self.values[block as usize].compare_exchange(
                CHECKSUM_UNKNOWN,
                actual,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return Verdict::Good;
        }
        self.mismatches.fetch_add(1, Ordering::Relaxed);
        Verdict::Corrupt { expected, actual }
    }

    /// Before a write of `data` at data block `first` is submitted: its
    /// blocks' checksums, appended to `crcs`.
    pub fn begin_writes(&self, first: u64, data: &[u8], crcs: &mut Vec<u32>) {
        for (i, block) in data.chunks(BLOCK_SIZE as usize).enumerate() {
            crcs.push(crc32c::crc32c(block));
            self.begin_write(first + i as u64);
        }
    }

    /// After that write completed (`ok`) or failed.
    pub fn end_writes(&self, first: u64, crcs: &[u32], ok: bool) {
        for (i, &crc) in crcs.iter().enumerate() {
            self.end_write(first + i as u64, ok.then_some(crc));
        }
    }

    /// Before a read of `blocks` blocks at data block `first` is submitted.
    pub fn sample_blocks(&self, first: u64, blocks: u64, out: &mut Vec<WriteSample>) {
        out.extend((first..first + blocks).map(|b| self.sample(b)));
    }

    /// The values of blocks `first..first+count` (for a checksum page).
    pub fn values(&self, first: u64, count: u64) -> Vec<u32> {
        (first..first + count).map(|b| self.get(b)).collect()
    }

    pub fn blocks(&self) -> u64 {
        self.values.len() as u64
    }
}

/// Reads of a block that keep racing writes are retried this many times,
/// backing off, before the data is returned as it is (a read concurrent
/// with writes to the same block has no defined result anyway).
const RACING_RETRIES: u32 = 12;

impl Store {
    /// Checks `buf`, just read from device offset `offset` in the data
    /// region, block by block (`samples` taken before the read). A block
    /// that raced a write is read again; one that does not hold what was
    /// written is an error, logged and counted, never returned as data.
    pub(crate) fn verify_read(
        &self,
        sums: &DataChecksums,
        offset: u64,
        buf: &mut [u8],
        samples: &[WriteSample],
    ) -> Result<(), IoError> {
        let first = self.layout.data_block_at(offset);
        let b = BLOCK_SIZE as usize;
        for (i, (block, &before)) in buf.chunks_mut(b).zip(samples).enumerate() {
            let n = first + i as u64;
            let mut verdict = sums.verify(n, block, before);
            let mut bounce: Option<AlignedBuf> = None;
            let mut tries = 0;
            while verdict == Verdict::Racing && tries < RACING_RETRIES {
                tries += 1;
                if tries > 2 {
                    std::thread::sleep(Duration::from_micros(50 << tries.min(10)));
                }
                let again = bounce.get_or_insert_with(|| AlignedBuf::zeroed(b));
                let before = sums.sample(n);
                self.device.read_at(again, offset + (i * b) as u64)?;
                verdict = sums.verify(n, again, before);
                block.copy_from_slice(again);
            }
            if let Verdict::Corrupt { expected, actual } = verdict {
                let at = offset + (i * b) as u64;
                tracing::error!(
                    device_offset = at,
                    expected = format_args!("{expected:#010x}"),
                    actual = format_args!("{actual:#010x}"),
                    "data block fails its checksum; answering the read with an error"
                );
                return Err(IoError::Corrupt { offset: at });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crc(fill: u8) -> u32 {
        crc32c::crc32c(&[fill; 4096])
    }

    #[test]
    fn a_completed_write_verifies_and_a_changed_block_does_not() {
        let c = DataChecksums::new(8);
        assert_eq!(c.verify(3, &[0u8; 4096], c.sample(3)), Verdict::Good);
        c.begin_write(3);
        c.end_write(3, Some(crc(7)));
        assert_eq!(c.verify(3, &[7u8; 4096], c.sample(3)), Verdict::Good);
        assert!(matches!(
            c.verify(3, &[8u8; 4096], c.sample(3)),
            Verdict::Corrupt { .. }
        ));
        assert_eq!(c.mismatches(), 1);
    }

    #[test]
    fn a_read_racing_a_write_is_retried_not_reported() {
        let c = DataChecksums::new(8);
        let before = c.sample(2);
        c.begin_write(2);
        // In flight: whatever the read saw.
        assert_eq!(c.verify(2, &[5u8; 4096], before), Verdict::Racing);
        c.end_write(2, Some(crc(5)));
        // Began and completed during the read, which saw the old data.
        assert_eq!(c.verify(2, &[0u8; 4096], before), Verdict::Racing);
        assert_eq!(c.verify(2, &[5u8; 4096], c.sample(2)), Verdict::Good);
        assert_eq!(c.mismatches(), 0);
    }

    #[test]
    fn overlapping_writes_leave_the_block_unknown_until_read() {
        let c = DataChecksums::new(8);
        c.begin_write(1);
        c.begin_write(1);
        c.end_write(1, Some(crc(1)));
        c.end_write(1, Some(crc(2)));
        assert_eq!(c.get(1), CHECKSUM_UNKNOWN);
        // Whichever landed last is adopted by the next quiet read.
        assert_eq!(c.verify(1, &[1u8; 4096], c.sample(1)), Verdict::Good);
        assert_eq!(c.get(1), crc(1));
        // The slot is quiet again: a later single write is exact.
        c.begin_write(1);
        c.end_write(1, Some(crc(3)));
        assert_eq!(c.get(1), crc(3));
        c.begin_write(1);
        c.end_write(1, None);
        assert_eq!(c.get(1), CHECKSUM_UNKNOWN);
    }

    #[test]
    fn concurrent_writers_and_readers_never_see_corruption() {
        // Threads overwrite and read a few blocks of a shared buffer under
        // the same protocol the store uses; no read may report a mismatch.
        use std::sync::{Arc, Mutex};
        let c = Arc::new(DataChecksums::new(4));
        let disk = Arc::new(Mutex::new(vec![[0u8; 4096]; 4]));
        let mut threads = Vec::new();
        for t in 0..4u8 {
            let (c, disk) = (c.clone(), disk.clone());
            threads.push(std::thread::spawn(move || {
                for i in 0..2000u32 {
                    let block = (i % 4) as u64;
                    if (i + t as u32).is_multiple_of(3) {
                        let fill = [t.wrapping_mul(31).wrapping_add(i as u8); 4096];
                        c.begin_write(block);
                        disk.lock().unwrap()[block as usize] = fill;
                        c.end_write(block, Some(crc32c::crc32c(&fill)));
                    } else {
                        loop {
                            let before = c.sample(block);
                            let data = disk.lock().unwrap()[block as usize];
                            match c.verify(block, &data, before) {
                                Verdict::Good => break,
                                Verdict::Racing => std::thread::yield_now(),
                                Verdict::Corrupt { .. } => panic!("false mismatch"),
                            }
                        }
                    }
                }
            }));
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.mismatches(), 0);
    }
}
