//! Compare-and-write on the primary (`ClientReq::CompareWrite`).
//!
//! Job: compare blocks with what a client expects and write the ones that
//! match, at one point of the write stream, with nothing new on the
//! replicas' side: the primary reads its own copy, compares, and streams
//! what it writes as an ordinary client write.
//!
//! Invariants:
//! - the read sees every write sent before the request: the disk queue
//!   issues overlapping operations in the order they were submitted;
//! - from the read's issue until its write is streamed (or it is answered
//!   without one), every later client request is held (`Primary::gate`):
//!   none can be ordered between the compare and the write;
//! - the write covers the first to the last block written, with the
//!   blocks between that did not match written as they were read (the
//!   same content), so it is one stream entry;
//! - a block of the local copy that fails its checksum is repaired from an
//!   in-sync replica before it is compared (the read is a client read);
//!   if no replica has a good copy, the request is answered `Unreadable`
//!   and nothing is written.

use super::{Kind, Out, Primary};
use crate::msg::{ClientReply, ClientReq, CompareWritten, DiskOp};
use crate::payload::{self, Payload};
use std::collections::BTreeSet;

/// A compare-and-write whose read is in flight.
pub(crate) struct PendingCompare {
    lba: u64,
    blocks: u64,
    /// Expected blocks, then the blocks to write.
    both: Payload,
    whole: bool,
    fua: bool,
}

impl Primary {
    /// Issues a compare-and-write's read and closes the gate behind it (a
    /// malformed one is answered `NotPrimary`, as a malformed write is).
    pub(super) fn start_compare(&mut self, id: u64, req: ClientReq, out: &mut Out) {
        let ClientReq::CompareWrite {
            lba,
            both,
            whole,
            fua,
        } = req
        else {
            return;
        };
        let block = self.cfg.block_len.max(1);
        let blocks = both.len() as u64 / 2 / block;
        if blocks == 0
            || both.len() as u64 != 2 * blocks * block
            || lba
                .checked_add(blocks)
                .is_none_or(|end| end > self.cfg.volume_blocks)
        {
            return self.reply(id, ClientReply::NotPrimary, out);
        }
        let vseq = self.next_vseq;
        self.next_vseq += 1;
        let read = DiskOp::Read { lba, blocks };
        self.queue_op(
            id,
            vseq,
            Kind::Read,
            BTreeSet::new(),
            Vec::new(),
            Some((lba, blocks)),
            read,
            out,
        );
        if let Some(op) = self.ops.get_mut(&vseq) {
            op.compare = Some(Box::new(PendingCompare {
                lba,
                blocks,
                both,
                whole,
                fua,
            }));
        }
        self.gate = Some(vseq);
    }

    /// Once the gated read is done: compares, streams the write (or
    /// answers), and opens the gate.
    pub(super) fn finish_compare(&mut self, now: u64, out: &mut Out) {
        let Some(vseq) = self.gate else {
            return;
        };
        if self.ops.get(&vseq).is_some_and(|op| !op.local_done) {
            return;
        }
        self.gate = None;
        let Some(op) = self.ops.remove(&vseq) else {
            return;
        };
        let Some(cw) = op.compare else {
            return;
        };
        let (id, by, epoch) = (op.client_id, self.me, self.epoch);
        let block = self.cfg.block_len.max(1) as usize;
        let n = cw.blocks as usize;
        let current = match op.data {
            Some(data) if !op.unreadable && data.len() == n * block => data,
            _ => return self.reply(id, ClientReply::Unreadable { by, epoch }, out),
        };
        let (expect, new) = cw.both.split_at(n * block);
        let matched: Vec<bool> = (0..n)
            .map(|i| current[i * block..(i + 1) * block] == expect[i * block..(i + 1) * block])
            .collect();
        let first = matched.iter().position(|m| *m);
        let last = matched.iter().rposition(|m| *m);
        let written = match (first, last) {
            (Some(_), Some(_)) => !cw.whole || matched.iter().all(|m| *m),
            _ => false,
        };
        let (Some(first), Some(last), true) = (first, last, written) else {
            let data = Some(CompareWritten { matched, written }.encode());
            return self.reply(id, ClientReply::Ok { by, epoch, data }, out);
        };
        let mut data = Vec::with_capacity((last - first + 1) * block);
        for i in first..=last {
            let src = if matched[i] { new } else { current.as_slice() };
            data.extend_from_slice(&src[i * block..(i + 1) * block]);
        }
        let answer = CompareWritten { matched, written }.encode();
        let write = ClientReq::Write {
            lba: cw.lba + first as u64,
            data: payload::aligned(&data),
            fua: cw.fua,
        };
        let before = self.next_vseq;
        self.serve(now, id, write, true, out);
        if let Some(op) = self.ops.get_mut(&before) {
            op.answer = Some(answer);
        }
    }
}
