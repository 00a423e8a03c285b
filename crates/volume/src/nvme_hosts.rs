//! NVMe/TCP host attachments of a volume: which host NQNs may connect to
//! its subsystem, and the DH-HMAC-CHAP secrets a host must prove in-band
//! (generated here, returned once, kept in the volume's catalog record).
//!
//! Invariants: a detached host loses its secrets with its attachment;
//! re-attaching with secrets replaces them (the old ones stop working at
//! the host's next connect); attaching without secrets keeps existing ones
//! (attach is idempotent).

use crate::service::validate_host_nqn;
use crate::{VolumeError, VolumeInfo, VolumeService};
use basalt_catalog::{NvmeHostKeys, VolumeRecord};
use basalt_nvme_wire::auth::{hash_id, DhchapSecret};
use rand::RngCore;

/// A fresh 256-bit secret, transformed with HMAC-SHA-256 over the NQN it
/// is used with (so it is worthless for any other NQN).
fn fresh_secret() -> String {
    let mut key = vec![0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut key);
    DhchapSecret {
        transform: hash_id::SHA256,
        key,
    }
    .encode()
}

impl VolumeService {
    /// Lets host `nqn` access `name` over NVMe/TCP (idempotent).
    pub fn attach_host(&self, name: &str, nqn: &str) -> Result<VolumeInfo, VolumeError> {
        validate_host_nqn(nqn)?;
        self.update_hosts(name, |record| {
            if !record.nvme_hosts.iter().any(|h| h == nqn) {
                record.nvme_hosts.push(nqn.to_string());
            }
        })
    }

    /// [`VolumeService::attach_host`] with fresh DH-HMAC-CHAP secrets (the
    /// host's, and the controller's for bidirectional authentication):
    /// from now on the host must authenticate on every queue. Returns the
    /// secrets, shown this once.
    pub fn attach_host_dhchap(
        &self,
        name: &str,
        nqn: &str,
    ) -> Result<(VolumeInfo, NvmeHostKeys), VolumeError> {
        validate_host_nqn(nqn)?;
        let keys = NvmeHostKeys {
            host_secret: fresh_secret(),
            controller_secret: Some(fresh_secret()),
            unknown: Default::default(),
        };
        let info = self.update_hosts(name, |record| {
            if !record.nvme_hosts.iter().any(|h| h == nqn) {
                record.nvme_hosts.push(nqn.to_string());
            }
            record.nvme_host_keys.insert(nqn.to_string(), keys.clone());
        })?;
        Ok((info, keys))
    }

    /// Revokes host `nqn`'s access to `name`, and its secrets (idempotent).
    /// Connected hosts keep their controller until they disconnect.
    pub fn detach_host(&self, name: &str, nqn: &str) -> Result<VolumeInfo, VolumeError> {
        self.update_hosts(name, |record| {
            record.nvme_hosts.retain(|h| h != nqn);
            record.nvme_host_keys.remove(nqn);
        })
    }

    /// The DH-HMAC-CHAP secrets host `nqn` must prove on volume `name`'s
    /// subsystem; `None` when it has none (or the volume is unknown).
    pub fn nvme_host_keys(&self, name: &str, nqn: &str) -> Option<NvmeHostKeys> {
        match self.catalog.get(name) {
            Ok(found) => found?.record.nvme_host_keys.get(nqn).cloned(),
            Err(e) => {
                tracing::error!(volume = name, error = %e, "cannot read a volume's NVMe host secrets");
                None
            }
        }
    }

    fn update_hosts(
        &self,
        name: &str,
        change: impl FnOnce(&mut VolumeRecord),
    ) -> Result<VolumeInfo, VolumeError> {
        self.edit_record(name, change, |record| {
            let with_secrets: Vec<&String> = record.nvme_host_keys.keys().collect();
            tracing::info!(volume = name, hosts = ?record.nvme_hosts, dhchap = ?with_secrets, "NVMe hosts changed");
        })
    }
}
