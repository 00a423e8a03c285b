//! Policy entries kept in the catalog beside the volumes: projects (tenants,
//! with quotas), API tokens (stored hashed), NBD TLS keys (pre-shared, so
//! stored as they are), volume types (named policy bundles) and
//! cluster-wide settings; and [`Entries`], which reads and
//! writes them as typed records with the catalog's revisions.
//!
//! The compatibility rules of `record.rs` apply to every entry: fields added
//! later carry `#[serde(default)]`, unknown fields are kept in `unknown` and
//! written back, nothing is renamed or re-typed.
//!
//! Invariant: an entry is stored under its own name ([`PolicyEntry::name`]);
//! one whose stored name differs from its key is reported corrupt.

use crate::{Catalog, CatalogError, Collection, Revision, Versioned};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The setting naming the volume type used when a create names none.
pub const DEFAULT_VOLUME_TYPE: &str = "default-volume-type";

/// A typed record of one policy collection.
pub trait PolicyEntry: Serialize + DeserializeOwned {
    /// Where records of this type are stored.
    const COLLECTION: Collection;
    /// The record's key in its collection.
    fn name(&self) -> &str;
}

/// Typed access to the policy entries of any [`Catalog`].
pub trait Entries {
    /// The record named `name`, or `None`.
    fn entry<T: PolicyEntry>(&self, name: &str) -> Result<Option<Versioned<T>>, CatalogError>;
    /// Every record of `T`'s collection, ordered by name.
    fn entries<T: PolicyEntry>(&self) -> Result<Vec<Versioned<T>>, CatalogError>;
    /// Stores `record` if its collection has no entry by its name.
    fn insert_entry_record<T: PolicyEntry>(&self, record: &T) -> Result<Revision, CatalogError>;
    /// Replaces `record`'s entry if its revision is still `expected`.
    fn update_entry_record<T: PolicyEntry>(
        &self,
        record: &T,
        expected: Revision,
    ) -> Result<Revision, CatalogError>;
    /// Removes `T`'s entry `name` if its revision is still `expected`.
    fn delete_entry_record<T: PolicyEntry>(
        &self,
        name: &str,
        expected: Revision,
    ) -> Result<(), CatalogError>;
}

fn to_json<T: PolicyEntry>(record: &T) -> String {
    // Strings, numbers, maps and JSON values always serialise.
    serde_json::to_string(record).expect("policy entries serialise to JSON")
}

fn decode<T: PolicyEntry>(
    name: &str,
    stored: Versioned<String>,
) -> Result<Versioned<T>, CatalogError> {
    let key = format!("{}/{name}", T::COLLECTION.dir());
    let record: T = serde_json::from_str(&stored.record).map_err(|e| CatalogError::Corrupt {
        key: key.clone(),
        reason: e.to_string(),
    })?;
    if record.name() != name {
        return Err(CatalogError::Corrupt {
            key,
            reason: format!("the entry is named {:?}", record.name()),
        });
    }
    Ok(Versioned {
        revision: stored.revision,
        record,
    })
}

impl<C: Catalog + ?Sized> Entries for C {
    fn entry<T: PolicyEntry>(&self, name: &str) -> Result<Option<Versioned<T>>, CatalogError> {
        self.get_entry(T::COLLECTION, name)?
            .map(|stored| decode(name, stored))
            .transpose()
    }

    fn entries<T: PolicyEntry>(&self) -> Result<Vec<Versioned<T>>, CatalogError> {
        self.list_entries(T::COLLECTION)?
            .into_iter()
            .map(|(name, stored)| decode(&name, stored))
            .collect()
    }

    fn insert_entry_record<T: PolicyEntry>(&self, record: &T) -> Result<Revision, CatalogError> {
        self.insert_entry(T::COLLECTION, record.name(), &to_json(record))
    }

    fn update_entry_record<T: PolicyEntry>(
        &self,
        record: &T,
        expected: Revision,
    ) -> Result<Revision, CatalogError> {
        self.update_entry(T::COLLECTION, record.name(), &to_json(record), expected)
    }

    fn delete_entry_record<T: PolicyEntry>(
        &self,
        name: &str,
        expected: Revision,
    ) -> Result<(), CatalogError> {
        self.delete_entry(T::COLLECTION, name, expected)
    }
}

/// Limits on what one project may hold; `None` is unlimited.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Quotas {
    /// Sum of the provisioned sizes of the project's volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Number of volumes (clones included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<u64>,
    /// Number of snapshots of the project's volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<u64>,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

/// A tenant: volumes belong to at most one project, and a project's tokens
/// see only its volumes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProjectRecord {
    /// Unique; the same rules as volume names.
    pub name: String,
    /// RFC 3339 in UTC with second precision.
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default)]
    pub quotas: Quotas,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl PolicyEntry for ProjectRecord {
    const COLLECTION: Collection = Collection::Projects;
    fn name(&self) -> &str {
        &self.name
    }
}

/// What a token may do within its scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Within a project: its volumes, its tokens and its quota's use.
    /// Without a project: the whole cluster (the cluster-admin role).
    Admin,
    /// Within a project: its volumes, snapshots and clones.
    Member,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }
}

