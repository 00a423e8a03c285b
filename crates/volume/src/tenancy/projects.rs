//! Projects: create, list, show, delete, and their quotas (set online, and
//! checked by every operation that adds a volume, capacity or a snapshot).

use super::quota::{self, Growth, Usage};
use super::{entry_error, validate_entry_name, Principal};
use crate::service::{catalog_error, ProvisioningGuard};
use crate::{VolumeError, VolumeService};
use basalt_catalog::{
    CatalogError, Entries, NbdKeyRecord, ProjectRecord, Quotas, TokenRecord, Versioned,
    VolumeRecord,
};
use std::time::SystemTime;

/// A project as the control plane reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProjectInfo {
    pub name: String,
    pub created_at: String,
    pub description: Option<String>,
    pub quotas: Quotas,
    pub usage: Usage,
}

/// One change to a project's quotas: `Some(limit)` sets it, `None` lifts it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuotaChange {
    pub capacity_bytes: Option<Option<u64>>,
    pub volumes: Option<Option<u64>>,
    pub snapshots: Option<Option<u64>>,
}

impl QuotaChange {
    /// Applies the change to `quotas`.
    pub fn apply(&self, quotas: &mut Quotas) {
        for (change, quota) in [
            (self.capacity_bytes, &mut quotas.capacity_bytes),
            (self.volumes, &mut quotas.volumes),
            (self.snapshots, &mut quotas.snapshots),
        ] {
            if let Some(value) = change {
                *quota = value;
            }
        }
    }
}

pub(crate) fn project_missing(name: &str) -> VolumeError {
    VolumeError::EntryNotFound {
        kind: "project",
        name: name.to_string(),
    }
}

impl VolumeService {
    /// The cluster's provisioning lock when clustered (see
    /// [`crate::ClusterVolumes::lock_provisioning`]); nothing on one node,
    /// where the control lock already serialises.
    pub(crate) fn provisioning(&self) -> Result<Option<ProvisioningGuard>, VolumeError> {
        self.cluster
            .as_ref()
            .map(|c| c.lock_provisioning())
            .transpose()
    }

    /// Project `name`'s record, or [`VolumeError::EntryNotFound`].
    pub(crate) fn project_record(
        &self,
        name: &str,
    ) -> Result<Versioned<ProjectRecord>, VolumeError> {
        self.catalog
            .entry::<ProjectRecord>(name)
            .map_err(catalog_error)?
            .ok_or_else(|| project_missing(name))
    }

    /// Fails unless `project` exists and `growth` fits its quotas, given
    /// the volumes in `records`. Call under the control lock and
    /// [`VolumeService::provisioning`], with `records` read under them, and
    /// record the change before releasing them.
    pub(crate) fn check_quota(
        &self,
        project: Option<&str>,
        records: &[Versioned<VolumeRecord>],
        growth: Growth,
    ) -> Result<(), VolumeError> {
        let Some(project) = project else {
            return Ok(());
        };
        let quotas = self.project_record(project)?.record.quotas;
        quota::check(project, &quotas, &Usage::of(project, records), &growth)
    }

    fn project_info(
        &self,
        record: ProjectRecord,
        records: &[Versioned<VolumeRecord>],
    ) -> ProjectInfo {
        ProjectInfo {
            usage: Usage::of(&record.name, records),
            name: record.name,
            created_at: record.created_at,
            description: record.description,
            quotas: record.quotas,
        }
    }

    /// Creates project `name` (cluster admins only).
    pub fn create_project(
        &self,
        principal: &Principal,
        name: &str,
        description: Option<String>,
        quotas: Quotas,
    ) -> Result<ProjectInfo, VolumeError> {
        principal.require_cluster_admin("creating a project")?;
        validate_entry_name("project", name)?;
        let record = ProjectRecord {
            name: name.to_string(),
            created_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            description,
            quotas,
            unknown: Default::default(),
        };
        let _control = self.control.lock();
        self.catalog
            .insert_entry_record(&record)
            .map_err(|e| entry_error("project", e))?;
        tracing::info!(project = name, "project created");
        Ok(self.project_info(record, &[]))
    }

