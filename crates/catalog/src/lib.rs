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
//! - Beside the volumes, the catalog keeps policy entries (projects, API
//!   tokens, volume types, settings; [`policy`]) in one [`Collection`] each,
//!   keyed by name, with the same revisions, put-if-absent and
//!   compare-and-swap. Entries are JSON text at this level; [`Entries`]
//!   reads and writes them as typed records.
//! - Every successful call is durable when it returns. A mutation that fails
//!   with [`CatalogError::Timeout`] or [`CatalogError::Request`] (remote
//!   backends) may or may not have been applied; re-read to find out.

mod error;
mod etcd_catalog;
pub mod policy;
mod record;
mod redb_catalog;

pub use error::CatalogError;
pub use etcd_catalog::{
    describe_request_failure, etcd_failure, prefix_end, EtcdCatalog, EtcdConfig,
    DEFAULT_ETCD_PREFIX,
};
pub use policy::{
    Entries, NbdKeyRecord, PolicyEntry, ProjectRecord, Quotas, Role, SettingRecord, TokenRecord,
    VolumeTypeRecord,
};
pub use record::{
    CloneSource, IscsiChapRecord, NvmeHostKeys, Reencryption, SnapshotRecord, VolumeRecord,
    WrappedKeyRecord, MAX_VOLUME_NAME_LEN,
};
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

/// A collection of policy entries in the catalog (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collection {
    Projects,
    Tokens,
    VolumeTypes,
    Settings,
    NbdKeys,
}

impl Collection {
    /// The collection's name in storage: its redb table and etcd key
    /// directory. Never changes.
    pub fn dir(self) -> &'static str {
        match self {
            Collection::Projects => "projects",
            Collection::Tokens => "tokens",
            Collection::VolumeTypes => "volume-types",
            Collection::Settings => "settings",
            Collection::NbdKeys => "nbd-keys",
        }
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

    /// The entry `name` of `collection` (its JSON), or `None`.
    fn get_entry(
        &self,
        collection: Collection,
        name: &str,
    ) -> Result<Option<Versioned<String>>, CatalogError>;

    /// Every entry of `collection` with its name, ordered by name.
    fn list_entries(
        &self,
        collection: Collection,
    ) -> Result<Vec<(String, Versioned<String>)>, CatalogError>;

    /// Stores `json` as entry `name` of `collection` if there is none by
    /// that name; like [`Catalog::insert`].
    fn insert_entry(
        &self,
        collection: Collection,
        name: &str,
        json: &str,
    ) -> Result<Revision, CatalogError>;

    /// Replaces entry `name` if its revision is still `expected`; like
    /// [`Catalog::update`].
    fn update_entry(
        &self,
        collection: Collection,
        name: &str,
        json: &str,
        expected: Revision,
    ) -> Result<Revision, CatalogError>;

    /// Removes entry `name` if its revision is still `expected`; like
    /// [`Catalog::delete`].
    fn delete_entry(
        &self,
        collection: Collection,
        name: &str,
        expected: Revision,
    ) -> Result<(), CatalogError>;
}
