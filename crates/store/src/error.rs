//! Typed errors of the store: control operations (`StoreError`) and the data
//! path (`IoError`, which frontends map to their protocol's status codes).

use crate::VolumeId;
use std::io;

/// Errors of store-level (control) operations.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("volume {0} does not exist in the store")]
    NotFound(VolumeId),
    #[error("volume {0} already exists in the store")]
    Exists(VolumeId),
    #[error("invalid size: {0}")]
    InvalidSize(String),
    #[error("the store holds its maximum number of volumes ({0})")]
    TooManyVolumes(u32),
    #[error("no space left in the store")]
    NoSpace,
    #[error("the device is too small: {0}")]
    DeviceTooSmall(String),
    #[error("{0}")]
    Format(String),
    #[error("device I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("the store stopped after an earlier device error; restart to recover")]
    Failed,
    #[error("{0}")]
    Layers(String),
    #[error("this store was formatted without layers (snapshots and clones); format a new store to use them")]
    NoLayers,
    /// An encrypted volume whose data key was not loaded: it is not served
    /// rather than return ciphertext as data.
    #[error("volume {0} is encrypted and its data key is not loaded (the server needs the master key that wrapped it)")]
    Locked(VolumeId),
}

/// Errors of data-path operations on a volume.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("request [{offset}, +{len}) is beyond the volume's size {size}")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("no space left in the store")]
    NoSpace,
    #[error("device I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("the volume was deleted")]
    Gone,
    #[error("the store stopped after an earlier device error")]
    Failed,
    /// A block read does not hold what was written to it (its checksum
    /// does not match), and no other copy was good: the read fails rather
    /// than return it. `offset`: the device offset in the local store; the
    /// volume offset of the read for a replicated volume.
    #[error("data at offset {offset} fails its checksum")]
    Corrupt { offset: u64 },
    /// A write to a snapshot.
    #[error("a snapshot is read-only")]
    ReadOnly,
}

impl From<StoreError> for IoError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Io(e) => IoError::Io(e),
            StoreError::NotFound(_) => IoError::Gone,
            StoreError::NoSpace => IoError::NoSpace,
            _ => IoError::Failed,
        }
    }
}

impl IoError {
    /// A copy of this error, for reporting one failure to several requests.
    pub fn duplicate(&self) -> IoError {
        match self {
            IoError::OutOfRange { offset, len, size } => IoError::OutOfRange {
                offset: *offset,
                len: *len,
                size: *size,
            },
            IoError::NoSpace => IoError::NoSpace,
            IoError::Io(e) => IoError::Io(match e.raw_os_error() {
                Some(code) => io::Error::from_raw_os_error(code),
                None => io::Error::new(e.kind(), e.to_string()),
            }),
            IoError::Gone => IoError::Gone,
            IoError::Failed => IoError::Failed,
            IoError::Corrupt { offset } => IoError::Corrupt { offset: *offset },
            IoError::ReadOnly => IoError::ReadOnly,
        }
    }
}
