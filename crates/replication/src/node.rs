//! One storage node's part in one replicated volume.
//!
//! Job: hold the node's role (Idle, Secondary or Primary) for the volume,
//! switch roles as the membership record dictates, keep the heartbeat and
//! lease, and route inputs to the role and its disk completions back.
//!
//! Invariants:
//! - the node acts on a record only if the record carries its current boot
//!   id; a restarted node stays Idle until the coordinator has handled its
//!   restart;
//! - the node is Primary only for an epoch whose record names it primary and
//!   in which it is InSync; it steps down on any sign of a newer epoch;
//! - the lease is extended only by a heartbeat answer naming this node the
//!   primary of its epoch, and only to `sent_at + lease`;
//! - a disk completion reaches the role that issued it, never a later role;
//! - as a secondary, a repair read is issued only once the stream it names
//!   is applied up to the entry the primary had sent when it asked (parked
//!   until then; answered empty if that stream is gone);
//! - with crash logs (`Config::crash_log_regions` > 0), every write
//!   (zeroing included) is submitted after a log save that holds its
//!   regions, and no save submitted between that one and the write's
//!   completion and flush drops them: the disk queue issues the write only
//!   once the save completed, so after a crash the saved copy names every
//!   region the disk may hold a write in that the other replicas may not
//!   have, or may have lost because it was not flushed.
//!
//! Growing (online resize; the record's `blocks` only grows):
//! - the local disk is grown before anything beyond its old end is done
//!   on it: the node issues a `Grow` to the record's size as soon as it
//!   sees the record, and a secondary that receives a write beyond the size
//!   it asked for grows to the write's end first; a grow runs alone in the
//!   disk queue, so no operation submitted after it overtakes it;
//! - a primary serves (answers client requests within) only the size both
//!   the record and its own grown disk hold; requests beyond are answered
//!   NotPrimary (the client retries) until both have grown;
//! - a node is promoted to primary only once its disk holds the record's
//!   size, so a new primary's regions cover every block any earlier primary
//!   accepted a write in (their sizes never exceeded that record's), and its
//!   failover resync covers them;
//! - the ack rule is unchanged: a write beyond the old end is acknowledged
//!   only once the primary and every replica the rule counts applied it,
//!   which each did only after growing; a replica that cannot grow never
//!   acknowledges it and is marked OutOfSync (by CAS) before the write is
//!   acknowledged without it.

use crate::disk::{Completion, DiskQueue};
use crate::msg::{
    Action, ClientReply, ClientReq, DiskOp, Endpoint, Flattened, Input, IoId, Msg, ReplOp,
};
use crate::primary::{Out, PrimTag, Primary};
use crate::secondary::{ReplIn, SecTag, Secondary};
use crate::types::{Epoch, LayerId, Membership, NodeId, ReplicaState, VolumeId};
use crate::uncertain::{SavedLog, Uncertain};
use crate::Config;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};

/// A node's uncertain-region logs of one volume as a clean stop saves
/// them (see [`Node::save_logs`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedLogs {
    /// The log of the newest epoch's stream.
    pub current: Option<SavedLog>,
    /// The log of the epoch before it.
    pub previous: Option<SavedLog>,
}

