//! Scrub: reads every written block of a volume and checks it against its
//! checksum, so that damage is found before a client reads it (or before
//! the only other copy is lost), at a bounded rate.
//!
//! Invariants: a scrub reads through the same checked path as a client
//! read (a block racing a client write is read again, never reported), and
//! holds the volume's map lock shared one extent at a time, so client I/O,
//! TRIM and resize interleave with it.

use crate::buf::AlignedBuf;
use crate::device::IoOp;
use crate::error::IoError;
use crate::volume::{LocalVolume, MapEntry};
use crate::BLOCK_SIZE;
use std::time::{Duration, Instant};

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Bytes read and checked (allocated extents only).
    pub bytes_checked: u64,
    /// Volume offsets of 4 KiB blocks that fail their checksum.
    pub bad_blocks: Vec<u64>,
    /// False for a store without data checksums: nothing could be checked.
    pub checksums: bool,
}

impl LocalVolume {
    /// Reads and checks every allocated block of the extents that overlap
    /// `range` (of the volume's address space), at most `rate` bytes per
    /// second if given; `progress(done, total)` after every extent (bytes of
    /// allocated extents in the range).
    pub fn scrub(
        &self,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ScrubReport, IoError> {
        let store = self.store();
        let Some(sums) = store.checksums.as_ref() else {
            return Ok(ScrubReport::default());
        };
        let layout = store.layout;
        let es = layout.extent_size as u64;
        let (first, end) = {
            let map = self.state().map.read();
            let end = range.end.div_ceil(es).min(map.len() as u64) as usize;
            ((range.start / es) as usize, end)
        };
        let total = {
            let map = self.state().map.read();
            (first..end)
                .filter(|&l| map.get(l).and_then(MapEntry::get).is_some())
                .count() as u64
                * es
        };
        let mut report = ScrubReport {
            checksums: true,
            ..ScrubReport::default()
        };
        let mut buf = AlignedBuf::zeroed(es as usize);
        let started = Instant::now();
        let b = BLOCK_SIZE as usize;
        for logical in first..end {
            {
                let map = self.state().map.read();
                if self.state().is_deleted() {
                    return Err(IoError::Gone);
                }
                let Some(phys) = map.get(logical).and_then(MapEntry::get) else {
                    continue;
                };
                let at = layout.extent_offset(phys);
                let mut samples = Vec::with_capacity(buf.len() / b);
                sums.sample_blocks(layout.data_block_at(at), es / BLOCK_SIZE, &mut samples);
                let mut ops = [IoOp::read(at, &mut buf)];
                store.device.submit(&mut ops);
                let [op] = ops;
                op.result?;
                for (i, block) in buf.chunks_mut(b).enumerate() {
                    let off = at + (i * b) as u64;
                    match store.verify_read(sums, off, block, &samples[i..i + 1]) {
                        Ok(()) => {}
                        Err(IoError::Corrupt { .. }) => {
                            report.bad_blocks.push(logical as u64 * es + (i * b) as u64)
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            report.bytes_checked += es;
            progress(report.bytes_checked, total.max(report.bytes_checked));
            if let Some(rate) = rate.filter(|&r| r > 0) {
                let due = Duration::from_secs_f64(report.bytes_checked as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
        Ok(report)
    }
}
