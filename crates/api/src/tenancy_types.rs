//! The JSON bodies of the tenancy endpoints: projects and their quotas,
//! tokens, volume types. Wire-format rules as in `types.rs`.

use crate::types::Size;
use basalt_volume::tenancy::{NbdKeyInfo, ProjectInfo, QuotaChange, TokenInfo, VolumeTypeInfo};
use basalt_volume::Role;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// Quotas as the API shows them: absent is unlimited.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaValues {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<u64>,
}

/// A project, as returned by the project endpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Project {
    pub name: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Limits (absent: unlimited).
    pub quotas: QuotaValues,
    /// What the project holds now.
    pub usage: QuotaValues,
}

impl From<ProjectInfo> for Project {
    fn from(p: ProjectInfo) -> Self {
        Project {
            name: p.name,
            created_at: p.created_at,
            description: p.description,
            quotas: QuotaValues {
                capacity_bytes: p.quotas.capacity_bytes,
                volumes: p.quotas.volumes,
                snapshots: p.quotas.snapshots,
            },
            usage: QuotaValues {
                capacity_bytes: Some(p.usage.capacity_bytes),
                volumes: Some(p.usage.volumes),
                snapshots: Some(p.usage.snapshots),
            },
        }
    }
}

/// `GET /api/v1/projects`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProjectList {
    pub projects: Vec<Project>,
}

/// `POST /api/v1/projects`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateProject {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Initial quotas (absent: unlimited).
    #[serde(default)]
    pub quotas: QuotaSet,
}

/// `PUT /api/v1/projects/{name}/quotas`: each quota given is set (a number,
/// or for capacity a size string like `"1T"`), `null` lifts it, absent
/// leaves it unchanged.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaSet {
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub capacity_bytes: Option<Option<Size>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub volumes: Option<Option<u64>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub snapshots: Option<Option<u64>>,
}

/// A field that is present (`Some`), possibly `null` (`Some(None)`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

impl From<&QuotaSet> for QuotaChange {
    fn from(q: &QuotaSet) -> Self {
        QuotaChange {
            capacity_bytes: q.capacity_bytes.map(|c| c.map(|s| s.0)),
            volumes: q.volumes,
            snapshots: q.snapshots,
        }
    }
}

/// A token as listed (never its secret).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Token {
    pub id: String,
    /// Absent: cluster-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub role: Role,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default)]
    pub expired: bool,
}

impl From<TokenInfo> for Token {
    fn from(t: TokenInfo) -> Self {
        Token {
            id: t.id,
            project: t.project,
            role: t.role,
            created_at: t.created_at,
            expires_at: t.expires_at,
            description: t.description,
            expired: t.expired,
        }
    }
}

/// `GET /api/v1/tokens`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenList {
    pub tokens: Vec<Token>,
}

/// `POST /api/v1/tokens`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// Absent: a cluster-wide token (admin role, cluster admins only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub role: Role,
    /// Lifetime such as `"30d"` or `"12h"` (absent: until revoked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// The answer to `POST /api/v1/tokens`: the only time `token` is shown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CreatedToken {
    pub token: String,
    #[serde(flatten)]
    pub info: Token,
}

/// A volume type, as returned by the volume type endpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeType {
    pub name: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Absent: the cluster's default replica count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// Cinder QoS key → value (absent: unlimited).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub qos: BTreeMap<String, u64>,
    /// Projects that may use it (absent: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<String>,
    /// Its volumes are encrypted at rest.
    #[serde(default)]
    pub encrypted: bool,
    /// The codec its volumes are kept compressed with (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    #[serde(default)]
    pub is_default: bool,
}

impl From<VolumeTypeInfo> for VolumeType {
    fn from(t: VolumeTypeInfo) -> Self {
        VolumeType {
            name: t.name,
            created_at: t.created_at,
            description: t.description,
            replicas: t.replicas,
            qos: t.qos.0,
            projects: t.projects,
            encrypted: t.encrypted,
            compression: t.compression,
            is_default: t.is_default,
        }
    }
}

/// `GET /api/v1/types`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeTypeList {
    pub types: Vec<VolumeType>,
}

/// `POST /api/v1/types`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeType {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub qos: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<String>,
    /// Its volumes are encrypted at rest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
    /// Its volumes' cold data is kept compressed: `lz4`, `zstd`,
    /// `zstd:LEVEL` (1-19) or `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// Also make it the default type.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
}

/// `PUT /api/v1/default-type`: the type volumes get when a create names
/// none (`null`: no default).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetDefaultType {
    pub name: Option<String>,
}

/// `POST /api/v1/volumes/{name}/retype`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retype {
    #[serde(rename = "type")]
    pub volume_type: String,
}

/// An NBD TLS key as listed (never the key).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NbdKey {
    /// The PSK identity (the user name in a `keys.psk` line).
    pub identity: String,
    /// The project whose volumes it opens (absent: every volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl From<NbdKeyInfo> for NbdKey {
    fn from(k: NbdKeyInfo) -> Self {
        NbdKey {
            identity: k.identity,
            project: k.project,
            created_at: k.created_at,
            description: k.description,
        }
    }
}

/// `GET /api/v1/nbd-keys`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NbdKeyList {
    pub keys: Vec<NbdKey>,
}

/// `POST /api/v1/nbd-keys`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateNbdKey {
    /// Absent: a key opening every volume (cluster admins only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// The answer to `POST /api/v1/nbd-keys`: the only time the key is shown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CreatedNbdKey {
    /// `IDENTITY:HEXKEY`, a line for a `keys.psk` file.
    pub psk_line: String,
    #[serde(flatten)]
    pub info: NbdKey,
}
