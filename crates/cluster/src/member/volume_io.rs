//! A replicated volume's data path as frontends see it ([`BlockIo`]):
//! reads and writes become client requests to the volume's primary, sent
//! as one batch (`batches.rs`), either waited for by the calling thread
//! (`submit`: lanes, NVMe queue threads, tools) or completed through a
//! callback (`start`: event loops, which never wait for the network).
//!
//! Invariants:
//! - a request beyond the volume's size fails before anything is sent;
//! - an encrypted volume's data leaves this node only as ciphertext: writes
//!   are sealed here, once for every attempt, and reads decrypted here;
//! - a write that is not whole blocks is a read-modify-write of its blocks
//!   that writes only if they still hold what was read (`rmw.rs`): two
//!   partial writes to one block, from any opens on any nodes, cannot lose
//!   each other's bytes; `start` runs it on the calling thread (event
//!   loops hand unaligned requests to their offload pool: they never
//!   come here from a loop);
//! - a compare-and-write is the same read, compare and conditional write,
//!   so it is atomic with every write of the volume, from any node;
//! - a write's bytes are copied once on this node, into an aligned payload
//!   that the local store writes with O_DIRECT as it is and every replica
//!   link shares.

use super::batches::ReqResult;
use super::rmw::Rmw;
use super::Inner;
use basalt_replication::{payload, ClientReq, Payload, VolumeId};
use basalt_store::{DataKind, DataOp, IoError, BLOCK_SIZE};
use basalt_volume::{submit_owned, BlockCipher, BlockIo, OnComplete, OwnedOp, WriteAck};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

pub(super) struct ClusterVolume {
    pub(super) inner: Weak<Inner>,
    pub(super) vol: VolumeId,
    /// Bytes clients may address, shared by every open of the volume on
    /// this node and raised when a record shows the volume grown (read per
    /// request: an atomic, no lock).
    pub(super) size: Arc<AtomicU64>,
    /// Serialises this open's read-modify-writes of partial blocks, so
    /// that they do not make each other read again.
    pub(super) partial: Mutex<()>,
    /// An encrypted volume's cipher: writes leave this node as ciphertext
    /// (the peer link and every replica carry nothing else), reads are
    /// decrypted here.
    pub(super) cipher: Option<Arc<BlockCipher>>,
    /// Counts this open among the node's clients of the volume, which
    /// other nodes see (`clients.rs`).
    pub(super) _open: super::clients::OpenCount,
}

pub(super) fn gone() -> IoError {
    IoError::Gone
}

/// `data` (whole blocks from block `lba`) as it is sent: an aligned copy,
/// encrypted for an encrypted volume.
pub(super) fn sealed(
    cipher: Option<&BlockCipher>,
    vol: VolumeId,
    lba: u64,
    data: &[u8],
) -> Result<Payload, IoError> {
    let Some(c) = cipher else {
        return Ok(payload::aligned(data));
    };
    let mut out = data.to_vec();
    c.encrypt(lba, &mut out).map_err(|e| {
        tracing::error!(volume = ?vol, error = %e, "encryption failed; the write fails");
        IoError::Failed
    })?;
    Ok(Payload::from(out))
}

/// Decrypts `data` (whole blocks from block `lba`) as read, for an
/// encrypted volume; never-written (all-zero) blocks stay zeros.
pub(super) fn unsealed(
    cipher: Option<&BlockCipher>,
    vol: VolumeId,
    lba: u64,
    data: &mut [u8],
) -> Result<(), IoError> {
    match cipher {
        None => Ok(()),
        Some(c) => c.decrypt_written(lba, data).map_err(|e| {
            tracing::error!(volume = ?vol, error = %e, "decryption failed; the read fails");
            IoError::Failed
        }),
    }
}

/// The request for a read of `len` bytes at `offset` (whole blocks around
/// it).
pub(super) fn read_req(offset: u64, len: u64) -> ClientReq {
    let first = offset / BLOCK_SIZE;
    ClientReq::Read {
        lba: first,
        blocks: (offset + len).div_ceil(BLOCK_SIZE) - first,
    }
}

