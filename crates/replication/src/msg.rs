//! The inputs and outputs of the state machines.
//!
//! Job: define every message on the wire, every disk operation and every
//! client request/reply, so that the state machines never do I/O: a driver
//! (production sockets/disks/etcd, or the simulator) feeds [`Input`]s and
//! carries out [`Action`]s.
//!
//! Invariant: every replication message carries the sender's epoch; a
//! receiver compares it before looking at anything else.

use crate::payload::Payload;
use crate::types::{Epoch, LayerId, Lba, Membership, NodeId, VolumeId};

/// Where a message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    Node(NodeId),
    /// The metadata service together with the elected coordinator.
    Control,
    /// The client (initiator) of the volume.
    Client,
}

/// One operation in a replication stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplOp {
    /// Opens a stream (session): the secondary resets its expected sequence.
    Start,
    /// Write `data` (whole blocks) at `lba`.
    Write { lba: Lba, data: Payload, fua: bool },
    /// Make every earlier write of the stream durable.
    Flush,
    /// Write zeros to `blocks` blocks at `lba`: what the primary sends
    /// instead of a `Write` whose data is all zero (a resync copy of a
    /// never-written region, a client's TRIM or WRITE_ZEROES), so that
    /// zeros never cross the network as bytes.
    WriteZeroes { lba: Lba, blocks: u64, fua: bool },
    /// Checksum your copy of `blocks` blocks at `lba` at this point of the
    /// stream (after every earlier entry, before every later one) and
    /// answer with a `ReplDigest`: the replica compare of a scrub.
    Digest { lba: Lba, blocks: u64 },
    /// Freeze your copy as it stands at this point of the stream (every
    /// earlier entry applied and flushed) into snapshot layer `layer`; the
    /// head goes on, empty, over it. Nothing if you hold `layer` already.
    Snapshot { layer: LayerId },
    /// Delete snapshot layer `layer` if you hold it (what it holds that
    /// a later layer needs moves there: no other layer reads differently).
    DeleteLayer { layer: LayerId },
    /// Make your head read exactly as layer `onto` (zeros: None) from this
    /// point of the stream, keeping its size: a rollback, or the start of a
    /// rebuild of the layers a replica lacks.
    Rebase { onto: Option<LayerId> },
    /// Copy into your head the blocks of `blocks` blocks at `lba` that it
    /// reads through a snapshot of another volume (a clone's source), at
    /// most `rate` bytes per second (0: no cap); once your head reads
    /// nothing through it, stop reading through it. Changes no content, so
    /// its place in the stream does not matter.
    Flatten { lba: Lba, blocks: u64, rate: u64 },
    /// Compress the extents of `blocks` blocks at `lba` of your copy and
    /// of its snapshot layers now, with the codec your node keeps the
    /// volume compressed with, at most `rate` bytes per second (0: no
    /// cap). Changes no content (only how it lies on your device), so its
    /// place in the stream does not matter.
    Compact { lba: Lba, blocks: u64, rate: u64 },
}

impl ReplOp {
    /// The blocks it writes, (first, count) with `block_len`-byte blocks;
    /// None for a start, a flush, a digest and the layer operations (a
    /// `Rebase` changes every block: see [`ReplOp::rewrites_all`]).
    pub fn extent(&self, block_len: u64) -> Option<(Lba, u64)> {
        match self {
            ReplOp::Write { lba, data, .. } => Some((*lba, data.len() as u64 / block_len.max(1))),
            ReplOp::WriteZeroes { lba, blocks, .. } => Some((*lba, *blocks)),
            ReplOp::Start
            | ReplOp::Flush
            | ReplOp::Digest { .. }
            | ReplOp::Snapshot { .. }
            | ReplOp::DeleteLayer { .. }
            | ReplOp::Rebase { .. }
            | ReplOp::Flatten { .. }
            | ReplOp::Compact { .. } => None,
        }
    }

    /// Whether it is a background entry (a layer deletion, a flatten, a
    /// compaction): it may take long on a replica, so it never times its
    /// link out, and it is sent again under the same `lseq` while
    /// unacknowledged.
    pub fn is_background(&self) -> bool {
        matches!(
            self,
            ReplOp::DeleteLayer { .. } | ReplOp::Flatten { .. } | ReplOp::Compact { .. }
        )
    }

