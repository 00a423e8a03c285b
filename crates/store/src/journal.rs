//! The metadata journal's bookkeeping: a ring of 4 KiB blocks, each holding
//! up to `JOURNAL_ENTRIES_PER_BLOCK` entries under its own sequence number
//! and CRC. Block `seq` lives at ring position `seq % journal_blocks`.
//!
//! Invariant: blocks `tail_seq .. head_seq` are on disk (durable once the
//! commit writing them flushed) and not yet covered by the tables; the
//! superblock's tail is only advanced by a checkpoint after the tables it
//! covers are durable. Every block of this open carries `epoch`.

use crate::buf::AlignedBuf;
use crate::format::{encode_journal_block, pack_journal_blocks, JournalEntry, PAGE};

pub(crate) struct Journal {
    pub store_id: uuid::Uuid,
    pub ring_blocks: u64,
    pub head_seq: u64,
    pub tail_seq: u64,
    pub epoch: u64,
    /// Generation of the last superblock written.
    pub generation: u64,
}

impl Journal {
    pub fn used_blocks(&self) -> u64 {
        self.head_seq - self.tail_seq
    }

    /// How many more blocks fit without overwriting blocks the tables do
    /// not cover yet.
    pub fn room(&self) -> u64 {
        self.ring_blocks - 1 - self.used_blocks()
    }

    /// How many of `entries` (from the front) fit in `blocks` blocks.
    pub fn entries_fitting(entries: &[JournalEntry], blocks: u64) -> usize {
        let packed = pack_journal_blocks(entries);
        match packed.get(blocks as usize) {
            Some(next) => next.start,
            None => entries.len(),
        }
    }

    /// Encodes `entries` as consecutive blocks starting at `head_seq` and
    /// returns the (device offset, byte range in `buf`) writes needed, split
    /// where the ring wraps.
    pub fn encode(
        &self,
        entries: &[JournalEntry],
        journal_offset: u64,
        buf: &mut AlignedBuf,
    ) -> Vec<(u64, std::ops::Range<usize>)> {
        let packed = pack_journal_blocks(entries);
        let blocks = packed.len();
        buf.set_len(blocks * PAGE as usize);
        for (i, range) in packed.into_iter().enumerate() {
            let at = i * PAGE as usize;
            encode_journal_block(
                self.store_id,
                self.epoch,
                self.head_seq + i as u64,
                self.head_seq,
                &entries[range],
                &mut buf[at..at + PAGE as usize],
            );
        }
        let first_pos = self.head_seq % self.ring_blocks;
        let until_wrap = (self.ring_blocks - first_pos) as usize;
        let off = |pos: u64| journal_offset + pos * PAGE;
        if blocks <= until_wrap {
            vec![(off(first_pos), 0..blocks * PAGE as usize)]
        } else {
            let split = until_wrap * PAGE as usize;
            vec![
                (off(first_pos), 0..split),
                (off(0), split..blocks * PAGE as usize),
            ]
        }
    }
}
