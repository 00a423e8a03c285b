//! The export of a snapshot of a replicated encrypted volume from this
//! node's copy: the cluster wrote that copy as ciphertext (the node serving
//! the volume's clients encrypts before replicating), so its store holds no
//! key for it; the snapshot is read through the store and decrypted here
//! with the key of the volume's record.
//!
//! Invariants: read-only (every write is refused with `IoError::ReadOnly`);
//! a read is widened to whole blocks, and never-written (all-zero) blocks
//! read as zeros without decrypting.

use crate::handle::BlockIo;
use basalt_crypt::BlockCipher;
use basalt_store::{AlignedBuf, DataKind, DataOp, IoError, LocalVolume, BLOCK_SIZE};
use std::sync::Arc;

pub(crate) struct SealedSnapshot {
    pub(crate) local: LocalVolume,
    pub(crate) cipher: Arc<BlockCipher>,
}

impl SealedSnapshot {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let first = offset / BLOCK_SIZE;
        let end = (offset + buf.len() as u64).div_ceil(BLOCK_SIZE);
        let mut blocks = AlignedBuf::zeroed(((end - first) * BLOCK_SIZE) as usize);
        self.local.read(first * BLOCK_SIZE, &mut blocks)?;
        self.cipher
            .decrypt_written(first, &mut blocks)
            .map_err(|e| {
                tracing::error!(error = %e, "decryption failed; the read fails");
                IoError::Failed
            })?;
        let at = (offset - first * BLOCK_SIZE) as usize;
        buf.copy_from_slice(&blocks[at..at + buf.len()]);
        Ok(())
    }
}

impl BlockIo for SealedSnapshot {
    fn size(&self) -> u64 {
        self.local.size()
    }

    fn is_read_only(&self) -> bool {
        true
    }

    fn submit(&self, ops: &mut [DataOp<'_>]) {
        for op in ops.iter_mut() {
            let offset = op.offset;
            op.result = match &mut op.kind {
                DataKind::Read(buf) => self.read(offset, buf),
                DataKind::Write(_) => Err(IoError::ReadOnly),
            };
        }
    }

    fn flush(&self) -> Result<(), IoError> {
        Ok(())
    }

    fn write_zeroes(&self, _offset: u64, _len: u64, _fua: bool) -> Result<(), IoError> {
        Err(IoError::ReadOnly)
    }
}
