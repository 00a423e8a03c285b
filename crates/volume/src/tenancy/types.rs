//! Volume types: named policy bundles (replica count, QoS limits,
//! encryption at rest, compression) that
//! volumes are created with (`--type`, else the default type) and can be
//! moved between online (`retype`). A type may be limited to some projects.
//!
//! Invariants: a type in use by a volume is not deleted; deleting the
//! default type clears the default; a volume's QoS and replica count are the
//! type's as of its create or last retype (a later `set-qos` overrides the
//! QoS, as Cinder's per-volume QoS does).

use super::{entry_error, validate_entry_name, Principal};
use crate::qos::QosSpec;
use crate::service::catalog_error;
use crate::{VolumeError, VolumeInfo, VolumeService};
use basalt_catalog::policy::DEFAULT_VOLUME_TYPE;
use basalt_catalog::{Entries, SettingRecord, VolumeTypeRecord};
use std::time::SystemTime;

/// What to create a volume type with.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NewVolumeType {
    pub name: String,
    pub description: Option<String>,
    /// `None`: the cluster's default replica count.
    pub replicas: Option<u32>,
    pub qos: QosSpec,
    /// Projects that may use it; empty: all.
    pub projects: Vec<String>,
    /// Its volumes are encrypted at rest.
    pub encrypted: bool,
    /// Its volumes' cold data is kept compressed: `lz4`, `zstd`,
    /// `zstd:LEVEL` or `off` (`None`: off).
    pub compression: Option<String>,
}

/// A volume type as the control plane reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeTypeInfo {
    pub name: String,
    pub created_at: String,
    pub description: Option<String>,
    pub replicas: Option<u32>,
    pub qos: QosSpec,
    pub projects: Vec<String>,
    pub encrypted: bool,
    /// The codec its volumes are kept compressed with (`None`: none).
    pub compression: Option<String>,
    /// Volumes created without a type get this one.
    pub is_default: bool,
}

fn type_missing(name: &str) -> VolumeError {
    VolumeError::EntryNotFound {
        kind: "volume type",
        name: name.to_string(),
    }
}

/// Whether a volume of `project` may use `t` (cluster-wide volumes: any).
fn usable_by(t: &VolumeTypeRecord, project: Option<&str>) -> bool {
    match project {
        None => true,
        Some(p) => t.projects.is_empty() || t.projects.iter().any(|q| q == p),
    }
}

fn info(t: VolumeTypeRecord, default: Option<&str>) -> VolumeTypeInfo {
    VolumeTypeInfo {
        is_default: default == Some(t.name.as_str()),
        name: t.name,
        created_at: t.created_at,
        description: t.description,
        replicas: t.replicas,
        qos: QosSpec(t.qos),
        projects: t.projects,
        encrypted: t.encrypted,
        compression: t.compression,
    }
}

impl VolumeService {
    /// The default volume type's name, if one is set.
    pub fn default_volume_type(&self) -> Result<Option<String>, VolumeError> {
        Ok(self
            .catalog
            .entry::<SettingRecord>(DEFAULT_VOLUME_TYPE)
            .map_err(catalog_error)?
            .map(|s| s.record.value))
    }

    /// Creates a volume type (cluster admins only); `make_default` also
    /// makes it the default.
    pub fn create_volume_type(
        &self,
        principal: &Principal,
        request: &NewVolumeType,
        make_default: bool,
    ) -> Result<VolumeTypeInfo, VolumeError> {
        principal.require_cluster_admin("creating a volume type")?;
        validate_entry_name("volume type", &request.name)?;
        if let Some(n) = request.replicas {
            if !(1..=5).contains(&n) {
                return Err(VolumeError::InvalidReplicas(n));
            }
            if n != 1 && self.cluster.is_none() {
                return Err(VolumeError::NotSupported(
                    "more than one replica needs a cluster (basalt server --etcd ...)".into(),
                ));
            }
        }
        request
            .qos
            .validate()
            .map_err(|e| VolumeError::InvalidQos(e.to_string()))?;
        // "off" is kept as no compression.
        let compression = request
            .compression
            .as_deref()
            .map(crate::compression::record_compression)
            .transpose()?
            .flatten();
        let record = VolumeTypeRecord {
            name: request.name.clone(),
            created_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            description: request.description.clone(),
            replicas: request.replicas,
            qos: request.qos.0.clone(),
            projects: request.projects.clone(),
            encrypted: request.encrypted,
            compression,
            unknown: Default::default(),
        };
        let control = self.control.lock();
        for project in &request.projects {
            self.project_record(project)?;
        }
        self.catalog
            .insert_entry_record(&record)
            .map_err(|e| entry_error("volume type", e))?;
        tracing::info!(volume_type = %record.name, replicas = ?record.replicas, qos = %request.qos.to_text(), encrypted = record.encrypted, compression = ?record.compression, "volume type created");
        drop(control);
        if make_default {
            self.set_default_volume_type(principal, Some(&record.name))?;
        }
        self.volume_type(principal, &record.name)
    }