/// Copies a read's answer (whole blocks) into `buf`, after decryption.
pub(super) fn fill_read(
    cipher: Option<&BlockCipher>,
    vol: VolumeId,
    offset: u64,
    buf: &mut [u8],
    answer: ReqResult,
) -> Result<(), IoError> {
    let mut data = answer?.ok_or(IoError::Failed)?;
    unsealed(cipher, vol, offset / BLOCK_SIZE, &mut data)?;
    let at = (offset % BLOCK_SIZE) as usize;
    let src = data.get(at..at + buf.len()).ok_or(IoError::Failed)?;
    buf.copy_from_slice(src);
    Ok(())
}

fn whole_blocks(offset: u64, len: u64) -> bool {
    offset.is_multiple_of(BLOCK_SIZE) && len.is_multiple_of(BLOCK_SIZE)
}

impl ClusterVolume {
    pub(super) fn check(&self, offset: u64, len: u64) -> Result<(), IoError> {
        let size = self.size.load(Ordering::Relaxed);
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(IoError::OutOfRange { offset, len, size });
        }
        Ok(())
    }

    fn cipher(&self) -> Option<&BlockCipher> {
        self.cipher.as_deref()
    }

    /// The request for a write of whole blocks at `offset`, its data as it
    /// leaves this node (sealed for an encrypted volume).
    fn write_req(&self, offset: u64, data: &[u8], fua: bool) -> Result<ClientReq, IoError> {
        let lba = offset / BLOCK_SIZE;
        Ok(ClientReq::Write {
            lba,
            data: sealed(self.cipher(), self.vol, lba, data)?,
            fua,
        })
    }

    fn rmw(&self, inner: Arc<Inner>) -> Rmw {
        Rmw {
            inner,
            vol: self.vol,
            cipher: self.cipher.clone(),
        }
    }

    /// Writes `data` at a byte offset that need not be block aligned,
    /// waiting for it.
    fn write_unaligned(
        &self,
        inner: &Arc<Inner>,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), IoError> {
        let _guard = self.partial.lock();
        let at = (offset % BLOCK_SIZE) as usize;
        let mut patch = |plain: &[u8]| {
            let mut new = plain.to_vec();
            new.get_mut(at..at + data.len())?.copy_from_slice(data);
            Some(new)
        };
        self.rmw(Arc::clone(inner))
            .read_modify_write(offset, data.len() as u64, fua, &mut patch)?
            // Nothing written: the read was shorter than asked.
            .map_or(Ok(()), |_| Err(IoError::Failed))
    }

    /// [`BlockIo::submit`]; `ack` is passed on to the batch when it is the
    /// whole submission and all writes (a refused op or a partial write, a
    /// read-modify-write of its own after the batch, is answered outside
    /// it).
    fn run(&self, ops: &mut [DataOp<'_>], ack: Option<&Arc<dyn WriteAck>>) {
        let Some(inner) = self.inner.upgrade() else {
            for op in ops.iter_mut() {
                op.result = Err(gone());
            }
            return;
        };
        // Reads and whole-block writes go out together; partial writes one
        // at a time (read-modify-write), after them.
        let mut sent = Vec::new();
        let mut reqs = Vec::new();
        for (i, op) in ops.iter_mut().enumerate() {
            let (len, req) = match &op.kind {
                DataKind::Read(b) => (b.len() as u64, None),
                DataKind::Write(d) => (d.len() as u64, Some(d)),
            };
            if let Err(e) = self.check(op.offset, len) {
                op.result = Err(e);
                continue;
            }
            let req = match req {
                None => read_req(op.offset, len),
                Some(_) if !whole_blocks(op.offset, len) => continue,
                Some(d) => match self.write_req(op.offset, d, op.fua) {
                    Ok(req) => req,
                    Err(e) => {
                        op.result = Err(e);
                        continue;
                    }
                },
            };
            sent.push(i);
            reqs.push(req);
        }
        let whole =
            sent.len() == ops.len() && ops.iter().all(|op| matches!(op.kind, DataKind::Write(_)));
        let results = if reqs.is_empty() {
            Vec::new()
        } else {
            inner.execute(self.vol, reqs, ack.filter(|_| whole))
        };
        for (i, answer) in sent.into_iter().zip(results) {
            let op = &mut ops[i];
            let offset = op.offset;
            op.result = match &mut op.kind {
                DataKind::Read(buf) => fill_read(self.cipher(), self.vol, offset, buf, answer),
                DataKind::Write(_) => answer.map(|_| ()),
            };
        }
        for op in ops.iter_mut() {
            if let DataKind::Write(d) = &op.kind {
                let len = d.len() as u64;
                if !whole_blocks(op.offset, len) && self.check(op.offset, len).is_ok() {
                    op.result = self.write_unaligned(&inner, op.offset, d, op.fua);
                }
            }
        }
    }
}

