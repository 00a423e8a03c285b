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
//! - every write or copy received in an epoch is in that epoch's
//!   [`Uncertain`] log until a `floor` passes it; the log of the epoch
//!   before the current one is kept and reported in `ReplStarted` to the
//!   next primary that opens a stream (a new epoch's `Repl` starts a new
//!   log, never an epoch learned from the record alone); a deposed primary
//!   starts as a secondary holding its own log of its epoch;
//! - a `Rebase` counts as a write of every region in that log (it changes
//!   what the head reads anywhere), so a replica whose head was rebased is
//!   resynced in full if it is not resynced by the primary that rebased it;
//! - layer operations (snapshot, deletion, rebase) are applied in stream
//!   order like writes: the disk queue runs each alone, after every
//!   earlier entry and before every later one.
//! - an entry the store has no space for ends the stream here: the
//!   primary is told (`ReplNoSpace`) and nothing more of that session is
//!   applied or acknowledged (acknowledging later entries would claim a
//!   stream with a hole), and no snapshot of it queued behind the entry is
//!   taken (the node drops it from the disk queue); the next `Start` opens
//!   a new one, whose resync copies what this replica missed.

use crate::msg::{DiskOp, Endpoint, Msg, ReplOp};
use crate::types::{Epoch, LayerId, NodeId, VolumeId};
use crate::uncertain::Uncertain;
use crate::Config;
use std::collections::{BTreeMap, VecDeque};

/// Tag of a disk operation the secondary issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SecTag {
    epoch: Epoch,
    session: u64,
    lseq: u64,
    /// The read of a `Digest`: answered with the checksum of its data.
    digest: bool,
    /// A background entry (layer deletion, flatten): remembered once done,
    /// to acknowledge again if the primary repeats it.
    background: bool,
}

impl SecTag {
    /// Whether it is an entry of stream `session` of `epoch`.
    pub(crate) fn of_stream(&self, epoch: Epoch, session: u64) -> bool {
        (self.epoch, self.session) == (epoch, session)
    }

    /// Whether both are entries of one stream.
    pub(crate) fn same_stream(&self, other: &SecTag) -> bool {
        (self.epoch, self.session) == (other.epoch, other.session)
    }
}

pub(crate) struct Secondary {
    vol: VolumeId,
    pub(crate) epoch: Epoch,
    session: Option<u64>,
    next_lseq: u64,
    primary: Option<NodeId>,
    buffer: BTreeMap<u64, ReplOp>,
    /// The writes received from the newest epoch's primary that streamed
    /// here, and from the one before.
    cur: Option<Uncertain>,
    prev: Option<Uncertain>,
    region_blocks: u64,
    block_len: u64,
    volume_blocks: u64,
    limit: usize,
    /// An epoch this node restarted in without any log: the log it begins
    /// for it is incomplete.
    partial: Option<Epoch>,
    /// The session this replica left for lack of space.
    left: Option<u64>,
    /// The background entries of the current session completed here, the
    /// newest [`BACKGROUND_DONE_KEPT`] (see `SecTag::background`).
    background_done: VecDeque<u64>,
}

/// How many completed background entries a secondary remembers: far more
/// than a primary has in flight at once.
const BACKGROUND_DONE_KEPT: usize = 256;

/// The fields of a `Repl`.
pub(crate) struct ReplIn {
    pub(crate) from: NodeId,
    pub(crate) epoch: Epoch,
    pub(crate) session: u64,
    pub(crate) lseq: u64,
    pub(crate) vseq: u64,
    pub(crate) commit: u64,
    pub(crate) floor: u64,
    pub(crate) op: ReplOp,
}

