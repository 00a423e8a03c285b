//! Scrub of a volume: this node's copy checked against its block checksums
//! (`LocalVolume::scrub`), and, for a replicated volume, every replica's
//! copy compared with the primary's (`ClusterVolumes::compare_replicas`),
//! copies that differ rewritten from the primary's.
//!
//! Invariants: the local check runs first, so the damage it reports is what
//! the disk held before the compare; a damaged local block counts as
//! repaired only when the compare of its region succeeded and either this
//! node was the primary (its read of the region was repaired from an
//! in-sync replica) or the compare named this node as differing there (its
//! copy is rewritten from the primary's).

use crate::error::VolumeError;
use crate::service::VolumeService;
use basalt_store::{ScrubReport, StoreError};

/// What a scrub of a volume found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeScrub {
    /// This node's copy checked against its block checksums (None: this
    /// node holds no replica of the volume).
    pub local: Option<ScrubReport>,
    /// A replicated volume's compare of its replicas.
    pub replicas: Option<ReplicaComparison>,
    /// The local copy's damaged blocks (volume offsets) that the compare
    /// repaired.
    pub repaired_blocks: Vec<u64>,
}

/// What a compare of a replicated volume's copies found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaComparison {
    /// The size of the regions compared one at a time.
    pub region_bytes: u64,
    /// Bytes of the volume compared (every region of the range).
    pub bytes_compared: u64,
    /// Bytes compared with fewer than all the volume's replicas (one was
    /// out of sync: its resync copies whatever may differ there).
    pub bytes_partial: u64,
    /// Regions where a replica's copy differed from the primary's, with
    /// the replicas (node names): their copy is being rewritten.
    pub differing: Vec<DifferingRange>,
    /// Offsets of regions whose blocks no replica holds a good copy of.
    pub unreadable: Vec<u64>,
    /// This node, and whether it was the primary when the compare began.
    pub this_node: String,
    pub this_node_primary: bool,
}

/// A region where some replicas differed from the primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DifferingRange {
    pub offset: u64,
    pub length: u64,
    pub replicas: Vec<String>,
}

impl VolumeScrub {
    /// The local damaged blocks the compare did not repair.
    pub fn unrepaired_blocks(&self) -> Vec<u64> {
        let bad = self.local.as_ref().map_or(&[][..], |l| &l.bad_blocks[..]);
        bad.iter()
            .copied()
            .filter(|b| !self.repaired_blocks.contains(b))
            .collect()
    }
}

/// The damaged local blocks in `bad` that `cmp` repaired (see the module's
/// invariants); `region` is the compare's region size in bytes.
fn repaired(bad: &[u64], cmp: &ReplicaComparison, region: u64) -> Vec<u64> {
    let region = region.max(1);
    bad.iter()
        .copied()
        .filter(|b| {
            let start = b - b % region;
            if cmp.unreadable.contains(&start) {
                return false;
            }
            cmp.this_node_primary
                || cmp.differing.iter().any(|d| {
                    (d.offset..d.offset + d.length).contains(b)
                        && d.replicas.contains(&cmp.this_node)
                })
        })
        .collect()
}

impl VolumeService {
    /// Scrubs `range` of `name` (see the module docs), each part at most
    /// `rate` bytes per second; `progress(done, total)` as it goes, over
    /// the local check and the compare together.
    pub fn scrub(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<VolumeScrub, VolumeError> {
        let record = self.record(name)?.record;
        // A volume of one replica has nothing to compare.
        let cluster = self
            .cluster_volumes()
            .filter(|_| record.replicas != Some(1));
        let len = range.end.saturating_sub(range.start);
        let total = if cluster.is_some() { 2 * len } else { len };
        let local = match self.local_copy(name) {
            Ok(copy) => {
                let report = copy
                    .scrub(range.clone(), rate, &mut |done, all| {
                        // Local progress counts allocated bytes: scaled to
                        // the range.
                        progress(done * len / all.max(1), total)
                    })
                    .map_err(|e| VolumeError::Cluster(format!("scrubbing the local copy: {e}")))?;
                if !report.bad_blocks.is_empty() {
                    tracing::error!(
                        volume = name,
                        bad_blocks = report.bad_blocks.len(),
                        first = report.bad_blocks[0],
                        "scrub found blocks that fail their checksum"
                    );
                }
                Some(report)
            }
            // A cluster node without a replica still compares the others.
            Err(VolumeError::Store(StoreError::NotFound(_))) | Err(VolumeError::NotFound(_))
                if cluster.is_some() =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        let Some(cluster) = cluster else {
            return Ok(VolumeScrub {
                local,
                replicas: None,
                repaired_blocks: Vec::new(),
            });
        };
        let cmp = cluster.compare_replicas(&record, range, rate, &mut |done, _| {
            progress(len + done, total)
        })?;
        for d in &cmp.differing {
            tracing::warn!(
                volume = name,
                offset = d.offset,
                length = d.length,
                replicas = ?d.replicas,
                "replica compare: copies differ from the primary's; rewriting them"
            );
        }
        let bad = local.as_ref().map_or(&[][..], |l| &l.bad_blocks[..]);
        let repaired_blocks = repaired(bad, &cmp, cmp.region_bytes);
        Ok(VolumeScrub {
            local,
            replicas: Some(cmp),
            repaired_blocks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(
        primary: bool,
        differing: Vec<DifferingRange>,
        unreadable: Vec<u64>,
    ) -> ReplicaComparison {
        ReplicaComparison {
            region_bytes: 100,
            differing,
            unreadable,
            this_node: "a".into(),
            this_node_primary: primary,
            ..ReplicaComparison::default()
        }
    }

    #[test]
    fn damaged_blocks_count_as_repaired_only_where_the_compare_fixed_this_copy() {
        let bad = [5, 150, 250];
        // The primary's damage is repaired by its read, unless unreadable.
        assert_eq!(
            repaired(&bad, &cmp(true, vec![], vec![200]), 100),
            vec![5, 150]
        );
        // A secondary's only where the compare named it.
        let d = |offset, who: &str| DifferingRange {
            offset,
            length: 100,
            replicas: vec![who.to_string()],
        };
        let c = cmp(false, vec![d(100, "a"), d(200, "b")], vec![]);
        assert_eq!(repaired(&bad, &c, 100), vec![150]);
    }
}
