//! Pre-shared keys for NBD over TLS: created for a project (or for the
//! whole cluster) and shown once as a `keys.psk` line (`IDENTITY:HEXKEY`,
//! what qemu's `tls-creds-psk` and libnbd's `tls-psk-file` read), listed
//! without the key, revoked, and looked up by the NBD frontend at every TLS
//! handshake.
//!
//! Who may manage them: a cluster admin any; a project admin its project's.
//! Unlike token secrets the key is stored as it is (TLS-PSK needs it).

use super::tokens::{hex, random_bytes};
use super::{entry_error, projects::project_missing, Principal};
use crate::service::catalog_error;
use crate::{VolumeError, VolumeService};
use basalt_catalog::{Entries, NbdKeyRecord};
use std::time::SystemTime;

/// Key length: 256 bits.
const KEY_BYTES: usize = 32;

/// An NBD key as listed: everything but the key.
#[derive(Clone, Debug, PartialEq)]
pub struct NbdKeyInfo {
    pub identity: String,
    pub project: Option<String>,
    pub created_at: String,
    pub description: Option<String>,
}

fn info(r: NbdKeyRecord) -> NbdKeyInfo {
    NbdKeyInfo {
        identity: r.identity,
        project: r.project,
        created_at: r.created_at,
        description: r.description,
    }
}

fn may_manage(principal: &Principal, project: Option<&str>) -> bool {
    match project {
        None => principal.is_cluster_admin(),
        Some(p) => principal.administers(p),
    }
}

/// Decodes lowercase or uppercase hex; `None` if it is not hex.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

impl VolumeService {
    /// Creates a key opening `project`'s volumes (`None`: every volume,
    /// cluster admins only); returns it listed and its `keys.psk` line,
    /// shown this once.
    pub fn create_nbd_key(
        &self,
        principal: &Principal,
        project: Option<&str>,
        description: Option<String>,
    ) -> Result<(NbdKeyInfo, String), VolumeError> {
        if !may_manage(principal, project) {
            return Err(match project {
                Some(p) if !principal.may_see(Some(p)) => project_missing(p),
                Some(p) => VolumeError::Forbidden(format!(
                    "creating NBD keys of project {p:?} needs its admin role"
                )),
                None => VolumeError::Forbidden(
                    "a cluster-wide NBD key needs a cluster-admin token".into(),
                ),
            });
        }
        let identity = format!(
            "{}.{}",
            project.unwrap_or("cluster"),
            hex(&random_bytes::<4>())
        );
        let key = hex(&random_bytes::<KEY_BYTES>());
        let record = NbdKeyRecord {
            identity: identity.clone(),
            project: project.map(str::to_string),
            key_hex: key.clone(),
            created_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            description,
            unknown: Default::default(),
        };
        let _control = self.control.lock();
        if let Some(p) = project {
            self.project_record(p)?;
        }
        self.catalog
            .insert_entry_record(&record)
            .map_err(|e| entry_error("NBD key", e))?;
        tracing::info!(identity = %identity, project, "NBD TLS key created");
        Ok((info(record), format!("{identity}:{key}")))
    }

    /// The NBD keys `principal` may manage.
    pub fn nbd_keys(&self, principal: &Principal) -> Result<Vec<NbdKeyInfo>, VolumeError> {
        if let Some(own) = principal.project() {
            if !principal.administers(own) {
                return Err(VolumeError::Forbidden(
                    "listing NBD keys needs an admin token".into(),
                ));
            }
        }
        Ok(self
            .catalog
            .entries::<NbdKeyRecord>()
            .map_err(catalog_error)?
            .into_iter()
            .map(|k| k.record)
            .filter(|k| may_manage(principal, k.project.as_deref()))
            .map(info)
            .collect())
    }

    /// Revokes NBD key `identity`: no new TLS session with it (open
    /// connections stay until they end or `volume disconnect`).
    pub fn revoke_nbd_key(&self, principal: &Principal, identity: &str) -> Result<(), VolumeError> {
        let _control = self.control.lock();
        let current = self
            .catalog
            .entry::<NbdKeyRecord>(identity)
            .map_err(catalog_error)?
            .filter(|k| may_manage(principal, k.record.project.as_deref()))
            .ok_or_else(|| VolumeError::EntryNotFound {
                kind: "NBD key",
                name: identity.to_string(),
            })?;
        self.catalog
            .delete_entry_record::<NbdKeyRecord>(identity, current.revision)
            .map_err(|e| entry_error("NBD key", e))?;
        tracing::info!(identity, "NBD TLS key revoked");
        Ok(())
    }

    /// The key of `identity` and the project it opens (`None`: every
    /// volume), for the NBD frontend's TLS handshake. `None` for an unknown
    /// identity or an unreadable record (logged).
    pub fn nbd_key(&self, identity: &str) -> Option<(Vec<u8>, Option<String>)> {
        let record = match self.catalog.entry::<NbdKeyRecord>(identity) {
            Ok(found) => found?.record,
            Err(e) => {
                tracing::error!(identity, error = %e, "cannot read an NBD key");
                return None;
            }
        };
        let key = unhex(&record.key_hex)?;
        Some((key, record.project))
    }
}

#[cfg(test)]
mod tests {
    use super::unhex;

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        assert_eq!(unhex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(unhex("ABcd"), Some(vec![0xab, 0xcd]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("é1"), None);
    }
}
