//! The primary of one volume in one epoch.
//!
//! Job: serve client writes, flushes and reads; replicate writes and flushes
//! to the secondaries; acknowledge; mark unresponsive secondaries OutOfSync
//! through the metadata service; track their dirty regions and resync them.
//!
//! Invariants:
//! - the ack rule: a write or flush is acknowledged only when the local disk
//!   completed it and every replica that is InSync in the record (or about to
//!   be) acknowledged it, while at least `min_in_sync` replicas are InSync and
//!   the primary's lease is valid; FUA writes and flushes are acknowledged
//!   only once durable on all of them;
//! - a write is acknowledged without a secondary's ack only after the CAS
//!   marking that secondary OutOfSync succeeded;
//! - every region written while a secondary does not receive the stream, or
//!   written in the stream but not yet covered by a flush the secondary
//!   acknowledged, is in that secondary's dirty set until a resync copy of
//!   it, read with no overlapping write in flight, has been acknowledged;
//! - per link at most `Config::resync_inflight` region copies are in flight
//!   (read or unacknowledged), never two of one region, and a region is read
//!   only while no client write to it is in flight locally; copies are
//!   admitted by a token bucket refilled at `Config::resync_rate` on the
//!   state machine's clock (so a simulation replays exactly);
//! - data that is all zero (a client's, or a region read for a copy) is
//!   streamed as `WriteZeroes`, never as bytes;
//! - a secondary is proposed InSync only after its dirty set is empty, a
//!   flush after the last copy was acknowledged, and every operation already
//!   acknowledged to the client that was streamed to it was acknowledged by it;
//! - on a newer epoch or another primary in the record, the primary steps
//!   down and answers nothing more.
//! - a stream session number is never used twice in an epoch, even for a
//!   replica removed from the record and added again.
//! - every `Repl` carries `commit` (every client operation up to it was
//!   acknowledged; sent as 0 to a link that is not InSync) and `floor` (no
//!   more than the `commit` every InSync link acknowledged receiving); a
//!   link the record makes InSync, and every link of a new volume, is sent
//!   the current `commit` at once, on a flush, rather than with the next
//!   client write;
//! - after a failover, a replica's dirty set (all regions) is narrowed once,
//!   when it acknowledges the first `Start`, to the regions this primary
//!   wrote plus its own uncertain regions above the replica's `synced` and
//!   the replica's uncertain regions, and only when both logs are of the
//!   epoch before this one, the replica's `synced` is at least this node's
//!   floor, and neither log overflowed (`docs/simulation.md`, "Failover
//!   resync"); the regions so left out are unflushed (dirty again if the
//!   link fails) until the replica acknowledges a flush of the stream.
//! - an operation never waits for a link whose stream failed or that left
//!   the record (what the link missed is in its dirty set);
//! - read repair and compares: see `repair`; snapshot layers: see
//!   `layers`.
//! - a snapshot is streamed only once every write before it completed
//!   here (later requests wait behind it): a write may still fail here for
//!   lack of space after replicas applied it, and a snapshot streamed
//!   before that was known would hold it there and not here;
//! - lack of space: a write this node's store has no space for fails every
//!   link it was streamed to (their copies may hold it, this one does not:
//!   each is resynced in its regions from here) and is answered `NoSpace`
//!   once none of those links counts as InSync; a secondary that had no
//!   space for an entry leaves the stream (`ReplNoSpace`), its link fails
//!   at once, and while such a link keeps the volume below `min_in_sync`,
//!   writes and flushes are answered `NoSpace` (new ones before anything is
//!   done, those already in flight once the ack rule but for `min_in_sync`
//!   holds) rather than wait for a resync that cannot finish until space is
//!   freed.

use crate::msg::{ClientReply, ClientReq, DiskOp, Endpoint, Msg, ReplOp};
use crate::payload::Payload;
use crate::types::{Epoch, LayerId, Membership, NodeId, ReplicaState, VolumeId};
use crate::uncertain::Uncertain;
use crate::Config;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

mod compare_write;
mod layers;
mod repair;
mod resync;