    /// The volume types `principal` may use, by name.
    pub fn volume_types(&self, principal: &Principal) -> Result<Vec<VolumeTypeInfo>, VolumeError> {
        let default = self.default_volume_type()?;
        Ok(self
            .catalog
            .entries::<VolumeTypeRecord>()
            .map_err(catalog_error)?
            .into_iter()
            .filter(|t| principal.is_cluster_admin() || usable_by(&t.record, principal.project()))
            .map(|t| info(t.record, default.as_deref()))
            .collect())
    }

    /// Volume type `name`, if `principal` may use it.
    pub fn volume_type(
        &self,
        principal: &Principal,
        name: &str,
    ) -> Result<VolumeTypeInfo, VolumeError> {
        let record = self
            .catalog
            .entry::<VolumeTypeRecord>(name)
            .map_err(catalog_error)?
            .map(|t| t.record)
            .filter(|t| principal.is_cluster_admin() || usable_by(t, principal.project()))
            .ok_or_else(|| type_missing(name))?;
        Ok(info(record, self.default_volume_type()?.as_deref()))
    }

    /// Deletes volume type `name` (cluster admins only); refused while a
    /// volume has it.
    pub fn delete_volume_type(&self, principal: &Principal, name: &str) -> Result<(), VolumeError> {
        principal.require_cluster_admin("deleting a volume type")?;
        let _control = self.control.lock();
        let current = self
            .catalog
            .entry::<VolumeTypeRecord>(name)
            .map_err(catalog_error)?
            .ok_or_else(|| type_missing(name))?;
        let volumes: Vec<String> = self
            .catalog
            .list()
            .map_err(catalog_error)?
            .into_iter()
            .filter(|v| v.record.volume_type.as_deref() == Some(name))
            .map(|v| v.record.name)
            .collect();
        if !volumes.is_empty() {
            return Err(VolumeError::TypeInUse {
                name: name.to_string(),
                volumes,
            });
        }
        if let Some(default) = self
            .catalog
            .entry::<SettingRecord>(DEFAULT_VOLUME_TYPE)
            .map_err(catalog_error)?
            .filter(|s| s.record.value == name)
        {
            self.catalog
                .delete_entry_record::<SettingRecord>(DEFAULT_VOLUME_TYPE, default.revision)
                .map_err(catalog_error)?;
        }
        self.catalog
            .delete_entry_record::<VolumeTypeRecord>(name, current.revision)
            .map_err(|e| entry_error("volume type", e))?;
        tracing::info!(volume_type = name, "volume type deleted");
        Ok(())
    }

    /// Makes `name` the default volume type (`None`: no default).
    pub fn set_default_volume_type(
        &self,
        principal: &Principal,
        name: Option<&str>,
    ) -> Result<(), VolumeError> {
        principal.require_cluster_admin("setting the default volume type")?;
        let _control = self.control.lock();
        if let Some(name) = name {
            if self
                .catalog
                .entry::<VolumeTypeRecord>(name)
                .map_err(catalog_error)?
                .is_none()
            {
                return Err(type_missing(name));
            }
        }
        let current = self
            .catalog
            .entry::<SettingRecord>(DEFAULT_VOLUME_TYPE)
            .map_err(catalog_error)?;
        let setting = |value: &str| SettingRecord {
            name: DEFAULT_VOLUME_TYPE.to_string(),
            value: value.to_string(),
            unknown: Default::default(),
        };
        match (name, current) {
            (None, None) => {}
            (None, Some(c)) => self
                .catalog
                .delete_entry_record::<SettingRecord>(DEFAULT_VOLUME_TYPE, c.revision)
                .map_err(catalog_error)?,
            (Some(name), None) => {
                self.catalog
                    .insert_entry_record(&setting(name))
                    .map_err(catalog_error)?;
            }
            (Some(name), Some(c)) => {
                self.catalog
                    .update_entry_record(&setting(name), c.revision)
                    .map_err(catalog_error)?;
            }
        }
        tracing::info!(default = ?name, "default volume type set");
        Ok(())
    }

