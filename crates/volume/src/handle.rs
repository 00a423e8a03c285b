//! `VolumeHandle`: what a frontend connection holds to serve I/O on one
//! volume. It forwards either to the local store's data path (a single-node
//! volume) or to a [`BlockIo`] (a replicated volume, served by its primary
//! wherever it runs), and records per-volume statistics.
//!
//! Invariants:
//! - While any clone of a handle is alive the volume counts one open
//!   handle, so the control plane can refuse to delete a volume in use.
//! - Every open of a volume shares the volume's one QoS throttle
//!   ([`VolumeHandle::throttle`]); the handle does not apply it itself:
//!   each frontend admits its reads and writes where waiting costs no other
//!   volume anything (a connection's own thread, or an event loop's retry).

use crate::qos::Throttle;
use crate::stats::{OpKind, VolumeStats};
use basalt_store::{AlignedBuf, DataKind, DataOp, IoError, LocalVolume, MappingRun, VolumeId};
use std::sync::Arc;
use std::time::Instant;

/// A frontend's acknowledgement of a batch of writes to its client, which
/// the data path may send itself, from the thread that completes the
/// batch's last write, instead of waking the submitting thread to send it.
/// For a replicated write that thread is the one receiving the last
/// replica's acknowledgement, so the client hears back one thread wake-up
/// sooner.
pub trait WriteAck: Send + Sync {
    /// Every write of the batch succeeded: tell the client now. Called at
    /// most once per submission, before the submission returns; the ops'
    /// results are still stored as usual, and the frontend learns from its
    /// own `WriteAck` whether the acknowledgement went out.
    fn acknowledge(&self);
}

/// A read or write handed over with its buffer ([`BlockIo::start`]), and
/// handed back with its outcome in `result`.
pub struct OwnedOp {
    pub offset: u64,
    pub buf: AlignedBuf,
    pub write: bool,
    pub fua: bool,
    pub result: Result<(), IoError>,
}

impl OwnedOp {
    pub fn read(offset: u64, buf: AlignedBuf) -> OwnedOp {
        OwnedOp {
            offset,
            buf,
            write: false,
            fua: false,
            result: Ok(()),
        }
    }

    pub fn write(offset: u64, buf: AlignedBuf, fua: bool) -> OwnedOp {
        OwnedOp {
            offset,
            buf,
            write: true,
            fua,
            result: Ok(()),
        }
    }

    fn data_op(&mut self) -> DataOp<'_> {
        if self.write {
            DataOp::write(self.offset, &self.buf[..], self.fua)
        } else {
            DataOp::read(self.offset, &mut self.buf[..])
        }
    }
}

/// Called once with a started batch's ops, each holding its outcome.
pub type OnComplete = Box<dyn FnOnce(Vec<OwnedOp>) + Send>;