impl SavedLogs {
    /// Names `regions` in both logs (see [`SavedLog::name_regions`]).
    fn name_regions(&mut self, regions: impl Iterator<Item = usize> + Clone) {
        for log in [&mut self.current, &mut self.previous]
            .into_iter()
            .flatten()
        {
            log.name_regions(regions.clone());
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Tag {
    P(PrimTag),
    S(SecTag),
    /// A save of the crash-safe log copy.
    Save,
    /// A grow of the local disk to this many blocks (the node's own, not a
    /// role's: its completion counts whatever the role is by then).
    Grow(u64),
    /// A read for the primary `to` of `epoch`, whose copy of the blocks
    /// failed its checksum (`RepairRead` `id`).
    Repair {
        to: NodeId,
        epoch: Epoch,
        id: u64,
    },
}

enum Role {
    Idle,
    Secondary(Box<Secondary>),
    Primary(Box<Primary>),
}

/// A node's role, for drivers and checkers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleKind {
    Idle,
    Secondary(Epoch),
    Primary(Epoch),
}

pub struct Node {
    me: NodeId,
    boot: u64,
    vol: VolumeId,
    cfg: Config,
    disk: DiskQueue<(u64, Tag)>,
    role: Role,
    rec: Option<Membership>,
    lease_until: u64,
    last_hb: Option<u64>,
    last_poll: Option<u64>,
    /// The newest epoch any message or record showed this node. A node
    /// never takes the primary role of an older one: a deposed primary that
    /// learned of its successor from a `Fenced` answer, before the record,
    /// must not be promoted again by the stale record it still holds (it
    /// would lose the log of its epoch it keeps for the new primary).
    seen_epoch: Epoch,
    /// Logs restored after a clean stop, held while Idle: (current,
    /// previous).
    restored: (Option<Uncertain>, Option<Uncertain>),
    gen: u64,
    /// Failover resyncs this node decided as primary: narrowed (a usable
    /// report), and full (no usable report).
    narrowed: (u64, u64),
    /// The same decisions, each with its replica and (regions to copy,
    /// regions in the volume), until the driver takes them.
    decided: Vec<(NodeId, Option<(usize, usize)>)>,
    /// Blocks the local disk holds: its size at start, then grows completed.
    disk_blocks: u64,
    /// Reads asked of this node by a primary whose copy failed its
    /// checksum, to submit at the end of the current input.
    repair_reads: Vec<(DiskOp, Tag)>,
    /// Repair reads waiting for this secondary to apply the stream up to
    /// the entry the primary had sent when it asked: (session, entry, read).
    parked_repairs: Vec<(u64, u64, DiskOp, Tag)>,
    /// Blocks asked of the local disk: the last grow issued (`cfg`'s
    /// `volume_blocks` follows it, for the roles created from now on).
    want_blocks: u64,
    crash: CrashLog,
    /// The snapshot layers of the volume the local disk holds, oldest
    /// first, once the operations submitted to it complete.
    layers: Vec<LayerId>,
    /// The snapshot of another volume the oldest of them (or the head)
    /// reads through: a clone's source, until flattened. Named first at a
    /// `Start`, so a rebuild copies only what differs from it.
    base: Option<LayerId>,
}

/// The crash-safe copy of the node's uncertain-region logs: which regions
/// it holds, and which regions have writes not yet flushed.
#[derive(Default)]
struct CrashLog {
    /// Regions of the newest save submitted: the copy on disk once the
    /// saves in flight complete (they complete in order).
    saved: BTreeSet<usize>,
    /// The epochs of the logs in the newest save (current, previous).
    epochs: (Option<Epoch>, Option<Epoch>),
    /// Regions of writes submitted since each flush: (the flush that
    /// closes the group, the regions), oldest first; the last group, open,
    /// has no flush.
    unflushed: VecDeque<(Option<IoId>, BTreeSet<usize>)>,
    /// Saves submitted.
    saves: u64,
    /// When the copy is next checked for cutting down.
    compact_at: u64,
}

impl Node {
    /// `initial`: the record of a freshly created volume (every replica
    /// empty, session 0 open); None for a node that (re)starts and must learn
    /// its role from the metadata service. `cfg.volume_blocks` is the size
    /// of the local disk now.
    pub fn new(
        me: NodeId,
        boot: u64,
        vol: VolumeId,
        cfg: Config,
        initial: Option<Membership>,
        now: u64,
    ) -> Self {
        let seen_epoch = initial.as_ref().map_or(Epoch(0), |r| r.epoch);
        let role = match &initial {
            Some(rec) if rec.primary == me => Role::Primary(Box::new(Primary::new(
                me,
                rec.clone(),
                cfg.clone(),
                true,
                now,
                None,
            ))),
            Some(rec) => Role::Secondary(Box::new(Secondary::new(
                vol,
                rec.epoch,
                Some((rec.primary, 0)),
                &cfg,
            ))),
            None => Role::Idle,
        };
        let cfg_blocks = cfg.volume_blocks;
        Node {
            me,
            boot,
            vol,
            disk: DiskQueue::new(cfg.block_len),
            cfg,
            role,
            rec: initial,
            lease_until: 0,
            last_hb: None,
            last_poll: None,
            seen_epoch,
            restored: (None, None),
            gen: 0,
            narrowed: (0, 0),
            decided: Vec::new(),
            repair_reads: Vec::new(),
            parked_repairs: Vec::new(),
            disk_blocks: cfg_blocks,
            want_blocks: cfg_blocks,
            crash: CrashLog::default(),
            layers: Vec::new(),
            base: None,
        }
    }

    /// The same node, whose local disk holds snapshot layers `layers` of
    /// the volume (oldest first), as a restart finds them.
    pub fn with_layers(mut self, layers: Vec<LayerId>) -> Self {
        if let Role::Primary(p) = &mut self.role {
            p.layers = layers.clone();
        }
        self.layers = layers;
        self
    }

    /// The snapshot layers the local disk holds once the operations
    /// submitted to it complete, oldest first.
    pub fn layers(&self) -> &[LayerId] {
        &self.layers
    }

    /// The same node, whose local disk's volume reads through snapshot
    /// `base` of another volume (a clone's source), as a restart or the
    /// creation of a clone's copy finds it.
    pub fn with_base(mut self, base: Option<LayerId>) -> Self {
        if let Role::Primary(p) = &mut self.role {
            p.base = base;
        }
        self.base = base;
        self
    }

    /// The clone source the local disk reads through, if any.
    pub fn base(&self) -> Option<LayerId> {
        self.base
    }

    /// The local disk stopped reading through its base (a flatten
    /// detached it).
    fn drop_base(&mut self) {
        self.base = None;
        if let Role::Primary(p) = &mut self.role {
            p.drop_base();
        }
    }

    /// Log saves submitted so far (crash logs; for tests).
    #[doc(hidden)]
    pub fn log_saves(&self) -> u64 {
        self.crash.saves
    }

    /// The node's logs as they are now: (current, previous), as a clean
    /// stop saves them.
    fn live_logs(&self) -> (Option<Uncertain>, Option<Uncertain>) {
        match &self.role {
            Role::Idle => (self.restored.0.clone(), self.restored.1.clone()),
            Role::Secondary(s) => {
                let (c, p) = s.logs();
                (c.cloned(), p.cloned())
            }
            Role::Primary(p) => (None, Some(p.deposed_log())),
        }
    }

    /// The epochs of the node's logs now (current, previous).
    fn live_epochs(&self) -> (Option<Epoch>, Option<Epoch>) {
        let epoch = |u: Option<&Uncertain>| u.map(|u| u.epoch);
        match &self.role {
            Role::Idle => (
                epoch(self.restored.0.as_ref()),
                epoch(self.restored.1.as_ref()),
            ),
            Role::Secondary(s) => {
                let (c, p) = s.logs();
                (epoch(c), epoch(p))
            }
            Role::Primary(p) => (None, Some(p.epoch)),
        }
    }

    /// The regions a crash-safe copy must hold: those of the logs and of
    /// the writes not yet flushed.
    fn crash_needed(&self) -> BTreeSet<usize> {
        let (cur, prev) = self.live_logs();
        let mut needed: BTreeSet<usize> = cur
            .iter()
            .chain(prev.iter())
            .flat_map(|u| u.regions())
            .collect();
        for (_, regions) in &self.crash.unflushed {
            needed.extend(regions.iter().copied());
        }
        needed
    }

    /// Submits a save of the crash-safe copy holding `regions` besides the
    /// logs' own.
    fn save_crash_log(&mut self, regions: BTreeSet<usize>, acts: &mut Vec<Action>) {
        let (cur, prev) = self.live_logs();
        let logs = SavedLogs {
            current: cur.as_ref().map(|u| u.crash_save(&regions)),
            previous: prev.as_ref().map(|u| u.crash_save(&regions)),
        };
        self.crash.saved = regions;
        self.crash.epochs = self.live_epochs();
        self.crash.saves += 1;
        self.disk
            .submit(DiskOp::SaveLogs { logs }, (self.gen, Tag::Save), acts);
    }

    /// A write of stream `t` found no space: this replica left that stream,
    /// and a snapshot of it not yet taken must not be (it would freeze a
    /// copy that lacks the write while the primary's has it, and be
    /// reported as held at the next `Start`). Other entries may run: the
    /// primary resyncs every region they touch.
    fn drop_left_snapshots(&mut self, t: SecTag) {
        let dropped = self.disk.drop_pending(|(_, tag), op| {
            matches!(tag, Tag::S(s) if s.same_stream(&t)) && matches!(op, DiskOp::Snapshot { .. })
        });
        for (op, _) in dropped {
            if let DiskOp::Snapshot { layer } = op {
                self.layers.retain(|l| *l != layer);
            }
        }
    }

    /// Drops the snapshots of streams other than `session` of `epoch`
    /// that are queued and not issued: a new stream starts, and the layers
    /// it reports must not lose one afterwards.
    fn drop_older_snapshots(&mut self, epoch: Epoch, session: u64) {
        let dropped = self.disk.drop_pending(|(_, tag), op| {
            matches!(tag, Tag::S(s) if !s.of_stream(epoch, session))
                && matches!(op, DiskOp::Snapshot { .. })
        });
        for (op, _) in dropped {
            if let DiskOp::Snapshot { layer } = op {
                self.layers.retain(|l| *l != layer);
            }
        }
    }

    /// The base the local disk reads through whatever happens to the
    /// streams in flight: none while a flatten or a layer deletion is
    /// queued or running (either may detach it).
    fn base_sure(&self) -> Option<LayerId> {
        let detaching = self
            .disk
            .ops()
            .any(|(op, _)| matches!(op, DiskOp::Flatten { .. } | DiskOp::DeleteLayer { .. }));
        self.base.filter(|_| !detaching)
    }

    /// Submits a disk operation; with crash logs, a write goes after a
    /// save that holds its regions (the disk queue holds it until then),
    /// and a flush closes the group of writes it makes durable.
    fn submit_disk(&mut self, op: DiskOp, tag: Tag, acts: &mut Vec<Action>) {
        match &op {
            DiskOp::Snapshot { layer } if !self.layers.contains(layer) => self.layers.push(*layer),
            // Of the base, a secondary's disk only stops reading through it.
            DiskOp::DeleteLayer { layer } if self.base == Some(*layer) => self.base = None,
            DiskOp::DeleteLayer { layer } => self.layers.retain(|l| l != layer),
            _ => {}
        }
        if self.cfg.crash_log_regions == 0 {
            self.disk.submit(op, (self.gen, tag), acts);
            return;
        }
        let extent = match &op {
            DiskOp::Write { lba, data, .. } => {
                Some((*lba, data.len() as u64 / self.cfg.block_len.max(1)))
            }
            DiskOp::WriteZeroes { lba, blocks, .. } => Some((*lba, *blocks)),
            // A rebase changes what every block reads.
            DiskOp::Rebase { .. } => Some((0, self.disk_blocks.max(self.want_blocks))),
            _ => None,
        };
        if let Some((lba, blocks)) = extent.filter(|(_, n)| *n > 0) {
            let rb = self.cfg.region_blocks.max(1);
            let regions = (lba / rb) as usize..=((lba + blocks - 1) / rb) as usize;
            // Into the open group: a write submitted after a flush is not
            // made durable by it, so it must not join the group that flush
            // closes (its regions would leave the copy when that flush
            // completes, while the write is still unflushed).
            if !matches!(self.crash.unflushed.back(), Some((None, _))) {
                self.crash.unflushed.push_back((None, BTreeSet::new()));
            }
            if let Some((_, open)) = self.crash.unflushed.back_mut() {
                open.extend(regions.clone());
            }
            // Also when the logs' epochs changed: a node that restarts
            // without a log of an epoch then knows it applied no write of
            // it (see `Secondary::mark_partial`).
            let epochs_changed = self.live_epochs() != self.crash.epochs;
            if epochs_changed || regions.clone().any(|r| !self.crash.saved.contains(&r)) {
                // A save not issued yet (waiting for the one in flight)
                // takes the new regions too, and this write waits for it:
                // one save per disk round trip instead of one per new
                // region, which on a fresh volume is one per write.
                let waiting = (!epochs_changed)
                    .then(|| self.disk.waiting_save())
                    .flatten();
                if let Some(waiting) = waiting {
                    waiting.name_regions(regions.clone());
                    self.crash.saved.extend(regions);
                } else {
                    let mut target = self.crash.saved.clone();
                    target.extend(regions);
                    self.save_crash_log(target, acts);
                }
            }
        }
        let is_flush = matches!(op, DiskOp::Flush);
        let id = self.disk.submit(op, (self.gen, tag), acts);
        if is_flush {
            if let Some((closer @ None, _)) = self.crash.unflushed.back_mut() {
                *closer = Some(id);
            }
        }
    }

    /// A flush completed: the writes of every group it closes, and of the
    /// groups before (issued before it, so completed), are durable.
    fn crash_flushed(&mut self, id: IoId) {
        if let Some(k) = self
            .crash
            .unflushed
            .iter()
            .position(|(f, _)| *f == Some(id))
        {
            self.crash.unflushed.drain(..=k);
        }
    }

    /// Cuts the crash-safe copy down to what it must hold, once it holds
    /// more than `crash_log_regions` (a save in flight is no obstacle:
    /// saves run one at a time, in order).
    fn compact_crash_log(&mut self, now: u64, acts: &mut Vec<Action>) {
        if self.cfg.crash_log_regions == 0
            || self.crash.saved.len() <= self.cfg.crash_log_regions
            || now < self.crash.compact_at
        {
            return;
        }
        // Not at every tick: the check walks the logs.
        self.crash.compact_at = now + self.cfg.crash_log_compact_ms;
        let needed = self.crash_needed();
        if needed.len() < self.crash.saved.len() {
            self.save_crash_log(needed, acts);
        }
    }

    /// Blocks the local disk holds (grows completed).
    pub fn disk_blocks(&self) -> u64 {
        self.disk_blocks
    }

    /// Blocks this node serves as primary (0 on other roles): client
    /// requests beyond are answered NotPrimary.
    pub fn serving_blocks(&self) -> u64 {
        match &self.role {
            Role::Primary(p) => p.volume_blocks(),
            _ => 0,
        }
    }

    /// Asks the local disk for at least `blocks` blocks: a grow is queued
    /// (before anything else this input issues) if that is more than asked
    /// so far.
    fn want(&mut self, blocks: u64, grows: &mut Vec<u64>) {
        if blocks <= self.want_blocks {
            return;
        }
        self.want_blocks = blocks;
        self.cfg.volume_blocks = blocks;
        grows.push(blocks);
        if let Role::Secondary(s) = &mut self.role {
            s.grow(blocks);
        }
    }

    /// The record's size: grow the disk to it, and let a primary serve it
    /// once the disk holds it.
    fn follow_size(&mut self, grows: &mut Vec<u64>) {
        let target = self.rec.as_ref().map_or(0, |r| r.blocks);
        self.want(target, grows);
        let serve = target.min(self.disk_blocks);
        if let Role::Primary(p) = &mut self.role {
            p.grow(serve);
        }
    }

    /// A grow of the local disk completed.
    fn grown(&mut self, now: u64, blocks: u64, out: &mut Out) {
        self.disk_blocks = self.disk_blocks.max(blocks);
        // A promotion may have waited for it.
        if let Some(rec) = self.rec.clone() {
            self.on_record(now, rec, out);
        }
    }

    /// Until when (on this node's clock) it may acknowledge as primary: the
    /// last heartbeat answer's `sent_at + lease`.
    pub fn lease_until(&self) -> u64 {
        self.lease_until
    }

    pub fn role(&self) -> RoleKind {
        match &self.role {
            Role::Idle => RoleKind::Idle,
            Role::Secondary(s) => RoleKind::Secondary(s.epoch),
            Role::Primary(p) => RoleKind::Primary(p.epoch),
        }
    }

    /// Client operations this node, as primary, has taken and not yet
    /// answered.
    pub fn pending_ops(&self) -> usize {
        match &self.role {
            Role::Primary(p) => p.pending_ops(),
            _ => 0,
        }
    }

    /// Whether this node, as primary, is copying regions to a replica now.
    pub fn copying(&self) -> bool {
        match &self.role {
            Role::Primary(p) => p.copying(),
            _ => false,
        }
    }

    /// Changes the cap on resync copies (bytes per second, 0: none) from
    /// `now` on, for this role and the roles that follow (a node shares
    /// one budget among the volumes it resyncs).
    pub fn set_resync_rate(&mut self, now: u64, rate: u64) {
        self.cfg.resync_rate = rate;
        if let Role::Primary(p) = &mut self.role {
            p.set_resync_rate(now, rate);
        }
    }

    /// On a primary, per replica being resynced (or waiting to be): regions
    /// still to copy and regions in the volume. Empty on other roles.
    pub fn resync_progress(&self) -> std::collections::BTreeMap<NodeId, (usize, usize)> {
        match &self.role {
            Role::Primary(p) => p.resync_progress(),
            _ => Default::default(),
        }
    }

    /// On a primary, the most region copies in flight to one replica (for
    /// the simulator's coverage counters).
    #[doc(hidden)]
    pub fn max_copies_in_flight(&self) -> usize {
        match &self.role {
            Role::Primary(p) => p.max_copies_in_flight(),
            _ => 0,
        }
    }

    /// On a primary, the bytes of resync copies it admitted without the
    /// rate bucket because the volume was below `min_in_sync` (for the
    /// simulator's rate check).
    #[doc(hidden)]
    pub fn unmetered_copy_bytes(&self) -> u64 {
        match &self.role {
            Role::Primary(p) => p.unmetered_bytes,
            _ => 0,
        }
    }

    /// Failover resyncs this node decided as primary since it started:
    /// (narrowed by the replica's usable report, full because it had
    /// none).
    #[doc(hidden)]
    pub fn failover_resyncs(&self) -> (u64, u64) {
        self.narrowed
    }

    /// Whether issued disk operation `id` is background work (a resync
    /// read, a layer rebuild's reads, a layer deletion, a flatten, a
    /// compaction) that a driver may run off the client's path.
    pub fn is_background(&self, id: IoId) -> bool {
        matches!(
            self.disk.op(id),
            Some(DiskOp::DeleteLayer { .. } | DiskOp::Flatten { .. } | DiskOp::Compact { .. })
        ) || matches!(
            self.disk.tag(id),
            Some((
                _,
                Tag::P(
                    PrimTag::ResyncRead { .. }
                        | PrimTag::LayerRead { .. }
                        | PrimTag::LayerDiff { .. }
                        | PrimTag::HeadDiff { .. }
                )
            ))
        )
    }

    /// Failover resyncs decided since the last call: per replica, (regions
    /// to copy, regions in the volume), or None for a full copy (the
    /// replica had no usable report). For the driver's log.
    pub fn take_failover_resyncs(&mut self) -> Vec<(NodeId, Option<(usize, usize)>)> {
        std::mem::take(&mut self.decided)
    }

    /// The uncertain-region logs to keep across a clean stop: call it once
    /// the node gets no more input and every disk operation it issued has
    /// completed and been flushed. A primary saves its own log, as if
    /// deposed. Restored by [`Node::restore_logs`] on the next start, they
    /// spare this replica a full copy after a failover; never restore them
    /// after a crash (the disk may have lost writes they do not name).
    pub fn save_logs(&self) -> SavedLogs {
        let (cur, prev) = match &self.role {
            Role::Idle => (self.restored.0.clone(), self.restored.1.clone()),
            Role::Secondary(s) => {
                let (c, p) = s.logs();
                (c.cloned(), p.cloned())
            }
            Role::Primary(p) => (None, Some(p.deposed_log())),
        };
        SavedLogs {
            current: cur.as_ref().map(Uncertain::save),
            previous: prev.as_ref().map(Uncertain::save),
        }
    }

    /// Takes up the logs a clean stop saved, before any other input.
    pub fn restore_logs(&mut self, saved: &SavedLogs) {
        if matches!(self.role, Role::Idle) {
            let limit = self.cfg.uncertain_limit;
            let restore = |l: &Option<SavedLog>| l.as_ref().map(|l| Uncertain::restore(l, limit));
            self.restored = (restore(&saved.current), restore(&saved.previous));
        }
    }

    /// The restored log of `epoch`, if any.
    fn take_restored(&mut self, epoch: Epoch) -> Option<Uncertain> {
        let (cur, prev) = std::mem::take(&mut self.restored);
        cur.into_iter().chain(prev).find(|u| u.epoch == epoch)
    }

    /// The role's state in one line, for simulator traces.
    #[doc(hidden)]
    pub fn describe(&self) -> String {
        match &self.role {
            Role::Primary(p) => p.describe(),
            _ => format!("{:?}", self.role()),
        }
    }

    /// Parked repair reads whose entry the stream has reached are issued;
    /// those of a stream no longer open here are answered with nothing.
    fn release_parked_repairs(&mut self, out: &mut Out) {
        if self.parked_repairs.is_empty() {
            return;
        }
        for (session, after, op, tag) in std::mem::take(&mut self.parked_repairs) {
            let applied = match &self.role {
                Role::Secondary(s) => s.applied(session),
                _ => None,
            };
            match (applied, tag) {
                (Some(a), _) if a >= after => self.repair_reads.push((op, tag)),
                (Some(_), _) => self.parked_repairs.push((session, after, op, tag)),
                (None, Tag::Repair { to, epoch, id }) => out.sends.push((
                    Endpoint::Node(to),
                    Msg::RepairData {
                        vol: self.vol,
                        epoch,
                        id,
                        data: None,
                    },
                )),
                (None, _) => {}
            }
        }
    }

    fn become_role(&mut self, role: Role, out: &mut Out) {
        if let Role::Primary(p) = &mut self.role {
            p.abandon(out);
        }
        self.role = role;
        // The primary that asked chases an unanswered repair elsewhere.
        self.parked_repairs.clear();
        self.gen += 1;
        self.lease_until = 0;
        self.last_hb = None;
    }

    fn step_down(&mut self, out: &mut Out) {
        let (epoch, log) = match &self.role {
            Role::Primary(p) => (p.epoch, p.deposed_log()),
            _ => return,
        };
        let epoch = self
            .rec
            .as_ref()
            .map_or(epoch, |r| r.epoch.max(epoch))
            .max(self.seen_epoch);
        let mut s = Secondary::new(self.vol, epoch, None, &self.cfg);
        s.remember(log);
        self.become_role(Role::Secondary(Box::new(s)), out);
    }

    fn on_record(&mut self, now: u64, record: Membership, out: &mut Out) {
        if record.volume != self.vol {
            return;
        }
        if self.rec.as_ref().is_none_or(|r| record.version > r.version) {
            self.rec = Some(record);
        }
        let Some(rec) = self.rec.clone() else {
            return;
        };
        let acknowledged = rec
            .replicas
            .get(&self.me)
            .is_some_and(|i| i.boot == self.boot);
        if !acknowledged {
            if matches!(self.role, Role::Primary(_)) {
                self.become_role(Role::Idle, out);
            }
            return;
        }
        self.seen_epoch = self.seen_epoch.max(rec.epoch);
        let same_epoch_primary = matches!(&self.role, Role::Primary(p) if p.epoch == rec.epoch);
        if rec.primary == self.me && !same_epoch_primary && rec.epoch >= self.seen_epoch {
            // Promoted only once the local disk holds the record's size
            // (the grow was issued when the record arrived; its completion
            // brings us back here).
            if rec.state(self.me) == Some(ReplicaState::InSync) && self.disk_blocks >= rec.blocks {
                // What this node received from the previous epoch's
                // primary, if it was its secondary (and did not restart).
                let before = Epoch(rec.epoch.0.saturating_sub(1));
                let mine = match &mut self.role {
                    Role::Secondary(s) => s.take_log(before),
                    Role::Idle => self.take_restored(before),
                    Role::Primary(_) => None,
                };
                let cfg = Config {
                    volume_blocks: self.disk_blocks,
                    ..self.cfg.clone()
                };
                let mut p = Primary::new(self.me, rec, cfg, false, now, mine);
                p.layers = self.layers.clone();
                p.base = self.base;
                self.become_role(Role::Primary(Box::new(p)), out);
            }
            return;
        }
        match &mut self.role {
            Role::Primary(p) => p.on_record(&rec, out),
            Role::Secondary(s) => s.adopt(rec.epoch),
            Role::Idle => {
                let mut s = Secondary::new(self.vol, rec.epoch, None, &self.cfg);
                let (cur, prev) = std::mem::take(&mut self.restored);
                // Restored logs (a clean stop's, or a crash-safe copy, saved
                // again whenever the logs' epochs change before a write of
                // the new epoch) include one of every epoch this node
                // applied writes of. Without any, it cannot tell: a log it
                // begins for the record's epoch may lack writes of that
                // epoch received before it restarted.
                if cur.is_none() && prev.is_none() {
                    s.mark_partial(rec.epoch);
                }
                s.restore(cur, prev);
                self.become_role(Role::Secondary(Box::new(s)), out);
            }
        }
    }

    /// Feeds one input at time `now`; returns what to do.
    pub fn handle(&mut self, now: u64, input: Input) -> Vec<Action> {
        let mut acts = Vec::new();
        let mut out = Out::default();
        let mut sdisk: Vec<(DiskOp, SecTag)> = Vec::new();
        let mut grows: Vec<u64> = Vec::new();
        match input {
            Input::Tick => {
                let every = match self.role {
                    Role::Primary(_) => self.cfg.heartbeat_ms,
                    _ => self.cfg.heartbeat_ms.max(self.cfg.lease_ms / 3),
                };
                if self.last_hb.is_none_or(|t| now >= t + every) {
                    self.last_hb = Some(now);
                    out.sends.push((
                        Endpoint::Control,
                        Msg::Heartbeat {
                            boot: self.boot,
                            sent_at: now,
                        },
                    ));
                }
                if self.last_poll.is_none_or(|t| now >= t + self.cfg.poll_ms) {
                    self.last_poll = Some(now);
                    out.sends
                        .push((Endpoint::Control, Msg::MetaGet { vol: self.vol }));
                }
                if let Role::Primary(p) = &mut self.role {
                    p.tick(now, self.lease_until, &mut out);
                }
                self.compact_crash_log(now, &mut acts);
            }
            Input::Msg { from, msg } => {
                self.on_msg(now, from, msg, &mut out, &mut sdisk, &mut grows)
            }
            Input::Disk { id, result } => {
                if let Some(((gen, tag), op, outcome)) = self.disk.complete(id, result, &mut acts) {
                    self.crash_flushed(id);
                    if let (DiskOp::Flatten { .. }, Completion::Done(Some(data))) = (&op, &outcome)
                    {
                        if Flattened::decode(data).is_some_and(|f| f.detached) {
                            self.drop_base();
                        }
                    }
                    let corrupt = outcome == Completion::Corrupt;
                    let no_space = outcome == Completion::NoSpace;
                    let data = match outcome {
                        Completion::Done(data) => data,
                        Completion::Corrupt | Completion::NoSpace => None,
                    };
                    match (tag, &mut self.role) {
                        // Nothing waits on a save but the disk queue.
                        (Tag::Save, _) => {}
                        (Tag::Grow(blocks), _) => self.grown(now, blocks, &mut out),
                        (Tag::Repair { to, epoch, id }, _) => out.sends.push((
                            Endpoint::Node(to),
                            Msg::RepairData {
                                vol: self.vol,
                                epoch,
                                id,
                                data,
                            },
                        )),
                        (Tag::P(t), Role::Primary(p)) if gen == self.gen && corrupt => {
                            p.on_disk_corrupt(now, t, &mut out)
                        }
                        (Tag::P(t), Role::Primary(p)) if gen == self.gen && no_space => {
                            p.on_disk_no_space(t)
                        }
                        (Tag::S(t), Role::Secondary(s)) if gen == self.gen && no_space => {
                            s.on_disk_no_space(t, &mut out.sends);
                            self.drop_left_snapshots(t);
                        }
                        (Tag::P(t), Role::Primary(p)) if gen == self.gen => {
                            p.on_disk_done(now, t, data, &mut out)
                        }
                        (Tag::S(t), Role::Secondary(s)) if gen == self.gen => {
                            s.on_disk_done(t, data, &mut out.sends)
                        }
                        _ => {}
                    }
                    if no_space {
                        self.disk.resume(&mut acts);
                    }
                }
            }
        }
        if out.step_down {
            out.step_down = false;
            self.step_down(&mut out);
        }
        self.follow_size(&mut grows);
        if let Role::Primary(p) = &mut self.role {
            p.progress(now, self.lease_until, &mut out);
        }
        for (replica, n) in std::mem::take(&mut out.narrowed) {
            match n {
                Some(_) => self.narrowed.0 += 1,
                None => self.narrowed.1 += 1,
            }
            self.decided.push((replica, n));
        }
        for blocks in grows {
            self.submit_disk(DiskOp::Grow { blocks }, Tag::Grow(blocks), &mut acts);
        }
        for (op, t) in sdisk {
            self.submit_disk(op, Tag::S(t), &mut acts);
        }
        self.release_parked_repairs(&mut out);
        for (op, t) in std::mem::take(&mut self.repair_reads) {
            self.submit_disk(op, t, &mut acts);
        }
        for (op, t) in out.disk {
            self.submit_disk(op, Tag::P(t), &mut acts);
        }
        acts.extend(
            out.sends
                .into_iter()
                .map(|(to, msg)| Action::Send { to, msg }),
        );
        acts
    }

    fn on_msg(
        &mut self,
        now: u64,
        from: Endpoint,
        msg: Msg,
        out: &mut Out,
        sdisk: &mut Vec<(DiskOp, SecTag)>,
        grows: &mut Vec<u64>,
    ) {
        // Not from a heartbeat answer: its epoch may be a promotion the
        // coordinator announced and never wrote (it lost etcd). A node
        // that took it as seen would step down for good from the record's
        // epoch, and fence the record's primary with it, leaving the volume
        // with no primary (sim seed 2177).
        if let Msg::Fenced { vol, epoch } | Msg::Repl { vol, epoch, .. } = &msg {
            if *vol == self.vol {
                self.seen_epoch = self.seen_epoch.max(*epoch);
            }
        }
        match msg {
            Msg::HeartbeatAck {
                sent_at,
                vol,
                epoch,
                primary,
                lease_ms,
            } if vol == self.vol => {
                if let Role::Primary(p) = &self.role {
                    if epoch == p.epoch && primary == self.me {
                        // The coordinator's lease: it waits `lease + grace`
                        // of its own before replacing this primary.
                        let lease = if lease_ms == 0 {
                            self.cfg.lease_ms
                        } else {
                            lease_ms
                        };
                        self.lease_until = self.lease_until.max(sent_at + lease);
                    } else if epoch > p.epoch {
                        out.sends
                            .push((Endpoint::Control, Msg::MetaGet { vol: self.vol }));
                    }
                }
            }
            Msg::MetaReply { record, .. } => self.on_record(now, record, out),
            Msg::Repl {
                vol,
                epoch,
                session,
                lseq,
                vseq,
                commit,
                floor,
                op,
            } if vol == self.vol => {
                let Endpoint::Node(f) = from else {
                    return;
                };
                if let Role::Primary(p) = &self.role {
                    if epoch > p.epoch {
                        self.step_down(out);
                    } else {
                        out.sends.push((
                            from,
                            Msg::Fenced {
                                vol,
                                epoch: p.epoch,
                            },
                        ));
                        return;
                    }
                }
                // A write beyond the size asked of the disk so far (its
                // primary saw a larger record before we did): grow first.
                let end = op
                    .span(self.cfg.block_len)
                    .map_or(0, |(lba, blocks)| lba.saturating_add(blocks));
                if matches!(&self.role, Role::Secondary(s) if epoch >= s.epoch) {
                    self.want(end, grows);
                }
                // A `Start` reports the layers: a snapshot of an older
                // stream not issued yet is dropped first (it could still be
                // dropped for lack of space, `drop_left_snapshots`, after
                // being reported), so the report is what the disk will
                // hold; the base is left out while it may be detached.
                let base = match op {
                    ReplOp::Start => {
                        if matches!(&self.role, Role::Secondary(s) if s.accepts_start(epoch, session))
                        {
                            self.drop_older_snapshots(epoch, session);
                        }
                        self.base_sure()
                    }
                    _ => self.base,
                };
                let layers = &self.layers;
                if let Role::Secondary(s) = &mut self.role {
                    let r = ReplIn {
                        from: f,
                        epoch,
                        session,
                        lseq,
                        vseq,
                        commit,
                        floor,
                        op,
                    };
                    s.on_repl(r, (base, layers), &mut out.sends, sdisk);
                }
            }
            Msg::ReplAck {
                vol,
                epoch,
                session,
                lseq,
            } if vol == self.vol => {
                if let (Role::Primary(p), Endpoint::Node(f)) = (&mut self.role, from) {
                    p.on_ack(f, epoch, session, lseq);
                }
            }
            Msg::ReplDigest {
                vol,
                epoch,
                session,
                lseq,
                digest,
            } if vol == self.vol => {
                if let (Role::Primary(p), Endpoint::Node(f)) = (&mut self.role, from) {
                    p.on_digest(f, epoch, session, lseq, digest);
                }
            }
            Msg::ReplNoSpace {
                vol,
                epoch,
                session,
                lseq,
            } if vol == self.vol => {
                if let (Role::Primary(p), Endpoint::Node(f)) = (&mut self.role, from) {
                    p.on_no_space(f, epoch, session, lseq);
                }
            }
            Msg::ReplStarted {
                vol,
                epoch,
                session,
                prior,
                layers,
            } if vol == self.vol => {
                if let (Role::Primary(p), Endpoint::Node(f)) = (&mut self.role, from) {
                    p.on_started(now, f, epoch, session, (prior, layers), out);
                }
            }
            Msg::Fenced { vol, epoch } if vol == self.vol => {
                if let Role::Primary(p) = &mut self.role {
                    p.on_fenced(epoch, out);
                    out.sends.push((Endpoint::Control, Msg::MetaGet { vol }));
                }
            }
            Msg::RepairRead {
                vol,
                epoch,
                id,
                lba,
                blocks,
                session,
                after,
            } if vol == self.vol => {
                let Endpoint::Node(to) = from else {
                    return;
                };
                // Only a secondary of the asker's epoch and stream holds what
                // it needs (every write it acknowledged); the read waits
                // until the stream is applied up to the entry the primary
                // had sent when it asked, and the disk queue orders it after
                // those writes.
                let applied = match &self.role {
                    Role::Secondary(s) if s.epoch == epoch => s.applied(session),
                    _ => None,
                };
                let fits = lba
                    .checked_add(blocks)
                    .is_some_and(|end| end <= self.disk_blocks);
                let read = (DiskOp::Read { lba, blocks }, Tag::Repair { to, epoch, id });
                if let (Some(applied), true) = (applied, fits) {
                    if applied >= after {
                        self.repair_reads.push(read);
                    } else {
                        self.parked_repairs.push((session, after, read.0, read.1));
                    }
                } else {
                    out.sends.push((
                        from,
                        Msg::RepairData {
                            vol,
                            epoch,
                            id,
                            data: None,
                        },
                    ));
                }
            }
            Msg::RepairData {
                vol,
                epoch,
                id,
                data,
            } if vol == self.vol => {
                if let (Role::Primary(p), Endpoint::Node(f)) = (&mut self.role, from) {
                    p.on_repair_data(now, f, epoch, id, data, out);
                }
            }
            Msg::ClientReq { id, req } => match &mut self.role {
                Role::Primary(p) if fits(&req, p.volume_blocks(), self.cfg.block_len) => {
                    p.on_client(now, id, req, out)
                }
                _ => out.sends.push((
                    Endpoint::Client,
                    Msg::ClientReply {
                        id,
                        reply: ClientReply::NotPrimary,
                    },
                )),
            },
            _ => {}
        }
    }
}

/// Whether `req` lies within the first `blocks` blocks.
fn fits(req: &ClientReq, blocks: u64, block_len: u64) -> bool {
    req.extent(block_len)
        .is_none_or(|(lba, n)| lba.checked_add(n).is_some_and(|end| end <= blocks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::CompareWritten;
    use crate::msg::{DiskResult, Flattened, IoId, Prior, ReplOp};
    use crate::types::{ReplicaInfo, ReplicaState};

    fn sends(acts: &[Action]) -> Vec<(Endpoint, Msg)> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Send { to, msg } => Some((*to, msg.clone())),
                _ => None,
            })
            .collect()
    }

    fn disk_ops(acts: &[Action]) -> Vec<(IoId, DiskOp)> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Disk { id, op } => Some((*id, op.clone())),
                _ => None,
            })
            .collect()
    }

    fn done(node: &mut Node, t: u64, id: IoId) -> Vec<Action> {
        node.handle(
            t,
            Input::Disk {
                id,
                result: DiskResult::Done { data: None },
            },
        )
    }

    fn record(node: &mut Node, t: u64, rec: &Membership) -> Vec<Action> {
        node.handle(
            t,
            Input::Msg {
                from: Endpoint::Control,
                msg: Msg::MetaReply {
                    record: rec.clone(),
                    cas_ok: None,
                },
            },
        )
    }

    fn client(node: &mut Node, t: u64, id: u64, req: ClientReq) -> Vec<Action> {
        node.handle(
            t,
            Input::Msg {
                from: Endpoint::Client,
                msg: Msg::ClientReq { id, req },
            },
        )
    }

    /// The coordinator's answer to `p`'s heartbeat sent at `t`: `p` holds
    /// the lease of epoch 1 until `t + lease`.
    fn lease(node: &mut Node, t: u64, p: NodeId, vol: VolumeId) -> Vec<Action> {
        node.handle(
            t,
            Input::Msg {
                from: Endpoint::Control,
                msg: Msg::HeartbeatAck {
                    sent_at: t,
                    vol,
                    epoch: Epoch(1),
                    primary: p,
                    lease_ms: 0,
                },
            },
        )
    }

    fn replied(acts: &[Action], id: u64) -> Option<ClientReply> {
        sends(acts).into_iter().find_map(|(to, m)| match m {
            Msg::ClientReply { id: i, reply } if to == Endpoint::Client && i == id => Some(reply),
            _ => None,
        })
    }

    fn small(blocks: u64) -> Config {
        Config {
            block_len: 1,
            volume_blocks: blocks,
            region_blocks: 4,
            ..Config::default()
        }
    }

    /// The regions a save holds (the primary's own log, in `previous`).
    fn saved_regions(op: &DiskOp) -> Option<Vec<u32>> {
        match op {
            DiskOp::SaveLogs { logs } => Some(
                logs.previous
                    .as_ref()
                    .map(|l| l.regions.iter().map(|(r, _)| *r).collect())
                    .unwrap_or_default(),
            ),
            _ => None,
        }
    }

    /// The regions of every save among `acts`.
    fn saves(acts: &[Action]) -> Vec<Vec<u32>> {
        disk_ops(acts)
            .iter()
            .filter_map(|(_, op)| saved_regions(op))
            .collect()
    }

    /// A single-replica primary of 16 blocks with crash logs that are cut
    /// down at every tick once they hold more than one region.
    fn crash_log_primary() -> Node {
        let (p, vol) = (NodeId(0), VolumeId(1));
        let rec = Membership::new(vol, &[p], p, 1).with_blocks(16);
        let cfg = Config {
            crash_log_regions: 1,
            crash_log_compact_ms: 0,
            ..small(16)
        };
        let mut node = Node::new(p, 0, vol, cfg, Some(rec), 0);
        lease(&mut node, 0, p, vol);
        node
    }

    /// A write of two blocks at `lba`.
    fn write(lba: u64) -> ClientReq {
        ClientReq::Write {
            lba,
            data: vec![7; 2].into(),
            fua: false,
        }
    }

    #[test]
    fn crash_log_is_saved_before_a_write_reaches_a_new_region_and_cut_down_after_flushes() {
        let mut node = crash_log_primary();
        // Region 0 is new: the save goes first, the write waits for it.
        let a = client(&mut node, 1, 1, write(0));
        let ops = disk_ops(&a);
        assert_eq!(ops.len(), 1, "{ops:?}");
        assert_eq!(saved_regions(&ops[0].1), Some(vec![0]));
        let a = done(&mut node, 2, ops[0].0);
        let ops = disk_ops(&a);
        assert!(
            matches!(ops[..], [(_, DiskOp::Write { lba: 0, .. })]),
            "{ops:?}"
        );
        let a = done(&mut node, 3, ops[0].0);
        assert!(matches!(replied(&a, 1), Some(ClientReply::Ok { .. })));
        // Region 0 again: no save. Regions 1 and 2 (one write across
        // both): one save holding all three, the write held until then.
        let a = client(&mut node, 4, 2, write(2));
        let w = disk_ops(&a);
        assert!(
            matches!(w[..], [(_, DiskOp::Write { lba: 2, .. })]),
            "{w:?}"
        );
        let a = client(&mut node, 5, 3, write(7));
        let ops = disk_ops(&a);
        assert_eq!(ops.len(), 1, "{ops:?}");
        assert_eq!(saved_regions(&ops[0].1), Some(vec![0, 1, 2]));
        done(&mut node, 6, w[0].0);
        let a = done(&mut node, 7, ops[0].0);
        let w = disk_ops(&a);
        assert!(
            matches!(w[..], [(_, DiskOp::Write { lba: 7, .. })]),
            "{w:?}"
        );
        done(&mut node, 8, w[0].0);
        // Not flushed yet: cutting down keeps every region written.
        let a = node.handle(9, Input::Tick);
        assert!(saves(&a).is_empty(), "{a:?}");
        let a = client(&mut node, 10, 4, ClientReq::Flush);
        let f = disk_ops(&a);
        assert!(matches!(f[..], [(_, DiskOp::Flush)]), "{f:?}");
        done(&mut node, 11, f[0].0);
        // Flushed, and on every replica (there is one): nothing is needed.
        let a = node.handle(12, Input::Tick);
        assert_eq!(saves(&a), vec![Vec::<u32>::new()]);
        assert_eq!(node.log_saves(), 3);
    }

    #[test]
    fn a_waiting_save_takes_later_regions_and_a_write_after_a_flush_stays_named() {
        let mut node = crash_log_primary();
        let a = client(&mut node, 1, 1, write(0));
        let first = disk_ops(&a);
        assert_eq!(saved_regions(&first[0].1), Some(vec![0]));
        // Regions 1 then 2 while the first save is in flight: one more save,
        // waiting, takes both; nothing is issued until the first completes.
        let a = client(&mut node, 2, 2, write(4));
        assert!(disk_ops(&a).is_empty(), "{a:?}");
        let a = client(&mut node, 3, 3, write(8));
        assert!(disk_ops(&a).is_empty(), "{a:?}");
        let a = done(&mut node, 4, first[0].0);
        let ops = disk_ops(&a);
        assert!(matches!(ops[0].1, DiskOp::Write { lba: 0, .. }), "{ops:?}");
        assert_eq!(saved_regions(&ops[1].1), Some(vec![0, 1, 2]));
        assert_eq!(ops.len(), 2, "{ops:?}");
        assert_eq!(node.log_saves(), 2);
        done(&mut node, 5, ops[0].0);
        let a = done(&mut node, 6, ops[1].0);
        let writes = disk_ops(&a);
        assert_eq!(writes.len(), 2, "{writes:?}");
        for (id, _) in writes {
            done(&mut node, 7, id);
        }
        // A flush in flight, then a write to a named region: the flush does
        // not cover it, so once the flush completes, cutting the copy down
        // still keeps its region.
        let a = client(&mut node, 8, 4, ClientReq::Flush);
        let flush = disk_ops(&a);
        assert!(matches!(flush[..], [(_, DiskOp::Flush)]), "{flush:?}");
        let a = client(&mut node, 9, 5, write(0));
        let late = disk_ops(&a);
        assert!(
            matches!(late[..], [(_, DiskOp::Write { lba: 0, .. })]),
            "{late:?}"
        );
        // (Completed first, so only its unflushed group still names it.)
        done(&mut node, 10, late[0].0);
        done(&mut node, 11, flush[0].0);
        let a = node.handle(12, Input::Tick);
        assert_eq!(saves(&a), vec![vec![0]]);
    }

    #[test]
    fn primary_grows_its_disk_before_it_serves_the_new_size() {
        let (p, s, vol) = (NodeId(0), NodeId(1), VolumeId(1));
        let rec = Membership::new(vol, &[p, s], p, 2).with_blocks(10);
        let mut node = Node::new(p, 0, vol, small(10), Some(rec.clone()), 0);
        lease(&mut node, 0, p, vol);
        // A read in flight keeps the grow waiting.
        let a = client(&mut node, 1, 1, ClientReq::Read { lba: 0, blocks: 1 });
        let read = disk_ops(&a)[0].0;
        let mut grown = rec.clone().with_blocks(20);
        grown.version = 2;
        let a = record(&mut node, 2, &grown);
        assert!(disk_ops(&a).is_empty(), "the grow waits for the read");
        // Beyond the old end: not served yet (the client retries).
        let beyond = ClientReq::Write {
            lba: 12,
            data: vec![5; 2].into(),
            fua: false,
        };
        let a = client(&mut node, 3, 2, beyond.clone());
        assert_eq!(replied(&a, 2), Some(ClientReply::NotPrimary));
        assert!(
            disk_ops(&a).is_empty() && !sends(&a).iter().any(|(to, _)| *to == Endpoint::Node(s))
        );
        let a = done(&mut node, 4, read);
        let grow = disk_ops(&a);
        assert_eq!(grow.len(), 1, "{a:?}");
        assert_eq!(grow[0].1, DiskOp::Grow { blocks: 20 });
        let a = client(&mut node, 5, 3, ClientReq::Read { lba: 18, blocks: 2 });
        assert_eq!(
            replied(&a, 3),
            Some(ClientReply::NotPrimary),
            "disk not grown yet"
        );
        assert_eq!(node.serving_blocks(), 10);
        done(&mut node, 6, grow[0].0);
        assert_eq!((node.disk_blocks(), node.serving_blocks()), (20, 20));
        // Now served, and acknowledged only once the secondary has it too.
        let a = client(&mut node, 7, 4, beyond);
        assert!(sends(&a).iter().any(|(to, m)| *to == Endpoint::Node(s)
            && matches!(
                m,
                Msg::Repl {
                    op: ReplOp::Write { lba: 12, .. },
                    ..
                }
            )));
        let a = done(&mut node, 8, disk_ops(&a)[0].0);
        assert_eq!(replied(&a, 4), None, "the secondary has not acknowledged");
    }

    #[test]
    fn secondary_grows_before_a_write_beyond_its_end() {
        let (p, s, vol) = (NodeId(0), NodeId(1), VolumeId(1));
        let rec = Membership::new(vol, &[p, s], p, 2).with_blocks(10);
        let mut node = Node::new(s, 0, vol, small(10), Some(rec), 0);
        let repl = |lseq: u64, lba: u64| Msg::Repl {
            vol,
            epoch: Epoch(1),
            session: 0,
            lseq,
            vseq: lseq,
            commit: 0,
            floor: 0,
            op: ReplOp::Write {
                lba,
                data: vec![1; 2].into(),
                fua: false,
            },
        };
        let from = Endpoint::Node(p);
        let a = node.handle(
            1,
            Input::Msg {
                from,
                msg: repl(1, 2),
            },
        );
        let first = disk_ops(&a);
        assert_eq!(first.len(), 1);
        // The primary saw the grown record first: lba 14..16.
        let a = node.handle(
            2,
            Input::Msg {
                from,
                msg: repl(2, 14),
            },
        );
        assert!(
            disk_ops(&a).is_empty(),
            "the grow waits for the write in flight"
        );
        let a = done(&mut node, 3, first[0].0);
        let grow = disk_ops(&a);
        assert_eq!(grow.len(), 1);
        assert_eq!(grow[0].1, DiskOp::Grow { blocks: 16 });
        let a = done(&mut node, 4, grow[0].0);
        assert_eq!(node.disk_blocks(), 16);
        let write = disk_ops(&a);
        assert!(matches!(
            write.as_slice(),
            [(_, DiskOp::Write { lba: 14, .. })]
        ));
        // The record's size (larger) follows, once the write is done.
        let mut grown = Membership::new(vol, &[p, s], p, 2).with_blocks(24);
        grown.version = 2;
        let a = record(&mut node, 5, &grown);
        assert!(disk_ops(&a).is_empty());
        let a = done(&mut node, 6, write[0].0);
        assert!(matches!(
            disk_ops(&a).as_slice(),
            [(_, DiskOp::Grow { blocks: 24 })]
        ));
    }

    #[test]
    fn node_appointed_primary_grows_first_and_then_resyncs_the_whole_size() {
        let (p, s, vol) = (NodeId(0), NodeId(1), VolumeId(1));
        let rec = Membership::new(vol, &[p, s], p, 1).with_blocks(10);
        let mut node = Node::new(s, 0, vol, small(10), Some(rec.clone()), 0);
        // Failover: s becomes primary of epoch 2 of a volume grown to 20
        // blocks meanwhile (it missed the resize).
        let mut next = rec.with_blocks(20);
        next.version = 3;
        next.epoch = Epoch(2);
        next.primary = s;
        next.replicas.get_mut(&p).unwrap().state = ReplicaState::OutOfSync;
        let a = record(&mut node, 1, &next);
        assert_eq!(
            node.role(),
            RoleKind::Secondary(Epoch(1)),
            "not before the grow"
        );
        let grow = disk_ops(&a);
        assert!(matches!(
            grow.as_slice(),
            [(_, DiskOp::Grow { blocks: 20 })]
        ));
        done(&mut node, 2, grow[0].0);
        assert_eq!(node.role(), RoleKind::Primary(Epoch(2)));
        assert_eq!(node.serving_blocks(), 20);
        // The old primary may hold writes beyond 10 blocks: every region of
        // the grown volume is to be copied.
        assert_eq!(node.resync_progress().get(&p), Some(&(5, 5)));
    }

    #[test]
    fn write_is_acked_only_after_lease_local_disk_and_secondary() {
        let cfg = small(16);
        let (p, s) = (NodeId(0), NodeId(1));
        let rec = Membership::new(VolumeId(1), &[p, s], p, 2);
        let mut node = Node::new(p, 0, VolumeId(1), cfg, Some(rec), 0);
        let write = ClientReq::Write {
            lba: 1,
            data: vec![7].into(),
            fua: true,
        };
        let acts = node.handle(
            0,
            Input::Msg {
                from: Endpoint::Client,
                msg: Msg::ClientReq { id: 9, req: write },
            },
        );
        let disk_id = acts
            .iter()
            .find_map(|a| match a {
                Action::Disk { id, .. } => Some(*id),
                _ => None,
            })
            .unwrap();
        let repl = sends(&acts)
            .into_iter()
            .find(|(to, _)| *to == Endpoint::Node(s))
            .unwrap();
        assert!(matches!(
            repl.1,
            Msg::Repl {
                lseq: 1,
                op: ReplOp::Write { fua: true, .. },
                ..
            }
        ));
        let acked = |acts: &[Action]| sends(acts).iter().any(|(to, _)| *to == Endpoint::Client);
        let a = node.handle(
            1,
            Input::Disk {
                id: disk_id,
                result: DiskResult::Done { data: None },
            },
        );
        assert!(!acked(&a), "secondary has not acknowledged");
        let a = node.handle(
            2,
            Input::Msg {
                from: Endpoint::Node(s),
                msg: Msg::ReplAck {
                    vol: VolumeId(1),
                    epoch: Epoch(1),
                    session: 0,
                    lseq: 1,
                },
            },
        );
        assert!(!acked(&a), "no lease yet");
        let a = lease(&mut node, 3, p, VolumeId(1));
        assert!(acked(&a));
        // A newer epoch in a replication message demotes the primary.
        node.handle(
            4,
            Input::Msg {
                from: Endpoint::Node(s),
                msg: Msg::Repl {
                    vol: VolumeId(1),
                    epoch: Epoch(2),
                    session: 0,
                    lseq: 0,
                    vseq: 0,
                    commit: 0,
                    floor: 0,
                    op: ReplOp::Start,
                },
            },
        );
        assert_eq!(node.role(), RoleKind::Secondary(Epoch(2)));
    }

    /// The primary `p` (with its lease) of a fresh volume replicated on `p`
    /// and `s`, `min_in_sync` 2: 16 blocks of one byte, regions of 4.
    fn rf2_primary_with_lease() -> (Node, NodeId, NodeId, Membership) {
        let cfg = small(16);
        let (p, s) = (NodeId(0), NodeId(1));
        let rec = Membership::new(VolumeId(1), &[p, s], p, 2);
        let mut node = Node::new(p, 0, VolumeId(1), cfg, Some(rec.clone()), 0);
        let mut acts = lease(&mut node, 0, p, VolumeId(1));
        acts.extend(node.handle(0, Input::Tick));
        // A new volume's secondary is told the commit first (lseq 1);
        // client writes follow from lseq 2.
        let told = sends(&acts).into_iter().any(|(to, m)| {
            to == Endpoint::Node(s)
                && matches!(
                    m,
                    Msg::Repl {
                        lseq: 1,
                        commit: 1,
                        op: ReplOp::Flush,
                        ..
                    }
                )
        });
        assert!(told, "the secondary is told the commit: {acts:?}");
        let ack = Msg::ReplAck {
            vol: VolumeId(1),
            epoch: Epoch(1),
            session: 0,
            lseq: 1,
        };
        node.handle(
            0,
            Input::Msg {
                from: Endpoint::Node(s),
                msg: ack,
            },
        );
        (node, p, s, rec)
    }

    /// A compare checksums the primary's copy and the in-sync secondary's
    /// at the same point of the stream; a secondary whose copy differs is
    /// named in the reply and gets the primary's copy of the region,
    /// streamed like a resync copy while it stays InSync.
    #[test]
    fn a_compare_names_a_differing_replica_and_rewrites_its_copy() {
        let (mut node, _, s, _) = rf2_primary_with_lease();
        let msg = |from, msg| Input::Msg { from, msg };
        let compare = |node: &mut Node, t: u64, id: u64, theirs: Option<u32>| {
            let acts = client(node, t, id, ClientReq::Compare { lba: 4, blocks: 4 });
            let (lseq, op) = sends(&acts)
                .into_iter()
                .find_map(|(to, m)| match m {
                    Msg::Repl { lseq, op, .. } if to == Endpoint::Node(s) => Some((lseq, op)),
                    _ => None,
                })
                .expect("the digest is streamed to the secondary");
            assert_eq!(op, ReplOp::Digest { lba: 4, blocks: 4 });
            let [(d, DiskOp::Read { lba: 4, blocks: 4 })] = disk_ops(&acts)[..] else {
                panic!("the primary reads its own copy: {acts:?}");
            };
            let result = DiskResult::Done {
                data: Some(vec![1, 2, 3, 4]),
            };
            let mut all = node.handle(t, Input::Disk { id: d, result });
            let digest = Msg::ReplDigest {
                vol: VolumeId(1),
                epoch: Epoch(1),
                session: 0,
                lseq,
                digest: theirs,
            };
            all.extend(node.handle(t, msg(Endpoint::Node(s), digest)));
            all
        };
        let same = crate::msg::digest(&[1, 2, 3, 4]);
        let acts = compare(&mut node, 10, 1, Some(same));
        let Some(ClientReply::Ok { data: Some(d), .. }) = replied(&acts, 1) else {
            panic!("compare answered: {acts:?}");
        };
        let outcome = crate::msg::Compared::decode(&d);
        assert_eq!(
            outcome,
            Some(crate::msg::Compared {
                replicas: vec![s],
                differing: vec![]
            })
        );
        assert!(disk_ops(&acts).is_empty(), "nothing to copy: {acts:?}");

        // The secondary's copy differs (or fails its checksums there).
        for (id, theirs) in [(2, Some(same ^ 1)), (3, None)] {
            let t = id * 10;
            let acts = compare(&mut node, t, id, theirs);
            let Some(ClientReply::Ok { data: Some(d), .. }) = replied(&acts, id) else {
                panic!("compare answered: {acts:?}");
            };
            let outcome = crate::msg::Compared::decode(&d).expect("a compare's outcome");
            assert_eq!((outcome.replicas, outcome.differing), (vec![s], vec![s]));
            let acts = node.handle(t + 1, Input::Tick);
            let [(r, DiskOp::Read { lba: 4, blocks: 4 })] = disk_ops(&acts)[..] else {
                panic!("region 1 is read for a copy: {acts:?}");
            };
            let result = DiskResult::Done {
                data: Some(vec![1, 2, 3, 4]),
            };
            let acts = node.handle(t + 2, Input::Disk { id: r, result });
            let copy = sends(&acts).into_iter().find_map(|(to, m)| match m {
                Msg::Repl { op, lseq, .. } if to == Endpoint::Node(s) => Some((op, lseq)),
                _ => None,
            });
            let Some((ReplOp::Write { lba: 4, data, .. }, lseq)) = copy else {
                panic!("the copy is streamed: {acts:?}");
            };
            assert_eq!(data, vec![1, 2, 3, 4]);
            let ack = Msg::ReplAck {
                vol: VolumeId(1),
                epoch: Epoch(1),
                session: 0,
                lseq,
            };
            node.handle(t + 3, msg(Endpoint::Node(s), ack));
            let acts = node.handle(t + 4, Input::Tick);
            assert!(
                disk_ops(&acts).is_empty(),
                "acknowledged: no copy again: {acts:?}"
            );
        }
        assert_eq!(node.role(), RoleKind::Primary(Epoch(1)), "still InSync");
    }

    /// A replica out of sync holds the floor back (its regions stay in the
    /// others' logs) but never counts towards `min_in_sync`.
    #[test]
    fn a_replica_out_of_sync_does_not_count_towards_min_in_sync() {
        let (mut node, _, s, rec) = rf2_primary_with_lease();
        let msg = |from, msg| Input::Msg { from, msg };
        let acked = |acts: &[Action], id: u64| {
            sends(acts).iter().any(|(to, m)| {
                *to == Endpoint::Client
                    && matches!(m, Msg::ClientReply { id: i, reply: ClientReply::Ok { .. } } if *i == id)
            })
        };
        // Writes 1 and 2 reach both; the secondary's acknowledgements (of
        // the commit's flush, then of the writes) move its `acked_commit`
        // above 0, so once out of sync it holds the floor back.
        for id in 1..=3u64 {
            if id == 3 {
                // The secondary is marked OutOfSync (the CAS succeeded).
                let mut out = rec.clone();
                out.version += 1;
                if let Some(info) = out.replicas.get_mut(&s) {
                    info.state = ReplicaState::OutOfSync;
                }
                let reply = Msg::MetaReply {
                    record: out,
                    cas_ok: None,
                };
                node.handle(id * 10, msg(Endpoint::Control, reply));
            }
            let req = ClientReq::Write {
                lba: id,
                data: vec![7].into(),
                fua: false,
            };
            let acts = node.handle(id * 10, msg(Endpoint::Client, Msg::ClientReq { id, req }));
            let mut all = Vec::new();
            for a in &acts {
                if let Action::Disk { id: d, .. } = a {
                    let result = DiskResult::Done { data: None };
                    all.extend(node.handle(id * 10 + 1, Input::Disk { id: *d, result }));
                }
            }
            if id < 3 {
                let ack = Msg::ReplAck {
                    vol: VolumeId(1),
                    epoch: Epoch(1),
                    session: 0,
                    lseq: id + 1,
                };
                all.extend(node.handle(id * 10 + 2, msg(Endpoint::Node(s), ack)));
                assert!(acked(&all, id), "write {id} with both replicas");
            } else {
                assert!(!acked(&all, id), "write 3 acknowledged below min_in_sync");
            }
        }
    }

    /// A compare-and-write reads only once the write before it is done
    /// here (the disk queue orders them), holds the write after it until its own write is issued, and
    /// writes exactly the blocks that match (one write from the first to
    /// the last, the others as read), or none (`whole`, or no match).
    #[test]
    fn compare_and_write_is_ordered_between_the_writes_around_it() {
        let p = NodeId(0);
        let rec = Membership::new(VolumeId(1), &[p], p, 1);
        let mut node = Node::new(p, 0, VolumeId(1), small(16), Some(rec), 0);
        lease(&mut node, 0, p, VolumeId(1));
        node.handle(0, Input::Tick);
        let data = |d: &[u8]| crate::payload::aligned(d);
        let w1 = ClientReq::Write {
            lba: 4,
            data: data(&[1, 1, 1]),
            fua: false,
        };
        let [(w1_io, _)] = disk_ops(&client(&mut node, 1, 1, w1))[..] else {
            panic!("the first write goes to the disk");
        };
        let cw = ClientReq::compare_write(4, &[1, 1, 1], &[9, 9, 9], true, false);
        assert!(
            disk_ops(&client(&mut node, 1, 2, cw)).is_empty(),
            "read before the write it overlaps is done"
        );
        let w2 = ClientReq::Write {
            lba: 5,
            data: data(&[2]),
            fua: false,
        };
        assert!(
            disk_ops(&client(&mut node, 1, 3, w2)).is_empty(),
            "held behind the compare"
        );
        let a = done(&mut node, 2, w1_io);
        assert!(
            matches!(replied(&a, 1), Some(ClientReply::Ok { .. })),
            "{a:?}"
        );
        let [(read_io, DiskOp::Read { lba: 4, blocks: 3 })] = disk_ops(&a)[..] else {
            panic!("{a:?}");
        };
        let a = node.handle(
            3,
            Input::Disk {
                id: read_io,
                result: DiskResult::Done {
                    data: Some(vec![1, 1, 1]),
                },
            },
        );
        let ops = disk_ops(&a);
        let writes: Vec<(u64, Vec<u8>)> = ops
            .iter()
            .filter_map(|(_, op)| match op {
                DiskOp::Write { lba, data, .. } => Some((*lba, data.to_vec())),
                _ => None,
            })
            .collect();
        // The compare's write, then the held write (the disk queue may
        // hold the second until the first is done).
        assert_eq!(writes.first(), Some(&(4, vec![9, 9, 9])), "{a:?}");
        let mut pending = ops;
        let mut replies = Vec::new();
        while let Some((id, op)) = pending.pop() {
            let a = done(&mut node, 4, id);
            if let DiskOp::Write { lba: 5, .. } = op {
                assert!(
                    replies.iter().any(|(i, _)| *i == 2),
                    "the held write went first"
                );
            }
            replies.extend(
                [2, 3]
                    .into_iter()
                    .filter_map(|i| replied(&a, i).map(|r| (i, r))),
            );
            pending.extend(disk_ops(&a));
        }
        let outcome = |replies: &[(u64, ClientReply)], id| {
            replies
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, r)| match r {
                    ClientReply::Ok { data: Some(d), .. } => CompareWritten::decode(d),
                    other => panic!("{other:?}"),
                })
        };
        let all = CompareWritten {
            matched: vec![true; 3],
            written: true,
        };
        assert_eq!(outcome(&replies, 2), Some(Some(all)), "{replies:?}");
        assert!(replies
            .iter()
            .any(|(i, r)| *i == 3 && matches!(r, ClientReply::Ok { .. })));

        // Now 9 2 9 0: a whole compare of 9 9 9 0 writes nothing; a
        // per-block one writes blocks 4, 6 and 7 (5 as read).
        for (id, whole, want, written) in [
            (4, true, None, false),
            (5, false, Some((4, vec![5, 2, 5, 5])), true),
        ] {
            let cw = ClientReq::compare_write(4, &[9, 9, 9, 0], &[5, 5, 5, 5], whole, false);
            let a = client(&mut node, 5, id, cw);
            let [(read_io, DiskOp::Read { lba: 4, blocks: 4 })] = disk_ops(&a)[..] else {
                panic!("{a:?}");
            };
            let a = node.handle(
                6,
                Input::Disk {
                    id: read_io,
                    result: DiskResult::Done {
                        data: Some(vec![9, 2, 9, 0]),
                    },
                },
            );
            let ops = disk_ops(&a);
            let write = ops.iter().find_map(|(_, op)| match op {
                DiskOp::Write { lba, data, .. } => Some((*lba, data.to_vec())),
                _ => None,
            });
            assert_eq!(write, want, "{a:?}");
            let mut reply = replied(&a, id);
            for (io, _) in ops {
                reply = reply.or(replied(&done(&mut node, 7, io), id));
            }
            let Some(ClientReply::Ok { data: Some(d), .. }) = reply else {
                panic!("{reply:?}");
            };
            let matched = vec![true, false, true, true];
            assert_eq!(
                CompareWritten::decode(&d),
                Some(CompareWritten { matched, written })
            );
        }
    }

    /// A snapshot read through the primary (`ClientReq::ReadLayer`, how a
    /// node holding no replica exports a snapshot): `NoSuchLayer` for a
    /// layer it does not hold; once it does, ordered after the snapshot and
    /// answered with what its disk read, or `Unreadable` when its copy of
    /// the layer fails its checksum (layers are not repaired from
    /// replicas: the read must end, not wait for ever).
    #[test]
    fn snapshot_reads_are_answered_from_the_primarys_layer() {
        let p = NodeId(0);
        let rec = Membership::new(VolumeId(1), &[p], p, 1);
        let mut node = Node::new(p, 0, VolumeId(1), small(16), Some(rec), 0);
        lease(&mut node, 0, p, VolumeId(1));
        node.handle(0, Input::Tick);
        let layer = LayerId(9);
        let read = ClientReq::ReadLayer {
            layer,
            lba: 2,
            blocks: 3,
        };
        let a = client(&mut node, 1, 1, read.clone());
        assert!(
            matches!(replied(&a, 1), Some(ClientReply::NoSuchLayer { .. })),
            "{a:?}"
        );
        assert!(disk_ops(&a).is_empty(), "{a:?}");
        // The snapshot, then a read of it while it is being taken.
        let mut pending = disk_ops(&client(&mut node, 2, 2, ClientReq::Snapshot { layer }));
        let a = client(&mut node, 2, 3, read.clone());
        assert!(replied(&a, 3).is_none(), "{a:?}");
        pending.extend(disk_ops(&a));
        let mut answer = None;
        while let Some((id, op)) = pending.pop() {
            let data = match op {
                DiskOp::ReadLayer {
                    layer: l,
                    lba: 2,
                    blocks: 3,
                } if l == layer => Some(vec![5, 6, 7]),
                DiskOp::ReadLayer { .. } => panic!("{op:?}"),
                _ => None,
            };
            let a = node.handle(
                3,
                Input::Disk {
                    id,
                    result: DiskResult::Done { data },
                },
            );
            answer = answer.or(replied(&a, 3));
            pending.extend(disk_ops(&a));
        }
        assert!(
            matches!(&answer, Some(ClientReply::Ok { data: Some(d), .. }) if d == &vec![5, 6, 7]),
            "{answer:?}"
        );
        let a = client(&mut node, 4, 4, read);
        let [(id, DiskOp::ReadLayer { .. })] = disk_ops(&a)[..] else {
            panic!("{a:?}");
        };
        let a = node.handle(
            5,
            Input::Disk {
                id,
                result: DiskResult::Corrupt,
            },
        );
        assert!(
            matches!(replied(&a, 4), Some(ClientReply::Unreadable { .. })),
            "{a:?}"
        );
    }

    /// A layer deletion, a flatten or a compaction may take seconds on a
    /// replica (a merge, a copy) while later writes go on: its entry
    /// unacknowledged past the ack timeout does not fail the link (found
    /// measuring snapshot deletions on RF3, which stalled writes for
    /// seconds while each replica was marked out of sync and resynced), but
    /// a write's does.
    #[test]
    fn a_slow_flatten_or_compaction_does_not_fail_its_link_and_a_slow_write_does() {
        let flatten = ClientReq::Flatten {
            lba: 0,
            blocks: 16,
            rate: 0,
        };
        let compact = ClientReq::Compact {
            lba: 0,
            blocks: 16,
            rate: 0,
        };
        for (req, data) in [
            (flatten, Flattened::default().encode()),
            (compact, b"report".to_vec()),
        ] {
            slow_background_entry(req, data);
        }
    }

    /// [`a_slow_flatten_or_compaction_does_not_fail_its_link_and_a_slow_write_does`]
    /// with `req`, whose disk operation completes with `data`.
    fn slow_background_entry(req: ClientReq, data: Vec<u8>) {
        let (mut node, _, s, _) = rf2_primary_with_lease();
        let timeout = Config::default().ack_timeout_ms;
        let marks_out_of_sync = |acts: &[Action]| {
            sends(acts).iter().any(|(to, m)| {
                *to == Endpoint::Control
                    && matches!(m, Msg::MetaCas { record, .. }
                        if record.replicas.get(&s).is_some_and(|r| r.state != ReplicaState::InSync))
            })
        };
        let what = format!("{req:?}");
        let streams_it = |acts: &[Action]| {
            sends(acts).iter().any(|(to, m)| {
                *to == Endpoint::Node(s)
                    && matches!(m, Msg::Repl { op, .. }
                        if op.is_background() && format!("{op:?}") == what)
            })
        };
        let acts = client(&mut node, 1, 1, req);
        assert!(
            streams_it(&acts),
            "{what} goes to the in-sync secondary: {acts:?}"
        );
        for (id, _) in disk_ops(&acts) {
            node.handle(
                2,
                Input::Disk {
                    id,
                    result: DiskResult::Done {
                        data: Some(data.clone()),
                    },
                },
            );
        }
        let acts = lease(&mut node, 3 * timeout, NodeId(0), VolumeId(1));
        let mut all = acts;
        all.extend(node.handle(3 * timeout, Input::Tick));
        assert!(
            !marks_out_of_sync(&all),
            "a slow {what} failed its link: {all:?}"
        );
        // Not acknowledged within the timeout, it is sent again (a lost
        // entry or acknowledgement would otherwise hold it for ever).
        assert!(streams_it(&all), "{what} was not sent again: {all:?}");
        let acts = client(&mut node, 3 * timeout, 2, write(3));
        for (id, _) in disk_ops(&acts) {
            node.handle(
                3 * timeout,
                Input::Disk {
                    id,
                    result: DiskResult::Done { data: None },
                },
            );
        }
        lease(&mut node, 5 * timeout, NodeId(0), VolumeId(1));
        let all = node.handle(5 * timeout, Input::Tick);
        assert!(
            marks_out_of_sync(&all),
            "an unacknowledged write did not fail its link: {all:?}"
        );
    }

    #[test]
    fn deposed_primary_keeps_its_log_and_a_stale_record_does_not_promote_it() {
        let (mut node, _, s, rec) = rf2_primary_with_lease();
        let msg = |from, msg| Input::Msg { from, msg };
        let mut disk_ids = Vec::new();
        for (id, lba) in [(1, 1), (2, 9)] {
            let req = ClientReq::Write {
                lba,
                data: vec![7].into(),
                fua: false,
            };
            let acts = node.handle(1, msg(Endpoint::Client, Msg::ClientReq { id, req }));
            disk_ids.extend(acts.iter().filter_map(|a| match a {
                Action::Disk { id, .. } => Some(*id),
                _ => None,
            }));
        }
        for id in disk_ids {
            let result = DiskResult::Done { data: None };
            node.handle(2, Input::Disk { id, result });
        }
        // The secondary acknowledges the first write only (lseq 2, after
        // the commit's flush): it is acknowledged to the client, the
        // second is not.
        let ack = Msg::ReplAck {
            vol: VolumeId(1),
            epoch: Epoch(1),
            session: 0,
            lseq: 2,
        };
        let acts = node.handle(3, msg(Endpoint::Node(s), ack));
        assert!(sends(&acts).iter().any(|(to, _)| *to == Endpoint::Client));
        // Its successor's `Fenced` deposes it; the record it still holds
        // names it primary of epoch 1, and must not promote it again.
        let fenced = Msg::Fenced {
            vol: VolumeId(1),
            epoch: Epoch(2),
        };
        node.handle(4, msg(Endpoint::Node(s), fenced));
        assert_eq!(node.role(), RoleKind::Secondary(Epoch(2)));
        node.handle(
            5,
            msg(
                Endpoint::Control,
                Msg::MetaReply {
                    record: rec,
                    cas_ok: None,
                },
            ),
        );
        assert_eq!(node.role(), RoleKind::Secondary(Epoch(2)));
        // The new primary's `Start` gets this node's log of epoch 1: both
        // writes' regions (the second may be on its disk alone), and
        // `synced` 2 (it acknowledged the first, vseq 2: vseq 1 stands for
        // the epoch's start).
        let start = Msg::Repl {
            vol: VolumeId(1),
            epoch: Epoch(2),
            session: 1,
            lseq: 0,
            vseq: 0,
            commit: 0,
            floor: 0,
            op: ReplOp::Start,
        };
        let acts = node.handle(6, msg(Endpoint::Node(s), start));
        let prior = sends(&acts).into_iter().find_map(|(_, m)| match m {
            Msg::ReplStarted { prior, .. } => Some(prior),
            _ => None,
        });
        let expected = Prior {
            epoch: Epoch(1),
            synced: 2,
            regions: vec![0, 2],
        };
        assert_eq!(prior, Some(Some(expected)));
    }

    #[test]
    fn replicas_added_are_resynced_and_removed_ones_are_not_waited_for() {
        let cfg = small(16);
        let (p, s1, s2) = (NodeId(0), NodeId(1), NodeId(2));
        let vol = VolumeId(1);
        let rec = Membership::new(vol, &[p, s1], p, 1);
        let mut node = Node::new(p, 0, vol, cfg, Some(rec.clone()), 0);
        let lease = |node: &mut Node, t: u64| lease(node, t, p, vol);
        lease(&mut node, 0);
        let acts = node.handle(
            1,
            Input::Msg {
                from: Endpoint::Client,
                msg: Msg::ClientReq {
                    id: 5,
                    req: ClientReq::Write {
                        lba: 0,
                        data: vec![1].into(),
                        fua: false,
                    },
                },
            },
        );
        let disk_id = acts
            .iter()
            .find_map(|a| match a {
                Action::Disk { id, .. } => Some(*id),
                _ => None,
            })
            .unwrap();
        let a = node.handle(
            2,
            Input::Disk {
                id: disk_id,
                result: DiskResult::Done { data: None },
            },
        );
        assert!(
            !sends(&a).iter().any(|(to, _)| *to == Endpoint::Client),
            "waits for s1"
        );
        // The coordinator replaces s1 by s2 (joining empty).
        let mut next = rec.clone();
        next.version = 2;
        next.replicas.remove(&s1);
        next.replicas.insert(
            s2,
            ReplicaInfo {
                state: ReplicaState::OutOfSync,
                boot: 0,
            },
        );
        let a = node.handle(
            3,
            Input::Msg {
                from: Endpoint::Control,
                msg: Msg::MetaReply {
                    record: next,
                    cas_ok: None,
                },
            },
        );
        assert!(
            sends(&a).iter().any(|(to, m)| *to == Endpoint::Client
                && matches!(
                    m,
                    Msg::ClientReply {
                        id: 5,
                        reply: ClientReply::Ok { .. }
                    }
                )),
            "the write no longer waits for the removed replica: {a:?}"
        );
        assert_eq!(
            node.resync_progress().get(&s2),
            Some(&(4, 4)),
            "the added replica has every region to copy"
        );
        lease(&mut node, 99);
        let a = node.handle(100, Input::Tick);
        assert!(
            sends(&a).iter().any(|(to, m)| *to == Endpoint::Node(s2)
                && matches!(
                    m,
                    Msg::Repl {
                        op: ReplOp::Start,
                        ..
                    }
                )),
            "the added replica is resynced: {a:?}"
        );
    }

    /// A replica that finished its resync learns the epoch's `commit` as
    /// soon as the record makes it InSync, not with the next client write:
    /// otherwise a failover before that write finds it with `synced = 0`
    /// and copies it in full (a rolling restart of idle volumes).
    #[test]
    fn a_replica_made_in_sync_is_told_the_commit_without_waiting_for_a_write() {
        let cfg = small(4);
        let (p, s1) = (NodeId(0), NodeId(1));
        let vol = VolumeId(1);
        let mut rec = Membership::new(vol, &[p, s1], p, 1);
        if let Some(r) = rec.replicas.get_mut(&s1) {
            r.state = ReplicaState::OutOfSync;
        }
        let mut meta = crate::types::MetaStore::default();
        meta.create(rec.clone());
        let mut node = Node::new(p, 0, vol, cfg, Some(rec), 0);
        lease(&mut node, 0, p, vol);
        // Acknowledged by the primary alone (s1 is out of sync): commit 1.
        let mut pending = node.handle(
            1,
            Input::Msg {
                from: Endpoint::Client,
                msg: Msg::ClientReq {
                    id: 5,
                    req: ClientReq::Write {
                        lba: 0,
                        data: vec![1].into(),
                        fua: false,
                    },
                },
            },
        );
        // Play s1, the disk and the metadata service; no client write more.
        let mut commits_to_s1 = Vec::new();
        let mut acked = false;
        for t in 2..500 {
            let mut next = Vec::new();
            for a in pending.drain(..) {
                let input = match a {
                    Action::Disk { id, op } => Input::Disk {
                        id,
                        result: DiskResult::Done {
                            data: match op {
                                DiskOp::Read { blocks, .. } => Some(vec![1; blocks as usize]),
                                _ => None,
                            },
                        },
                    },
                    Action::Send {
                        to: Endpoint::Node(n),
                        msg:
                            Msg::Repl {
                                session,
                                lseq,
                                commit,
                                op,
                                ..
                            },
                    } if n == s1 => {
                        commits_to_s1.push(commit);
                        Input::Msg {
                            from: Endpoint::Node(s1),
                            msg: if op == ReplOp::Start {
                                Msg::ReplStarted {
                                    vol,
                                    epoch: Epoch(1),
                                    session,
                                    prior: None,
                                    layers: Vec::new(),
                                }
                            } else {
                                Msg::ReplAck {
                                    vol,
                                    epoch: Epoch(1),
                                    session,
                                    lseq,
                                }
                            },
                        }
                    }
                    Action::Send {
                        to: Endpoint::Control,
                        msg: Msg::MetaCas { expected, record },
                    } => Input::Msg {
                        from: Endpoint::Control,
                        msg: match meta.cas(expected, record) {
                            Ok(record) => Msg::MetaReply {
                                record,
                                cas_ok: Some(true),
                            },
                            Err(e) => panic!("CAS refused: {e:?}"),
                        },
                    },
                    Action::Send {
                        to: Endpoint::Client,
                        msg: Msg::ClientReply { id: 5, .. },
                    } => {
                        acked = true;
                        continue;
                    }
                    _ => continue,
                };
                next.extend(node.handle(t, input));
            }
            next.extend(lease(&mut node, t, p, vol));
            next.extend(node.handle(t, Input::Tick));
            pending = next;
        }
        assert!(acked, "the write was acknowledged");
        let rec = meta.get(vol).expect("the record");
        assert_eq!(
            rec.replicas.get(&s1).map(|r| r.state),
            Some(ReplicaState::InSync),
            "s1 was resynced"
        );
        // Start, the copy and the final flush carry 0 (s1 was not InSync);
        // then one flush carries the commit, which covers the epoch's start
        // (vseq 1), the write (2) and the copy (3).
        assert_eq!(
            commits_to_s1,
            [0, 0, 0, 3],
            "s1 was told the commit once InSync"
        );
    }

    #[test]
    fn replica_removed_and_re_added_gets_a_new_session() {
        let cfg = small(16);
        let (p, s1) = (NodeId(0), NodeId(1));
        let vol = VolumeId(1);
        let mut rec = Membership::new(vol, &[p, s1], p, 1);
        let mut node = Node::new(p, 0, vol, cfg, Some(rec.clone()), 0);
        let deliver = |node: &mut Node, t: u64, rec: &Membership| {
            node.handle(
                t,
                Input::Msg {
                    from: Endpoint::Control,
                    msg: Msg::MetaReply {
                        record: rec.clone(),
                        cas_ok: None,
                    },
                },
            )
        };
        let starts = |acts: &[Action]| -> Vec<u64> {
            sends(acts)
                .into_iter()
                .filter_map(|(to, m)| match m {
                    Msg::Repl {
                        session,
                        op: ReplOp::Start,
                        ..
                    } if to == Endpoint::Node(s1) => Some(session),
                    _ => None,
                })
                .collect()
        };
        // s1 falls out of sync and is resynced in session 1.
        rec.version = 2;
        rec.replicas.get_mut(&s1).unwrap().state = ReplicaState::OutOfSync;
        deliver(&mut node, 1, &rec);
        assert_eq!(starts(&node.handle(50, Input::Tick)), vec![1]);
        // Removed, then added again (empty): its secondary may still hold
        // session 1 of this epoch, so the new stream must not reuse it.
        rec.version = 3;
        rec.replicas.remove(&s1);
        deliver(&mut node, 51, &rec);
        rec.version = 4;
        rec.replicas.insert(
            s1,
            ReplicaInfo {
                state: ReplicaState::OutOfSync,
                boot: 0,
            },
        );
        deliver(&mut node, 52, &rec);
        let again = starts(&node.handle(100, Input::Tick));
        assert!(
            again.len() == 1 && again[0] > 1,
            "session reused: {again:?}"
        );
    }

    /// Runs a primary resyncing one OutOfSync secondary from `t = 0` to
    /// `until` ms in steps of `step` ms: disk reads complete at once with
    /// `fill(lba)`, the secondary acknowledges every entry at once. Returns
    /// when each resync read was issued (ms, lba) and the `Repl` ops sent.
    fn resync_run(
        cfg: Config,
        fill: impl Fn(u64) -> u8,
        until: u64,
        step: u64,
    ) -> (Vec<(u64, u64)>, Vec<ReplOp>) {
        resync_run_with(cfg, 1, fill, until, step, None)
    }

    fn resync_run_min(
        cfg: Config,
        min_in_sync: usize,
        fill: impl Fn(u64) -> u8,
        until: u64,
        step: u64,
    ) -> (Vec<(u64, u64)>, Vec<ReplOp>) {
        resync_run_with(cfg, min_in_sync, fill, until, step, None)
    }

    /// `resync_run` with a record requiring `min_in_sync` replicas.
    /// `set_rate`: at that time (ms), the rate cap changes to that value.
    fn resync_run_with(
        cfg: Config,
        min_in_sync: usize,
        fill: impl Fn(u64) -> u8,
        until: u64,
        step: u64,
        set_rate: Option<(u64, u64)>,
    ) -> (Vec<(u64, u64)>, Vec<ReplOp>) {
        let (p, s, vol) = (NodeId(0), NodeId(1), VolumeId(1));
        let bl = cfg.block_len as usize;
        let mut rec = Membership::new(vol, &[p, s], p, min_in_sync);
        rec.replicas.get_mut(&s).unwrap().state = ReplicaState::OutOfSync;
        let mut node = Node::new(p, 0, vol, cfg, None, 0);
        let mut pending = node.handle(
            0,
            Input::Msg {
                from: Endpoint::Control,
                msg: Msg::MetaReply {
                    record: rec,
                    cas_ok: None,
                },
            },
        );
        let (mut reads, mut ops) = (Vec::new(), Vec::new());
        let mut t = 0;
        while t <= until {
            if let Some((at, rate)) = set_rate.filter(|(at, _)| *at == t) {
                assert!(node.copying(), "at {at} ms the resync is under way");
                node.set_resync_rate(t, rate);
            }
            pending.extend(node.handle(t, Input::Tick));
            while !pending.is_empty() {
                let mut next = Vec::new();
                for a in std::mem::take(&mut pending) {
                    match a {
                        Action::Disk {
                            id,
                            op: DiskOp::Read { lba, blocks },
                        } => {
                            reads.push((t, lba));
                            let data = vec![fill(lba); blocks as usize * bl];
                            next.extend(node.handle(
                                t,
                                Input::Disk {
                                    id,
                                    result: DiskResult::Done { data: Some(data) },
                                },
                            ));
                        }
                        Action::Send {
                            to: Endpoint::Node(n),
                            msg:
                                Msg::Repl {
                                    epoch,
                                    session,
                                    lseq,
                                    op,
                                    ..
                                },
                        } if n == s => {
                            ops.push(op);
                            next.extend(node.handle(
                                t,
                                Input::Msg {
                                    from: Endpoint::Node(s),
                                    msg: Msg::ReplAck {
                                        vol,
                                        epoch,
                                        session,
                                        lseq,
                                    },
                                },
                            ));
                        }
                        Action::Disk { id, .. } => next.extend(node.handle(
                            t,
                            Input::Disk {
                                id,
                                result: DiskResult::Done { data: None },
                            },
                        )),
                        Action::Send { .. } => {}
                    }
                }
                pending = next;
            }
            t += step;
        }
        (reads, ops)
    }

    const MIB: u64 = 1 << 20;

    /// 16 regions of 4 MiB.
    fn big_volume(rate: u64, inflight: usize) -> Config {
        Config {
            block_len: 4096,
            region_blocks: 1024,
            volume_blocks: 16 * 1024,
            resync_rate: rate,
            resync_inflight: inflight,
            ..Config::default()
        }
    }

    #[test]
    fn rate_cap_spaces_copies_of_data() {
        // 1 MiB/s and 4 MiB regions: after the first copy (the bucket starts
        // full with one region), one copy every 4 s.
        let (reads, ops) = resync_run(big_volume(MIB, 1), |_| 7, 20_000, 10);
        let times: Vec<u64> = reads.iter().map(|(t, _)| *t).collect();
        assert_eq!(times.len(), 5, "{times:?}");
        for w in times.windows(2) {
            let gap = w[1] - w[0];
            assert!((4000..=4010).contains(&gap), "{times:?}");
        }
        assert!(ops
            .iter()
            .all(|op| !matches!(op, ReplOp::WriteZeroes { .. })));

        // Four in flight: the bucket holds four regions, which go at once;
        // then the rate is the same.
        let (reads, _) = resync_run(big_volume(MIB, 4), |_| 7, 20_000, 10);
        let times: Vec<u64> = reads.iter().map(|(t, _)| *t).collect();
        assert_eq!(&times[..4], &[times[0]; 4], "{times:?}");
        assert_eq!(times.len(), 8, "{times:?}");
        for w in times[3..].windows(2) {
            assert!((4000..=4010).contains(&(w[1] - w[0])), "{times:?}");
        }

        // No cap: the whole volume in one step per round trip.
        let (reads, _) = resync_run(big_volume(0, 4), |_| 7, 1_000, 10);
        assert_eq!(reads.len(), 16);
        assert!(reads.iter().all(|(t, _)| *t == reads[0].0), "{reads:?}");
    }

    #[test]
    fn a_changed_rate_cap_applies_from_then_on() {
        // 1 MiB/s: a 4 MiB region every 4 s; at 8.5 s (0.46 s after the
        // third copy, with 0.46 MiB earned) the node's share becomes
        // 2 MiB/s: the next copy 1.77 s later, then one every 2 s.
        let (reads, _) = resync_run_with(
            big_volume(MIB, 1),
            1,
            |_| 7,
            16_000,
            10,
            Some((8_500, 2 * MIB)),
        );
        let times: Vec<u64> = reads.iter().map(|(t, _)| *t).collect();
        let gaps: Vec<u64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps.len(), 5, "{times:?}");
        for (gap, want) in gaps.iter().zip([4000, 4000, 2230, 2000, 2000]) {
            assert!((want..=want + 10).contains(gap), "{times:?}");
        }
    }

    #[test]
    fn rate_cap_does_not_hold_back_a_volume_below_min_in_sync() {
        // RF 2 with min_in_sync 2 and the secondary out of sync: client
        // writes wait for the resync, so the copies ignore the 1 MiB/s cap
        // and the whole volume goes in one round trip.
        let (reads, _) = resync_run_min(big_volume(MIB, 4), 2, |_| 7, 1_000, 10);
        assert_eq!(reads.len(), 16, "{reads:?}");
        assert!(reads.iter().all(|(t, _)| *t == reads[0].0), "{reads:?}");
    }

    #[test]
    fn regions_of_zeros_go_as_zeroing_at_a_sixteenth_of_the_cost() {
        // Region 3 holds data, the others read as zeros: 15 WriteZeroes and
        // one 4 MiB write. At 1 MiB/s a zero region costs 256 KiB, a data
        // region 4 MiB: once the data region has taken half the bucket,
        // zero regions go four a second (each still needs a region's worth
        // in the bucket to start), where data would go one per 4 s.
        let region3 = 3 * 1024;
        let (reads, ops) = resync_run(
            big_volume(MIB, 2),
            |lba| u8::from(lba == region3),
            10_000,
            10,
        );
        let times: Vec<u64> = reads.iter().map(|(t, _)| *t).collect();
        assert_eq!(times.len(), 16, "{reads:?}");
        assert_eq!(&times[..4], &[times[0]; 4], "{reads:?}");
        for w in times[4..].windows(2) {
            assert!((250..=260).contains(&(w[1] - w[0])), "{reads:?}");
        }
        assert!(times[15] <= 4_000, "{reads:?}");
        let zeroes = ops
            .iter()
            .filter(|op| {
                matches!(
                    op,
                    ReplOp::WriteZeroes {
                        blocks: 1024,
                        fua: false,
                        ..
                    }
                )
            })
            .count();
        let data: Vec<u64> = ops
            .iter()
            .filter_map(|op| match op {
                ReplOp::Write { lba, data, .. } => Some((*lba, data.len() as u64)),
                _ => None,
            })
            .map(|(lba, len)| {
                assert_eq!(len, 4 * MIB);
                lba
            })
            .collect();
        assert_eq!((zeroes, data), (15, vec![region3]));
        assert!(
            matches!(ops.last(), Some(ReplOp::Flush)),
            "the resync ends with its flush: {ops:?}"
        );

        // A volume of zeros only: 16 regions at 256 KiB, 4 MiB in all, fit
        // in the 8 MiB the bucket starts with.
        let (reads, _) = resync_run(big_volume(MIB, 2), |_| 0, 10_000, 10);
        let times: Vec<u64> = reads.iter().map(|(t, _)| *t).collect();
        assert_eq!(times.len(), 16, "{times:?}");
        assert!(times[15] <= 1_000, "{times:?}");
    }

    #[test]
    fn client_zeros_are_streamed_as_zeroing() {
        let cfg = Config {
            block_len: 4,
            volume_blocks: 16,
            region_blocks: 4,
            ..Config::default()
        };
        let (p, s) = (NodeId(0), NodeId(1));
        let rec = Membership::new(VolumeId(1), &[p, s], p, 2);
        let mut node = Node::new(p, 0, VolumeId(1), cfg, Some(rec), 0);
        let acts = node.handle(
            0,
            Input::Msg {
                from: Endpoint::Client,
                msg: Msg::ClientReq {
                    id: 1,
                    req: ClientReq::Write {
                        lba: 2,
                        data: vec![0; 12].into(),
                        fua: true,
                    },
                },
            },
        );
        let zeroing = ReplOp::WriteZeroes {
            lba: 2,
            blocks: 3,
            fua: true,
        };
        assert!(acts.iter().any(|a| matches!(
            a,
            Action::Disk {
                op: DiskOp::WriteZeroes {
                    lba: 2,
                    blocks: 3,
                    fua: true
                },
                ..
            }
        )));
        assert!(sends(&acts).iter().any(|(to, m)| *to == Endpoint::Node(s)
            && matches!(m, Msg::Repl { op, .. } if *op == zeroing)));
    }
}