    /// The type a new volume of `project` gets: `requested` (which must
    /// exist and be usable by the project), else the default type when it
    /// is usable by the project, else none.
    pub(crate) fn resolve_volume_type(
        &self,
        project: Option<&str>,
        requested: Option<&str>,
    ) -> Result<Option<VolumeTypeRecord>, VolumeError> {
        let (name, explicit) = match requested {
            Some(name) => (name.to_string(), true),
            None => match self.default_volume_type()? {
                Some(name) => (name, false),
                None => return Ok(None),
            },
        };
        let found = self
            .catalog
            .entry::<VolumeTypeRecord>(&name)
            .map_err(catalog_error)?
            .map(|t| t.record)
            .filter(|t| usable_by(t, project));
        match found {
            None if explicit => Err(type_missing(&name)),
            found => Ok(found),
        }
    }

    /// Gives volume `name` the policies of type `type_name`, online: its QoS
    /// at once on every node that serves it, its compression (the type's,
    /// or none: data packed with another codec stays readable as it is,
    /// and is repacked only when rewritten) to every store holding a copy,
    /// its replica count through the cluster's placement (replicas are
    /// added or removed by the coordinator like after a node loss). Between
    /// an encrypted and a plain type (single node), it starts the volume's
    /// re-encryption (`reencryption.rs`): new writes are under the new key
    /// at once, and `basalt volume flatten` reseals the rest.
    pub fn retype(&self, name: &str, type_name: &str) -> Result<VolumeInfo, VolumeError> {
        let control = self.control.lock();
        let mut current = self.record(name)?;
        let t = self
            .resolve_volume_type(current.record.project.as_deref(), Some(type_name))?
            .ok_or_else(|| type_missing(type_name))?;
        let reencrypt = t.encrypted != current.record.encrypted;
        if reencrypt && self.cluster.is_some() {
            return Err(VolumeError::NotSupported(format!(
                "type {type_name} {} encrypted and volume {name} {}: re-encrypting a replicated volume is not built yet; copy it into a new volume of that type instead",
                if t.encrypted { "is" } else { "is not" },
                if current.record.encrypted { "is" } else { "is not" },
            )));
        }
        let mut record = current.record.clone();
        record.volume_type = Some(t.name.clone());
        record.qos = t.qos.clone();
        if t.compression.is_some() && t.compression != record.compression {
            self.require_compression()?;
        }
        record.compression = t.compression.clone();
        let _provisioning = match (&self.cluster, t.replicas) {
            (Some(_), Some(n)) if record.replicas != Some(n) => {
                record.replicas = Some(n);
                self.provisioning()?
            }
            (None, Some(n)) if n != 1 => {
                return Err(VolumeError::NotSupported(
                    "more than one replica needs a cluster (basalt server --etcd ...)".into(),
                ))
            }
            _ => None,
        };
        if reencrypt {
            let (started, revision) = self.begin_reencryption(&current, t.encrypted)?;
            current.revision = revision;
            current.record.reencryption = Some(started.clone());
            record.reencryption = Some(started);
            record.encrypted = t.encrypted;
        }
        if record != current.record {
            self.catalog
                .update(&record, current.revision)
                .map_err(catalog_error)?;
            tracing::info!(volume = name, volume_type = type_name, replicas = ?record.replicas, compression = ?record.compression, "volume retyped");
        }
        if record.compression != current.record.compression && self.cluster.is_none() {
            // (A replicated volume's nodes each follow the record.)
            self.store
                .set_compression(record.id, crate::compression::record_codec(&record));
        }
        self.throttle_for(&record);
        drop(control);
        self.get(name)
    }
}
