//! The data path of a batch of block-aligned reads and writes, in two
//! phases so that whoever owns the device I/O can run it: `stage` plans the
//! batch against the volume's layer maps (lookups, allocations, checksums
//! of the data to write) and describes the device I/O it needs as
//! [`DevicePiece`]s; the caller runs those pieces — synchronously through
//! the store's `BlockDevice` (`LocalVolume::submit`), or on an event loop's
//! own io_uring — and hands their outcomes to [`StagedBatch::finish`],
//! which verifies what was read, records what was written and tells the
//! caller whether a commit must follow for the batch's FUA writes.
//!
//! Invariants:
//! - A `StagedBatch` holds the volume's map lock (and its ancestors')
//!   shared from `stage` until `finish` or drop, so no extent it targets
//!   can be unmapped and reused while its I/O is in flight. Dropping a
//!   staged batch without finishing it is only correct if none of its
//!   pieces was submitted (or all have completed).
//! - The pieces of a batch are ordered by op, and within an op by position
//!   in its buffer, and never overlap; a piece's buffer range lies inside
//!   its op's buffer. The buffers must not move between `stage` and
//!   `finish` (the caller owns them: heap buffers of a request).
//! - `finish` gets one result per piece, in piece order.
//! - [`LocalVolume::try_stage`] never blocks on a map lock: an event loop
//!   that holds other staged batches must not wait for a writer (a
//!   snapshot, a trim) that waits for those batches to finish.
//! - A read of a packed extent is a piece at a virtual offset
//!   ([`StagedBatch::has_packed`]): `run` decompresses it on the calling
//!   thread, so an event loop hands such a batch to its offload pool. A
//!   write to a packed extent stages nothing ([`StagedBatch::needs_unpack`]):
//!   the caller drops the batch unrun, unpacks (`LocalVolume::submit` does)
//!   and stages again.
//! - An encrypted volume's writes reach the device only as ciphertext:
//!   staging encrypts each write piece into a buffer of the batch
//!   ([`StagedBatch::write_data`]), and checksums cover that ciphertext;
//!   `finish` decrypts what was read after verifying it. A block that is
//!   all zeros on the device was never written through the cipher (a
//!   fresh extent, a zeroed range) and reads as zeros without decrypting;
//!   a written block is never all zeros (the chance that a block's
//!   ciphertext is, is 2^-32768), so written zeros stay data. A read piece
//!   is decrypted with the key of the layer it reads from: the volume's,
//!   unless it was re-encrypted and the piece comes from an older layer
//!   (`keys.rs`); a piece never spans two layers (it reads one extent).

use crate::buf::AlignedBuf;
use crate::device::IoOp;
use crate::error::IoError;
use crate::integrity::WriteSample;
use crate::layer_map::{resolve_layer, stack_states, LayerGuard, VolumeState};
use crate::volume::{check_range, DataKind, DataOp, LocalVolume};
use crate::BLOCK_SIZE;
use basalt_crypt::BlockCipher;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

/// One device I/O of a staged batch: `len` bytes at `device_offset`, read
/// into or written from bytes `start..start + len` of op `op`'s buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePiece {
    pub op: usize,
    pub start: usize,
    pub len: usize,
    pub device_offset: u64,
    pub write: bool,
    /// A write the device must make durable before completing it.
    pub fua: bool,
}

/// A map lock could not be taken without waiting: retry the batch later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contended;

/// A batch planned against the volume's maps, its device I/O not yet done.
pub struct StagedBatch {
    volume: LocalVolume,
    _map: LayerGuard,
    _ancestors: Vec<LayerGuard>,
    layered: bool,
    pieces: Vec<DevicePiece>,
    /// With data checksums, for each piece: where its blocks' checksums
    /// (writes) or write samples (reads) start.
    checks_at: Vec<usize>,
    crcs: Vec<u32>,
    samples: Vec<WriteSample>,
    /// Ops that failed while staging (allocation, range).
    failed: Vec<(usize, IoError)>,
    /// An encrypted volume's cipher.
    cipher: Option<Arc<BlockCipher>>,
    /// Of a stack whose layers have different keys: each layer's cipher
    /// (`stack_states` order), and each piece's (reads: its layer's).
    /// Both empty otherwise: every piece uses `cipher`.
    layer_ciphers: Vec<Option<Arc<BlockCipher>>>,
    piece_ciphers: Vec<Option<Arc<BlockCipher>>>,
    /// With a cipher, for each piece: a write's ciphertext (`None` for a
    /// read). Empty without one.
    sealed: Vec<Option<AlignedBuf>>,
    fua_wanted: bool,
    /// The FUA writes need a commit: metadata was pending when staged.
    commit_after: bool,
    /// Some piece reads a packed extent.
    has_packed: bool,
    /// A write reaches a packed extent: the batch must not be run.
    needs_unpack: bool,
    /// Errors of packed pieces run by `run` (by piece), for `finish`.
    packed_errors: parking_lot::Mutex<Vec<(usize, IoError)>>,
    finished: bool,
}

