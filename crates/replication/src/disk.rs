//! A node's local disk queue.
//!
//! Job: issue a node's disk operations in submission order while letting
//! independent ones run concurrently, and retry transient I/O errors.
//!
//! Invariants:
//! - two operations on overlapping blocks, one of them a write, never run at
//!   the same time, and the earlier-submitted one is issued first (so every
//!   replica applies overlapping writes in stream order);
//! - a flush is issued only once every earlier write (zeroing included) has
//!   completed, so it makes all of them durable;
//! - a grow and the layer operations but deletion (snapshot, rebase,
//!   changed regions) run alone: each is issued once nothing is in flight,
//!   and nothing submitted after it is issued before it completed (so no
//!   operation beyond the old end reaches a disk that has not grown yet,
//!   and a snapshot holds exactly the writes submitted before it);
//! - a read of a snapshot layer, a layer deletion, a flatten and a
//!   compaction conflict with nothing but those, and with each other but
//!   for two reads (a layer does not change; a deletion changes what no
//!   head reads, a flatten and a compaction no content, and all may take
//!   long: writes go on beside them);
//! - a log save (`SaveLogs`) is issued only when no other one is in flight
//!   (so saves complete in submission order), and no write submitted after
//!   it is issued before it completed (so a write's region is on disk in
//!   the crash-safe log before the write can reach the disk);
//! - an operation that fails is issued again, unchanged, under the same id,
//!   except a write or zeroing the store has no space for: that one ends
//!   (`Completion::NoSpace`), as retrying it would fail the same way until
//!   space is freed, and nothing more is issued until the caller has
//!   dropped what must not follow it (`drop_pending`) and calls `resume`.

use crate::msg::{Action, DiskOp, DiskResult, IoId};

/// How a finished disk operation ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Completion {
    /// Done, with the data of a read.
    Done(Option<Vec<u8>>),
    /// A read whose data fails its checksum.
    Corrupt,
    /// A write or zeroing the store had no space for.
    NoSpace,
}
use std::collections::{BTreeMap, VecDeque};

pub(crate) struct DiskQueue<T> {
    block_len: u64,
    next_id: IoId,
    pending: VecDeque<(IoId, DiskOp, T)>,
    inflight: BTreeMap<IoId, (DiskOp, T)>,
}

impl<T> DiskQueue<T> {
    /// Operation `id` while it is issued and not completed.
    pub(crate) fn op(&self, id: IoId) -> Option<&DiskOp> {
        self.inflight.get(&id).map(|(op, _)| op)
    }

    /// Every operation not completed yet, queued or issued.
    pub(crate) fn ops(&self) -> impl Iterator<Item = (&DiskOp, &T)> {
        self.pending
            .iter()
            .map(|(_, op, tag)| (op, tag))
            .chain(self.inflight.values().map(|(op, tag)| (op, tag)))
    }

    /// The tag of operation `id` while it is issued and not completed.
    pub(crate) fn tag(&self, id: IoId) -> Option<&T> {
        self.inflight.get(&id).map(|(_, t)| t)
    }

    /// The logs of the newest log save submitted and not issued yet (it
    /// waits behind the save in flight): what it will write may still grow,
    /// and every operation submitted from now on is issued after it.
    pub(crate) fn waiting_save(&mut self) -> Option<&mut crate::node::SavedLogs> {
        self.pending
            .iter_mut()
            .rev()
            .find_map(|(_, op, _)| match op {
                DiskOp::SaveLogs { logs } => Some(logs),
                _ => None,
            })
    }
}

fn range(op: &DiskOp, block_len: u64) -> Option<(u64, u64)> {
    match op {
        DiskOp::Write { lba, data, .. } => Some((*lba, data.len() as u64 / block_len.max(1))),
        DiskOp::Read { lba, blocks } | DiskOp::WriteZeroes { lba, blocks, .. } => {
            Some((*lba, *blocks))
        }
        DiskOp::Flush
        | DiskOp::Grow { .. }
        | DiskOp::SaveLogs { .. }
        | DiskOp::Snapshot { .. }
        | DiskOp::DeleteLayer { .. }
        | DiskOp::Rebase { .. }
        | DiskOp::Changed { .. }
        | DiskOp::ReadLayer { .. }
        | DiskOp::Flatten { .. }
        | DiskOp::Compact { .. } => None,
    }
}

