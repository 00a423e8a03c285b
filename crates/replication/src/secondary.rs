//! The secondary replica of one volume.
//!
//! Job: apply the primary's replication stream to the local disk, in order,
//! and acknowledge each entry once it is done.
//!
//! Invariants:
//! - a message from an older epoch is refused (answered `Fenced`) and never
//!   applied: a deposed primary cannot write here;
//! - a message from a newer epoch makes the secondary adopt that epoch and
//!   drop the old stream;
//! - within an epoch only the newest session (stream) is applied, entries in
//!   `lseq` order with no gaps;
//! - a write (or zeroing) is acknowledged after its disk write completed (a
//!   FUA write after it completed durably), a flush after the disk flush that
//!   follows every earlier write of the stream.

use crate::msg::{DiskOp, Endpoint, Msg, ReplOp};
use crate::types::{Epoch, NodeId, VolumeId};
use std::collections::BTreeMap;

/// Tag of a disk operation the secondary issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SecTag {
    epoch: Epoch,
    session: u64,
    lseq: u64,
}

pub(crate) struct Secondary {
    vol: VolumeId,
    pub(crate) epoch: Epoch,
    session: Option<u64>,
    next_lseq: u64,
    primary: Option<NodeId>,
    buffer: BTreeMap<u64, ReplOp>,
}

impl Secondary {
    /// `stream`: the session already open (a fresh volume starts with
    /// session 0 open on every InSync replica), or None to wait for a Start.
    pub(crate) fn new(vol: VolumeId, epoch: Epoch, stream: Option<(NodeId, u64)>) -> Self {
        Secondary {
            vol,
            epoch,
            session: stream.map(|s| s.1),
            next_lseq: 1,
            primary: stream.map(|s| s.0),
            buffer: BTreeMap::new(),
        }
    }

    /// Adopts a newer epoch learned from the membership record.
    pub(crate) fn adopt(&mut self, epoch: Epoch) {
        if epoch > self.epoch {
            self.epoch = epoch;
            self.session = None;
            self.primary = None;
            self.buffer.clear();
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_repl(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        session: u64,
        lseq: u64,
        op: ReplOp,
        sends: &mut Vec<(Endpoint, Msg)>,
        disk: &mut Vec<(DiskOp, SecTag)>,
    ) {
        if epoch < self.epoch {
            sends.push((
                Endpoint::Node(from),
                Msg::Fenced {
                    vol: self.vol,
                    epoch: self.epoch,
                },
            ));
            return;
        }
        self.adopt(epoch);
        if op == ReplOp::Start {
            if lseq == 0 && self.session.is_none_or(|s| session >= s) {
                if self.session != Some(session) {
                    self.session = Some(session);
                    self.next_lseq = 1;
                    self.buffer.clear();
                }
                self.primary = Some(from);
                sends.push((Endpoint::Node(from), self.ack(session, 0)));
            }
            return;
        }
        if self.session != Some(session) || lseq < self.next_lseq {
            return;
        }
        self.primary = Some(from);
        self.buffer.insert(lseq, op);
        while let Some(op) = self.buffer.remove(&self.next_lseq) {
            let tag = SecTag {
                epoch: self.epoch,
                session,
                lseq: self.next_lseq,
            };
            self.next_lseq += 1;
            match op {
                ReplOp::Start => {}
                ReplOp::Write { lba, data, fua } => {
                    disk.push((DiskOp::Write { lba, data, fua }, tag))
                }
                ReplOp::Flush => disk.push((DiskOp::Flush, tag)),
                ReplOp::WriteZeroes { lba, blocks, fua } => {
                    disk.push((DiskOp::WriteZeroes { lba, blocks, fua }, tag))
                }
            }
        }
    }

    fn ack(&self, session: u64, lseq: u64) -> Msg {
        Msg::ReplAck {
            vol: self.vol,
            epoch: self.epoch,
            session,
            lseq,
        }
    }

    pub(crate) fn on_disk_done(&mut self, tag: SecTag, sends: &mut Vec<(Endpoint, Msg)>) {
        if tag.epoch != self.epoch || self.session != Some(tag.session) {
            return;
        }
        if let Some(p) = self.primary {
            sends.push((Endpoint::Node(p), self.ack(tag.session, tag.lseq)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(b: u8) -> ReplOp {
        ReplOp::Write {
            lba: 0,
            data: vec![b],
            fua: false,
        }
    }

    #[test]
    fn fences_old_epochs_and_applies_in_order() {
        let p = NodeId(0);
        let mut s = Secondary::new(VolumeId(1), Epoch(2), Some((p, 0)));
        let (mut sends, mut disk) = (Vec::new(), Vec::new());
        s.on_repl(p, Epoch(1), 0, 1, w(1), &mut sends, &mut disk);
        assert_eq!(
            sends,
            vec![(
                Endpoint::Node(p),
                Msg::Fenced {
                    vol: VolumeId(1),
                    epoch: Epoch(2)
                }
            )]
        );
        assert!(disk.is_empty());
        sends.clear();
        s.on_repl(p, Epoch(2), 0, 2, w(2), &mut sends, &mut disk);
        assert!(disk.is_empty(), "gap: lseq 1 missing");
        s.on_repl(p, Epoch(2), 0, 1, w(1), &mut sends, &mut disk);
        assert_eq!(disk.len(), 2);
        assert_eq!(
            disk[0].0,
            DiskOp::Write {
                lba: 0,
                data: vec![1],
                fua: false
            }
        );
        // A newer epoch drops the stream until a Start.
        s.on_repl(NodeId(1), Epoch(3), 0, 3, w(3), &mut sends, &mut disk);
        assert_eq!(disk.len(), 2);
        s.on_repl(
            NodeId(1),
            Epoch(3),
            5,
            0,
            ReplOp::Start,
            &mut sends,
            &mut disk,
        );
        s.on_repl(NodeId(1), Epoch(3), 5, 1, w(4), &mut sends, &mut disk);
        assert_eq!(disk.len(), 3);
        s.on_disk_done(disk[2].1, &mut sends);
        assert_eq!(
            sends.last(),
            Some(&(
                Endpoint::Node(NodeId(1)),
                Msg::ReplAck {
                    vol: VolumeId(1),
                    epoch: Epoch(3),
                    session: 5,
                    lseq: 1
                }
            ))
        );
        // The old epoch's completion is not acknowledged.
        let n = sends.len();
        s.on_disk_done(disk[0].1, &mut sends);
        assert_eq!(sends.len(), n);
    }
}