impl Secondary {
    /// `stream`: the session already open (a fresh volume starts with
    /// session 0 open on every InSync replica), or None to wait for a Start.
    pub(crate) fn new(
        vol: VolumeId,
        epoch: Epoch,
        stream: Option<(NodeId, u64)>,
        cfg: &Config,
    ) -> Self {
        Secondary {
            vol,
            epoch,
            session: stream.map(|s| s.1),
            next_lseq: 1,
            primary: stream.map(|s| s.0),
            buffer: BTreeMap::new(),
            cur: stream.map(|_| Uncertain::new(epoch, cfg.uncertain_limit)),
            prev: None,
            partial: None,
            background_done: VecDeque::new(),
            left: None,
            region_blocks: cfg.region_blocks.max(1),
            block_len: cfg.block_len.max(1),
            volume_blocks: cfg.volume_blocks,
            limit: cfg.uncertain_limit,
        }
    }

    /// Keeps `log` (this node's own, as the primary it was) to report to
    /// the next epoch's primary, as if it had received that stream.
    pub(crate) fn remember(&mut self, log: Uncertain) {
        self.prev = Some(log);
    }

    /// Takes up the logs a clean stop saved (this node's disk holds
    /// everything they describe).
    pub(crate) fn restore(&mut self, cur: Option<Uncertain>, prev: Option<Uncertain>) {
        self.cur = cur;
        self.prev = prev;
    }

    /// This node restarted in `epoch` without any log: the log begun for
    /// it may lack what was received before (see `Uncertain::complete`).
    pub(crate) fn mark_partial(&mut self, epoch: Epoch) {
        self.partial = Some(epoch);
    }

    /// The logs as a clean stop saves them: (current, previous).
    pub(crate) fn logs(&self) -> (Option<&Uncertain>, Option<&Uncertain>) {
        (self.cur.as_ref(), self.prev.as_ref())
    }

    /// The log of the stream received in `epoch`, if any (for a promotion).
    pub(crate) fn take_log(&mut self, epoch: Epoch) -> Option<Uncertain> {
        if self.cur.as_ref().is_some_and(|u| u.epoch == epoch) {
            return self.cur.take();
        }
        self.prev.take().filter(|u| u.epoch == epoch)
    }

    /// A `Repl` of `epoch` (not older than ours) arrived: a newer epoch's
    /// stream gets a new log, the current one becomes the previous one.
    fn note_epoch(&mut self, epoch: Epoch) {
        if self.cur.as_ref().is_some_and(|u| u.epoch >= epoch) {
            return;
        }
        if let Some(c) = self.cur.take() {
            self.prev = Some(c);
        }
        let mut log = Uncertain::new(epoch, self.limit);
        log.complete = self.partial != Some(epoch);
        self.cur = Some(log);
    }

    fn regions_of(&self, op: &ReplOp) -> Vec<usize> {
        if op.rewrites_all() {
            let regions = self.volume_blocks.div_ceil(self.region_blocks) as usize;
            return (0..regions).collect();
        }
        let Some((lba, blocks)) = op.extent(self.block_len).filter(|(_, n)| *n > 0) else {
            return Vec::new();
        };
        let last = (lba.saturating_add(blocks) - 1).min(self.volume_blocks.saturating_sub(1));
        ((lba / self.region_blocks) as usize..=(last / self.region_blocks) as usize).collect()
    }

    /// The volume has (at least) `blocks` blocks now: the regions of
    /// writes up to there are logged.
    pub(crate) fn grow(&mut self, blocks: u64) {
        self.volume_blocks = self.volume_blocks.max(blocks);
    }

    /// Whether a `Start` of `session` in `epoch` opens a stream here (not
    /// fenced, not older than the current one).
    pub(crate) fn accepts_start(&self, epoch: Epoch, session: u64) -> bool {
        let current = if epoch > self.epoch {
            None
        } else {
            self.session
        };
        epoch >= self.epoch && current.is_none_or(|s| session >= s)
    }

    /// Adopts a newer epoch learned from the membership record.
    pub(crate) fn adopt(&mut self, epoch: Epoch) {
        if epoch > self.epoch {
            self.epoch = epoch;
            self.session = None;
            self.primary = None;
            self.buffer.clear();
            self.background_done.clear();
        }
    }

