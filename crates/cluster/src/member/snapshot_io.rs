//! The export of a replicated volume's snapshot through a node that holds
//! no replica of it ([`BlockIo`]): reads become `ClientReq::ReadLayer`
//! requests to the volume's primary, which reads the snapshot's layer of
//! its copy, sent as one batch (`batches.rs`) and either waited for
//! (`submit`) or completed through a callback (`start`: event loops never
//! wait for the network). A node holding a replica exports the snapshot
//! from its own store instead (`basalt_volume`'s service).
//!
//! Invariants:
//! - read-only: every write is refused with `IoError::ReadOnly`;
//! - a read beyond the snapshot's size fails before anything is sent, and
//!   is widened to whole blocks;
//! - an encrypted volume's snapshot crosses the peer link as the
//!   ciphertext its replicas hold and is decrypted here, as the volume's
//!   reads are (`volume_io.rs`).

use super::volume_io::{fill_read, gone};
use super::Inner;
use basalt_replication::{ClientReq, LayerId, VolumeId};
use basalt_store::{DataKind, DataOp, IoError, BLOCK_SIZE};
use basalt_volume::{BlockCipher, BlockIo, OnComplete, OwnedOp};
use std::sync::{Arc, Weak};

pub(super) struct RemoteSnapshot {
    pub(super) inner: Weak<Inner>,
    pub(super) vol: VolumeId,
    pub(super) layer: LayerId,
    /// The snapshot's size (its volume's when it was taken).
    pub(super) size: u64,
    pub(super) cipher: Option<Arc<BlockCipher>>,
}

impl RemoteSnapshot {
    /// The request reading `len` bytes at `offset` (whole blocks around
    /// it), or why not: a write, or a range beyond the snapshot.
    fn request(&self, write: bool, offset: u64, len: u64) -> Result<ClientReq, IoError> {
        if write {
            return Err(IoError::ReadOnly);
        }
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(IoError::OutOfRange {
                offset,
                len,
                size: self.size,
            });
        }
        let lba = offset / BLOCK_SIZE;
        Ok(ClientReq::ReadLayer {
            layer: self.layer,
            lba,
            blocks: (offset + len).div_ceil(BLOCK_SIZE) - lba,
        })
    }

    /// The requests of a batch whose ops are `(write, offset, len)`: the
    /// indexes of the ops sent with their requests; `refuse(i, e)` for the
    /// others.
    fn requests(
        &self,
        ops: impl Iterator<Item = (bool, u64, u64)>,
        refuse: &mut dyn FnMut(usize, IoError),
    ) -> (Vec<usize>, Vec<ClientReq>) {
        let (mut sent, mut reqs) = (Vec::new(), Vec::new());
        for (i, (write, offset, len)) in ops.enumerate() {
            match self.request(write, offset, len) {
                Ok(req) => {
                    sent.push(i);
                    reqs.push(req);
                }
                Err(e) => refuse(i, e),
            }
        }
        (sent, reqs)
    }
}

impl BlockIo for RemoteSnapshot {
    fn size(&self) -> u64 {
        self.size
    }

    fn is_read_only(&self) -> bool {
        true
    }

    fn submit(&self, ops: &mut [DataOp<'_>]) {
        let Some(inner) = self.inner.upgrade() else {
            for op in ops.iter_mut() {
                op.result = Err(gone());
            }
            return;
        };
        let shape = ops.iter().map(|op| match &op.kind {
            DataKind::Write(d) => (true, op.offset, d.len() as u64),
            DataKind::Read(b) => (false, op.offset, b.len() as u64),
        });
        let mut refused = Vec::new();
        let (sent, reqs) = self.requests(shape, &mut |i, e| refused.push((i, e)));
        for (i, e) in refused {
            ops[i].result = Err(e);
        }
        if reqs.is_empty() {
            return;
        }
        let results = inner.execute(self.vol, reqs, None);
        for (i, answer) in sent.into_iter().zip(results) {
            let op = &mut ops[i];
            let offset = op.offset;
            if let DataKind::Read(buf) = &mut op.kind {
                op.result = fill_read(self.cipher.as_deref(), self.vol, offset, buf, answer);
            }
        }
    }

    fn start(&self, mut ops: Vec<OwnedOp>, done: OnComplete) {
        let Some(inner) = self.inner.upgrade() else {
            for op in ops.iter_mut() {
                op.result = Err(gone());
            }
            done(ops);
            return;
        };
        let shape = ops
            .iter()
            .map(|op| (op.write, op.offset, op.buf.len() as u64));
        let mut refused = Vec::new();
        let (sent, reqs) = self.requests(shape, &mut |i, e| refused.push((i, e)));
        for (i, e) in refused {
            ops[i].result = Err(e);
        }
        if reqs.is_empty() {
            done(ops);
            return;
        }
        let (vol, cipher) = (self.vol, self.cipher.clone());
        inner.start_batch(
            self.vol,
            reqs,
            None,
            Box::new(move |results| {
                for (i, answer) in sent.into_iter().zip(results) {
                    let op = &mut ops[i];
                    op.result = fill_read(cipher.as_deref(), vol, op.offset, &mut op.buf, answer);
                }
                done(ops);
            }),
        );
    }

    fn start_runs_disk_io(&self) -> bool {
        false
    }

    fn flush(&self) -> Result<(), IoError> {
        Ok(())
    }

    fn write_zeroes(&self, _offset: u64, _len: u64, _fua: bool) -> Result<(), IoError> {
        Err(IoError::ReadOnly)
    }
}
