//! Basalt's replication protocol as sans-I/O state machines.
//!
//! Job: decide, for one replicated volume, what every node does: the
//! [`Node`] (primary or secondary role) and the [`Coordinator`] take
//! messages, disk completions and clock ticks in and return actions (sends,
//! disk operations, replies); they never do I/O. Production drives them with
//! sockets, disks and etcd; `tests/sim.rs` with a seeded simulation.
//!
//! Invariants the protocol keeps (checked by the simulator, see
//! `docs/simulation.md`):
//! - no acknowledged durable write is lost or changed;
//! - at most one primary's writes are accepted per epoch, and a replica never
//!   applies a write of an epoch older than its own (fencing);
//! - replicas converge once faults heal;
//! - no read returns data that was never written.

mod coordinator;
mod disk;
pub mod msg;
mod node;
pub mod payload;
mod primary;
mod secondary;
pub mod types;
mod uncertain;

pub use coordinator::{Change, ChangeOutcome, Coordinator, CoordinatorBug};
pub use msg::{
    decode_regions, digest, encode_regions, Action, ClientReply, ClientReq, CompareWritten,
    Compared, DiskOp, DiskResult, Endpoint, Flattened, Input, IoId, Msg, Prior, ReplOp,
};
pub use node::{Node, RoleKind, SavedLogs};
pub use payload::Payload;
pub use types::{
    CasError, Epoch, LayerId, Lba, Membership, MetaStore, NodeId, ReplicaInfo, ReplicaState,
    VolumeId, BLOCK_SIZE,
};
pub use uncertain::SavedLog;

/// Timing and geometry of a node's replication logic (times in ms).
#[derive(Clone, Debug)]
pub struct Config {
    /// Bytes per block in the data the node carries (4096 in production).
    pub block_len: u64,
    pub volume_blocks: u64,
    /// Blocks per dirty-tracking region.
    pub region_blocks: u64,
    /// How often a primary heartbeats (each answer extends its lease). A
    /// replica that is not primary heartbeats every `lease_ms / 3` if that
    /// is longer: it needs no lease, only to be heard (its node and itself
    /// alive, its boot) within the coordinator's `lease + grace`.
    pub heartbeat_ms: u64,
    /// A primary acknowledges nothing after `heartbeat sent_at + lease_ms`.
    pub lease_ms: u64,
    /// A secondary that has not acknowledged a message for this long is
    /// marked OutOfSync.
    pub ack_timeout_ms: u64,
    pub cas_timeout_ms: u64,
    pub poll_ms: u64,
    pub resync_retry_ms: u64,
    /// Cap on the rate of resync copies a primary makes, in bytes per
    /// second over all the replicas it resyncs (0: no cap). A token bucket
    /// of `resync_inflight` regions admits a copy only once it holds the
    /// whole region, so copies of data start at most every
    /// `region bytes / resync_rate` seconds once the bucket is empty. A
    /// region that reads as zeros (it goes as `WriteZeroes`) is charged
    /// [`Config::zero_copy_cost`] instead.
    pub resync_rate: u64,
    /// Region copies in flight per replica being resynced (read from the
    /// local disk or sent and not yet acknowledged); at least 1.
    pub resync_inflight: usize,
    /// Most regions a node remembers as uncertain (written above the
    /// primary's `floor`, which a replica out of sync holds back); beyond
    /// it, it forgets them all and reports nothing usable until the floor
    /// passes the last one forgotten, so a failover meanwhile resyncs it
    /// fully. The default, 16384 regions (16 GiB of 1 MiB regions written
    /// while a replica is away), costs at most about 1.5 MiB per log.
    pub uncertain_limit: usize,
    /// Keep a crash-safe copy of the uncertain-region logs (0: none): every
    /// region is in the copy on disk before a write to it is issued, so a
    /// node that crashed is resynced after a failover only where it may
    /// differ, as one stopped cleanly is. The copy keeps regions written
    /// before (a hot set, as DRBD's activity log does) and is cut down to
    /// what the logs and the unflushed writes need once it holds more than
    /// this many regions.
    pub crash_log_regions: usize,
    /// How often the crash-safe copy is checked for cutting down.
    pub crash_log_compact_ms: u64,
    /// Test-only: acknowledge after the local disk alone (a deliberately
    /// broken protocol, to prove the simulator's checks can fail).
    #[doc(hidden)]
    pub ack_before_secondaries: bool,
    /// Test-only: stream snapshots to replicas still being copied to (a
    /// deliberately broken protocol: their layer freezes a head that is not
    /// the primary's yet).
    #[doc(hidden)]
    pub snapshot_resyncing_replicas: bool,
    /// Test-only: a write the primary's store has no space for is answered
    /// without failing the links it was streamed to (a deliberately broken
    /// protocol: their copies may hold a write this one lacks).
    #[doc(hidden)]
    pub keep_links_without_space: bool,
}

impl Config {
    pub fn regions(&self) -> usize {
        self.volume_blocks.div_ceil(self.region_blocks.max(1)) as usize
    }

    /// What a resync copy of a region of `bytes` that reads as zeros is
    /// charged against `resync_rate`: 1/16 of it, at least one block. It
    /// ships no data, but the primary still reads the region and checks it
    /// (about 65 µs per MiB of a never-written region in the cluster's
    /// store); at 1/16, zero regions at the cap take about as much of the
    /// primary's time as copies of data (a 64 MiB/s cap: 1024 regions of
    /// 1 MiB a second, some 7 % of a core), and a rebuild of an empty
    /// volume still goes 16 times as fast as a full one.
    pub fn zero_copy_cost(&self, bytes: u64) -> u64 {
        (bytes / 16).max(self.block_len).min(bytes)
    }

    /// Blocks in region `r` (the last region may be short).
    pub fn region_len(&self, r: usize) -> u64 {
        let rb = self.region_blocks.max(1);
        let lba = r as u64 * rb;
        rb.min(self.volume_blocks.saturating_sub(lba))
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            block_len: BLOCK_SIZE,
            volume_blocks: 1 << 18,
            region_blocks: 1024,
            heartbeat_ms: 20,
            lease_ms: 100,
            ack_timeout_ms: 60,
            cas_timeout_ms: 50,
            poll_ms: 50,
            resync_retry_ms: 40,
            resync_rate: 0,
            resync_inflight: 4,
            uncertain_limit: 16384,
            crash_log_regions: 0,
            crash_log_compact_ms: 1000,
            ack_before_secondaries: false,
            snapshot_resyncing_replicas: false,
            keep_links_without_space: false,
        }
    }
}
