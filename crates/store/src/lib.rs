//! Basalt's local store engine: thin-provisioned volumes kept in fixed-size
//! extents on one block device (a data file or a raw device), with a
//! checksummed metadata journal that makes every flushed write survive a
//! crash or a power loss (on-disk format version 2, `docs/format.md`).
//!
//! Invariants (docs/format.md states the on-disk rules behind them):
//! - A physical extent is owned by at most one (volume, logical extent).
//! - A free clean extent reads as zeros; so does every logical extent that
//!   is not mapped. Both hold after a power loss too: an extent that may
//!   hold data while free is marked dirty on disk and zeroed before reuse.
//! - A write is durable once it carried FUA or a later `flush` completed; the
//!   mapping it needed is journaled no later than that.
//! - An extent unmapped by TRIM, shrink or delete is reused only after the
//!   unmap is durable and the extent's zeroing was flushed, and only after
//!   every I/O that could still reach it has finished.
//! - After a failed commit no flush reports success.
//! - A read never returns a block that does not hold what was last written
//!   to it: every 4 KiB block's CRC32C is checked (`integrity.rs`), and a
//!   crash never leaves a checksum that disagrees with a valid block
//!   (`intent.rs`).

mod alloc;
mod buf;
mod check;
mod compactor;
pub mod device;
mod diff;
mod engine;
mod error;
pub mod format;
mod integrity;
mod intent;
mod journal;
mod keys;
mod layer_map;
mod layers;
mod meta;
mod pace;
mod packing;
mod presence;
mod recovery;
mod rekey;
mod scrub;
mod space;
mod staged;
mod volume;

pub use buf::AlignedBuf;
pub use check::CheckReport;
pub use compactor::CompactReport;
pub use device::{BlockDevice, FileDevice, IoKind, IoOp, MemDevice, SimDevice};
pub use diff::ChangedRun;
pub use engine::{
    FlushStats, FormatOptions, IntegrityStats, OpenOptions, RecoveryReport, Store, StoreUsage,
    VolumeUsage, DEFAULT_COMPACTION_RATE, DEFAULT_SCRUB_INTERVAL, DEFAULT_SCRUB_RATE,
};
pub use error::{IoError, StoreError};
pub use format::Codec;
pub use format::WrappedKey;
pub use layers::{FlattenReport, SnapshotUsage};
pub use pace::Pacer;
pub use packing::PackOutcome;
pub use recovery::{inspect, StoreInfo};
pub use scrub::{ScrubFollowUp, ScrubReport};
pub use staged::{fail_fua_writes, Contended, DevicePiece, StagedBatch};
pub use volume::{DataKind, DataOp, LocalVolume, MappingRun};

/// Identifies a volume in the store; the control plane's volume UUID.
pub type VolumeId = uuid::Uuid;

/// The block size every data-path offset and length is aligned to internally.
pub const BLOCK_SIZE: u64 = 4096;