use compare_write::PendingCompare;
use layers::Build;
use repair::Repair;
use resync::Bucket;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PrimTag {
    Op(u64),
    ResyncRead {
        peer: NodeId,
        session: u64,
        region: usize,
        gen: u64,
        /// Whether the copy was charged to the rate bucket (copies made
        /// while the volume is below `min_in_sync` are not).
        charged: bool,
        /// Blocks read (the region's length when the read was issued: a
        /// grow may lengthen a short last region meanwhile).
        blocks: u64,
    },
    /// The rewrite of blocks whose copy here failed its checksum, with the
    /// data an in-sync replica gave.
    Rewrite,
    /// The regions of the layer a link rebuilds next that differ from the
    /// layer before it.
    LayerDiff {
        peer: NodeId,
        session: u64,
    },
    /// A region of a layer a link rebuilds, read for it.
    LayerRead {
        peer: NodeId,
        session: u64,
        region: usize,
        charged: bool,
        blocks: u64,
    },
    /// The regions of the head that differ from the newest layer, for a
    /// link that rebuilt its layers.
    HeadDiff {
        peer: NodeId,
        session: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    InSync,
    /// CAS to OutOfSync in flight; still counts as InSync.
    Leaving,
    OutOfSync,
    Faulty,
    Starting,
    Resyncing,
    Finishing,
    /// CAS to InSync in flight; already counts as InSync.
    Joining,
    /// Rebuilding the snapshot layers the replica lacks (`Link::build`):
    /// no client operation is streamed to it.
    Layering,
}

impl Mode {
    fn streams(self) -> bool {
        matches!(
            self,
            Mode::InSync | Mode::Starting | Mode::Resyncing | Mode::Finishing | Mode::Joining
        )
    }
    fn counts(self) -> bool {
        matches!(self, Mode::InSync | Mode::Leaving | Mode::Joining)
    }
}

#[derive(Clone, Copy, Debug)]
enum Pend {
    Op(u64),
    Chunk(usize),
    Start,
    FinalFlush,
    /// The flush that tells a link just made InSync this epoch's `commit`.
    CommitFlush,
    /// A layer deletion before a layer rebuild.
    LayerStep,
    /// The rebase that starts a layer rebuild: nothing is diffed before
    /// the replica acknowledges it (it is durable then), or a link failing
    /// in between would count as rebased a head that is not.
    LayerRebase,
    /// A region of the layer being rebuilt.
    LayerChunk(usize),
    /// The `Snapshot` that seals the layer being rebuilt.
    LayerSeal,
}

struct Link {
    mode: Mode,
    boot: u64,
    session: u64,
    next_lseq: u64,
    /// lseq → (when sent, what, the `commit` it carried).
    inflight: BTreeMap<u64, (u64, Pend, u64)>,
    /// The highest `commit` carried by an entry this link acknowledged.
    acked_commit: u64,
    /// Created by a failover: the first `ReplStarted` may narrow `dirty`.
    narrow: bool,
    /// InSync (made so by the record, or from a new volume's start) and not
    /// yet sent a `commit`: the next tick sends it one on a flush, so a
    /// replica that saw no client write since still reports a `synced` at
    /// the next failover and is resynced in the regions that may differ,
    /// not in full.
    announce_commit: bool,
    unflushed: BTreeMap<u64, Vec<usize>>,
    dirty: BTreeSet<usize>,
    /// Regions whose resync read is in flight (a subset of `dirty`).
    copying: BTreeSet<usize>,
    /// Regions whose copy was sent and is not yet acknowledged (a subset of
    /// `dirty`).
    chunks: BTreeSet<usize>,
    last_attempt: u64,
    /// The layer rebuild under way (`Mode::Layering`).
    build: Option<Build>,
    /// Rebuilt its layers and waits for the regions of the head to copy
    /// (`PrimTag::HeadDiff`): not InSync before they are in.
    head_diff: bool,
    /// Background entries (layer deletions, flattens) in flight, as sent:
    /// they may take long, so no timeout fails the link for them; one not
    /// acknowledged within the ack timeout is sent again instead (the
    /// replica acknowledges a repeat of one it completed), so a lost
    /// entry or acknowledgement does not leave it waiting for ever.
    background: BTreeMap<u64, Msg>,
}

impl Link {
    /// The next entry of this link's stream: a flush taking no vseq (a
    /// resync's final flush, or the one telling `commit` to a link just
    /// made InSync), recorded in flight as `pend`.
    fn stream_flush(
        &mut self,
        vol: VolumeId,
        epoch: Epoch,
        now: u64,
        pend: Pend,
        commit: u64,
        floor: u64,
    ) -> Msg {
        let lseq = self.next_lseq;
        self.next_lseq += 1;
        self.inflight.insert(lseq, (now, pend, commit));
        Msg::Repl {
            vol,
            epoch,
            session: self.session,
            lseq,
            vseq: 0,
            commit,
            floor,
            op: ReplOp::Flush,
        }
    }

    fn new(mode: Mode, boot: u64, dirty: BTreeSet<usize>, now: u64) -> Self {
        Link {
            mode,
            boot,
            session: 0,
            next_lseq: 1,
            inflight: BTreeMap::new(),
            background: BTreeMap::new(),
            acked_commit: 0,
            narrow: false,
            announce_commit: false,
            unflushed: BTreeMap::new(),
            dirty,
            copying: BTreeSet::new(),
            chunks: BTreeSet::new(),
            last_attempt: now,
            build: None,
            head_diff: false,
        }
    }

    /// Whether the replica's copy equals this node's at the current end of
    /// the stream, so that a snapshot streamed now freezes the same data
    /// there: it is in sync with nothing left to copy.
    fn holds_head(&self) -> bool {
        match self.mode {
            Mode::InSync => self.dirty.is_empty() && self.copies_in_flight() == 0,
            Mode::Finishing | Mode::Joining => true,
            _ => false,
        }
    }

    /// Region copies in flight: being read, or sent and not acknowledged.
    fn copies_in_flight(&self) -> usize {
        self.copying.len() + self.chunks.len()
    }
}

/// The stream entry copying `blocks` blocks of `data` to `lba` (a region,
/// for a resync or a layer rebuild): a zeroing if `zero`.
fn copy_op(lba: u64, blocks: u64, data: Vec<u8>, zero: bool) -> ReplOp {
    if zero {
        ReplOp::WriteZeroes {
            lba,
            blocks,
            fua: false,
        }
    } else {
        ReplOp::Write {
            lba,
            data: Payload::from(data),
            fua: false,
        }
    }
}

/// Whether `data` is all zero bytes. OR-folds fixed-size chunks (which
/// vectorizes) and stops at the first chunk that is not zero.
/// Whether a request waits until no write is in flight on this node's
/// disk: a snapshot, which must hold every write before it.
fn barrier(req: &ClientReq) -> bool {
    matches!(req, ClientReq::Snapshot { .. })
}

fn is_zero(data: &[u8]) -> bool {
    data.chunks(4096)
        .all(|c| c.iter().fold(0u8, |acc, b| acc | b) == 0)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Write,
    Flush,
    Read,
    /// A replica compare (`ClientReq::Compare`).
    Compare,
    /// A snapshot.
    Layer,
    /// A layer deletion, a flatten or a compaction: on a replica it may
    /// take long (a merge, a copy) beside later writes, so its stream entry never times
    /// its link out (later entries do, and a replica that died is marked
    /// faulty by the coordinator).
    Background,
}

impl Kind {
    /// Whether it changes no block (and so holds back no `commit`).
    fn reads(self) -> bool {
        matches!(self, Kind::Read | Kind::Compare)
    }
}

struct Op {
    client_id: u64,
    kind: Kind,
    local_done: bool,
    sent: BTreeSet<NodeId>,
    acked: BTreeSet<NodeId>,
    data: Option<Vec<u8>>,
    regions: Vec<usize>,
    /// A read: (lba, blocks), to ask a replica for them should the local
    /// copy fail its checksum.
    read: Option<(u64, u64)>,
    /// No replica could give a good copy: answered `Unreadable`.
    unreadable: bool,
    /// A compare: each replica's checksum of the blocks (None: they fail
    /// their block checksums there).
    digests: BTreeMap<NodeId, Option<u32>>,
    /// A write this node's store had no space for: answered `NoSpace`.
    no_space: bool,
    /// A client's write or flush (not a rollback, which needs no space):
    /// answered `NoSpace` while replicas short of space keep the volume
    /// below `min_in_sync` (a flush then cannot make earlier writes durable
    /// on enough replicas, and waiting would last until space is freed).
    refusable: bool,
    /// A flatten: done here, it may detach this copy from its base.
    flatten: bool,
    /// A compare-and-write's read: what to compare and write once done.
    compare: Option<Box<PendingCompare>>,
    /// The data its `Ok` carries instead of the disk's (a compare-and-write's
    /// outcome, on the write it became).
    answer: Option<Vec<u8>>,
}

/// What the primary wants done.
#[derive(Default)]
pub(crate) struct Out {
    pub sends: Vec<(Endpoint, Msg)>,
    pub disk: Vec<(DiskOp, PrimTag)>,
    pub step_down: bool,
    /// Failover resyncs decided: (regions to copy, regions in the volume),
    /// None when the replica's report was not usable (full resync).
    pub narrowed: Vec<(NodeId, Option<(usize, usize)>)>,
}

pub(crate) struct Primary {
    me: NodeId,
    vol: VolumeId,
    pub(crate) epoch: Epoch,
    rec: Membership,
    cfg: Config,
    links: BTreeMap<NodeId, Link>,
    ops: BTreeMap<u64, Op>,
    next_vseq: u64,
    /// The CAS in flight: (when sent or last chased, expected version). It
    /// stays unresolved until a record newer than `expected` is seen: only
    /// then can it no longer apply, whatever the network did with it.
    cas: Option<(u64, u64)>,
    region_gen: Vec<u64>,
    region_inflight: Vec<u32>,
    /// The next stream session, shared by all links: a replica removed and
    /// re-added in this epoch gets a new link, and its secondary still holds
    /// the old link's session; a reused number would let it keep its old
    /// position in the stream (or ignore the Start) and acknowledge old
    /// entries as new ones. Session 0 is the fresh volume's.
    next_session: u64,
    /// Admits resync copies at `Config::resync_rate`, over all links.
    bucket: Bucket,
    /// The link that was last admitted a copy: the next round starts after
    /// it, so links share the rate fairly.
    last_copy: Option<NodeId>,
    /// Bytes of resync copies admitted without the rate bucket (while the
    /// volume was below `min_in_sync`), for the simulator's rate check.
    pub(crate) unmetered_bytes: u64,
    /// This node's log of the previous epoch's stream, when it was promoted
    /// from secondary (None: fresh volume, restart, re-appointment).
    mine: Option<Uncertain>,
    /// This epoch's writes above the floor, kept like a secondary's log:
    /// reported by this node once deposed, so that a partitioned primary
    /// that comes back is resynced in those regions only.
    own: Uncertain,
    /// Regions written by clients in this epoch.
    written: BTreeSet<usize>,
    /// Repairs in flight, by `RepairRead` id.
    repairs: BTreeMap<u64, Repair>,
    next_repair: u64,
    /// Regions whose copy here no replica could repair, with the time until
    /// which resync copies skip them.
    unrepaired: BTreeMap<usize, u64>,
    /// The snapshot layers of the volume here, oldest first, once the disk
    /// operations submitted complete.
    pub(crate) layers: Vec<LayerId>,
    /// The snapshot of another volume this copy reads through (a clone's
    /// source), until flattened: a replica reading through it too is
    /// rebuilt from it (see `layers.rs`).
    pub(crate) base: Option<LayerId>,
    /// Replicas that left the stream for lack of space and have not been
    /// InSync since.
    short_of_space: BTreeSet<NodeId>,
    /// Client requests held, in order, behind a snapshot that waits for
    /// the writes before it to complete here, or behind a
    /// compare-and-write's read.
    held: VecDeque<(u64, ClientReq)>,
    /// The compare-and-write whose read is in flight (its vseq): every
    /// later request waits until it is compared and its write streamed.
    gate: Option<u64>,
}

impl Primary {
    /// `fresh`: the volume was just created, every InSync replica already has
    /// session 0 open and identical (empty) contents.
    pub(crate) fn new(
        me: NodeId,
        rec: Membership,
        cfg: Config,
        fresh: bool,
        now: u64,
        mine: Option<Uncertain>,
    ) -> Self {
        let regions = cfg.regions();
        let all: BTreeSet<usize> = (0..regions).collect();
        let links = rec
            .replicas
            .iter()
            .filter(|(n, _)| **n != me)
            .map(|(n, info)| {
                let mode = match info.state {
                    ReplicaState::InSync if fresh => Mode::InSync,
                    ReplicaState::InSync => Mode::Leaving,
                    ReplicaState::OutOfSync => Mode::OutOfSync,
                    ReplicaState::Faulty => Mode::Faulty,
                };
                let dirty = if mode == Mode::InSync {
                    BTreeSet::new()
                } else {
                    all.clone()
                };
                let mut link = Link::new(mode, info.boot, dirty, now);
                link.narrow = !fresh;
                // A new volume's replicas are InSync from the start: told
                // the commit on the first tick, like a link that joins, so
                // that even a volume never written is narrowed at failover.
                link.announce_commit = mode == Mode::InSync;
                (*n, link)
            })
            .collect();
        let rec_epoch = rec.epoch;
        Primary {
            me,
            vol: rec.volume,
            epoch: rec.epoch,
            rec,
            links,
            ops: BTreeMap::new(),
            // vseq 1 stands for the epoch's start: no operation takes it,
            // so `commit` is at least 1 from the start and a replica InSync
            // in an epoch without a single write still reports a non-zero
            // `synced` (0 means "never InSync in this epoch").
            next_vseq: 2,
            cas: None,
            region_gen: vec![0; regions],
            region_inflight: vec![0; regions],
            next_session: 1,
            bucket: Bucket::new(&cfg, now),
            last_copy: None,
            unmetered_bytes: 0,
            mine,
            own: Uncertain::new(rec_epoch, cfg.uncertain_limit).owned(),
            written: BTreeSet::new(),
            repairs: BTreeMap::new(),
            short_of_space: BTreeSet::new(),
            held: VecDeque::new(),
            gate: None,
            next_repair: 1,
            unrepaired: BTreeMap::new(),
            layers: Vec::new(),
            base: None,
            cfg,
        }
    }

    pub(crate) fn pending_ops(&self) -> usize {
        self.ops.len()
    }

    /// Whether a replica is being copied to now (a link in the copying
    /// phase with regions left), as opposed to waiting for one to return.
    pub(crate) fn copying(&self) -> bool {
        self.links
            .values()
            .any(|l| l.mode == Mode::Resyncing && !l.dirty.is_empty())
    }

    /// Changes the resync rate cap from `now` on (what the bucket earned
    /// until now, it keeps).
    pub(crate) fn set_resync_rate(&mut self, now: u64, rate: u64) {
        self.bucket.refill(now);
        self.bucket.rate = rate;
        self.cfg.resync_rate = rate;
    }

    /// Per replica that is not in sync: (regions still to copy, regions in
    /// the volume).
    pub(crate) fn resync_progress(&self) -> BTreeMap<NodeId, (usize, usize)> {
        let total = self.region_gen.len();
        self.links
            .iter()
            .filter(|(_, l)| !l.mode.counts())
            .map(|(n, l)| (*n, (l.dirty.len(), total)))
            .collect()
    }

    pub(crate) fn max_copies_in_flight(&self) -> usize {
        self.links
            .values()
            .map(Link::copies_in_flight)
            .max()
            .unwrap_or(0)
    }

    /// The blocks this primary serves (client requests beyond are not
    /// its to answer yet).
    pub(crate) fn volume_blocks(&self) -> u64 {
        self.cfg.volume_blocks
    }

    /// Serves `blocks` blocks from now on (the node grew its local disk to
    /// at least that first). New regions start clean on every link: no
    /// primary accepted a write beyond the old end (the record's size when
    /// this primary was appointed bounded every earlier primary's, and it
    /// served no more itself), so every replica holds zeros there, or
    /// nothing yet and grows with zeros before it applies anything there.
    /// A copy of the old short last region in flight is discarded (its
    /// generation changes) and that region read again at its new length.
    pub(crate) fn grow(&mut self, blocks: u64) {
        if blocks <= self.cfg.volume_blocks {
            return;
        }
        let old = self.region_gen.len();
        if old > 0 && self.cfg.region_len(old - 1) < self.cfg.region_blocks {
            self.region_gen[old - 1] += 1;
        }
        self.cfg.volume_blocks = blocks;
        let regions = self.cfg.regions();
        self.region_gen.resize(regions, 0);
        self.region_inflight.resize(regions, 0);
    }

    /// One line per link, for traces.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!("primary e{} cas={:?}", self.epoch.0, self.cas);
        for (v, op) in &self.ops {
            s += &format!(
                " op{v}:{:?}{}{:?}/{:?}",
                op.kind,
                if op.local_done { "+" } else { "-" },
                op.sent,
                op.acked
            );
        }
        for (n, l) in &self.links {
            s += &format!(
                " | n{} {:?} s{} next{} inflight{:?} dirty{:?} copying{:?} chunks{:?}",
                n.0, l.mode, l.session, l.next_lseq, l.inflight, l.dirty, l.copying, l.chunks
            );
        }
        s
    }

    fn regions_of(&self, lba: u64, blocks: u64) -> Vec<usize> {
        let rb = self.cfg.region_blocks;
        if blocks == 0 {
            return Vec::new();
        }
        let first = (lba / rb) as usize;
        let last = ((lba + blocks - 1) / rb) as usize;
        (first..=last.min(self.region_gen.len().saturating_sub(1))).collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn repl(&self, session: u64, lseq: u64, vseq: u64, commit: u64, floor: u64, op: ReplOp) -> Msg {
        Msg::Repl {
            vol: self.vol,
            epoch: self.epoch,
            session,
            lseq,
            vseq,
            commit,
            floor,
            op,
        }
    }

    /// (commit, floor) before the next vseq is taken: every client
    /// operation (reads aside) up to `commit` was acknowledged; `floor` is
    /// the least `commit` an InSync link acknowledged receiving (`commit`
    /// if no link is InSync). A link out of sync that once acknowledged a
    /// `commit` holds the floor at its last one until it is InSync again
    /// (or removed, or restarted): every InSync replica then keeps the
    /// regions written since, so whichever is promoted can resync it in
    /// those regions only (its dirty set lives on in the other replicas).
    fn watermarks(&self) -> (u64, u64) {
        let commit = self
            .ops
            .iter()
            .find(|(_, op)| !op.kind.reads())
            .map_or(self.next_vseq - 1, |(v, _)| v - 1);
        let floor = self
            .links
            .values()
            .filter(|l| l.mode == Mode::InSync || l.acked_commit > 0)
            .map(|l| l.acked_commit)
            .min()
            .unwrap_or(commit)
            .min(commit);
        (commit, floor)
    }

    /// This epoch's log as a deposed primary reports it: every client
    /// operation up to `synced` was acknowledged (so this node applied it),
    /// and every write above the floor is in it, acknowledged or not.
    pub(crate) fn deposed_log(&self) -> Uncertain {
        let (commit, floor) = self.watermarks();
        let mut log = self.own.clone();
        log.advance(commit, floor);
        log
    }

    /// Replies NotPrimary to every pending client operation.
    pub(crate) fn abandon(&mut self, out: &mut Out) {
        self.gate = None;
        for (id, _) in std::mem::take(&mut self.held) {
            self.reply(id, ClientReply::NotPrimary, out);
        }
        for (_, op) in std::mem::take(&mut self.ops) {
            out.sends.push((
                Endpoint::Client,
                Msg::ClientReply {
                    id: op.client_id,
                    reply: ClientReply::NotPrimary,
                },
            ));
        }
    }

    pub(crate) fn on_client(&mut self, now: u64, id: u64, req: ClientReq, out: &mut Out) {
        if !self.held.is_empty() || self.gate.is_some() || (barrier(&req) && self.writing()) {
            self.held.push_back((id, req));
            return;
        }
        self.serve(now, id, req, true, out);
    }

    /// Whether a client write is in flight on this node's disk.
    fn writing(&self) -> bool {
        self.ops
            .values()
            .any(|op| op.kind == Kind::Write && !op.local_done)
    }

    /// Serves the held requests that may go now.
    fn release_held(&mut self, now: u64, out: &mut Out) {
        while let Some((_, req)) = self.held.front() {
            if self.gate.is_some() || (barrier(req) && self.writing()) {
                return;
            }
            let Some((id, req)) = self.held.pop_front() else {
                return;
            };
            self.serve(now, id, req, true, out);
        }
    }

    /// `from_client`: a client's own request (not the flush a retried
    /// snapshot or deletion is answered as): a write or flush of it may be
    /// answered `NoSpace`.
    fn serve(&mut self, now: u64, id: u64, req: ClientReq, from_client: bool, out: &mut Out) {
        if let ClientReq::Snapshot { layer }
        | ClientReq::DeleteSnapshot { layer }
        | ClientReq::Rollback { layer } = req
        {
            self.on_layer_request(now, id, req, layer, out);
            return;
        }
        if let ClientReq::ReadLayer { layer, .. } = req {
            if !self.layers.contains(&layer) {
                let (by, epoch) = (self.me, self.epoch);
                return self.reply(id, ClientReply::NoSuchLayer { by, epoch }, out);
            }
        }
        if let ClientReq::CompareWrite { .. } = req {
            return self.start_compare(id, req, out);
        }
        let refusable = from_client && matches!(req, ClientReq::Write { .. } | ClientReq::Flush);
        if refusable && self.out_of_space() {
            // Nothing is done: no replica is changed.
            self.reply(id, self.no_space(), out);
            return;
        }
        let (commit, floor) = self.watermarks();
        let vseq = self.next_vseq;
        self.next_vseq += 1;
        let (kind, regions, repl, disk) = match req {
            ClientReq::Write { lba, data, fua } => {
                let blocks = data.len() as u64 / self.cfg.block_len.max(1);
                if lba + blocks > self.cfg.volume_blocks || blocks == 0 {
                    out.sends.push((
                        Endpoint::Client,
                        Msg::ClientReply {
                            id,
                            reply: ClientReply::NotPrimary,
                        },
                    ));
                    return;
                }
                let regions = self.regions_of(lba, blocks);
                self.written.extend(regions.iter().copied());
                self.own.on_repl(vseq, commit, floor, &regions);
                for r in &regions {
                    self.region_gen[*r] += 1;
                    self.region_inflight[*r] += 1;
                }
                // Zeros (TRIM, WRITE_ZEROES) go as a zeroing: no bytes on
                // the wire, and stores may free the blocks.
                let (repl, disk) = if is_zero(&data) {
                    (
                        ReplOp::WriteZeroes { lba, blocks, fua },
                        DiskOp::WriteZeroes { lba, blocks, fua },
                    )
                } else {
                    (
                        ReplOp::Write {
                            lba,
                            data: data.clone(),
                            fua,
                        },
                        DiskOp::Write { lba, data, fua },
                    )
                };
                (Kind::Write, regions, Some(repl), disk)
            }
            ClientReq::Flush => (Kind::Flush, Vec::new(), Some(ReplOp::Flush), DiskOp::Flush),
            ClientReq::Read { lba, blocks } => {
                let blocks = blocks.min(self.cfg.volume_blocks.saturating_sub(lba));
                (Kind::Read, Vec::new(), None, DiskOp::Read { lba, blocks })
            }
            ClientReq::Compare { lba, blocks } => {
                let blocks = blocks.min(self.cfg.volume_blocks.saturating_sub(lba));
                (
                    Kind::Compare,
                    Vec::new(),
                    Some(ReplOp::Digest { lba, blocks }),
                    DiskOp::Read { lba, blocks },
                )
            }
            // Streamed to the replicas whose head is this one's: one being
            // copied to flattens nothing it will not be given in full, and
            // one that missed it is flattened when the snapshot it reads
            // through is deleted there.
            ClientReq::Flatten { lba, blocks, rate } => {
                let blocks = blocks.min(self.cfg.volume_blocks.saturating_sub(lba));
                (
                    Kind::Background,
                    Vec::new(),
                    Some(ReplOp::Flatten { lba, blocks, rate }),
                    DiskOp::Flatten { lba, blocks, rate },
                )
            }
            // Streamed like a flatten: a replica being copied to gets
            // what the copy writes, which its own compactor packs once
            // cold.
            ClientReq::Compact { lba, blocks, rate } => {
                let blocks = blocks.min(self.cfg.volume_blocks.saturating_sub(lba));
                (
                    Kind::Background,
                    Vec::new(),
                    Some(ReplOp::Compact { lba, blocks, rate }),
                    DiskOp::Compact { lba, blocks, rate },
                )
            }
            // A layer does not change: no replica is involved. The disk
            // queue orders it after the snapshot that made the layer and
            // after a deletion asked before it.
            ClientReq::ReadLayer { layer, lba, blocks } => {
                let blocks = blocks.min(self.cfg.volume_blocks.saturating_sub(lba));
                (
                    Kind::Read,
                    Vec::new(),
                    None,
                    DiskOp::ReadLayer { layer, lba, blocks },
                )
            }
            ClientReq::Snapshot { .. }
            | ClientReq::DeleteSnapshot { .. }
            | ClientReq::Rollback { .. }
            | ClientReq::CompareWrite { .. } => return,
        };
        let read = match &disk {
            DiskOp::Read { lba, blocks } => Some((*lba, *blocks)),
            _ => None,
        };
        let mut sent = BTreeSet::new();
        if let Some(rop) = repl {
            let peers: Vec<NodeId> = self.links.keys().copied().collect();
            for n in peers {
                let Some(l) = self.links.get_mut(&n) else {
                    continue;
                };
                // Only in-sync replicas are compared: the others are being
                // (or will be) copied to anyway.
                if kind == Kind::Compare && l.mode != Mode::InSync {
                    continue;
                }
                if l.mode.streams() {
                    self.stream_op(n, now, (vseq, commit, floor), &regions, rop.clone(), out);
                    sent.insert(n);
                } else {
                    l.dirty.extend(regions.iter().copied());
                }
            }
        }
        self.queue_op(id, vseq, kind, sent, regions, read, disk, out);
        if let Some(op) = self.ops.get_mut(&vseq) {
            op.refusable = refusable;
        }
    }

    /// Records client operation `vseq` and submits its local part.
    #[allow(clippy::too_many_arguments)]
    fn queue_op(
        &mut self,
        client_id: u64,
        vseq: u64,
        kind: Kind,
        sent: BTreeSet<NodeId>,
        regions: Vec<usize>,
        read: Option<(u64, u64)>,
        disk: DiskOp,
        out: &mut Out,
    ) {
        self.ops.insert(
            vseq,
            Op {
                client_id,
                kind,
                local_done: false,
                sent,
                acked: BTreeSet::new(),
                data: None,
                regions,
                read,
                unreadable: false,
                no_space: false,
                refusable: false,
                digests: BTreeMap::new(),
                flatten: matches!(disk, DiskOp::Flatten { .. }),
                compare: None,
                answer: None,
            },
        );
        out.disk.push((disk, PrimTag::Op(vseq)));
    }

    /// Streams client operation `vseq` to link `n` as its next entry
    /// (`marks`: the operation's vseq and the (commit, floor) before it
    /// took it); `regions` it writes stay unflushed there until a flush.
    fn stream_op(
        &mut self,
        n: NodeId,
        now: u64,
        marks: (u64, u64, u64),
        regions: &[usize],
        rop: ReplOp,
        out: &mut Out,
    ) {
        let (vseq, commit, floor) = marks;
        let Some(l) = self.links.get_mut(&n) else {
            return;
        };
        let c = if l.mode == Mode::InSync { commit } else { 0 };
        let lseq = l.next_lseq;
        l.next_lseq += 1;
        l.inflight.insert(lseq, (now, Pend::Op(vseq), c));
        if !regions.is_empty() {
            l.unflushed.insert(lseq, regions.to_vec());
        }
        let session = l.session;
        let background = rop.is_background();
        let msg = self.repl(session, lseq, vseq, c, floor, rop);
        if background {
            if let Some(l) = self.links.get_mut(&n) {
                l.background.insert(lseq, msg.clone());
            }
        }
        out.sends.push((Endpoint::Node(n), msg));
    }

    /// Streams `op`, no client operation, to link `n` as its next entry,
    /// in flight as `pend`.
    fn stream_step(&mut self, n: NodeId, now: u64, pend: Pend, op: ReplOp, out: &mut Out) {
        let (_, floor) = self.watermarks();
        let vseq = self.next_vseq;
        self.next_vseq += 1;
        let Some(l) = self.links.get_mut(&n) else {
            return;
        };
        let lseq = l.next_lseq;
        l.next_lseq += 1;
        l.inflight.insert(lseq, (now, pend, 0));
        let session = l.session;
        let msg = self.repl(session, lseq, vseq, 0, floor, op);
        out.sends.push((Endpoint::Node(n), msg));
    }

    fn reply(&self, id: u64, reply: ClientReply, out: &mut Out) {
        out.sends
            .push((Endpoint::Client, Msg::ClientReply { id, reply }));
    }

    pub(crate) fn on_disk_done(
        &mut self,
        now: u64,
        tag: PrimTag,
        data: Option<Vec<u8>>,
        out: &mut Out,
    ) {
        match tag {
            PrimTag::Rewrite => {}
            PrimTag::LayerDiff { .. } | PrimTag::LayerRead { .. } | PrimTag::HeadDiff { .. } => {
                self.on_build_done(now, tag, data, out)
            }
            PrimTag::Op(v) => {
                if let Some(op) = self.ops.get_mut(&v) {
                    op.local_done = true;
                    op.data = data;
                    if op.kind == Kind::Write {
                        for r in &op.regions {
                            self.region_inflight[*r] = self.region_inflight[*r].saturating_sub(1);
                        }
                    }
                } else {
                    // The op was abandoned; its regions are still in flight.
                }
            }
            PrimTag::ResyncRead {
                peer,
                session,
                region,
                gen,
                charged,
                blocks,
            } => {
                let fresh = self.region_gen.get(region) == Some(&gen);
                let reserved = blocks * self.cfg.block_len;
                // The copy was charged its whole region when admitted; a
                // region of zeros costs less (see `Config::zero_copy_cost`),
                // used or not (a discarded read was still made).
                let zero = data.as_deref().is_some_and(is_zero);
                if zero && charged {
                    let cost = self.cfg.zero_copy_cost(reserved);
                    self.bucket.refund(reserved - cost);
                }
                let (_, floor) = self.watermarks();
                let vseq = self.next_vseq;
                let Some(l) = self.links.get_mut(&peer) else {
                    return;
                };
                // An InSync link is copied to only where a compare found it
                // differing.
                if l.session != session
                    || !matches!(l.mode, Mode::Resyncing | Mode::InSync)
                    || !l.copying.remove(&region)
                {
                    return;
                }
                // A write to the region was issued since the read: the data
                // may predate it on this disk while the write is already
                // ahead of the copy in the stream. Drop it; the region stays
                // dirty and is read again.
                let Some(data) = data.filter(|_| fresh) else {
                    return;
                };
                self.next_vseq += 1;
                let lseq = l.next_lseq;
                l.next_lseq += 1;
                // No `commit` on a copy: it is no client operation.
                l.inflight.insert(lseq, (now, Pend::Chunk(region), 0));
                l.unflushed.insert(lseq, vec![region]);
                l.chunks.insert(region);
                let op = copy_op(region as u64 * self.cfg.region_blocks, blocks, data, zero);
                let msg = self.repl(session, lseq, vseq, 0, floor, op);
                out.sends.push((Endpoint::Node(peer), msg));
            }
        }
    }

    fn no_space(&self) -> ClientReply {
        ClientReply::NoSpace {
            by: self.me,
            epoch: self.epoch,
        }
    }

    /// Whether replicas short of space keep the volume below
    /// `min_in_sync`: writes are answered `NoSpace` rather than wait.
    fn out_of_space(&self) -> bool {
        !self.short_of_space.is_empty() && self.below_min_in_sync()
    }

    /// This node's store had no space for operation `tag`, a write.
    pub(crate) fn on_disk_no_space(&mut self, tag: PrimTag) {
        // Only client writes and repair rewrites write here; a rewrite's
        // region stays as it was (and is repaired again when read).
        let PrimTag::Op(v) = tag else {
            return;
        };
        let Some(op) = self.ops.get_mut(&v) else {
            return;
        };
        op.local_done = true;
        op.no_space = true;
        op.data = None;
        if op.kind == Kind::Write {
            for r in &op.regions {
                self.region_inflight[*r] = self.region_inflight[*r].saturating_sub(1);
            }
        }
        if self.cfg.keep_links_without_space {
            return;
        }
        // Every replica it was streamed to may hold it, acknowledged or
        // not: each leaves the stream and is resynced from here, and the
        // answer waits until none of them counts as InSync (so none can
        // be promoted holding a write this node lacks). Its regions are
        // dirty there even where a later flush was acknowledged (which
        // clears them from what is unflushed): this copy, not theirs, is
        // the one they are resynced to.
        let sent = std::mem::take(&mut op.sent);
        let regions = op.regions.clone();
        op.acked.clear();
        for n in sent {
            self.link_failed(n);
            if let Some(l) = self.links.get_mut(&n) {
                l.dirty.extend(regions.iter().copied());
            }
        }
    }

    /// Secondary `from` had no space for entry `lseq` and left the stream.
    pub(crate) fn on_no_space(&mut self, from: NodeId, epoch: Epoch, session: u64, lseq: u64) {
        if epoch != self.epoch {
            return;
        }
        let Some(l) = self.links.get(&from) else {
            return;
        };
        if l.session != session || !l.inflight.contains_key(&lseq) {
            return;
        }
        self.short_of_space.insert(from);
        self.link_failed(from);
    }

    /// A secondary's checksum for the `Digest` at `lseq` (its ack).
    pub(crate) fn on_digest(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        session: u64,
        lseq: u64,
        digest: Option<u32>,
    ) {
        if epoch != self.epoch {
            return;
        }
        let op = self
            .links
            .get(&from)
            .filter(|l| l.session == session)
            .and_then(|l| l.inflight.get(&lseq))
            .and_then(|(_, pend, _)| match pend {
                Pend::Op(v) => Some(*v),
                _ => None,
            });
        if let Some(op) = op.and_then(|v| self.ops.get_mut(&v)) {
            op.digests.insert(from, digest);
        }
        self.on_ack(from, epoch, session, lseq);
    }

    pub(crate) fn on_ack(&mut self, from: NodeId, epoch: Epoch, session: u64, lseq: u64) {
        if epoch != self.epoch {
            return;
        }
        let Some(l) = self.links.get_mut(&from) else {
            return;
        };
        if l.session != session {
            return;
        }
        let Some((_, pend, commit)) = l.inflight.remove(&lseq) else {
            return;
        };
        l.background.remove(&lseq);
        l.acked_commit = l.acked_commit.max(commit);
        match pend {
            Pend::Start => {
                if l.mode == Mode::Starting {
                    l.mode = Mode::Resyncing;
                }
            }
            Pend::Chunk(r) => {
                l.chunks.remove(&r);
                l.dirty.remove(&r);
            }
            Pend::LayerStep => {}
            Pend::LayerRebase => {
                if let Some(b) = l.build.as_mut() {
                    b.rebasing = false;
                }
            }
            Pend::LayerChunk(r) => {
                if let Some(b) = l.build.as_mut() {
                    b.sent.remove(&r);
                    if let Some(regions) = b.regions.as_mut() {
                        regions.remove(&r);
                    }
                }
            }
            Pend::LayerSeal => {
                if let Some(b) = l.build.as_mut().filter(|b| b.sealing) {
                    b.sealing = false;
                    b.prev = b.todo.pop_front();
                    b.regions = None;
                }
            }
            Pend::FinalFlush | Pend::CommitFlush => {
                l.unflushed.retain(|k, _| *k > lseq);
                if l.mode == Mode::Finishing {
                    l.mode = Mode::Joining;
                }
            }
            Pend::Op(v) => {
                if let Some(op) = self.ops.get_mut(&v) {
                    op.acked.insert(from);
                    if op.kind == Kind::Flush {
                        l.unflushed.retain(|k, _| *k > lseq);
                    }
                } else {
                    // Flush acks also clear unflushed even if the op is gone.
                }
            }
        }
    }

    /// The stream to `n` is gone: no operation waits for its
    /// acknowledgement any more (the ack rule waits for the link to leave
    /// instead, or for nothing once it is out of the record). One that
    /// still did would wait for ever once the link is InSync again (or a
    /// new link to the node is), holding `commit` and read repairs of its
    /// regions back: the simulator's final check that the primary owes
    /// nothing found both.
    fn unwait(&mut self, n: NodeId) {
        for op in self.ops.values_mut() {
            if !op.acked.contains(&n) {
                op.sent.remove(&n);
            }
        }
    }

    fn link_failed(&mut self, n: NodeId) {
        let Some(l) = self.links.get_mut(&n) else {
            return;
        };
        let unflushed = std::mem::take(&mut l.unflushed);
        l.dirty.extend(unflushed.into_values().flatten());
        l.dirty.extend(std::mem::take(&mut l.chunks));
        l.dirty.extend(std::mem::take(&mut l.copying));
        l.inflight.clear();
        l.background.clear();
        // A rebuild starts over at the next `Start`; a head whose regions
        // to copy are not known yet may differ anywhere.
        l.build = None;
        if std::mem::take(&mut l.head_diff) {
            l.dirty.extend(0..self.region_gen.len());
        }
        l.mode = match l.mode {
            Mode::InSync | Mode::Joining | Mode::Leaving => Mode::Leaving,
            Mode::Faulty => Mode::Faulty,
            _ => Mode::OutOfSync,
        };
        // What the link missed is in its dirty set: the regions of the
        // writes sent to it were in `unflushed`.
        self.unwait(n);
    }

    pub(crate) fn on_record(&mut self, rec: &Membership, out: &mut Out) {
        if self.cas.is_some_and(|(_, expected)| rec.version > expected) {
            self.cas = None;
        }
        if rec.epoch != self.epoch || rec.primary != self.me {
            if rec.epoch >= self.epoch {
                out.step_down = true;
            }
            return;
        }
        if rec.version <= self.rec.version {
            return;
        }
        self.rec = rec.clone();
        // Replicas removed from the record (replaced, moved away): nothing
        // waits for them any more.
        let removed: Vec<NodeId> = self
            .links
            .keys()
            .filter(|n| !rec.replicas.contains_key(n))
            .copied()
            .collect();
        for n in removed {
            self.links.remove(&n);
            self.unwait(n);
        }
        // Replicas added (a rebuild, a degraded volume completed): they hold
        // nothing yet, so every region is dirty; the resync starts at once.
        let regions = self.region_gen.len();
        for (n, info) in &rec.replicas {
            if *n == self.me || self.links.contains_key(n) {
                continue;
            }
            let mode = if info.state == ReplicaState::Faulty {
                Mode::Faulty
            } else {
                Mode::OutOfSync
            };
            self.links
                .insert(*n, Link::new(mode, info.boot, (0..regions).collect(), 0));
        }
        let peers: Vec<NodeId> = self.links.keys().copied().collect();
        for n in peers {
            let Some(info) = rec.replicas.get(&n).copied() else {
                continue;
            };
            let Some((mode, boot)) = self.links.get(&n).map(|l| (l.mode, l.boot)) else {
                continue;
            };
            if info.boot != boot {
                if let Some(l) = self.links.get_mut(&n) {
                    l.boot = info.boot;
                }
                if mode.streams() || mode == Mode::Leaving {
                    self.link_failed(n);
                }
            }
            let Some(mode) = self.links.get(&n).map(|l| l.mode) else {
                continue;
            };
            let new_mode = match (info.state, mode) {
                (ReplicaState::InSync, Mode::Joining) => Mode::InSync,
                (ReplicaState::InSync, Mode::InSync | Mode::Leaving) => mode,
                (ReplicaState::InSync, _) => {
                    self.link_failed(n);
                    Mode::Leaving
                }
                (ReplicaState::OutOfSync, Mode::InSync | Mode::Joining) => {
                    self.link_failed(n);
                    Mode::OutOfSync
                }
                (ReplicaState::OutOfSync, Mode::Leaving | Mode::Faulty) => Mode::OutOfSync,
                (ReplicaState::OutOfSync, m) => m,
                (ReplicaState::Faulty, _) => {
                    self.link_failed(n);
                    Mode::Faulty
                }
            };
            if let Some(l) = self.links.get_mut(&n) {
                l.announce_commit |= mode == Mode::Joining && new_mode == Mode::InSync;
                l.mode = new_mode;
            }
        }
    }

    pub(crate) fn on_fenced(&mut self, epoch: Epoch, out: &mut Out) {
        if epoch > self.epoch {
            out.step_down = true;
        }
    }

    /// Timeouts, resync progress, CAS requests and acknowledgements.
    pub(crate) fn tick(&mut self, now: u64, lease_until: u64, out: &mut Out) {
        self.chase_repairs(now, out);
        if let Some((t, expected)) = self.cas {
            if now > t + self.cfg.cas_timeout_ms {
                // Unanswered: send it again (same expected version, so at most
                // one copy can apply) and ask for the record.
                self.cas = Some((now, expected));
                let desired = self.desired();
                out.sends.push((
                    Endpoint::Control,
                    Msg::MetaCas {
                        expected,
                        record: desired,
                    },
                ));
                out.sends
                    .push((Endpoint::Control, Msg::MetaGet { vol: self.vol }));
            }
        }
        let ops = &self.ops;
        let background = |p: &Pend| matches!(p, Pend::Op(v) if ops.get(v).is_some_and(|o| o.kind == Kind::Background));
        let expired: Vec<NodeId> = self
            .links
            .iter()
            .filter(|(_, l)| {
                l.inflight
                    .values()
                    .any(|(t, p, _)| now > t + self.cfg.ack_timeout_ms && !background(p))
            })
            .map(|(n, _)| *n)
            .collect();
        for n in expired {
            self.link_failed(n);
        }
        let timeout = self.cfg.ack_timeout_ms;
        for (n, l) in self.links.iter_mut() {
            for (lseq, msg) in &l.background {
                if let Some((sent, _, _)) = l.inflight.get_mut(lseq) {
                    if now > *sent + timeout {
                        *sent = now;
                        out.sends.push((Endpoint::Node(*n), msg.clone()));
                    }
                }
            }
        }
        for (n, l) in self.links.iter_mut() {
            if l.mode == Mode::OutOfSync && now >= l.last_attempt + self.cfg.resync_retry_ms {
                l.last_attempt = now;
                l.session = self.next_session;
                self.next_session += 1;
                l.next_lseq = 1;
                l.inflight.insert(0, (now, Pend::Start, 0));
                l.mode = Mode::Starting;
                let msg = Msg::Repl {
                    vol: self.vol,
                    epoch: self.epoch,
                    session: l.session,
                    lseq: 0,
                    vseq: 0,
                    commit: 0,
                    floor: 0,
                    op: ReplOp::Start,
                };
                out.sends.push((Endpoint::Node(*n), msg));
            }
        }
        self.progress(now, lease_until, out);
    }

    pub(crate) fn progress(&mut self, now: u64, lease_until: u64, out: &mut Out) {
        self.finish_compare(now, out);
        self.release_held(now, out);
        self.resync_step(now, out);
        self.want_cas(now, out);
        self.try_acks(now, lease_until, out);
    }

    fn want_cas(&mut self, now: u64, out: &mut Out) {
        if self.cas.is_some() {
            return;
        }
        // A link leaving that the record already shows out of sync (it
        // failed while Joining, before its InSync CAS) needs no CAS; with no
        // CAS of ours unresolved, nothing can make it InSync behind our back.
        for (n, l) in self.links.iter_mut() {
            if l.mode == Mode::Leaving {
                match self.rec.state(*n) {
                    Some(ReplicaState::OutOfSync) => l.mode = Mode::OutOfSync,
                    Some(ReplicaState::Faulty) => l.mode = Mode::Faulty,
                    _ => {}
                }
            }
        }
        if self.cas.is_some() {
            return;
        }
        let desired = self.desired();
        if desired.replicas != self.rec.replicas {
            self.cas = Some((now, self.rec.version));
            out.sends.push((
                Endpoint::Control,
                Msg::MetaCas {
                    expected: self.rec.version,
                    record: desired,
                },
            ));
        }
    }

    /// The record this primary wants: its links' pending state changes
    /// applied to the last record it saw.
    fn desired(&self) -> Membership {
        let mut desired = self.rec.clone();
        for (n, l) in &self.links {
            if let Some(info) = desired.replicas.get_mut(n) {
                match l.mode {
                    Mode::Leaving => info.state = ReplicaState::OutOfSync,
                    // Proposed only once every stream entry the link still
                    // owes is for an operation not yet acknowledged to the
                    // client (those now wait for it): an operation that was
                    // acknowledged while the link did not count yet must be
                    // on it before it counts as InSync.
                    Mode::Joining
                        if l.inflight.values().all(
                            |(_, p, _)| matches!(p, Pend::Op(v) if self.ops.contains_key(v)),
                        ) =>
                    {
                        info.state = ReplicaState::InSync
                    }
                    _ => {}
                }
            }
        }
        desired
    }

    /// Whether fewer than `min_in_sync` replicas (this one included) count
    /// as InSync: client writes then wait.
    pub(crate) fn below_min_in_sync(&self) -> bool {
        let in_sync = 1 + self
            .links
            .values()
            .filter(|l| l.mode == Mode::InSync)
            .count();
        in_sync < self.rec.min_in_sync
    }

    fn try_acks(&mut self, now: u64, lease_until: u64, out: &mut Out) {
        if now >= lease_until {
            return;
        }
        let links = &self.links;
        self.short_of_space
            .retain(|n| links.get(n).is_some_and(|l| l.mode != Mode::InSync));
        let enough = !self.below_min_in_sync();
        let out_of_space = self.out_of_space();
        let mut done = Vec::new();
        let mut refused = Vec::new();
        for (v, op) in &self.ops {
            // A compare-and-write's read is answered by `finish_compare`.
            if !op.local_done || op.compare.is_some() {
                continue;
            }
            // The ack rule but for `min_in_sync`: every replica that counts
            // acknowledged it, and none it missed is still leaving.
            let rule_holds = |op: &Op| {
                self.links.iter().all(|(n, l)| {
                    !l.mode.counts()
                        || if op.sent.contains(n) {
                            op.acked.contains(n)
                        } else {
                            l.mode != Mode::Leaving
                        }
                })
            };
            if op.no_space || (op.refusable && out_of_space) {
                if rule_holds(op) {
                    refused.push(*v);
                }
                continue;
            }
            let ok = match op.kind {
                Kind::Read => true,
                // Compared with the replicas still InSync that were asked
                // (one that left is resynced where it may differ anyway).
                Kind::Compare => op.sent.iter().all(|n| {
                    op.acked.contains(n) || self.links.get(n).is_none_or(|l| l.mode != Mode::InSync)
                }),
                _ if self.cfg.ack_before_secondaries => true,
                _ => enough && rule_holds(op),
            };
            if ok {
                done.push(*v);
            }
        }
        for v in refused {
            if let Some(op) = self.ops.remove(&v) {
                self.reply(op.client_id, self.no_space(), out);
            }
        }
        for v in done {
            if let Some(mut op) = self.ops.remove(&v) {
                if op.kind == Kind::Compare && !op.unreadable {
                    op.data = Some(self.compared(&op));
                }
                let reply = if op.unreadable {
                    ClientReply::Unreadable {
                        by: self.me,
                        epoch: self.epoch,
                    }
                } else {
                    ClientReply::Ok {
                        by: self.me,
                        epoch: self.epoch,
                        data: op.answer.or(op.data),
                    }
                };
                out.sends.push((
                    Endpoint::Client,
                    Msg::ClientReply {
                        id: op.client_id,
                        reply,
                    },
                ));
            }
        }
    }
}