    /// The projects `principal` may see (all, or its own), by name.
    pub fn projects(&self, principal: &Principal) -> Result<Vec<ProjectInfo>, VolumeError> {
        let records = self.catalog.list().map_err(catalog_error)?;
        Ok(self
            .catalog
            .entries::<ProjectRecord>()
            .map_err(catalog_error)?
            .into_iter()
            .filter(|p| principal.may_see(Some(&p.record.name)))
            .map(|p| self.project_info(p.record, &records))
            .collect())
    }

    /// Project `name`, if `principal` may see it.
    pub fn project(&self, principal: &Principal, name: &str) -> Result<ProjectInfo, VolumeError> {
        if !principal.may_see(Some(name)) {
            return Err(project_missing(name));
        }
        let record = self.project_record(name)?.record;
        let records = self.catalog.list().map_err(catalog_error)?;
        Ok(self.project_info(record, &records))
    }

    /// Changes project `name`'s quotas (cluster admins only). Lowering a
    /// quota below what the project holds is allowed: it then only stops
    /// growth.
    pub fn set_quotas(
        &self,
        principal: &Principal,
        name: &str,
        change: &QuotaChange,
    ) -> Result<ProjectInfo, VolumeError> {
        principal.require_cluster_admin("changing a quota")?;
        let _control = self.control.lock();
        let current = self.project_record(name)?;
        let mut record = current.record.clone();
        change.apply(&mut record.quotas);
        if record != current.record {
            self.catalog
                .update_entry_record(&record, current.revision)
                .map_err(|e| entry_error("project", e))?;
            tracing::info!(project = name, quotas = ?record.quotas, "project quotas changed");
        }
        let records = self.catalog.list().map_err(catalog_error)?;
        Ok(self.project_info(record, &records))
    }

    /// Deletes project `name` with its tokens and NBD keys (cluster admins
    /// only); refused while it has volumes.
    pub fn delete_project(&self, principal: &Principal, name: &str) -> Result<(), VolumeError> {
        principal.require_cluster_admin("deleting a project")?;
        let _control = self.control.lock();
        // No create may pass its quota check against the project meanwhile.
        let _provisioning = self.provisioning()?;
        let current = self.project_record(name)?;
        let volumes: Vec<String> = self
            .catalog
            .list()
            .map_err(catalog_error)?
            .into_iter()
            .filter(|v| v.record.project.as_deref() == Some(name))
            .map(|v| v.record.name)
            .collect();
        if !volumes.is_empty() {
            return Err(VolumeError::ProjectNotEmpty {
                project: name.to_string(),
                volumes,
            });
        }
        // Credentials first: a project whose delete failed halfway keeps
        // no token or NBD key that could act in a project of the same
        // name created later.
        for token in self
            .catalog
            .entries::<TokenRecord>()
            .map_err(catalog_error)?
        {
            if token.record.project.as_deref() == Some(name) {
                match self
                    .catalog
                    .delete_entry_record::<TokenRecord>(&token.record.id, token.revision)
                {
                    Ok(()) | Err(CatalogError::NotFound(_)) => {}
                    Err(e) => return Err(catalog_error(e)),
                }
            }
        }
        for key in self
            .catalog
            .entries::<NbdKeyRecord>()
            .map_err(catalog_error)?
        {
            if key.record.project.as_deref() == Some(name) {
                match self
                    .catalog
                    .delete_entry_record::<NbdKeyRecord>(&key.record.identity, key.revision)
                {
                    Ok(()) | Err(CatalogError::NotFound(_)) => {}
                    Err(e) => return Err(catalog_error(e)),
                }
            }
        }
        self.catalog
            .delete_entry_record::<ProjectRecord>(name, current.revision)
            .map_err(|e| entry_error("project", e))?;
        tracing::info!(project = name, "project deleted");
        Ok(())
    }
}
