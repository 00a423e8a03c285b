//! Read-modify-writes of replicated volumes: a write that is not whole
//! blocks, and SCSI's COMPARE AND WRITE. The node reads the blocks
//! around the range, makes their new content, and writes it with a
//! compare-and-write of what it read (`ClientReq::CompareWrite`: the
//! primary compares and writes at one point of the stream); if another
//! write changed the blocks in between, it reads again.
//!
//! Invariants:
//! - a block is written only if it still holds exactly the ciphertext
//!   read, so no write between the read and the write is lost, from any
//!   open on any node;
//! - a compare-and-write asked again after a failover may find its own
//!   first attempt's write: a read that returns exactly what the last
//!   round tried to write ends the loop as written;
//! - at most [`RMW_ROUNDS`] rounds, then the write fails (`Failed`).
//!
//! The calling thread waits for each round: event loops hand unaligned
//! requests to the reactor's offload pool (`basalt-loop-io`), so no loop
//! ever runs one.

use super::volume_io::{read_req, sealed, unsealed};
use super::Inner;
use basalt_replication::{ClientReq, CompareWritten, Payload, VolumeId};
use basalt_store::{IoError, BLOCK_SIZE};
use basalt_volume::BlockCipher;
use std::sync::Arc;

/// Rounds of read and conditional write before a read-modify-write gives
/// up: a round is lost only when another write changed the blocks between
/// the two, so the next read nearly always settles it.
const RMW_ROUNDS: usize = 64;

/// What to do with the blocks as read: their new plaintext, or nothing
/// (the plaintext as read is returned instead).
pub(super) type Update<'a> = dyn FnMut(&[u8]) -> Option<Vec<u8>> + 'a;

/// One volume's read-modify-writes, as the node's data path for it does
/// them.
pub(super) struct Rmw {
    pub(super) inner: Arc<Inner>,
    pub(super) vol: VolumeId,
    pub(super) cipher: Option<Arc<BlockCipher>>,
}

impl Rmw {
    /// Reads the blocks around `len` bytes at `offset` and writes what
    /// `update` makes of their plaintext if they still hold what was read,
    /// reading again if not; waits for the outcome. `update` returning
    /// None writes nothing: the blocks' plaintext as read is returned.
    pub(super) fn read_modify_write(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        update: &mut Update<'_>,
    ) -> Result<Option<Vec<u8>>, IoError> {
        let first = offset / BLOCK_SIZE;
        let blocks = (offset + len).div_ceil(BLOCK_SIZE) - first;
        let mut last: Option<Payload> = None;
        for _ in 0..RMW_ROUNDS {
            let read = self.execute(read_req(offset, len))?;
            let on_disk = read
                .filter(|d| d.len() as u64 == blocks * BLOCK_SIZE)
                .ok_or(IoError::Failed)?;
            if last.as_deref() == Some(&on_disk[..]) {
                return Ok(None);
            }
            let mut plain = on_disk.clone();
            unsealed(self.cipher.as_deref(), self.vol, first, &mut plain)?;
            let Some(new) = update(&plain) else {
                return Ok(Some(plain));
            };
            let new = sealed(self.cipher.as_deref(), self.vol, first, &new)?;
            let req = ClientReq::compare_write(first, &on_disk, &new, true, fua);
            let written = self
                .execute(req)?
                .as_deref()
                .and_then(CompareWritten::decode)
                .ok_or(IoError::Failed)?
                .written;
            if written {
                return Ok(None);
            }
            last = Some(new);
        }
        tracing::warn!(volume = ?self.vol, offset, len, "a read-modify-write lost {RMW_ROUNDS} rounds to other writes; it fails");
        Err(IoError::Failed)
    }

    /// Sends `req` to the volume's primary and waits for its answer.
    fn execute(&self, req: ClientReq) -> Result<Option<Vec<u8>>, IoError> {
        self.inner
            .execute(self.vol, vec![req], None)
            .into_iter()
            .next()
            .unwrap_or(Err(IoError::Failed))
    }
}