impl LocalVolume {
    /// Stages a batch, waiting for the map locks if need be. Sets the
    /// result of every op that fails before reaching the device (out of
    /// range, volume gone, read-only); unaligned ops are left untouched
    /// (`Ok`, no pieces) for the caller to run as read-modify-writes.
    /// `None`: nothing is left to do for the batch.
    pub fn stage(&self, ops: &mut [DataOp<'_>]) -> Option<StagedBatch> {
        self.stage_locked(ops, true).ok().flatten()
    }

    /// [`LocalVolume::stage`] without waiting: `Err(Contended)` when a map
    /// lock is held or wanted exclusively; the ops are then untouched.
    pub fn try_stage(&self, ops: &mut [DataOp<'_>]) -> Result<Option<StagedBatch>, Contended> {
        self.stage_locked(ops, false)
    }

    pub(crate) fn stage_locked(
        &self,
        ops: &mut [DataOp<'_>],
        wait: bool,
    ) -> Result<Option<StagedBatch>, Contended> {
        let store = self.store();
        let vol = self.state();
        let map = if wait {
            vol.map.read_arc()
        } else {
            vol.map.try_read_arc().ok_or(Contended)?
        };
        let ancestors = if wait {
            VolumeState::lock_ancestors(&map)
        } else {
            VolumeState::try_lock_ancestors(&map).ok_or(Contended)?
        };
        let size = vol.size();
        for op in ops.iter_mut() {
            op.result = check_range(op.offset, op.len(), size);
        }
        if vol.is_deleted() {
            for op in ops.iter_mut() {
                op.result = Err(IoError::Gone);
            }
            return Ok(None);
        }
        let cipher = match store.cipher_of(vol) {
            Ok(c) => c,
            Err(e) => {
                // Opening refuses a locked volume; a handle never sees one.
                tracing::error!(volume = %vol.id, error = %e, "I/O to a locked volume refused");
                for op in ops.iter_mut() {
                    op.result = Err(IoError::Failed);
                }
                return Ok(None);
            }
        };
        let layer_ciphers = if ancestors.is_empty() || !store.stacks_may_mix_keys() {
            Ok(Vec::new())
        } else {
            store.stack_ciphers(&stack_states(vol, &map, &ancestors), &cipher)
        };
        let layer_ciphers = match layer_ciphers {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(volume = %vol.id, error = %e, "I/O through a locked snapshot refused");
                for op in ops.iter_mut() {
                    op.result = Err(IoError::Failed);
                }
                return Ok(None);
            }
        };
        let writes = ops.iter().any(|o| matches!(o.kind, DataKind::Write(_)));
        if writes && (vol.is_snapshot() || store.check_usable().is_err()) {
            let snapshot = vol.is_snapshot();
            for op in ops.iter_mut() {
                op.result = Err(if snapshot {
                    IoError::ReadOnly
                } else {
                    IoError::Failed
                });
            }
            return Ok(None);
        }
        let es = store.extent_size();
        let layout = store.layout;
        let layered = !ancestors.is_empty();
        let sums = store.checksums.as_ref();
        let bs = BLOCK_SIZE as usize;
        let mut batch = StagedBatch {
            volume: self.clone(),
            layered,
            pieces: Vec::with_capacity(ops.len()),
            checks_at: Vec::new(),
            crcs: Vec::new(),
            samples: Vec::new(),
            failed: Vec::new(),
            cipher,
            layer_ciphers,
            piece_ciphers: Vec::new(),
            sealed: Vec::new(),
            fua_wanted: false,
            commit_after: false,
            has_packed: false,
            needs_unpack: false,
            packed_errors: parking_lot::Mutex::new(Vec::new()),
            finished: false,
            _map: map,
            _ancestors: ancestors,
        };
        let map = &*batch._map;
        for (i, op) in ops.iter_mut().enumerate() {
            if op.result.is_err() || !op.is_aligned() || op.is_empty() {
                continue;
            }
            let DataOp {
                offset, kind, fua, ..
            } = op;
            let mut off = *offset;
            let mut start = 0usize;
            match kind {
                DataKind::Read(buf) => {
                    let mut rest: &mut [u8] = buf;
                    while !rest.is_empty() {
                        let within = off % es;
                        let logical = (off / es) as usize;
                        // A run of blocks that read from one place: a
                        // whole extent's piece, or (layered) the blocks
                        // that resolve to consecutive device offsets.
                        let mut n = ((es - within) as usize).min(rest.len());
                        let (at, layer) = if layered {
                            let ancestors = &batch._ancestors;
                            let first = resolve_layer(store, map, ancestors, logical, within);
                            let mut run = bs;
                            while run < n {
                                let next = resolve_layer(
                                    store,
                                    map,
                                    ancestors,
                                    logical,
                                    within + run as u64,
                                );
                                // Contiguous on the device: one extent, so
                                // one layer.
                                let contiguous = match (first, next) {
                                    (Some((a, _)), Some((b, _))) => b == a + run as u64,
                                    (None, None) => true,
                                    _ => false,
                                };
                                if !contiguous {
                                    break;
                                }
                                run += bs;
                            }
                            n = run;
                            (first.map(|(at, _)| at), first.map_or(0, |(_, k)| k))
                        } else {
                            let at = map
                                .phys(logical)
                                .map(|phys| layout.extent_offset(phys) + within);
                            (at, 0)
                        };
                        let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
                        rest = tail;
                        match at {
                            Some(at) => {
                                // Verified by its run's own checksums.
                                let packed = at >= layout.virtual_base();
                                batch.has_packed |= packed;
                                if let Some(sums) = sums {
                                    batch.checks_at.push(batch.samples.len());
                                    let blocks = n as u64 / BLOCK_SIZE;
                                    if !packed {
                                        sums.sample_blocks(
                                            layout.data_block_at(at),
                                            blocks,
                                            &mut batch.samples,
                                        );
                                    }
                                }
                                batch.pieces.push(DevicePiece {
                                    op: i,
                                    start,
                                    len: n,
                                    device_offset: at,
                                    write: false,
                                    fua: false,
                                });
                                if batch.cipher.is_some() {
                                    batch.sealed.push(None);
                                }
                                if !batch.layer_ciphers.is_empty() {
                                    let c = batch.layer_ciphers.get(layer).cloned().flatten();
                                    batch.piece_ciphers.push(c);
                                }
                            }
                            None => piece.fill(0),
                        }
                        off += n as u64;
                        start += n;
                    }
                }
                DataKind::Write(data) => {
                    batch.fua_wanted |= *fua;
                    let mut rest: &[u8] = data;
                    while !rest.is_empty() {
                        let within = off % es;
                        let n = ((es - within) as usize).min(rest.len());
                        let (piece, tail) = rest.split_at(n);
                        rest = tail;
                        let logical = (off / es) as u32;
                        let phys = match map.get(logical as usize) {
                            Some(entry) => match entry.get() {
                                Some(p) if layout.is_virtual(p) => {
                                    batch.needs_unpack = true;
                                    break;
                                }
                                Some(p) => store.heat(p).map(|()| p).map_err(IoError::from),
                                None => store
                                    .allocate(vol, map.slot, logical, entry)
                                    .map_err(IoError::from),
                            },
                            None => Err(IoError::OutOfRange {
                                offset: off,
                                len: n as u64,
                                size: vol.size(),
                            }),
                        };
                        match phys {
                            Ok(phys) => {
                                let at = layout.extent_offset(phys) + within;
                                let sealed = match batch.cipher.as_ref().map(|c| {
                                    let mut b = AlignedBuf::zeroed(n);
                                    b.copy_from_slice(piece);
                                    c.encrypt(off / BLOCK_SIZE, &mut b).map(|()| b)
                                }) {
                                    None => None,
                                    Some(Ok(b)) => Some(b),
                                    Some(Err(e)) => {
                                        tracing::error!(volume = %vol.id, error = %e, "encryption failed; the write fails");
                                        batch.failed.push((i, IoError::Failed));
                                        break;
                                    }
                                };
                                if let Some(sums) = sums {
                                    batch.checks_at.push(batch.crcs.len());
                                    sums.begin_writes(
                                        layout.data_block_at(at),
                                        sealed.as_deref().unwrap_or(piece),
                                        &mut batch.crcs,
                                    );
                                }
                                if batch.cipher.is_some() {
                                    batch.sealed.push(sealed);
                                }
                                if !batch.layer_ciphers.is_empty() {
                                    batch.piece_ciphers.push(batch.cipher.clone());
                                }
                                batch.pieces.push(DevicePiece {
                                    op: i,
                                    start,
                                    len: n,
                                    device_offset: at,
                                    write: true,
                                    fua: *fua,
                                });
                            }
                            Err(e) => {
                                batch.failed.push((i, e));
                                break;
                            }
                        }
                        off += n as u64;
                        start += n;
                    }
                }
            }
        }
        // A FUA write needs its mapping durable too: if metadata is queued,
        // write normally and commit; otherwise let the device do FUA.
        batch.commit_after = batch.fua_wanted && store.metadata_pending();
        if batch.commit_after {
            for piece in &mut batch.pieces {
                piece.fua = false;
            }
        }
        Ok(Some(batch))
    }

    /// Whether writing `[offset, offset + len)` would first wait for
    /// metadata to be made durable: an extent to allocate, or one to mark
    /// hot (a commit). An event loop runs such a write elsewhere rather
    /// than stall. Unknown (a map lock contended, out of range): `false`,
    /// and staging says so itself.
    pub fn write_needs_commit(&self, offset: u64, len: u64) -> bool {
        let store = self.store();
        let Some(map) = self.state().map.try_read() else {
            return false;
        };
        let es = store.extent_size();
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if len == 0 {
            return false;
        }
        (offset / es..=(end - 1) / es).any(|logical| match map.get(logical as usize) {
            Some(entry) => match entry.get() {
                Some(phys) => !store.is_hot(phys),
                None => true,
            },
            None => false,
        })
    }

    /// A descriptor of the store's device that an event loop may submit
    /// the pieces of staged batches to with its own io_uring (buffers
    /// aligned to 4 KiB); `None`: run them with [`StagedBatch::run`].
    pub fn ring_fd(&self) -> Option<RawFd> {
        self.store().device.ring_fd()
    }

    /// After a batch whose [`StagedBatch::finish`] asked for a commit:
    /// commits, and fails the FUA writes if the commit failed.
    pub fn commit_fua_writes(&self, ops: &mut [DataOp<'_>]) {
        if let Err(e) = self.flush() {
            fail_fua_writes(ops, &e);
        }
    }
}

/// Records a failed commit on every FUA write of a batch that succeeded.
pub fn fail_fua_writes(ops: &mut [DataOp<'_>], err: &IoError) {
    for op in ops
        .iter_mut()
        .filter(|o| o.fua && matches!(o.kind, DataKind::Write(_)))
    {
        if op.result.is_ok() {
            op.result = Err(err.duplicate());
        }
    }
}

impl StagedBatch {
    /// The device I/O the batch needs, in order.
    pub fn pieces(&self) -> &[DevicePiece] {
        &self.pieces
    }

    /// Some piece reads a packed extent: only [`StagedBatch::run`] can run
    /// the batch (it decompresses on the calling thread).
    pub fn has_packed(&self) -> bool {
        self.has_packed
    }

    /// A write reaches a packed extent: drop the batch unrun, have the
    /// extent unpacked (`LocalVolume::submit` does both) and stage again.
    pub fn needs_unpack(&self) -> bool {
        self.needs_unpack
    }

    /// The cipher piece `k`'s blocks are sealed with on the device.
    fn piece_cipher(&self, k: usize) -> Option<&BlockCipher> {
        if self.layer_ciphers.is_empty() {
            self.cipher.as_deref()
        } else {
            self.piece_ciphers.get(k).and_then(|c| c.as_deref())
        }
    }

    fn is_packed(&self, piece: &DevicePiece) -> bool {
        !piece.write && piece.device_offset >= self.volume.store().layout.virtual_base()
    }

    /// What write piece `k` writes to the device, given its op's data:
    /// that data's bytes, or for an encrypted volume their ciphertext,
    /// which the batch holds (unmoved on the heap) until dropped.
    pub fn write_data<'b>(&'b self, k: usize, data: &'b [u8]) -> &'b [u8] {
        let p = &self.pieces[k];
        match self.sealed.get(k) {
            Some(Some(sealed)) => sealed,
            _ => &data[p.start..p.start + p.len],
        }
    }

    /// The pieces as device ops over the ops' buffers (the batch must have
    /// been staged from these `ops`); a batch with packed pieces has none.
    pub fn device_ios<'a>(&'a self, ops: &'a mut [DataOp<'_>]) -> Vec<IoOp<'a>> {
        if self.has_packed {
            return Vec::new();
        }
        let mut ios = Vec::with_capacity(self.pieces.len());
        let mut pieces = self.pieces.iter().enumerate().peekable();
        for (i, op) in ops.iter_mut().enumerate() {
            let mut pos = 0usize;
            match &mut op.kind {
                DataKind::Read(buf) => {
                    let mut rest: &mut [u8] = buf;
                    while let Some((_, p)) = pieces.next_if(|(_, p)| p.op == i) {
                        let skip = p.start.saturating_sub(pos);
                        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
                        let (piece, tail) = tail.split_at_mut(p.len);
                        rest = tail;
                        pos = p.start + p.len;
                        ios.push(IoOp::read(p.device_offset, piece));
                    }
                }
                DataKind::Write(data) => {
                    let data: &[u8] = data;
                    while let Some((k, p)) = pieces.next_if(|(_, p)| p.op == i) {
                        let piece = self.write_data(k, data);
                        ios.push(IoOp::write(p.device_offset, piece, p.fua));
                    }
                }
            }
        }
        ios
    }

    /// Runs the pieces through the store's device on this thread; their
    /// outcomes, for [`StagedBatch::finish`].
    pub fn run(&self, ops: &mut [DataOp<'_>]) -> Vec<io::Result<()>> {
        if self.has_packed {
            return self.run_one_by_one(ops);
        }
        let mut ios = self.device_ios(ops);
        self.volume.store().device.submit(&mut ios);
        ios.into_iter().map(|io| io.result).collect()
    }

    /// `run` for a batch reading packed extents: piece after piece, packed
    /// ones decompressed (their errors kept for `finish`).
    fn run_one_by_one(&self, ops: &mut [DataOp<'_>]) -> Vec<io::Result<()>> {
        let store = self.volume.store();
        let layout = store.layout;
        let es = layout.extent_size as u64;
        let mut out = Vec::with_capacity(self.pieces.len());
        for (k, p) in self.pieces.iter().enumerate() {
            let Some(op) = ops.get_mut(p.op) else {
                out.push(Err(io::Error::other("no such op")));
                continue;
            };
            let result = match &mut op.kind {
                DataKind::Read(buf) => {
                    let span = &mut buf[p.start..p.start + p.len];
                    if self.is_packed(p) {
                        let rel = p.device_offset - layout.data_offset;
                        store
                            .read_packed((rel / es) as u32, rel % es, span, self.piece_cipher(k))
                            .map_err(|e| {
                                self.packed_errors.lock().push((k, e));
                                io::Error::other("packed extent read failed")
                            })
                    } else {
                        store.device.read_at(span, p.device_offset)
                    }
                }
                DataKind::Write(data) => {
                    store
                        .device
                        .write_at(self.write_data(k, data), p.device_offset, p.fua)
                }
            };
            out.push(result);
        }
        out
    }

    /// Runs piece `k` alone through the store's device on this thread (to
    /// finish one the ring completed short); its outcome.
    pub fn run_piece(&self, ops: &mut [DataOp<'_>], k: usize) -> io::Result<()> {
        if self.has_packed {
            return Err(io::Error::other(
                "a batch reading packed extents runs whole",
            ));
        }
        let mut ios = self.device_ios(ops);
        if k >= ios.len() {
            return Err(io::Error::other("no such piece"));
        }
        let mut one = [ios.swap_remove(k)];
        self.volume.store().device.submit(&mut one);
        let [io] = one;
        io.result
    }

    /// Completes the batch with its pieces' outcomes (one per piece, in
    /// order): checks what was read against its checksums, records what
    /// was written, and stores every op's result. Returns whether the
    /// caller must now commit for the FUA writes
    /// ([`LocalVolume::commit_fua_writes`], or a flush whose error goes to
    /// [`fail_fua_writes`]).
    pub fn finish(
        mut self,
        ops: &mut [DataOp<'_>],
        results: impl IntoIterator<Item = io::Result<()>>,
    ) -> bool {
        let store = self.volume.store().clone();
        let layout = store.layout;
        let sums = store.checksums.as_ref();
        let mut present = Vec::new();
        let mut results = results.into_iter();
        for (k, piece) in self.pieces.iter().enumerate() {
            let mut result = results
                .next()
                .unwrap_or_else(|| Err(io::Error::other("device I/O was not run")))
                .map_err(IoError::Io);
            let blocks = piece.len / BLOCK_SIZE as usize;
            let first = layout.data_block_at(piece.device_offset);
            let packed = self.is_packed(piece);
            if packed && result.is_err() {
                let mut errors = self.packed_errors.lock();
                if let Some(i) = errors.iter().position(|(at, _)| *at == k) {
                    result = Err(errors.swap_remove(i).1);
                }
            }
            if let (Some(sums), false) = (sums, packed) {
                let at = self.checks_at[k];
                if piece.write {
                    sums.end_writes(first, &self.crcs[at..at + blocks], result.is_ok());
                } else if result.is_ok() {
                    if let Some(DataKind::Read(buf)) = ops.get_mut(piece.op).map(|o| &mut o.kind) {
                        let mine = &self.samples[at..at + blocks];
                        let buf = &mut buf[piece.start..piece.start + piece.len];
                        result = store.verify_read(sums, piece.device_offset, buf, mine);
                    }
                }
            }
            if let (Some(cipher), false, true) = (self.piece_cipher(k), piece.write, result.is_ok())
            {
                if let Some(op) = ops.get_mut(piece.op) {
                    let first = (op.offset + piece.start as u64) / BLOCK_SIZE;
                    if let DataKind::Read(buf) = &mut op.kind {
                        let span = &mut buf[piece.start..piece.start + piece.len];
                        if let Err(e) = cipher.decrypt_written(first, span) {
                            tracing::error!(error = %e, "decryption failed; the read fails");
                            result = Err(IoError::Failed);
                        }
                    }
                }
            }
            if self.layered && result.is_ok() && piece.write {
                if let Some(presence) = &store.presence {
                    presence.mark(first, blocks as u64, &mut present);
                }
            }
            if let Err(e) = result {
                self.failed.push((piece.op, e));
            }
        }
        // Queued before the map lock is released: a snapshot (which takes
        // it exclusively) then commits these blocks' presence with itself.
        if !present.is_empty() {
            let mut m = store.meta.lock();
            for e in present {
                m.push(e);
            }
            self.commit_after |= self.fua_wanted;
        }
        let commit_after = self.commit_after;
        let failed = std::mem::take(&mut self.failed);
        self.finished = true;
        drop(self);
        for (i, e) in failed {
            if let Some(op) = ops.get_mut(i) {
                if op.result.is_ok() {
                    op.result = Err(e);
                }
            }
        }
        commit_after
    }
}

impl Drop for StagedBatch {
    /// A batch dropped unfinished (its caller gave up before submitting)
    /// must not leave its blocks' checksums marked as being written.
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let store = self.volume.store();
        if let Some(sums) = store.checksums.as_ref() {
            for (k, piece) in self.pieces.iter().enumerate().filter(|(_, p)| p.write) {
                let at = self.checks_at[k];
                let blocks = piece.len / BLOCK_SIZE as usize;
                let first = store.layout.data_block_at(piece.device_offset);
                sums.end_writes(first, &self.crcs[at..at + blocks], false);
            }
        }
    }
}