/// Runs `ops` through a synchronous `submit` (a batch of borrowed ops) and
/// stores each outcome in its op.
pub fn submit_owned(ops: &mut [OwnedOp], submit: impl FnOnce(&mut [DataOp<'_>])) {
    let mut data: Vec<DataOp<'_>> = ops.iter_mut().map(OwnedOp::data_op).collect();
    submit(&mut data);
    let results: Vec<Result<(), IoError>> = data.into_iter().map(|op| op.result).collect();
    for (op, result) in ops.iter_mut().zip(results) {
        op.result = result;
    }
}

/// The data path of a volume that is not (only) on this node's store: the
/// cluster layer implements it. Requests are byte ranges within `size()`;
/// the implementation handles alignment and durability (FUA, flush) with the
/// same meaning as the local store.
pub trait BlockIo: Send + Sync {
    fn size(&self) -> u64;
    /// Writes are refused (`IoError::ReadOnly`): a snapshot's export.
    fn is_read_only(&self) -> bool {
        false
    }
    /// Executes a batch of reads and writes; each op's outcome is stored in it.
    fn submit(&self, ops: &mut [DataOp<'_>]);
    /// [`BlockIo::submit`] of a batch of writes, which may call `ack` (see
    /// [`WriteAck`]) once all of them succeeded. By default it never does.
    fn submit_writes(&self, ops: &mut [DataOp<'_>], ack: &Arc<dyn WriteAck>) {
        let _ = ack;
        self.submit(ops);
    }
    /// Starts a batch of reads and writes without waiting for it: `done`
    /// gets the ops back with their outcomes, once, on whichever thread
    /// completes the batch (possibly this one, before `start` returns). An
    /// event loop's way in: it must not wait for the network, though it
    /// may run local disk I/O on the calling thread. By default it runs
    /// [`BlockIo::submit`] here.
    fn start(&self, mut ops: Vec<OwnedOp>, done: OnComplete) {
        submit_owned(&mut ops, |data| self.submit(data));
        done(ops);
    }
    /// Whether [`BlockIo::start`] would run disk I/O on the calling thread
    /// now (the volume's primary is on this node), so that an event loop
    /// runs it elsewhere unless nothing else waits for the loop.
    fn start_runs_disk_io(&self) -> bool {
        true
    }
    /// Makes every completed write durable.
    fn flush(&self) -> Result<(), IoError>;
    /// The range reads as zeros afterwards.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), IoError>;
    /// Writes `data` at `offset` if the range holds `expect` (of the same
    /// length), as SCSI's COMPARE AND WRITE: `Ok(None)` when written,
    /// `Ok(Some(content))` with what the range held when it differs. By
    /// default a read, a compare and a write, atomic only among callers
    /// that serialise them; a data path that can make it atomic with every
    /// write of the volume, from any node, does so.
    fn compare_and_write(
        &self,
        offset: u64,
        expect: &[u8],
        data: &[u8],
        fua: bool,
    ) -> Result<Option<Vec<u8>>, IoError> {
        unserialised_compare_and_write(
            |buf| one(self, DataOp::read(offset, buf)),
            |data| one(self, DataOp::write(offset, data, fua)),
            expect,
            data,
        )
    }
}

/// [`BlockIo::compare_and_write`] as a read, a compare and a write.
fn unserialised_compare_and_write(
    read: impl FnOnce(&mut [u8]) -> Result<(), IoError>,
    write: impl FnOnce(&[u8]) -> Result<(), IoError>,
    expect: &[u8],
    data: &[u8],
) -> Result<Option<Vec<u8>>, IoError> {
    if expect.len() != data.len() {
        return Err(IoError::Failed);
    }
    let mut current = vec![0u8; expect.len()];
    read(&mut current)?;
    if current != expect {
        return Ok(Some(current));
    }
    write(data).map(|()| None)
}

fn one<B: BlockIo + ?Sized>(io: &B, mut op: DataOp<'_>) -> Result<(), IoError> {
    io.submit(std::slice::from_mut(&mut op));
    op.result
}

enum Backend {
    Local(LocalVolume),
    Cluster { io: Arc<dyn BlockIo>, id: VolumeId },
}

struct Open {
    backend: Backend,
    name: String,
    stats: Arc<VolumeStats>,
    throttle: Arc<Throttle>,
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
        Self::with_backend(Backend::Local(local), name, stats)
    }

    /// A handle on a replicated volume's data path.
    pub fn clustered(
        io: Arc<dyn BlockIo>,
        id: VolumeId,
        name: String,
        stats: Arc<VolumeStats>,
    ) -> VolumeHandle {
        Self::with_backend(Backend::Cluster { io, id }, name, stats)
    }

    fn with_backend(backend: Backend, name: String, stats: Arc<VolumeStats>) -> VolumeHandle {
        stats.handle_opened();
        VolumeHandle(Arc::new(Open {
            backend,
            name,
            stats,
            throttle: Arc::new(Throttle::default()),
        }))
    }

    /// This open under the volume's shared throttle (instead of none). Only
    /// for a handle just made: a clone would keep the old throttle.
    pub fn with_throttle(mut self, throttle: Arc<Throttle>) -> VolumeHandle {
        match Arc::get_mut(&mut self.0) {
            Some(open) => open.throttle = throttle,
            None => tracing::error!(volume = %self.0.name,
                "a shared volume handle cannot take a throttle; its QoS limits do not apply"),
        }
        self
    }

    /// Another open of the same volume under `throttle` (tests, tools).
    pub fn clone_with_throttle(&self, throttle: Arc<Throttle>) -> VolumeHandle {
        let open = &self.0;
        let backend = match &open.backend {
            Backend::Local(l) => Backend::Local(l.clone()),
            Backend::Cluster { io, id } => Backend::Cluster {
                io: Arc::clone(io),
                id: *id,
            },
        };
        Self::with_backend(backend, open.name.clone(), Arc::clone(&open.stats))
            .with_throttle(throttle)
    }

    /// The volume's QoS throttle (unlimited unless the volume has limits).
    pub fn throttle(&self) -> &Throttle {
        &self.0.throttle
    }

    /// Blocks the calling thread until the volume's QoS admits every read
    /// and write of `ops`: for frontends whose thread serves one volume (an
    /// NBD connection's lanes, an NVMe/TCP queue thread). An unlimited
    /// volume returns at once.
    pub fn wait_for_qos(&self, ops: &[DataOp<'_>]) {
        let throttle = &self.0.throttle;
        if !throttle.is_limited() {
            return;
        }
        for op in ops {
            let (direction, bytes) = match &op.kind {
                DataKind::Read(b) => (crate::qos::Direction::Read, b.len() as u64),
                DataKind::Write(b) => (crate::qos::Direction::Write, b.len() as u64),
            };
            throttle.wait_admitted(direction, bytes);
        }
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn id(&self) -> VolumeId {
        match &self.0.backend {
            Backend::Local(l) => l.id(),
            Backend::Cluster { id, .. } => *id,
        }
    }

    /// A snapshot: writes are refused (`IoError::ReadOnly`).
    pub fn is_read_only(&self) -> bool {
        match &self.0.backend {
            Backend::Local(l) => l.is_read_only(),
            Backend::Cluster { io, .. } => io.is_read_only(),
        }
    }

    /// Current size in bytes (a multiple of 4096); grows online on resize.
    pub fn size(&self) -> u64 {
        match &self.0.backend {
            Backend::Local(l) => l.size(),
            Backend::Cluster { io, .. } => io.size(),
        }
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
        self.timed(OpKind::Read, n, || match &self.0.backend {
            Backend::Local(l) => l.read(offset, buf),
            Backend::Cluster { io, .. } => one(io.as_ref(), DataOp::read(offset, buf)),
        })
    }

    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError> {
        self.timed(OpKind::Write, data.len() as u64, || match &self.0.backend {
            Backend::Local(l) => l.write(offset, data, fua),
            Backend::Cluster { io, .. } => one(io.as_ref(), DataOp::write(offset, data, fua)),
        })
    }

    /// SCSI's COMPARE AND WRITE ([`BlockIo::compare_and_write`]): `data`
    /// is written at `offset` if the range holds `expect`; otherwise
    /// `Ok(Some(content))` returns what it held. Atomic with every write
    /// of a replicated volume, from any node; on a single-node volume,
    /// only among callers that serialise their compare-and-writes (the
    /// iSCSI frontend holds a lock per logical unit).
    pub fn compare_and_write(
        &self,
        offset: u64,
        expect: &[u8],
        data: &[u8],
        fua: bool,
    ) -> Result<Option<Vec<u8>>, IoError> {
        self.timed(OpKind::Write, data.len() as u64, || match &self.0.backend {
            Backend::Local(l) => unserialised_compare_and_write(
                |buf| l.read(offset, buf),
                |data| l.write(offset, data, fua),
                expect,
                data,
            ),
            Backend::Cluster { io, .. } => io.compare_and_write(offset, expect, data, fua),
        })
    }

    /// Makes every completed write durable — on this volume and on every
    /// other handle and volume of the store (multi-connection consistency).
    pub fn flush(&self) -> Result<(), IoError> {
        self.timed(OpKind::Flush, 0, || match &self.0.backend {
            Backend::Local(l) => l.flush(),
            Backend::Cluster { io, .. } => io.flush(),
        })
    }

    /// The range reads as zeros afterwards; whole extents are freed.
    pub fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), IoError> {
        self.timed(OpKind::Trim, len, || match &self.0.backend {
            Backend::Local(l) => l.trim(offset, len, fua),
            // Zeroing is a valid trim (the range's contents become
            // unspecified or zero); replicas then stay identical.
            Backend::Cluster { io, .. } => io.write_zeroes(offset, len, fua),
        })
    }

    pub fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_unmap: bool,
        fua: bool,
    ) -> Result<(), IoError> {
        self.timed(OpKind::WriteZeroes, len, || match &self.0.backend {
            Backend::Local(l) => l.write_zeroes(offset, len, may_unmap, fua),
            Backend::Cluster { io, .. } => io.write_zeroes(offset, len, fua),
        })
    }

    /// Bytes held by allocated extents (thin provisioning: at most the size).
    pub fn allocated_bytes(&self) -> u64 {
        match &self.0.backend {
            Backend::Local(l) => l.allocated_bytes(),
            // Allocation lives on the replicas, maybe elsewhere; report the
            // volume as fully used (a conservative NUSE).
            Backend::Cluster { io, .. } => io.size(),
        }
    }

    /// Allocated and unallocated (reads-as-zero) runs covering the range.
    pub fn mapping(&self, offset: u64, len: u64) -> Result<Vec<MappingRun>, IoError> {
        match &self.0.backend {
            Backend::Local(l) => l.mapping(offset, len),
            // The primary may be elsewhere: report the range allocated,
            // which is always a correct (if conservative) answer.
            Backend::Cluster { io, .. } => {
                let size = io.size();
                if offset.checked_add(len).is_none_or(|end| end > size) {
                    return Err(IoError::OutOfRange { offset, len, size });
                }
                Ok(vec![MappingRun {
                    len,
                    allocated: true,
                }])
            }
        }
    }

    /// Executes a batch of reads and writes with one device submission;
    /// each op's outcome is stored in it.
    pub fn submit(&self, ops: &mut [DataOp<'_>]) {
        let start = Instant::now();
        match &self.0.backend {
            Backend::Local(l) => l.submit(ops),
            Backend::Cluster { io, .. } => io.submit(ops),
        }
        self.record(ops, start);
    }

    /// Whether [`VolumeHandle::submit_writes`] may acknowledge early: only a
    /// replicated volume's writes complete on another thread than the
    /// submitter's, so only there is a [`WriteAck`] worth building.
    pub fn acknowledges_writes(&self) -> bool {
        matches!(self.0.backend, Backend::Cluster { .. })
    }

    /// [`VolumeHandle::submit`] of a batch of writes; `ack` may be called
    /// once all of them succeeded, from the thread that completed the last
    /// one (see [`WriteAck`]).
    pub fn submit_writes(&self, ops: &mut [DataOp<'_>], ack: &Arc<dyn WriteAck>) {
        let start = Instant::now();
        match &self.0.backend {
            Backend::Local(l) => l.submit(ops),
            Backend::Cluster { io, .. } => io.submit_writes(ops, ack),
        }
        self.record(ops, start);
    }

    /// [`BlockIo::start`] on this volume: a single-node volume's batch runs
    /// here; a replicated volume's goes to its primary, and `done` is called
    /// by the thread that brings its last reply. Statistics are recorded on
    /// completion.
    pub fn start(&self, mut ops: Vec<OwnedOp>, done: OnComplete) {
        let started = Instant::now();
        let handle = self.clone();
        let done: OnComplete = Box::new(move |mut ops: Vec<OwnedOp>| {
            let elapsed = started.elapsed();
            for op in ops.iter_mut() {
                let kind = if op.write {
                    OpKind::Write
                } else {
                    OpKind::Read
                };
                handle
                    .0
                    .stats
                    .record(kind, op.buf.len() as u64, elapsed, op.result.is_ok());
            }
            done(ops)
        });
        match &self.0.backend {
            Backend::Local(l) => {
                submit_owned(&mut ops, |data| l.submit(data));
                done(ops);
            }
            Backend::Cluster { io, .. } => io.start(ops, done),
        }
    }

    /// See [`BlockIo::start_runs_disk_io`]; always for a single-node volume.
    pub fn start_runs_disk_io(&self) -> bool {
        match &self.0.backend {
            Backend::Local(_) => true,
            Backend::Cluster { io, .. } => io.start_runs_disk_io(),
        }
    }

    /// The local store's data path, for a single-node volume (an event loop
    /// stages and runs its batches itself).
    pub fn local(&self) -> Option<&LocalVolume> {
        match &self.0.backend {
            Backend::Local(l) => Some(l),
            Backend::Cluster { .. } => None,
        }
    }

    /// Records the statistics of a batch that was run outside the handle
    /// (through [`VolumeHandle::local`]) and started at `start`.
    pub fn record(&self, ops: &[DataOp<'_>], start: Instant) {
        let elapsed = start.elapsed();
        for op in ops.iter() {
            let (kind, bytes) = match &op.kind {
                DataKind::Read(b) => (OpKind::Read, b.len() as u64),
                DataKind::Write(b) => (OpKind::Write, b.len() as u64),
            };
            self.0.stats.record(kind, bytes, elapsed, op.result.is_ok());
        }
    }
}
