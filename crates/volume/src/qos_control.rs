//! The control side of QoS: a volume's spec lives in its catalog record
//! (Cinder key → value), is changed online with
//! [`VolumeService::set_qos`], and every open of the volume on this node
//! shares one throttle (`crate::qos::Throttle`) configured from the record.
//!
//! Invariants:
//! - A spec is validated before it is stored; the record is updated by
//!   compare-and-swap under the control lock, like every record change.
//! - This node's throttle of a volume takes a new spec (or a new size, for
//!   `_per_gb` limits) at once; in a cluster, every other node's as soon
//!   as its catalog watch delivers the record
//!   ([`VolumeService::volume_record_changed`]).

use crate::qos::{QosSpec, Throttle};
use crate::service::catalog_error;
use crate::{VolumeError, VolumeInfo, VolumeService};
use basalt_catalog::VolumeRecord;
use std::sync::Arc;
use std::time::Duration;

impl VolumeService {
    /// Replaces `name`'s QoS spec (empty: unlimited); takes effect at once
    /// for this node's connections.
    pub fn set_qos(&self, name: &str, spec: &QosSpec) -> Result<VolumeInfo, VolumeError> {
        spec.validate()
            .map_err(|e| VolumeError::InvalidQos(e.to_string()))?;
        let control = self.control.lock();
        let current = self.record(name)?;
        let mut record = current.record.clone();
        record.qos = spec.0.clone();
        if record.qos != current.record.qos {
            self.catalog
                .update(&record, current.revision)
                .map_err(catalog_error)?;
            tracing::info!(volume = name, qos = %spec.to_text(), "QoS changed");
        }
        self.throttle_for(&record);
        drop(control);
        self.get(name)
    }

    /// Applies `record`'s QoS to this node's throttle of the volume, if
    /// the volume is open here (a change made through another node of the
    /// cluster, seen by the catalog watch); nothing otherwise (an open
    /// configures the throttle from the record it reads).
    pub fn volume_record_changed(&self, record: &VolumeRecord) {
        let throttle = self.throttles.lock().get(&record.id).cloned();
        if let Some(throttle) = throttle {
            throttle.configure(&QosSpec(record.qos.clone()).limits(record.size_bytes));
        }
    }

    /// The shared throttle of the volume `record` describes, configured
    /// from it (created on first use).
    pub(crate) fn throttle_for(&self, record: &VolumeRecord) -> Arc<Throttle> {
        let limits = QosSpec(record.qos.clone()).limits(record.size_bytes);
        let throttle = Arc::clone(
            self.throttles
                .lock()
                .entry(record.id)
                .or_insert_with(|| Arc::new(Throttle::new(&limits))),
        );
        throttle.configure(&limits);
        throttle
    }

    /// Time the operations of volume `record` spent waiting for QoS
    /// admission on this node.
    pub(crate) fn throttled(&self, record: &VolumeRecord) -> Duration {
        self.throttles
            .lock()
            .get(&record.id)
            .map_or(Duration::ZERO, |t| t.throttled())
    }
}