impl BlockIo for ClusterVolume {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    fn submit(&self, ops: &mut [DataOp<'_>]) {
        self.run(ops, None);
    }

    fn submit_writes(&self, ops: &mut [DataOp<'_>], ack: &Arc<dyn WriteAck>) {
        self.run(ops, Some(ack));
    }

    fn start(&self, mut ops: Vec<OwnedOp>, done: OnComplete) {
        let Some(inner) = self.inner.upgrade() else {
            for op in ops.iter_mut() {
                op.result = Err(gone());
            }
            done(ops);
            return;
        };
        if ops
            .iter()
            .any(|op| op.write && !whole_blocks(op.offset, op.buf.len() as u64))
        {
            // A read-modify-write waits for its read: run the batch here.
            submit_owned(&mut ops, |data| self.run(data, None));
            done(ops);
            return;
        }
        let mut sent = Vec::with_capacity(ops.len());
        let mut reqs = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter_mut().enumerate() {
            let len = op.buf.len() as u64;
            if let Err(e) = self.check(op.offset, len) {
                op.result = Err(e);
                continue;
            }
            let req = if op.write {
                match self.write_req(op.offset, &op.buf, op.fua) {
                    Ok(req) => req,
                    Err(e) => {
                        op.result = Err(e);
                        continue;
                    }
                }
            } else {
                read_req(op.offset, len)
            };
            sent.push(i);
            reqs.push(req);
        }
        let (vol, cipher) = (self.vol, self.cipher.clone());
        inner.start_batch(
            self.vol,
            reqs,
            None,
            Box::new(move |results| {
                for (i, answer) in sent.into_iter().zip(results) {
                    let op = &mut ops[i];
                    op.result = if op.write {
                        answer.map(|_| ())
                    } else {
                        fill_read(cipher.as_deref(), vol, op.offset, &mut op.buf, answer)
                    };
                }
                done(ops);
            }),
        );
    }

    fn start_runs_disk_io(&self) -> bool {
        self.inner
            .upgrade()
            .is_some_and(|inner| inner.primary_is_local(self.vol))
    }

    fn flush(&self) -> Result<(), IoError> {
        let inner = self.inner.upgrade().ok_or_else(gone)?;
        inner
            .execute(self.vol, vec![ClientReq::Flush], None)
            .into_iter()
            .next()
            .unwrap_or(Err(IoError::Failed))
            .map(|_| ())
    }

    fn compare_and_write(
        &self,
        offset: u64,
        expect: &[u8],
        data: &[u8],
        fua: bool,
    ) -> Result<Option<Vec<u8>>, IoError> {
        let len = data.len() as u64;
        if expect.len() != data.len() {
            return Err(IoError::Failed);
        }
        self.check(offset, len)?;
        let inner = self.inner.upgrade().ok_or_else(gone)?;
        let at = (offset % BLOCK_SIZE) as usize;
        let mut update = |plain: &[u8]| {
            let range = plain.get(at..at + data.len())?;
            (range == expect).then(|| {
                let mut new = plain.to_vec();
                new[at..at + data.len()].copy_from_slice(data);
                new
            })
        };
        let current = self
            .rmw(inner)
            .read_modify_write(offset, len, fua, &mut update)?;
        match current {
            None => Ok(None),
            Some(plain) => plain
                .get(at..at + data.len())
                .map(|range| Some(range.to_vec()))
                .ok_or(IoError::Failed),
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), IoError> {
        self.check(offset, len)?;
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK as usize];
        let mut at = offset;
        let end = offset + len;
        while at < end {
            // Up to the next chunk boundary, so middle chunks are aligned.
            let n = (CHUNK - at % CHUNK).min(end - at);
            let mut op = [DataOp::write(at, &zeros[..n as usize], fua)];
            self.submit(&mut op);
            let [op] = op;
            op.result?;
            at += n;
        }
        Ok(())
    }
}