/// Whether `op` is a layer operation that runs beside writes (a layer
/// read, deletion, flatten or compaction): those wait for each other,
/// except that layer reads go on together.
fn is_side_layer_op(op: &DiskOp) -> bool {
    matches!(
        op,
        DiskOp::ReadLayer { .. }
            | DiskOp::DeleteLayer { .. }
            | DiskOp::Flatten { .. }
            | DiskOp::Compact { .. }
    )
}

/// Whether `op` changes blocks (and so must not overlap any other
/// operation, and must complete before a flush is issued).
fn is_write(op: &DiskOp) -> bool {
    matches!(op, DiskOp::Write { .. } | DiskOp::WriteZeroes { .. })
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

impl<T> DiskQueue<T> {
    pub(crate) fn new(block_len: u64) -> Self {
        DiskQueue {
            block_len,
            next_id: 1,
            pending: VecDeque::new(),
            inflight: BTreeMap::new(),
        }
    }

    /// Queues `op`; returns its id.
    pub(crate) fn submit(&mut self, op: DiskOp, tag: T, out: &mut Vec<Action>) -> IoId {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.push_back((id, op, tag));
        self.pump(out);
        id
    }

    fn issuable(&self, op: &DiskOp) -> bool {
        if op.runs_alone() {
            return self.inflight.is_empty();
        }
        let (mut alone, mut saving) = (false, false);
        for (o, _) in self.inflight.values() {
            alone |= o.runs_alone();
            saving |= matches!(o, DiskOp::SaveLogs { .. });
        }
        if alone {
            return false;
        }
        if is_side_layer_op(op) {
            let read = |o: &DiskOp| matches!(o, DiskOp::ReadLayer { .. });
            return !self
                .inflight
                .values()
                .any(|(o, _)| is_side_layer_op(o) && !(read(op) && read(o)));
        }
        let writes = is_write(op);
        if matches!(op, DiskOp::SaveLogs { .. }) {
            return !saving;
        }
        // Pending operations are issued in order, so a save in flight was
        // submitted before this write.
        if writes && saving {
            return false;
        }
        match range(op, self.block_len) {
            None => !self.inflight.values().any(|(o, _)| is_write(o)),
            Some(r) => !self.inflight.values().any(|(o, _)| {
                (writes || is_write(o)) && range(o, self.block_len).is_some_and(|q| overlaps(q, r))
            }),
        }
    }

    fn pump(&mut self, out: &mut Vec<Action>) {
        while let Some((_, op, _)) = self.pending.front() {
            if !self.issuable(op) {
                break;
            }
            let Some((id, op, tag)) = self.pending.pop_front() else {
                break;
            };
            out.push(Action::Disk { id, op: op.clone() });
            self.inflight.insert(id, (op, tag));
        }
    }

    /// Handles a completion; returns the tag, operation and outcome of a
    /// finished operation (None for unknown ids and retried errors).
    pub(crate) fn complete(
        &mut self,
        id: IoId,
        result: DiskResult,
        out: &mut Vec<Action>,
    ) -> Option<(T, DiskOp, Completion)> {
        let no_space = result == DiskResult::NoSpace
            && self.inflight.get(&id).is_some_and(|(op, _)| is_write(op));
        let outcome = match result {
            DiskResult::NoSpace if no_space => Completion::NoSpace,
            // Nothing but a write allocates: anything else is retried.
            DiskResult::Error | DiskResult::NoSpace => {
                if let Some((op, _)) = self.inflight.get(&id) {
                    out.push(Action::Disk { id, op: op.clone() });
                }
                return None;
            }
            DiskResult::Done { data } => Completion::Done(data),
            DiskResult::Corrupt => Completion::Corrupt,
        };
        let (op, tag) = self.inflight.remove(&id)?;
        if outcome != Completion::NoSpace {
            self.pump(out);
        }
        Some((tag, op, outcome))
    }

    /// Issues what may go now (after a `NoSpace` completion).
    pub(crate) fn resume(&mut self, out: &mut Vec<Action>) {
        self.pump(out);
    }

    /// Removes the operations not issued yet whose tag and operation match
    /// `drop`; returns them.
    pub(crate) fn drop_pending(
        &mut self,
        mut drop: impl FnMut(&T, &DiskOp) -> bool,
    ) -> Vec<(DiskOp, T)> {
        let mut dropped = Vec::new();
        let mut kept = VecDeque::with_capacity(self.pending.len());
        for (id, op, tag) in std::mem::take(&mut self.pending) {
            if drop(&tag, &op) {
                dropped.push((op, tag));
            } else {
                kept.push_back((id, op, tag));
            }
        }
        self.pending = kept;
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_writes_are_serialized_and_flush_waits() {
        let mut q = DiskQueue::new(1);
        let mut out = Vec::new();
        let w = |lba| DiskOp::Write {
            lba,
            data: vec![0; 2].into(),
            fua: false,
        };
        q.submit(w(0), 1, &mut out);
        q.submit(w(4), 2, &mut out);
        q.submit(w(1), 3, &mut out); // overlaps the first
        q.submit(DiskOp::Flush, 4, &mut out);
        assert_eq!(out.len(), 2);
        out.clear();
        assert_eq!(q.complete(1, DiskResult::Error, &mut out), None);
        assert_eq!(out.len(), 1, "error retried");
        out.clear();
        assert_eq!(
            q.complete(1, DiskResult::Done { data: None }, &mut out)
                .map(|(tag, _, outcome)| (tag, outcome)),
            Some((1, Completion::Done(None)))
        );
        assert_eq!(out.len(), 1, "third write issued, flush still waits");
        out.clear();
        q.complete(2, DiskResult::Done { data: None }, &mut out);
        assert!(out.is_empty());
        q.complete(3, DiskResult::Done { data: None }, &mut out);
        assert_eq!(
            out,
            vec![Action::Disk {
                id: 4,
                op: DiskOp::Flush
            }]
        );
    }

    #[test]
    fn a_write_without_space_ends_and_lets_the_next_one_run() {
        let mut q = DiskQueue::new(1);
        let mut out = Vec::new();
        let w = |lba| DiskOp::Write {
            lba,
            data: vec![0; 2].into(),
            fua: false,
        };
        q.submit(w(0), 1, &mut out);
        q.submit(w(1), 2, &mut out); // overlaps the first
        q.submit(DiskOp::Flush, 3, &mut out);
        assert_eq!(out.len(), 1);
        out.clear();
        assert_eq!(
            q.complete(1, DiskResult::NoSpace, &mut out)
                .map(|(tag, _, outcome)| (tag, outcome)),
            Some((1, Completion::NoSpace)),
            "not retried"
        );
        assert!(out.is_empty(), "nothing issued before resume: {out:?}");
        q.resume(&mut out);
        assert_eq!(out, vec![Action::Disk { id: 2, op: w(1) }]);
        out.clear();
        // A flush cannot lack space: retried like any error.
        q.complete(2, DiskResult::Done { data: None }, &mut out);
        assert_eq!(out.len(), 1);
        out.clear();
        assert_eq!(q.complete(3, DiskResult::NoSpace, &mut out), None);
        assert_eq!(
            out,
            vec![Action::Disk {
                id: 3,
                op: DiskOp::Flush
            }]
        );
    }

    #[test]
    fn grow_runs_alone() {
        let mut q = DiskQueue::new(1);
        let mut out = Vec::new();
        let w = |lba| DiskOp::Write {
            lba,
            data: vec![0; 1].into(),
            fua: false,
        };
        q.submit(DiskOp::Read { lba: 0, blocks: 1 }, 1, &mut out);
        q.submit(DiskOp::Grow { blocks: 32 }, 2, &mut out);
        q.submit(w(20), 3, &mut out); // beyond the old end
        q.submit(w(1), 4, &mut out);
        assert_eq!(out.len(), 1, "the grow waits for the read: {out:?}");
        out.clear();
        q.complete(1, DiskResult::Done { data: None }, &mut out);
        assert_eq!(
            out,
            vec![Action::Disk {
                id: 2,
                op: DiskOp::Grow { blocks: 32 }
            }],
            "nothing is issued beside the grow"
        );
        out.clear();
        q.complete(2, DiskResult::Error, &mut out);
        assert_eq!(out.len(), 1, "a failed grow is retried, alone");
        out.clear();
        q.complete(2, DiskResult::Done { data: None }, &mut out);
        assert_eq!(out.len(), 2, "both writes follow the grow: {out:?}");
    }
}
