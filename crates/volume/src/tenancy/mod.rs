//! Tenancy: projects (tenants, with quotas), API tokens with roles, NBD TLS
//! keys, volume types (named policy bundles), and who may see and do what.
//!
//! Invariants:
//! - A volume belongs to at most one project, fixed when it is created
//!   (a clone belongs to its source's project).
//! - A project's quotas are checked and the new volume or snapshot recorded
//!   under one hold of the control lock and, in a cluster, of the cluster's
//!   provisioning lock: two creates, on one node or on two, cannot both pass
//!   the same remaining quota.
//! - A project token sees its project's volumes only; any other volume
//!   answers exactly like one that does not exist ([`VolumeError::NotFound`]),
//!   so the names of other projects' volumes do not leak.
//! - Token secrets are stored only as SHA-256 hashes and compared in
//!   constant time; a token is valid only while its record exists and has
//!   not expired.
//! - Every change to a project, token, type or setting is a put-if-absent or
//!   compare-and-swap on the catalog's revision, under the control lock.

mod nbd_keys;
mod principal;
mod projects;
mod quota;
mod tokens;
mod types;

pub use basalt_catalog::Quotas;
pub use nbd_keys::NbdKeyInfo;
pub use principal::Principal;
pub use projects::{ProjectInfo, QuotaChange};
pub use quota::{Growth, Usage};
pub use tokens::{constant_time_eq, NewToken, TokenInfo, TOKEN_PREFIX};
pub use types::{NewVolumeType, VolumeTypeInfo};

use crate::service::name_problem;
use crate::VolumeError;
use basalt_catalog::CatalogError;

/// Maps the catalog's outcomes on a policy entry of `kind` onto the
/// control plane's.
pub(crate) fn entry_error(kind: &'static str, e: CatalogError) -> VolumeError {
    match e {
        CatalogError::NotFound(name) => VolumeError::EntryNotFound { kind, name },
        CatalogError::AlreadyExists(name) => VolumeError::EntryExists { kind, name },
        other => VolumeError::Catalog(other),
    }
}

/// Checks the name of a project or volume type: the rules of volume names.
pub(crate) fn validate_entry_name(kind: &'static str, name: &str) -> Result<(), VolumeError> {
    match name_problem(name) {
        Some(reason) => Err(VolumeError::InvalidEntryName {
            kind,
            name: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

impl crate::VolumeService {
    /// Fails with [`VolumeError::NotFound`], exactly as for a missing
    /// volume, unless `principal` may see volume `name`.
    pub fn check_visible(&self, principal: &Principal, name: &str) -> Result<(), VolumeError> {
        if principal.is_cluster_admin() {
            return Ok(());
        }
        match self
            .catalog
            .get(name)
            .map_err(crate::service::catalog_error)?
        {
            Some(v) if principal.may_see(v.record.project.as_deref()) => Ok(()),
            _ => Err(VolumeError::NotFound(name.to_string())),
        }
    }
}
