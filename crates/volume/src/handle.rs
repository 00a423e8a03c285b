//! `VolumeHandle`: what a frontend connection holds to serve I/O on one
//! volume. It forwards to the local store's data path (the replication
//! pipeline will sit here) and records per-volume statistics.
//!
//! Invariant: while any clone of a handle is alive the volume counts one
//! open handle, so the control plane can refuse to delete a volume in use.

use crate::stats::{OpKind, VolumeStats};
use basalt_store::{DataOp, IoError, LocalVolume, MappingRun, VolumeId};
use std::sync::Arc;
use std::time::Instant;

struct Open {
    local: LocalVolume,
    name: String,
    stats: Arc<VolumeStats>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.stats.handle_closed();
    }
}

/// One open of a volume; clones share the open.
#[derive(Clone)]
pub struct VolumeHandle(Arc<Open>);

impl VolumeHandle {
    pub fn new(local: LocalVolume, name: String, stats: Arc<VolumeStats>) -> VolumeHandle {
        stats.handle_opened();
        VolumeHandle(Arc::new(Open { local, name, stats }))
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn id(&self) -> VolumeId {
        self.0.local.id()
    }

    /// Current size in bytes (a multiple of 4096); grows online on resize.
    pub fn size(&self) -> u64 {
        self.0.local.size()
    }

    fn timed<T>(
        &self,
        kind: OpKind,
        bytes: u64,
        f: impl FnOnce() -> Result<T, IoError>,
    ) -> Result<T, IoError> {
        let start = Instant::now();
        let r = f();
        self.0.stats.record(kind, bytes, start.elapsed(), r.is_ok());
        r
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let n = buf.len() as u64;
        self.timed(OpKind::Read, n, || self.0.local.read(offset, buf))
    }

    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError> {
        self.timed(OpKind::Write, data.len() as u64, || {
            self.0.local.write(offset, data, fua)
        })
    }

    /// Makes every completed write durable — on this volume and on every
    /// other handle and volume of the store (multi-connection consistency).
    pub fn flush(&self) -> Result<(), IoError> {
        self.timed(OpKind::Flush, 0, || self.0.local.flush())
    }

    /// The range reads as zeros afterwards; whole extents are freed.
    pub fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), IoError> {
        self.timed(OpKind::Trim, len, || self.0.local.trim(offset, len, fua))
    }

    pub fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_unmap: bool,
        fua: bool,
    ) -> Result<(), IoError> {
        self.timed(OpKind::WriteZeroes, len, || {
            self.0.local.write_zeroes(offset, len, may_unmap, fua)
        })
    }

    /// Bytes held by allocated extents (thin provisioning: at most the size).
    pub fn allocated_bytes(&self) -> u64 {
        self.0.local.allocated_bytes()
    }

    /// Allocated and unallocated (reads-as-zero) runs covering the range.
    pub fn mapping(&self, offset: u64, len: u64) -> Result<Vec<MappingRun>, IoError> {
        self.0.local.mapping(offset, len)
    }

    /// Executes a batch of reads and writes with one device submission;
    /// each op's outcome is stored in it.
    pub fn submit(&self, ops: &mut [DataOp<'_>]) {
        let start = Instant::now();
        self.0.local.submit(ops);
        let elapsed = start.elapsed();
        for op in ops.iter() {
            let (kind, bytes) = match &op.kind {
                basalt_store::DataKind::Read(b) => (OpKind::Read, b.len() as u64),
                basalt_store::DataKind::Write(b) => (OpKind::Write, b.len() as u64),
            };
            self.0.stats.record(kind, bytes, elapsed, op.result.is_ok());
        }
    }
}