    /// `layers`: the clone source the local disk reads through, if any,
    /// and the snapshot layers it holds (once the operations submitted
    /// complete), reported at a `Start` in that order.
    pub(crate) fn on_repl(
        &mut self,
        r: ReplIn,
        layers: (Option<LayerId>, &[LayerId]),
        sends: &mut Vec<(Endpoint, Msg)>,
        disk: &mut Vec<(DiskOp, SecTag)>,
    ) {
        let ReplIn {
            from,
            epoch,
            session,
            lseq,
            vseq,
            commit,
            floor,
            op,
        } = r;
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
        self.note_epoch(epoch);
        if op == ReplOp::Start {
            if lseq == 0 && self.session.is_none_or(|s| session >= s) {
                if self.session != Some(session) {
                    self.session = Some(session);
                    self.next_lseq = 1;
                    self.buffer.clear();
                    self.background_done.clear();
                }
                self.primary = Some(from);
                sends.push((
                    Endpoint::Node(from),
                    Msg::ReplStarted {
                        vol: self.vol,
                        epoch: self.epoch,
                        session,
                        prior: self.prev.as_ref().and_then(Uncertain::report),
                        layers: layers
                            .0
                            .into_iter()
                            .chain(layers.1.iter().copied())
                            .collect(),
                    },
                ));
            }
            return;
        }
        if self.session == Some(session)
            && lseq < self.next_lseq
            && self.background_done.contains(&lseq)
        {
            // A background entry repeated: its acknowledgement was lost.
            sends.push((Endpoint::Node(from), self.ack(session, lseq)));
            return;
        }
        if self.session != Some(session) || lseq < self.next_lseq || self.left == Some(session) {
            return;
        }
        self.primary = Some(from);
        let regions = self.regions_of(&op);
        if let Some(u) = self.cur.as_mut() {
            u.on_repl(vseq, commit, floor, &regions);
        }
        self.buffer.insert(lseq, op);
        while let Some(op) = self.buffer.remove(&self.next_lseq) {
            let tag = SecTag {
                epoch: self.epoch,
                session,
                lseq: self.next_lseq,
                digest: matches!(op, ReplOp::Digest { .. }),
                background: op.is_background(),
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
                // A read, ordered by the disk queue after every earlier
                // write of the stream to these blocks and before every
                // later one, as the primary's own read of them is.
                ReplOp::Digest { lba, blocks } => disk.push((DiskOp::Read { lba, blocks }, tag)),
                ReplOp::Snapshot { layer } => disk.push((DiskOp::Snapshot { layer }, tag)),
                ReplOp::DeleteLayer { layer } => disk.push((DiskOp::DeleteLayer { layer }, tag)),
                ReplOp::Rebase { onto } => disk.push((DiskOp::Rebase { onto }, tag)),
                ReplOp::Flatten { lba, blocks, rate } => {
                    disk.push((DiskOp::Flatten { lba, blocks, rate }, tag))
                }
                ReplOp::Compact { lba, blocks, rate } => {
                    disk.push((DiskOp::Compact { lba, blocks, rate }, tag))
                }
            }
        }
    }

    /// Operation `tag`, a write, found no space in the store: this
    /// replica leaves the stream and tells the primary.
    pub(crate) fn on_disk_no_space(&mut self, tag: SecTag, sends: &mut Vec<(Endpoint, Msg)>) {
        if tag.epoch != self.epoch
            || self.session != Some(tag.session)
            || self.left == Some(tag.session)
        {
            return;
        }
        self.left = Some(tag.session);
        self.buffer.clear();
        if let Some(p) = self.primary {
            sends.push((
                Endpoint::Node(p),
                Msg::ReplNoSpace {
                    vol: self.vol,
                    epoch: self.epoch,
                    session: tag.session,
                    lseq: tag.lseq,
                },
            ));
        }
    }

    /// The last entry of stream `session` applied (handed to the disk in
    /// order), if that stream is the one open here (and was not left).
    pub(crate) fn applied(&self, session: u64) -> Option<u64> {
        (self.session == Some(session) && self.left != Some(session)).then(|| self.next_lseq - 1)
    }

