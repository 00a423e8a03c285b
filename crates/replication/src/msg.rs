//! The inputs and outputs of the state machines.
//!
//! Job: define every message on the wire, every disk operation and every
//! client request/reply, so that the state machines never do I/O: a driver
//! (production sockets/disks/etcd, or the simulator) feeds [`Input`]s and
//! carries out [`Action`]s.
//!
//! Invariant: every replication message carries the sender's epoch; a
//! receiver compares it before looking at anything else.

use crate::types::{Epoch, Lba, Membership, NodeId, VolumeId};

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
    Write { lba: Lba, data: Vec<u8>, fua: bool },
    /// Make every earlier write of the stream durable.
    Flush,
    /// Write zeros to `blocks` blocks at `lba`: what the primary sends
    /// instead of a `Write` whose data is all zero (a resync copy of a
    /// never-written region, a client's TRIM or WRITE_ZEROES), so that
    /// zeros never cross the network as bytes.
    WriteZeroes { lba: Lba, blocks: u64, fua: bool },
}

impl ReplOp {
    /// The blocks it writes, (first, count) with `block_len`-byte blocks;
    /// None for a start or a flush.
    pub fn extent(&self, block_len: u64) -> Option<(Lba, u64)> {
        match self {
            ReplOp::Write { lba, data, .. } => Some((*lba, data.len() as u64 / block_len.max(1))),
            ReplOp::WriteZeroes { lba, blocks, .. } => Some((*lba, *blocks)),
            ReplOp::Start | ReplOp::Flush => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientReq {
    Write { lba: Lba, data: Vec<u8>, fua: bool },
    Flush,
    Read { lba: Lba, blocks: u64 },
}

impl ClientReq {
    /// The blocks it reads or writes, (first, count) with `block_len`-byte
    /// blocks; None for a flush.
    pub fn extent(&self, block_len: u64) -> Option<(Lba, u64)> {
        match self {
            ClientReq::Write { lba, data, .. } => {
                Some((*lba, data.len() as u64 / block_len.max(1)))
            }
            ClientReq::Read { lba, blocks } => Some((*lba, *blocks)),
            ClientReq::Flush => None,
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
    /// it restarted since, or its record of it overflowed).
    ReplStarted {
        vol: VolumeId,
        epoch: Epoch,
        session: u64,
        prior: Option<Prior>,
    },
    /// Secondary → primary: entry `lseq` is applied (for writes: completed on
    /// disk, durable if FUA; for flushes and Start: done).
    ReplAck {
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
    /// copy for me (mine fails its checksum there); answered by
    /// `RepairData` with the same `id`.
    RepairRead {
        vol: VolumeId,
        epoch: Epoch,
        id: u64,
        lba: Lba,
        blocks: u64,
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
        data: Vec<u8>,
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
