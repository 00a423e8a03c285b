//! Quota arithmetic, pure: what a project holds ([`Usage`]), what an
//! operation adds ([`Growth`]) and whether that fits its [`Quotas`].
//!
//! A quota is only checked against growth: an operation that adds nothing
//! of a kind passes that kind even when the project is already over it
//! (after its quota was lowered), so deleting and shrinking always work.

use crate::VolumeError;
use basalt_catalog::{Quotas, Versioned, VolumeRecord};

/// What one project holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Sum of its volumes' provisioned sizes.
    pub capacity_bytes: u64,
    pub volumes: u64,
    /// Snapshots of its volumes.
    pub snapshots: u64,
}

impl Usage {
    /// What `project` holds among `records`.
    pub fn of(project: &str, records: &[Versioned<VolumeRecord>]) -> Usage {
        records
            .iter()
            .map(|v| &v.record)
            .filter(|r| r.project.as_deref() == Some(project))
            .fold(Usage::default(), |u, r| Usage {
                capacity_bytes: u.capacity_bytes.saturating_add(r.size_bytes),
                volumes: u.volumes + 1,
                snapshots: u.snapshots + r.snapshots.len() as u64,
            })
    }
}

/// What an operation adds to a project.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Growth {
    pub capacity_bytes: u64,
    pub volumes: u64,
    pub snapshots: u64,
}

/// Fails with [`VolumeError::QuotaExceeded`] naming the first quota of
/// `project` that `growth` on top of `usage` would exceed.
pub fn check(
    project: &str,
    quotas: &Quotas,
    usage: &Usage,
    growth: &Growth,
) -> Result<(), VolumeError> {
    let kinds = [
        (
            "capacity",
            quotas.capacity_bytes,
            usage.capacity_bytes,
            growth.capacity_bytes,
        ),
        ("volumes", quotas.volumes, usage.volumes, growth.volumes),
        (
            "snapshots",
            quotas.snapshots,
            usage.snapshots,
            growth.snapshots,
        ),
    ];
    for (quota, limit, used, requested) in kinds {
        let Some(limit) = limit else { continue };
        if requested > 0 && used.saturating_add(requested) > limit {
            return Err(VolumeError::QuotaExceeded {
                project: project.to_string(),
                quota,
                limit,
                used,
                requested,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;
    use uuid::Uuid;

    fn vol(name: &str, project: Option<&str>, size: u64, snaps: usize) -> Versioned<VolumeRecord> {
        let mut r = VolumeRecord::new(Uuid::new_v4(), name, size, SystemTime::UNIX_EPOCH);
        r.project = project.map(Into::into);
        for i in 0..snaps {
            r.snapshots.push(basalt_catalog::SnapshotRecord::new(
                Uuid::new_v4(),
                format!("s{i}"),
                size,
                SystemTime::UNIX_EPOCH,
            ));
        }
        Versioned {
            revision: basalt_catalog::Revision::new(1),
            record: r,
        }
    }

    #[test]
    fn usage_counts_only_the_project() {
        let records = [
            vol("a", Some("p"), 4096, 2),
            vol("b", Some("q"), 8192, 1),
            vol("c", None, 8192, 0),
            vol("d", Some("p"), 8192, 0),
        ];
        assert_eq!(
            Usage::of("p", &records),
            Usage {
                capacity_bytes: 12288,
                volumes: 2,
                snapshots: 2
            }
        );
    }

    #[test]
    fn each_quota_is_checked_against_growth_only() {
        let quotas = Quotas {
            capacity_bytes: Some(10),
            volumes: Some(2),
            snapshots: None,
            ..Quotas::default()
        };
        let usage = Usage {
            capacity_bytes: 8,
            volumes: 2,
            snapshots: 100,
        };
        let grow = |c, v, s| Growth {
            capacity_bytes: c,
            volumes: v,
            snapshots: s,
        };
        assert!(check("p", &quotas, &usage, &grow(2, 0, 5)).is_ok());
        let err = check("p", &quotas, &usage, &grow(3, 0, 0)).unwrap_err();
        assert!(
            matches!(
                err,
                VolumeError::QuotaExceeded {
                    quota: "capacity",
                    ..
                }
            ),
            "{err}"
        );
        let err = check("p", &quotas, &usage, &grow(0, 1, 0)).unwrap_err();
        assert!(err.to_string().contains("may hold 2 of volumes"), "{err}");
        // Over a lowered quota, what adds nothing of that kind still passes.
        let over = Usage {
            volumes: 5,
            ..usage
        };
        assert!(check("p", &quotas, &over, &grow(1, 0, 1)).is_ok());
    }
}
