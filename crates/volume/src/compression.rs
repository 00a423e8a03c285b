//! Per-volume compression: which codec a volume's cold data is kept
//! compressed with (its record's `compression`: the create request's, else
//! its volume type's; a clone's, else its source's), handed to the store's
//! compactor at create and at every start (`Store::set_compression` is in
//! memory only), and compaction now (`basalt volume compact`).
//!
//! Invariants: a record's `compression` is either absent or a text
//! `Codec::parse` accepts ("off" is never stored: it means absent); a
//! single-node volume with one is in the store's compression policy from
//! its create (or the start after it) until its delete. A replicated
//! volume's is applied by each node holding a replica, to its own store
//! (`basalt_cluster`, when the replica starts).

use crate::error::VolumeError;
use crate::service::VolumeService;
use basalt_catalog::{Versioned, VolumeRecord};
use basalt_store::{Codec, CompactReport};

/// What `--compression` accepts, for error messages.
const ACCEPTED: &str = "lz4, zstd, zstd:LEVEL (LEVEL 1-19) or off";

/// `text` as a volume's or volume type's compression: `None` for "off",
/// else the codec (`Codec::parse`'s spellings); anything else is
/// [`VolumeError::InvalidCompression`], one line naming what is accepted.
pub(crate) fn parse_compression(text: &str) -> Result<Option<Codec>, VolumeError> {
    if text == "off" {
        return Ok(None);
    }
    Codec::parse(text).map(Some).map_err(|why| {
        // Codec::parse names the accepted values for an unknown name; a
        // bad zstd level gets them added.
        let why = if why.starts_with("unknown compression") {
            format!("invalid compression {text:?}: use {ACCEPTED}")
        } else {
            format!("invalid compression {text:?}: {why}; use {ACCEPTED}")
        };
        VolumeError::InvalidCompression(why)
    })
}

/// The text a record keeps for `text` (`None`: not compressed), checked.
pub(crate) fn record_compression(text: &str) -> Result<Option<String>, VolumeError> {
    Ok(parse_compression(text)?.map(|_| text.to_string()))
}

/// The codec `record`'s volume is kept compressed with, if any. A record
/// whose text does not parse (written by a newer basalt with a codec this
/// one lacks) counts as not compressed, with an error logged.
pub(crate) fn record_codec(record: &VolumeRecord) -> Option<Codec> {
    let text = record.compression.as_deref()?;
    match parse_compression(text) {
        Ok(codec) => codec,
        Err(e) => {
            tracing::error!(volume = %record.name, "compression left off: {e}");
            None
        }
    }
}

impl VolumeService {
    /// Refuses compression on a store formatted before packed extents.
    pub(crate) fn require_compression(&self) -> Result<(), VolumeError> {
        if self.store.supports_compression() {
            return Ok(());
        }
        Err(VolumeError::NotSupported(
            "this server's store was formatted without packed extents (compression); only a store formatted by this version or later compresses".into(),
        ))
    }

    /// Hands every single-node volume's compression to the store's
    /// compactor (it keeps it in memory only); called at start, by
    /// [`VolumeService::reconcile`].
    pub(crate) fn apply_compression(&self, records: &[Versioned<VolumeRecord>]) -> usize {
        if self.cluster.is_some() {
            return 0;
        }
        let mut applied = 0;
        for Versioned { record, .. } in records {
            if let Some(codec) = record_codec(record) {
                self.store.set_compression(record.id, Some(codec));
                applied += 1;
            }
        }
        if applied > 0 {
            tracing::info!(volumes = applied, "compression policy set for volumes");
        }
        applied
    }

    /// Compresses the extents of volume `name` and of its snapshots whose
    /// first byte lies in `range` now, with the volume's codec (hot data
    /// too: the background compactor only packs data not written for a
    /// while), at most `rate` bytes per second; `progress(done, total)` in
    /// extents (bytes for a replicated volume, compacted on every replica:
    /// [`crate::ClusterVolumes::compact`]). Client I/O goes on meanwhile.
    pub fn compact(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(String, CompactReport), VolumeError> {
        let record = self.record(name)?.record;
        let (Some(text), Some(codec)) = (record.compression.clone(), record_codec(&record)) else {
            return Err(VolumeError::NotCompressed(name.to_string()));
        };
        self.require_compression()?;
        let started = std::time::Instant::now();
        let report = match &self.cluster {
            Some(cluster) => cluster.compact(&record, range, rate, progress)?,
            None => self
                .store
                .compact_range(record.id, codec, range, rate, progress)?,
        };
        tracing::info!(
            volume = name,
            compression = %text,
            packed_extents = report.packed_extents,
            packed_bytes = report.packed_bytes,
            stored_bytes = report.stored_bytes,
            incompressible_extents = report.incompressible_extents,
            seconds = started.elapsed().as_secs_f64(),
            "volume compacted"
        );
        Ok((text, report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_values_and_one_line_errors() {
        assert_eq!(parse_compression("off").unwrap(), None);
        assert_eq!(parse_compression("lz4").unwrap(), Some(Codec::Lz4));
        assert_eq!(parse_compression("zstd:3").unwrap(), Some(Codec::Zstd(3)));
        assert_eq!(record_compression("off").unwrap(), None);
        assert_eq!(
            record_compression("zstd:3").unwrap().as_deref(),
            Some("zstd:3")
        );
        for bad in ["gzip", "zstd:25", "LZ4", ""] {
            let e = parse_compression(bad).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, VolumeError::InvalidCompression(_)), "{bad}");
            assert!(!text.contains('\n'), "{text}");
            assert!(text.contains("lz4") && text.contains("zstd"), "{text}");
        }
    }
}
