//! Changed blocks: which 4 KiB blocks may read differently in one layer
//! than in another (a snapshot, or nothing), found from the layers' maps and
//! presence bits without reading data. The basis of `volume diff`,
//! incremental export (`export-diff`) and exact allocation maps.
//!
//! Invariants:
//! - Conservative, never short: a block that reads differently in the two
//!   layers is always reported; a block written with the same bytes again
//!   may be reported too.
//! - A reported run says whether `to` reads data there or zeros (no layer of
//!   its chain holds the block), so a consumer can send a hole instead of
//!   reading it.
//! - It holds `Store::layer_ops` while it looks, so no snapshot, clone,
//!   rollback or deletion moves a layer meanwhile; `to`'s own writes may go
//!   on (they are what changes next).

use crate::engine::Store;
use crate::error::StoreError;
use crate::layer_map::{resolve, LayerGuard, LayerMap, VolumeState};
use crate::{VolumeId, BLOCK_SIZE};
use std::sync::Arc;

/// A run of blocks in a diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangedRun {
    pub offset: u64,
    pub len: u64,
    /// `to` reads data here (else zeros).
    pub data: bool,
}

/// One layer of a chain with its id (the map lock held).
struct ChainLayer<'a> {
    id: VolumeId,
    map: &'a LayerMap,
}

fn chain<'a>(
    head_id: VolumeId,
    head: &'a LayerMap,
    ancestors: &'a [LayerGuard],
) -> Vec<ChainLayer<'a>> {
    let mut out = vec![ChainLayer {
        id: head_id,
        map: head,
    }];
    for guard in ancestors {
        let id = out
            .last()
            .and_then(|l| l.map.parent.as_ref())
            .map(|p| p.id)
            .unwrap_or_default();
        out.push(ChainLayer { id, map: guard });
    }
    out
}

impl Store {
    fn diff_layer(&self, id: VolumeId) -> Result<Arc<VolumeState>, StoreError> {
        let layer = self.volume_state(id)?;
        if layer.is_retired() || layer.is_deleted() {
            return Err(StoreError::NotFound(id));
        }
        Ok(layer)
    }

    /// The runs of `to` that may read differently than in snapshot `from`
    /// (`None`: than an empty volume, i.e. every block `to` reads data
    /// from), within `to`'s size. Blocks past `from`'s size count as
    /// changed where `to` holds data.
    pub fn changed_blocks(
        &self,
        from: Option<VolumeId>,
        to: VolumeId,
    ) -> Result<Vec<ChangedRun>, StoreError> {
        self.check_usable()?;
        let _op = self.layer_ops.lock();
        let to_layer = self.diff_layer(to)?;
        let from_layer = from.map(|id| self.diff_layer(id)).transpose()?;
        if let Some(f) = &from_layer {
            if !f.is_snapshot() {
                return Err(StoreError::Layers(format!(
                    "{} is a volume, not a snapshot: diff from a snapshot",
                    f.id
                )));
            }
        }
        // Child before parent: `to`'s chain first, then the part of
        // `from`'s chain not shared with it (snapshots, which only layer
        // operations lock exclusively, and those wait for `layer_ops`).
        let to_map = to_layer.map.read();
        let to_ancestors = VolumeState::lock_ancestors(&to_map);
        let to_chain = chain(to, &to_map, &to_ancestors);
        let mut from_guards: Vec<LayerGuard> = Vec::new();
        let mut common: Option<VolumeId> = None;
        if let Some(f) = &from_layer {
            let mut next = Some(Arc::clone(f));
            while let Some(layer) = next {
                if to_chain.iter().any(|l| l.id == layer.id) {
                    common = Some(layer.id);
                    break;
                }
                let guard = layer.map.read_arc();
                next = guard.parent.clone();
                from_guards.push(guard);
            }
        }
        // Layers above the common ancestor, on either side, hold what may
        // differ (all of `to`'s chain when there is no `from`).
        let to_upper: Vec<&LayerMap> = to_chain
            .iter()
            .take_while(|l| Some(l.id) != common)
            .map(|l| l.map)
            .collect();
        let from_upper: Vec<&LayerMap> = if from.is_some() {
            from_guards.iter().map(|g| &**g).collect()
        } else {
            Vec::new()
        };
        let from_size = from_layer.as_ref().map_or(0, |f| f.size());
        let size = to_layer.size();

        let es = self.extent_size();
        let bpe = self.layout.blocks_per_extent();
        let holds = |layer: &LayerMap, logical: usize, j: u64| -> bool {
            let Some(phys) = layer.phys(logical) else {
                return false;
            };
            layer.parent.is_none()
                || self
                    .presence
                    .as_ref()
                    .is_some_and(|p| p.is_present(phys as u64 * bpe + j))
        };
        let mut runs: Vec<ChangedRun> = Vec::new();
        let extents = size.div_ceil(es) as usize;
        for logical in 0..extents {
            let touched = to_upper
                .iter()
                .chain(from_upper.iter())
                .any(|l| l.phys(logical).is_some());
            let past_from = (logical as u64 + 1) * es > from_size;
            if !touched && !past_from {
                continue;
            }
            for j in 0..bpe {
                let offset = logical as u64 * es + j * BLOCK_SIZE;
                if offset >= size {
                    break;
                }
                let data = resolve(self, &to_map, &to_ancestors, logical, j * BLOCK_SIZE).is_some();
                let changed = if offset >= from_size {
                    data
                } else {
                    to_upper
                        .iter()
                        .chain(from_upper.iter())
                        .any(|l| holds(l, logical, j))
                };
                if !changed {
                    continue;
                }
                let len = BLOCK_SIZE.min(size - offset);
                match runs.last_mut() {
                    Some(r) if r.data == data && r.offset + r.len == offset => r.len += len,
                    _ => runs.push(ChangedRun { offset, len, data }),
                }
            }
        }
        Ok(runs)
    }
}
