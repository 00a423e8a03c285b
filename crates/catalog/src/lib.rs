//! Basalt's catalog: the control-plane record of volumes, i.e. the desired
//! state a node converges its local store on.
//!
//! The [`Catalog`] trait is the only thing the rest of the control plane sees.
//! Two backends implement it with the same semantics: the embedded
//! [`RedbCatalog`] (one node) and [`EtcdCatalog`] (a cluster's shared
//! catalog in etcd):
//!
//! - Records are keyed by volume name; names are unique.
//! - Every stored record carries a [`Revision`]. Revisions are assigned by the
//!   catalog, grow monotonically across the whole catalog and are never
//!   reused, so a record that was deleted and recreated has a new revision
//!   (etcd's `mod_revision` has exactly these properties).
//! - Creation is put-if-absent; update and delete are compare-and-swap on the
//!   revision the caller read. A caller that lost a race gets
//!   [`CatalogError::Conflict`] and re-reads; nothing is overwritten blindly.
//! - Every successful call is durable when it returns. A mutation that fails
//!   with [`CatalogError::Timeout`] or [`CatalogError::Request`] (remote
//!   backends) may or may not have been applied; re-read to find out.

mod error;
mod etcd_catalog;
mod record;
mod redb_catalog;

pub use error::CatalogError;
pub use etcd_catalog::{
    describe_request_failure, etcd_failure, prefix_end, EtcdCatalog, EtcdConfig,
    DEFAULT_ETCD_PREFIX,
};
pub use record::{CloneSource, SnapshotRecord, VolumeRecord, MAX_VOLUME_NAME_LEN};
pub use redb_catalog::RedbCatalog;

use std::fmt;

/// The catalog's version stamp of one stored record; see the crate docs for
/// its guarantees. Opaque to callers apart from equality and display.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(u64);

impl Revision {
    /// Wraps a backend's raw revision number.
    pub fn new(raw: u64) -> Self {
        Revision(raw)
    }

    /// The backend's raw revision number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A record as stored, with the revision to pass back for update or delete.
#[derive(Clone, Debug, PartialEq)]
pub struct Versioned<T> {
    pub revision: Revision,
    pub record: T,
}

/// The control-plane record of volumes. Implementations must be safe to
/// share between threads and must give every call the semantics listed in the
/// crate docs, whatever their backend.
pub trait Catalog: Send + Sync {
    /// The record named `name`, or `None` if there is none.
    fn get(&self, name: &str) -> Result<Option<Versioned<VolumeRecord>>, CatalogError>;

    /// Every record, ordered by name.
    fn list(&self) -> Result<Vec<Versioned<VolumeRecord>>, CatalogError>;

    /// Stores `record` under `record.name` if no record has that name.
    /// Fails with [`CatalogError::AlreadyExists`] otherwise.
    fn insert(&self, record: &VolumeRecord) -> Result<Revision, CatalogError>;

    /// Replaces the record named `record.name` if its revision is still
    /// `expected`. Fails with [`CatalogError::NotFound`] if it is gone and
    /// with [`CatalogError::Conflict`] if it changed since it was read.
    fn update(&self, record: &VolumeRecord, expected: Revision) -> Result<Revision, CatalogError>;

    /// Removes the record named `name` if its revision is still `expected`;
    /// fails like [`Catalog::update`].
    fn delete(&self, name: &str, expected: Revision) -> Result<(), CatalogError>;
}