/// An API token. Only a hash of its secret is stored: the secret is shown
/// once, when the token is created.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Public identifier, the entry's key; part of the presented token so
    /// the record is found without scanning.
    pub id: String,
    /// The project the token acts in; `None` for a cluster-wide token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub role: Role,
    /// SHA-256 of the secret part, lowercase hex.
    pub secret_sha256: String,
    /// RFC 3339 in UTC with second precision.
    pub created_at: String,
    /// After this instant (RFC 3339) the token is refused; `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl PolicyEntry for TokenRecord {
    const COLLECTION: Collection = Collection::Tokens;
    fn name(&self) -> &str {
        &self.id
    }
}

/// A pre-shared key for NBD over TLS. Unlike a token's secret it is stored
/// as it is: TLS-PSK needs the key itself on the server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NbdKeyRecord {
    /// The PSK identity clients present (the user name of a `keys.psk`
    /// line); the entry's key.
    pub identity: String,
    /// The project whose volumes it opens; `None`: every volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// The key, lowercase hex.
    pub key_hex: String,
    /// RFC 3339 in UTC with second precision.
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl PolicyEntry for NbdKeyRecord {
    const COLLECTION: Collection = Collection::NbdKeys;
    fn name(&self) -> &str {
        &self.identity
    }
}

/// A named bundle of policies a volume is created with (Cinder's volume
/// type): replica count and QoS limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeTypeRecord {
    /// Unique; the same rules as volume names.
    pub name: String,
    /// RFC 3339 in UTC with second precision.
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Replica count of its volumes (`None`: the cluster's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// QoS limits, Cinder QoS key → value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub qos: BTreeMap<String, u64>,
    /// Projects that may use it; empty: every project (public).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<String>,
    /// Its volumes are encrypted at rest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
    /// The codec its volumes' cold data is kept compressed with (`lz4`,
    /// `zstd`, `zstd:LEVEL`; checked by the volume service when the type
    /// is created); absent: not compressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl PolicyEntry for VolumeTypeRecord {
    const COLLECTION: Collection = Collection::VolumeTypes;
    fn name(&self) -> &str {
        &self.name
    }
}

/// One cluster-wide setting (e.g. [`DEFAULT_VOLUME_TYPE`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SettingRecord {
    pub name: String,
    pub value: String,
    /// Fields written by a newer basalt that this version does not know.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl PolicyEntry for SettingRecord {
    const COLLECTION: Collection = Collection::Settings;
    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RedbCatalog;

    fn project(name: &str) -> ProjectRecord {
        ProjectRecord {
            name: name.into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            description: None,
            quotas: Quotas {
                volumes: Some(3),
                ..Quotas::default()
            },
            unknown: Default::default(),
        }
    }

    #[test]
    fn entries_have_the_catalog_semantics_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.redb");
        let cat = RedbCatalog::open(&path).unwrap();
        let rev = cat.insert_entry_record(&project("p1")).unwrap();
        assert!(matches!(
            cat.insert_entry_record(&project("p1")),
            Err(CatalogError::AlreadyExists(_))
        ));
        let mut changed = project("p1");
        changed.quotas.snapshots = Some(9);
        let rev2 = cat.update_entry_record(&changed, rev).unwrap();
        assert!(rev2 > rev);
        assert!(matches!(
            cat.update_entry_record(&changed, rev),
            Err(CatalogError::Conflict { .. })
        ));
        // Collections are separate from each other and from volumes.
        assert!(cat.entry::<VolumeTypeRecord>("p1").unwrap().is_none());
        assert!(cat.get("p1").unwrap().is_none());
        drop(cat);
        let cat = RedbCatalog::open(&path).unwrap();
        let all = cat.entries::<ProjectRecord>().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].record, changed);
        cat.delete_entry_record::<ProjectRecord>("p1", rev2)
            .unwrap();
        assert!(cat.entry::<ProjectRecord>("p1").unwrap().is_none());
    }

    #[test]
    fn misnamed_and_unreadable_entries_are_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let cat = RedbCatalog::open(dir.path().join("c.redb")).unwrap();
        let json = serde_json::to_string(&project("other")).unwrap();
        cat.insert_entry(Collection::Projects, "p", &json).unwrap();
        cat.insert_entry(Collection::Projects, "q", "{").unwrap();
        for name in ["p", "q"] {
            match cat.entry::<ProjectRecord>(name) {
                Err(CatalogError::Corrupt { key, .. }) => {
                    assert_eq!(key, format!("projects/{name}"))
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_fields_survive_a_rewrite() {
        let json = r#"{"id":"t1","role":"member","secret_sha256":"ab","created_at":"x","scopes":["read"]}"#;
        let token: TokenRecord = serde_json::from_str(json).unwrap();
        assert_eq!(token.role, Role::Member);
        let back: serde_json::Value = serde_json::from_str(&to_json(&token)).unwrap();
        assert_eq!(back["scopes"][0], "read");
    }
}