    /// Whether it changes every block of the volume (a `Rebase`).
    pub fn rewrites_all(&self) -> bool {
        matches!(self, ReplOp::Rebase { .. })
    }

    /// The blocks it reads or writes (a digest's included): the replica's
    /// disk must hold them.
    pub fn span(&self, block_len: u64) -> Option<(Lba, u64)> {
        match self {
            ReplOp::Digest { lba, blocks } => Some((*lba, *blocks)),
            _ => self.extent(block_len),
        }
    }
}

/// The checksum a replica compare uses: CRC32C of the blocks' bytes.
pub fn digest(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// What a `Compare` found, carried as its `Ok` reply's data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compared {
    /// The replicas (besides the primary) whose checksum was compared: the
    /// ones InSync from the request to the answer.
    pub replicas: Vec<NodeId>,
    /// Those of them whose copy differed (or failed its block checksums):
    /// their copy of the regions is being rewritten from the primary's.
    pub differing: Vec<NodeId>,
}

impl Compared {
    /// `u32` count of `replicas`, the ids, then the ids of `differing`
    /// (all little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = (self.replicas.len() as u32).to_le_bytes().to_vec();
        for n in self.replicas.iter().chain(&self.differing) {
            out.extend_from_slice(&n.0.to_le_bytes());
        }
        out
    }

    /// Reads [`Compared::encode`]'s bytes back; None if they are not that.
    pub fn decode(data: &[u8]) -> Option<Compared> {
        let (count, rest) = data.split_first_chunk::<4>()?;
        let count = u32::from_le_bytes(*count) as usize;
        if !rest.len().is_multiple_of(4) || rest.len() / 4 < count {
            return None;
        }
        let ids: Vec<NodeId> = rest
            .chunks_exact(4)
            .map(|c| NodeId(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        let (replicas, differing) = ids.split_at(count);
        Some(Compared {
            replicas: replicas.to_vec(),
            differing: differing.to_vec(),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientReq {
    Write {
        lba: Lba,
        data: Payload,
        fua: bool,
    },
    Flush,
    Read {
        lba: Lba,
        blocks: u64,
    },
    /// Compare every in-sync replica's copy of these blocks with the
    /// primary's (a checksum of each, taken at the same point of the
    /// stream) and rewrite the copies that differ from the primary's, whose
    /// read verified the blocks' checksums (or was repaired). Answered `Ok`
    /// with a [`Compared`] ([`Compared::encode`]) as `data`, or
    /// `Unreadable` if the primary's copy fails its checksum and no replica
    /// gave a good one.
    Compare {
        lba: Lba,
        blocks: u64,
    },
    /// Take snapshot layer `layer` of the volume: at one point of the
    /// write stream on every replica (every write acknowledged before the
    /// request is in it, none sent after the answer). Answered `Ok` once
    /// the primary and every in-sync replica hold it durably; a retry (the
    /// primary holds `layer` already) is answered once they hold it, as a
    /// flush is. A client asks for a `layer` id of one primary only: one
    /// not answered (the primary changed) is asked again under a new id,
    /// since a primary lacking it would take it again at another point of
    /// the stream while replicas hold the first.
    Snapshot {
        layer: LayerId,
    },
    /// Delete snapshot layer `layer` on every replica (`Ok` also if no
    /// replica holds it).
    DeleteSnapshot {
        layer: LayerId,
    },
    /// Make the volume read exactly as snapshot layer `layer` (its size is
    /// kept: a volume never shrinks). Answered `NoSuchLayer` if the primary
    /// does not hold it.
    Rollback {
        layer: LayerId,
    },
    /// Flatten `blocks` blocks at `lba` of a clone on every replica
    /// (`ReplOp::Flatten`), at most `rate` bytes per second each (0: no
    /// cap). Answered `Ok` with the primary's [`Flattened`]
    /// ([`Flattened::encode`]) as `data` once it and every replica it was
    /// streamed to are done.
    Flatten {
        lba: Lba,
        blocks: u64,
        rate: u64,
    },
    /// Compress `blocks` blocks at `lba` of the volume and of its
    /// snapshots on every replica (`ReplOp::Compact`), at most `rate`
    /// bytes per second each (0: no cap). Answered `Ok` with what the
    /// primary's disk reported (opaque here: the store's compaction
    /// report) as `data` once it and every replica it was streamed to are
    /// done.
    Compact {
        lba: Lba,
        blocks: u64,
        rate: u64,
    },
    /// Read `blocks` blocks at `lba` of snapshot layer `layer` on the
    /// primary's copy (zeros beyond the layer's size): the export of a
    /// snapshot through a node that holds no replica. Answered `Ok` with
    /// the data, `NoSuchLayer` if the primary does not hold the layer,
    /// `Unreadable` if its copy of it fails its checksum (layers are not
    /// repaired from replicas) or is gone by the time it is read.
    ReadLayer {
        layer: LayerId,
        lba: Lba,
        blocks: u64,
    },
    /// Compare and write, atomically: at one point of the write stream
    /// (after every write sent before it, before every request sent after
    /// it), each block's current content on the primary is compared with
    /// its expected content, and the new content is written to the blocks
    /// that match (`whole`: to none unless all match), as one write
    /// replicated like a client's. `both` holds `n` expected blocks, then
    /// the `n` blocks to write. Answered `Ok` with a [`CompareWritten`]
    /// ([`CompareWritten::encode`]) as `data` once its write (if any) is
    /// acknowledged by the ack rule; `Unreadable` (nothing written) if the
    /// primary's copy fails its checksum and no replica gives a good one.
    ///
    /// Asked again after a failover, blocks its first attempt wrote no
    /// longer match (unless the new content equals the expected): a
    /// client that needs to tell "written by me" from "changed by someone
    /// else" compares what it reads with what it wrote.
    CompareWrite {
        lba: Lba,
        both: Payload,
        whole: bool,
        fua: bool,
    },
}

impl ClientReq {
    /// A compare-and-write of `expect` with `data` (whole blocks, of equal
    /// length) at `lba`.
    pub fn compare_write(
        lba: Lba,
        expect: &[u8],
        data: &[u8],
        whole: bool,
        fua: bool,
    ) -> ClientReq {
        let mut both = Vec::with_capacity(expect.len() + data.len());
        both.extend_from_slice(expect);
        both.extend_from_slice(data);
        ClientReq::CompareWrite {
            lba,
            both: crate::payload::aligned(&both),
            whole,
            fua,
        }
    }
}

/// What a compare-and-write found and did, carried as its `Ok` reply's
/// data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompareWritten {
    /// Per block, whether its content matched the expected.
    pub matched: Vec<bool>,
    /// Whether the matching blocks were written (false for a `whole`
    /// compare-and-write with a block that did not match, or none
    /// matching).
    pub written: bool,
}

impl CompareWritten {
    /// `written` (one byte), the block count (u32, little-endian), then
    /// `matched` as a bitmap (bit `i % 8` of byte `i / 8`).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![u8::from(self.written)];
        out.extend_from_slice(&(self.matched.len() as u32).to_le_bytes());
        out.extend_from_slice(&bitmap(&self.matched));
        out
    }

    /// Reads [`CompareWritten::encode`]'s bytes back; None if they are not
    /// that.
    pub fn decode(data: &[u8]) -> Option<CompareWritten> {
        let (&written, rest) = data.split_first()?;
        let (n, bits) = rest.split_first_chunk::<4>()?;
        let n = u32::from_le_bytes(*n) as usize;
        if written > 1 || bits.len() != n.div_ceil(8) {
            return None;
        }
        Some(CompareWritten {
            matched: (0..n).map(|i| bit(bits, i)).collect(),
            written: written == 1,
        })
    }
}

/// `flags` as a bitmap: bit `i % 8` of byte `i / 8` set for each true.
fn bitmap(flags: &[bool]) -> Vec<u8> {
    let mut out = vec![0u8; flags.len().div_ceil(8)];
    for (i, f) in flags.iter().enumerate() {
        if *f {
            out[i / 8] |= 1 << (i % 8);
        }
    }
    out
}

/// Bit `i` of a [`bitmap`] (false beyond its end).
fn bit(bits: &[u8], i: usize) -> bool {
    bits.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

/// What a flatten did on the primary's copy, carried as its `Ok` reply's
/// data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flattened {
    /// Blocks copied into the head.
    pub copied_blocks: u64,
    /// The head reads nothing through another volume's snapshot any more.
    pub detached: bool,
}

impl Flattened {
    /// `copied_blocks` (u64, little-endian), then `detached` (one byte).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.copied_blocks.to_le_bytes().to_vec();
        out.push(u8::from(self.detached));
        out
    }

    /// Reads [`Flattened::encode`]'s bytes back; None if they are not that.
    pub fn decode(data: &[u8]) -> Option<Flattened> {
        let (copied, rest) = data.split_first_chunk::<8>()?;
        match rest {
            [d @ (0 | 1)] => Some(Flattened {
                copied_blocks: u64::from_le_bytes(*copied),
                detached: *d == 1,
            }),
            _ => None,
        }
    }
}

impl ClientReq {
    /// The blocks it reads or writes, (first, count) with `block_len`-byte
    /// blocks; None for a flush.
    pub fn extent(&self, block_len: u64) -> Option<(Lba, u64)> {
        match self {
            ClientReq::Write { lba, data, .. } => {
                Some((*lba, data.len() as u64 / block_len.max(1)))
            }
            ClientReq::Read { lba, blocks } | ClientReq::Compare { lba, blocks } => {
                Some((*lba, *blocks))
            }
            ClientReq::CompareWrite { lba, both, .. } => {
                Some((*lba, both.len() as u64 / 2 / block_len.max(1)))
            }
            ClientReq::Flush
            | ClientReq::Snapshot { .. }
            | ClientReq::DeleteSnapshot { .. }
            | ClientReq::Rollback { .. }
            | ClientReq::Flatten { .. }
            | ClientReq::Compact { .. }
            | ClientReq::ReadLayer { .. } => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientReply {
    /// Done by the primary `by` in `epoch`.
    Ok {
        by: NodeId,
        epoch: Epoch,
        data: Option<Vec<u8>>,
    },
    /// Not done (this node is not, or no longer, the primary); the outcome of
    /// a write answered this way is unknown.
    NotPrimary,
    /// A read the primary `by` could not serve: its copy of a block fails
    /// its checksum and no in-sync replica gave a good one (a media error).
    Unreadable { by: NodeId, epoch: Epoch },
    /// A rollback to a layer the primary `by` does not hold.
    NoSuchLayer { by: NodeId, epoch: Epoch },
    /// A write (or flush) not done for lack of space: the primary's store
    /// had none for it, or too few replicas did for it to count (the
    /// volume is below `min_in_sync` because replicas ran out of space).
    /// Like any failed write, the blocks may hold the old data, the new, or
    /// a mix, and every InSync replica holds the same.
    NoSpace { by: NodeId, epoch: Epoch },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// Primary → secondary: entry `lseq` of stream `session` in `epoch`.
    /// `vseq` is the primary's volume-wide operation number (writes and
    /// resync copies get increasing ones from 2, vseq 1 standing for the
    /// epoch's start; 0 for `Start`, a resync's final flush and the flush
    /// that tells a link just made InSync the `commit`).
    ///
    /// `commit`: when the message was sent, every client operation with a
    /// `vseq` up to it was acknowledged to the client, and this secondary
    /// was InSync (so it held every acknowledged write); 0 when it was not
    /// InSync. `floor`: no more than the `commit` every InSync secondary
    /// had acknowledged receiving (the current `commit` if none is
    /// InSync). A secondary forgets the regions of writes at or below
    /// `floor` (see [`Prior`]).
    Repl {
        vol: VolumeId,
        epoch: Epoch,
        session: u64,
        lseq: u64,
        vseq: u64,
        commit: u64,
        floor: u64,
        op: ReplOp,
    },
    /// Secondary → primary: the `Start` of `session` is applied (the
    /// acknowledgement of entry 0), with what the secondary knows of the
    /// stream it received in the epoch before (None: nothing usable, e.g.
    /// it restarted since, or its record of it overflowed) and the
    /// snapshot layers it holds, oldest first.
    ReplStarted {
        vol: VolumeId,
        epoch: Epoch,
        session: u64,
        prior: Option<Prior>,
        layers: Vec<LayerId>,
    },
    /// Secondary → primary: entry `lseq` is applied (for writes: completed on
    /// disk, durable if FUA; for flushes and Start: done).
    ReplAck {
        vol: VolumeId,
        epoch: Epoch,
        session: u64,
        lseq: u64,
    },
    /// Secondary → primary: entry `lseq`, a `Digest`, is done: the
    /// checksum of its blocks here ([`digest`]), None if they fail their
    /// block checksums here. Acknowledges the entry like a `ReplAck`.
    ReplDigest {
        vol: VolumeId,
        epoch: Epoch,
        session: u64,
        lseq: u64,
        digest: Option<u32>,
    },
    /// Secondary → primary: entry `lseq` of `session` could not be
    /// applied for lack of space here; the secondary left that stream (it
    /// applies and acknowledges nothing more of it), so the primary fails
    /// the link at once rather than after the acknowledgement timeout.
    ReplNoSpace {
        vol: VolumeId,
        epoch: Epoch,
        session: u64,
        lseq: u64,
    },
    /// Secondary → sender: your epoch is older than mine; refused.
    Fenced {
        vol: VolumeId,
        epoch: Epoch,
    },
    /// Node → coordinator, every heartbeat interval.
    Heartbeat {
        boot: u64,
        sent_at: u64,
    },
    /// Coordinator → node: the record's epoch and primary at answer time; a
    /// primary extends its lease to `sent_at + lease_ms` only if it is still
    /// the primary of its epoch. `lease_ms` is the coordinator's (0: not
    /// stated, by an older coordinator; the node's own setting applies).
    HeartbeatAck {
        sent_at: u64,
        vol: VolumeId,
        epoch: Epoch,
        primary: NodeId,
        lease_ms: u64,
    },
    /// Node → metadata service.
    MetaGet {
        vol: VolumeId,
    },
    MetaCas {
        expected: u64,
        record: Membership,
    },
    /// Metadata service → node: the record now; `cas_ok` answers a MetaCas.
    MetaReply {
        record: Membership,
        cas_ok: Option<bool>,
    },
    /// Primary → in-sync secondary: read `blocks` blocks at `lba` from your
    /// copy for me (mine fails its checksum there), once you have applied
    /// entry `after` of stream `session` (every write streamed to you before
    /// this request, which the network may deliver after it); answered by
    /// `RepairData` with the same `id`.
    RepairRead {
        vol: VolumeId,
        epoch: Epoch,
        id: u64,
        lba: Lba,
        blocks: u64,
        session: u64,
        after: u64,
    },
    /// Secondary → primary: the blocks asked for by `RepairRead` `id`, or
    /// None if this replica cannot give them (its copy fails its checksum
    /// too, or it is not a secondary of `epoch`).
    RepairData {
        vol: VolumeId,
        epoch: Epoch,
        id: u64,
        data: Option<Vec<u8>>,
    },
    ClientReq {
        id: u64,
        req: ClientReq,
    },
    ClientReply {
        id: u64,
        reply: ClientReply,
    },
}

/// What a secondary reports, when a new primary opens a stream to it,
/// about the stream it received in an earlier epoch: the regions where it
/// may differ from any other replica that held every acknowledged write of
/// that epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prior {
    /// The epoch of that stream (never 0).
    pub epoch: Epoch,
    /// The highest `commit` it received in that epoch (0: none): it held
    /// every write acknowledged by then.
    pub synced: u64,
    /// Regions of every write or copy it received in that epoch above the
    /// highest `floor` it received, ascending.
    pub regions: Vec<u32>,
}

/// A local disk operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskOp {
    Write {
        lba: Lba,
        data: Payload,
        fua: bool,
    },
    Read {
        lba: Lba,
        blocks: u64,
    },
    Flush,
    /// Make `blocks` blocks at `lba` read as zeros. Same ordering and
    /// durability as a `Write` of zeros (FUA: durable on completion); a
    /// thin store may free the blocks instead of writing them.
    WriteZeroes {
        lba: Lba,
        blocks: u64,
        fua: bool,
    },
    /// Grow the local copy of the volume to `blocks` blocks (nothing if it
    /// is that large already); the blocks added read as zeros. Durable on
    /// completion. Issued alone: it waits for every earlier operation and
    /// every later one waits for it.
    Grow {
        blocks: u64,
    },
    /// Make `logs` the node's crash-safe copy of its uncertain-region logs
    /// (replacing the previous one atomically), durable on completion.
    /// Issued only when no other one is in flight; every write submitted
    /// after it waits for it.
    SaveLogs {
        logs: crate::node::SavedLogs,
    },
    /// Flush every earlier write, then freeze the volume's head into
    /// snapshot layer `layer` (nothing if the disk holds it already); the
    /// head goes on, empty, over it. Durable on completion. Issued alone,
    /// like a grow.
    Snapshot {
        layer: LayerId,
    },
    /// Delete snapshot layer `layer` if the disk holds it, without
    /// changing what any other layer reads (its blocks a later layer needs
    /// move there while writes go on, so it is not issued alone: it waits
    /// only for layer operations and reads of layers). Durable on
    /// completion.
    DeleteLayer {
        layer: LayerId,
    },
    /// Make the head read exactly as layer `onto` (zeros: None), keeping
    /// the disk's size. Durable on completion; issued alone.
    Rebase {
        onto: Option<LayerId>,
    },
    /// Which regions of `region_blocks` blocks may read differently in
    /// `to` (the head: None) than in layer `from` (zeros: None); a region
    /// left out certainly reads the same. Completes with the regions as
    /// [`encode_regions`] bytes. Issued alone (it sees every write
    /// submitted before it and none after).
    Changed {
        from: Option<LayerId>,
        to: Option<LayerId>,
        region_blocks: u64,
    },
    /// Read `blocks` blocks at `lba` of snapshot layer `layer` (zeros
    /// beyond the layer's size).
    ReadLayer {
        layer: LayerId,
        lba: Lba,
        blocks: u64,
    },
    /// `ReplOp::Flatten` on this disk; completes with a [`Flattened`]
    /// ([`Flattened::encode`]). Changes no content: it goes on beside
    /// writes, waiting only for the other layer operations that do
    /// (deletions, layer reads, flattens). Durable on completion.
    Flatten {
        lba: Lba,
        blocks: u64,
        rate: u64,
    },
    /// `ReplOp::Compact` on this disk; completes with the store's report
    /// as data (opaque to the protocol). Changes no content: it goes on
    /// beside writes, waiting only for the other layer operations.
    Compact {
        lba: Lba,
        blocks: u64,
        rate: u64,
    },
}

impl DiskOp {
    /// Whether it is issued alone: once nothing else is in flight, and
    /// before anything submitted after it.
    pub fn runs_alone(&self) -> bool {
        matches!(
            self,
            DiskOp::Grow { .. }
                | DiskOp::Snapshot { .. }
                | DiskOp::Rebase { .. }
                | DiskOp::Changed { .. }
        )
    }
}

/// Region numbers as a `Changed` completion carries them: `u32`
/// little-endian each, ascending.
pub fn encode_regions(regions: impl IntoIterator<Item = u32>) -> Vec<u8> {
    regions.into_iter().flat_map(u32::to_le_bytes).collect()
}

/// Reads [`encode_regions`]'s bytes back (a trailing partial number is
/// ignored).
pub fn decode_regions(data: &[u8]) -> Vec<u32> {
    data.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Identifies one disk operation of a node.
pub type IoId = u64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskResult {
    Done {
        data: Option<Vec<u8>>,
    },
    /// A transient I/O error: the node retries the operation.
    Error,
    /// A read whose data fails its checksum (the disk does not hold what
    /// was written): not retried; a primary reads the blocks from an
    /// in-sync replica and rewrites its own copy.
    Corrupt,
    /// A write (or zeroing) the local store has no space for: not
    /// retried (it would fail the same way until space is freed). The
    /// disk may hold any part of it. A primary answers the client
    /// `NoSpace`; a secondary leaves the stream (`ReplNoSpace`).
    NoSpace,
}

#[derive(Clone, Debug)]
pub enum Input {
    Msg {
        from: Endpoint,
        msg: Msg,
    },
    Disk {
        id: IoId,
        result: DiskResult,
    },
    /// The clock advanced; time is passed with every input.
    Tick,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Send { to: Endpoint, msg: Msg },
    Disk { id: IoId, op: DiskOp },
}