    fn ack(&self, session: u64, lseq: u64) -> Msg {
        Msg::ReplAck {
            vol: self.vol,
            epoch: self.epoch,
            session,
            lseq,
        }
    }

    /// Operation `tag` completed: `data` is a read's (None if it failed
    /// its block checksums).
    pub(crate) fn on_disk_done(
        &mut self,
        tag: SecTag,
        data: Option<Vec<u8>>,
        sends: &mut Vec<(Endpoint, Msg)>,
    ) {
        if tag.epoch != self.epoch
            || self.session != Some(tag.session)
            || self.left == Some(tag.session)
        {
            return;
        }
        let Some(p) = self.primary else {
            return;
        };
        let msg = if tag.digest {
            Msg::ReplDigest {
                vol: self.vol,
                epoch: self.epoch,
                session: tag.session,
                lseq: tag.lseq,
                digest: data.as_deref().map(crate::msg::digest),
            }
        } else {
            if tag.background {
                if self.background_done.len() == BACKGROUND_DONE_KEPT {
                    self.background_done.pop_front();
                }
                self.background_done.push_back(tag.lseq);
            }
            self.ack(tag.session, tag.lseq)
        };
        sends.push((Endpoint::Node(p), msg));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::too_many_arguments)]
    fn on(
        s: &mut Secondary,
        from: NodeId,
        epoch: Epoch,
        session: u64,
        lseq: u64,
        op: ReplOp,
        sends: &mut Vec<(Endpoint, Msg)>,
        disk: &mut Vec<(DiskOp, SecTag)>,
    ) {
        let r = ReplIn {
            from,
            epoch,
            session,
            lseq,
            vseq: lseq,
            commit: 0,
            floor: 0,
            op,
        };
        s.on_repl(r, (None, &[]), sends, disk);
    }

    fn cfg() -> Config {
        Config {
            block_len: 1,
            region_blocks: 4,
            volume_blocks: 64,
            ..Config::default()
        }
    }

    fn w(b: u8) -> ReplOp {
        ReplOp::Write {
            lba: 0,
            data: vec![b].into(),
            fua: false,
        }
    }

    #[test]
    fn fences_old_epochs_and_applies_in_order() {
        let p = NodeId(0);
        let mut s = Secondary::new(VolumeId(1), Epoch(2), Some((p, 0)), &cfg());
        let (mut sends, mut disk) = (Vec::new(), Vec::new());
        on(&mut s, p, Epoch(1), 0, 1, w(1), &mut sends, &mut disk);
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
        on(&mut s, p, Epoch(2), 0, 2, w(2), &mut sends, &mut disk);
        assert!(disk.is_empty(), "gap: lseq 1 missing");
        on(&mut s, p, Epoch(2), 0, 1, w(1), &mut sends, &mut disk);
        assert_eq!(disk.len(), 2);
        assert_eq!(
            disk[0].0,
            DiskOp::Write {
                lba: 0,
                data: vec![1].into(),
                fua: false
            }
        );
        // A newer epoch drops the stream until a Start.
        on(
            &mut s,
            NodeId(1),
            Epoch(3),
            0,
            3,
            w(3),
            &mut sends,
            &mut disk,
        );
        assert_eq!(disk.len(), 2);
        on(
            &mut s,
            NodeId(1),
            Epoch(3),
            5,
            0,
            ReplOp::Start,
            &mut sends,
            &mut disk,
        );
        on(
            &mut s,
            NodeId(1),
            Epoch(3),
            5,
            1,
            w(4),
            &mut sends,
            &mut disk,
        );
        assert_eq!(disk.len(), 3);
        s.on_disk_done(disk[2].1, None, &mut sends);
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
        s.on_disk_done(disk[0].1, None, &mut sends);
        assert_eq!(sends.len(), n);
    }

    /// A background entry the primary repeats (its acknowledgement was
    /// lost) is acknowledged again once done, and not run twice.
    #[test]
    fn a_repeated_background_entry_is_acknowledged_again_once_done() {
        let p = NodeId(0);
        let mut s = Secondary::new(VolumeId(1), Epoch(1), Some((p, 0)), &cfg());
        let (mut sends, mut disk) = (Vec::new(), Vec::new());
        let flatten = ReplOp::Flatten {
            lba: 0,
            blocks: 4,
            rate: 0,
        };
        on(
            &mut s,
            p,
            Epoch(1),
            0,
            1,
            flatten.clone(),
            &mut sends,
            &mut disk,
        );
        assert_eq!(disk.len(), 1);
        let (_, tag) = disk.pop().expect("the flatten");
        // Repeated while it runs: nothing (its acknowledgement comes).
        on(
            &mut s,
            p,
            Epoch(1),
            0,
            1,
            flatten.clone(),
            &mut sends,
            &mut disk,
        );
        assert!(sends.is_empty() && disk.is_empty(), "{sends:?} {disk:?}");
        s.on_disk_done(tag, None, &mut sends);
        assert_eq!(sends.len(), 1, "acknowledged when done");
        sends.clear();
        // Repeated once done: acknowledged again, not run again.
        on(&mut s, p, Epoch(1), 0, 1, flatten, &mut sends, &mut disk);
        assert!(disk.is_empty());
        assert!(
            matches!(sends.as_slice(), [(_, Msg::ReplAck { lseq: 1, .. })]),
            "{sends:?}"
        );
    }

    #[test]
    fn reports_the_uncertain_regions_of_the_epoch_before() {
        let (p, q) = (NodeId(0), NodeId(2));
        let mut s = Secondary::new(VolumeId(1), Epoch(1), Some((p, 0)), &cfg());
        let (mut sends, mut disk) = (Vec::new(), Vec::new());
        let wr = |lba: u64| ReplOp::Write {
            lba,
            data: vec![1, 1].into(),
            fua: false,
        };
        // vseq 1..=3: regions 0, 1 and 2 (lba 7 spans regions 1 and 2).
        for (vseq, lba, commit, floor) in [(1, 0, 0, 0), (2, 7, 1, 0), (3, 12, 2, 1)] {
            let r = ReplIn {
                from: p,
                epoch: Epoch(1),
                session: 0,
                lseq: vseq,
                vseq,
                commit,
                floor,
                op: wr(lba),
            };
            s.on_repl(r, (None, &[]), &mut sends, &mut disk);
        }
        // The record alone (epoch 2) changes nothing; the new primary's
        // Start gets the report of epoch 1.
        s.adopt(Epoch(2));
        on(
            &mut s,
            q,
            Epoch(2),
            4,
            0,
            ReplOp::Start,
            &mut sends,
            &mut disk,
        );
        let Some((_, Msg::ReplStarted { prior, epoch, .. })) = sends.last() else {
            panic!("{sends:?}");
        };
        assert_eq!(*epoch, Epoch(2));
        let prior = prior.clone().unwrap();
        assert_eq!(prior.epoch, Epoch(1));
        assert_eq!(prior.synced, 2);
        assert_eq!(prior.regions, vec![1, 2, 3], "vseq 1 is at the floor");
        // A second Start of the same epoch reports the same.
        on(
            &mut s,
            q,
            Epoch(2),
            5,
            0,
            ReplOp::Start,
            &mut sends,
            &mut disk,
        );
        assert!(
            matches!(sends.last(), Some((_, Msg::ReplStarted { prior: Some(p2), .. })) if *p2 == prior)
        );
        // A fresh secondary (a restart) knows nothing.
        let mut r = Secondary::new(VolumeId(1), Epoch(2), None, &cfg());
        on(
            &mut r,
            q,
            Epoch(2),
            4,
            0,
            ReplOp::Start,
            &mut sends,
            &mut disk,
        );
        assert!(matches!(
            sends.last(),
            Some((_, Msg::ReplStarted { prior: None, .. }))
        ));
    }
}
