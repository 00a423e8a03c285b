//! Opening a store: the superblock, the tables (each entry verified, a bad
//! one quarantined rather than trusted), the journal replay of this epoch,
//! the in-place upgrade of a version-1 store, the data checksums, and the
//! runtime structures (volume maps, free and dirty extents) built from the
//! result.
//!
//! Invariants: nothing here writes except `upgrade_v1`, which leaves the
//! version-1 superblock authoritative until every table page is rewritten
//! and flushed, so an upgrade interrupted at any point is simply done again,
//! and `load_checksums`, which rewrites only checksum pages that failed to
//! verify (with values recomputed from the data they cover); an entry that
//! fails to verify is never read as a valid owner or as free.

use crate::alloc::FreeExtents;
use crate::buf::AlignedBuf;
use crate::device::{BlockDevice, IoOp};
use crate::engine::{write_dirty_pages, write_superblock};
use crate::error::StoreError;
use crate::format::{decode_checksum_page, CHECKSUMS_PER_PAGE, CHECKSUM_UNKNOWN};
use crate::format::{
    decode_journal_block, decode_journal_block_v1, ExtentState, FormatError, JournalBlock,
    JournalEntry, Layout, SlotState, Superblock, EXTENT_ENTRY_SIZE, PAGE, SUPERBLOCK_COPIES,
    VOLUME_SLOT_SIZE,
};
use crate::format::{decode_presence_sector, PRESENCE_SECTOR, PRESENCE_WORDS_PER_SECTOR};
use crate::format::{decode_virtual_entry, RunLoc, VIRTUAL_ENTRY_SIZE};
use crate::integrity::{zero_block_crc, DataChecksums};
use crate::intent::{write_pages, Intent};
use crate::layer_map::{LayerMap, VolumeState};
use crate::meta::MetaState;
use crate::VolumeId;
use std::collections::HashMap;
use std::sync::Arc;

fn read_region(device: &dyn BlockDevice, offset: u64, len: u64) -> Result<AlignedBuf, StoreError> {
    let mut buf = AlignedBuf::zeroed(len as usize);
    const CHUNK: usize = 8 << 20;
    let mut ops: Vec<IoOp<'_>> = buf
        .chunks_mut(CHUNK)
        .enumerate()
        .map(|(i, c)| IoOp::read(offset + (i * CHUNK) as u64, c))
        .collect();
    device.submit(&mut ops);
    for op in ops {
        op.result?;
    }
    Ok(buf)
}

/// The valid superblock copy with the highest generation, of either version.
pub(crate) fn read_superblock(device: &dyn BlockDevice) -> Result<Superblock, StoreError> {
    let mut page = AlignedBuf::zeroed(PAGE as usize);
    let mut best: Option<Superblock> = None;
    let mut first_err: Option<FormatError> = None;
    for at in SUPERBLOCK_COPIES {
        device.read_at(&mut page, at)?;
        match Superblock::decode(&page) {
            Ok(sb) => {
                if best.as_ref().is_none_or(|b| sb.generation > b.generation) {
                    best = Some(sb);
                }
            }
            Err(e) => {
                // A newer format in either copy must refuse, not fall back.
                if matches!(
                    e,
                    FormatError::UnsupportedVersion { .. } | FormatError::UnknownFeatures(_)
                ) {
                    return Err(StoreError::Format(e.to_string()));
                }
                first_err.get_or_insert(e);
            }
        }
    }
    best.ok_or_else(|| StoreError::Format(first_err.map(|e| e.to_string()).unwrap_or_default()))
}

/// The tables as read, with entries that failed to verify quarantined (and
/// their pages marked, so the quarantine is written back).
struct Tables {
    state: MetaState,
    quarantined_extents: u64,
    quarantined_slots: u64,
    bad_presence_sectors: u64,
}

/// Reads the presence region into `state`. A sector that fails to verify
/// (never left by a stop: sectors are written whole) is taken as all
/// present, so a layered block is read from its own layer rather than
/// silently from an older one, and is rewritten at the next checkpoint.
fn read_presence(device: &dyn BlockDevice, state: &mut MetaState) -> Result<u64, StoreError> {
    let layout = state.layout;
    if !layout.has_layers() {
        return Ok(0);
    }
    let region = read_region(device, layout.presence_offset, layout.presence_len())?;
    let mut bad = 0u64;
    for sector in 0..layout.presence_sectors {
        let at = sector as usize * PRESENCE_SECTOR;
        let words = sector as usize * PRESENCE_WORDS_PER_SECTOR;
        let out = &mut state.presence[words..words + PRESENCE_WORDS_PER_SECTOR];
        match decode_presence_sector(sector, &region[at..at + PRESENCE_SECTOR]) {
            Some(w) => out.copy_from_slice(&w),
            None => {
                if bad < 16 {
                    tracing::error!(
                        sector,
                        "presence sector fails its checksum; the layered blocks it covers are taken as present"
                    );
                }
                bad += 1;
                out.fill(u64::MAX);
                state
                    .dirty_presence_pages
                    .insert(sector * PRESENCE_SECTOR as u64 / PAGE);
            }
        }
    }
    Ok(bad)
}

/// Decodes `count` table entries of `size` bytes each from `table`; an
/// entry that fails to verify becomes `quarantined`, and its index is
/// returned with the others.
fn decode_entries<T: Clone>(
    table: &[u8],
    count: u32,
    size: u64,
    quarantined: T,
    decode: fn(u32, &[u8]) -> Option<T>,
) -> (Vec<T>, Vec<u32>) {
    let mut bad = Vec::new();
    let entries = (0..count)
        .map(|i| {
            decode(i, &table[i as usize * size as usize..]).unwrap_or_else(|| {
                bad.push(i);
                quarantined.clone()
            })
        })
        .collect();
    (entries, bad)
}

fn read_tables(
    device: &dyn BlockDevice,
    layout: Layout,
    any_version: bool,
) -> Result<Tables, StoreError> {
    let vt = read_region(
        device,
        layout.volume_table_offset,
        layout.volume_table_pages() * PAGE,
    )?;
    let et = read_region(
        device,
        layout.extent_table_offset,
        layout.extent_table_pages() * PAGE,
    )?;
    let (slots, bad_slots) = decode_entries(
        &vt,
        layout.volume_slots,
        VOLUME_SLOT_SIZE,
        SlotState::Quarantined,
        if any_version {
            SlotState::decode_any
        } else {
            SlotState::decode
        },
    );
    let (extents, bad_extents) = decode_entries(
        &et,
        layout.extent_count,
        EXTENT_ENTRY_SIZE,
        ExtentState::QUARANTINED,
        if any_version {
            ExtentState::decode_any
        } else {
            ExtentState::decode
        },
    );
    let (mut extents, mut bad_extents) = (extents, bad_extents);
    let mut runs = Vec::with_capacity(layout.virtual_extents as usize);
    if layout.has_packed() {
        let vt = read_region(
            device,
            layout.virtual_offset,
            layout.virtual_table_pages() * PAGE,
        )?;
        let size = VIRTUAL_ENTRY_SIZE as usize;
        for i in 0..layout.virtual_extents as usize {
            let virt = layout.extent_count + i as u32;
            match decode_virtual_entry(virt, &vt[i * size..(i + 1) * size]) {
                Some((e, run)) => {
                    extents.push(e);
                    runs.push(run);
                }
                None => {
                    extents.push(ExtentState::QUARANTINED);
                    runs.push(RunLoc::default());
                    bad_extents.push(virt);
                }
            }
        }
    }
    let mut state = MetaState::new(layout, extents, runs, slots);
    let bad_presence_sectors = read_presence(device, &mut state)?;
    for &i in &bad_slots {
        tracing::error!(slot = i + 1, "volume table entry fails its checksum; quarantined (the slot is not reused and its extents are kept)");
        state
            .dirty_slot_pages
            .insert(i as u64 * VOLUME_SLOT_SIZE / PAGE);
    }
    for (n, &p) in bad_extents.iter().enumerate() {
        if n < 16 {
            tracing::error!(
                extent = p,
                "extent table entry fails its checksum; quarantined (never reused)"
            );
        }
        state.mark_extent_dirty(p);
    }
    if bad_extents.len() > 16 {
        tracing::error!(
            count = bad_extents.len(),
            "extent table entries quarantined in all"
        );
    }
    Ok(Tables {
        state,
        quarantined_extents: bad_extents.len() as u64,
        quarantined_slots: bad_slots.len() as u64,
        bad_presence_sectors,
    })
}

/// Applies the journal from the superblock's tail until the first block
/// that is not of this store, sequence and epoch; returns the head and the
/// number of entries applied. The ring is read in one pass (at most 64 MiB).
fn replay(
    device: &dyn BlockDevice,
    sb: &Superblock,
    state: &mut MetaState,
) -> Result<(u64, u64), StoreError> {
    let layout = sb.layout;
    let ring = read_region(device, layout.journal_offset, layout.journal_blocks * PAGE)?;
    let block_at = |seq: u64| {
        let at = ((seq % layout.journal_blocks) * PAGE) as usize;
        &ring[at..at + PAGE as usize]
    };
    let decode = |seq: u64| {
        if sb.version == 1 {
            decode_journal_block_v1(sb.store_id, seq, block_at(seq))
        } else {
            decode_journal_block(sb.store_id, sb.journal_epoch, seq, block_at(seq))
        }
        .map_err(|e| StoreError::Format(e.to_string()))
    };
    let end = sb.journal_tail_seq + layout.journal_blocks;
    let mut seq = sb.journal_tail_seq;
    let mut replayed = 0u64;
    let mut freed = Vec::new();
    while seq < end {
        let Some(JournalBlock { entries, .. }) = decode(seq)? else {
            break;
        };
        for e in &entries {
            state
                .apply(e, &mut freed)
                .map_err(|m| StoreError::Format(format!("corrupt journal block {seq}: {m}")))?;
        }
        replayed += entries.len() as u64;
        seq += 1;
    }
    // A crash can only tear the last commit. If a block of a later commit
    // verifies, the block replay stopped at was durable once and has been
    // corrupted since: stopping there would silently drop acknowledged
    // changes, so the open is refused. (Version 1 blocks do not say which
    // commit wrote them.)
    if sb.version >= 2 {
        for later in seq + 1..end {
            if let Ok(Some(block)) = decode(later) {
                if block.commit_first > seq {
                    return Err(StoreError::Format(format!(
                        "journal block {seq} (at byte {}) fails its checksum, but block {later} of a \
                         later commit verifies: the journal was corrupted after it was written, not \
                         torn by a crash; refusing to open rather than lose acknowledged changes",
                        layout.journal_block_offset(seq)
                    )));
                }
            }
        }
    }
    Ok((seq, replayed))
}

/// A version-2 store's journaled state after replay.
pub(crate) struct Loaded {
    pub state: MetaState,
    pub head_seq: u64,
    pub replayed_entries: u64,
    pub quarantined_extents: u64,
    pub quarantined_slots: u64,
    pub bad_presence_sectors: u64,
}

pub(crate) fn load(device: &dyn BlockDevice, sb: &Superblock) -> Result<Loaded, StoreError> {
    let tables = read_tables(device, sb.layout, false)?;
    let mut state = tables.state;
    let (head_seq, replayed_entries) = replay(device, sb, &mut state)?;
    Ok(Loaded {
        state,
        head_seq,
        replayed_entries,
        quarantined_extents: tables.quarantined_extents,
        quarantined_slots: tables.quarantined_slots,
        bad_presence_sectors: tables.bad_presence_sectors,
    })
}

/// What an upgrade of this device would do (or did), for a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreInfo {
    pub version: u32,
    pub store_id: uuid::Uuid,
    pub clean: bool,
    pub capacity_bytes: u64,
    pub extent_size: u64,
    pub volumes: u64,
    /// Table pages an upgrade to the current version rewrites (0: none needed).
    pub upgrade_pages: u64,
}

/// Reads a store without changing it (the journal is replayed in memory):
/// its version, and what an upgrade would rewrite.
pub fn inspect(device: &dyn BlockDevice) -> Result<StoreInfo, StoreError> {
    let sb = read_superblock(device)?;
    let mut state = read_tables(device, sb.layout, sb.version == 1)?.state;
    replay(device, &sb, &mut state)?;
    let volumes = state.slots.iter().filter(|s| s.live().is_some()).count() as u64;
    let l = sb.layout;
    Ok(StoreInfo {
        version: sb.version,
        store_id: sb.store_id,
        clean: sb.clean,
        capacity_bytes: l.capacity_bytes(),
        extent_size: l.extent_size as u64,
        volumes,
        upgrade_pages: if sb.version == 1 {
            l.extent_table_pages() + l.volume_table_pages()
        } else {
            0
        },
    })
}

/// Upgrades a version-1 store in place: replays its journal, rewrites every
/// table entry with its checksum (free extents of a store that was not
/// closed cleanly become dirty, so they are zeroed before reuse), flushes,
/// and only then writes a version-2 superblock with a fresh journal epoch.
/// Data extents do not move.
pub(crate) fn upgrade_v1(device: &dyn BlockDevice, sb: &Superblock) -> Result<(), StoreError> {
    let layout = sb.layout;
    let pages = layout.extent_table_pages() + layout.volume_table_pages();
    tracing::info!(
        store = %sb.store_id,
        table_pages = pages,
        clean = sb.clean,
        "upgrading store format v1 -> v2 in place (table entries gain checksums, the journal an epoch; data does not move)"
    );
    let tables = read_tables(device, layout, true)?;
    let mut state = tables.state;
    let (head_seq, _) = replay(device, sb, &mut state)?;
    if !sb.clean {
        // Version 1 zeroed every free extent after a crash; version 2 zeroes
        // the dirty ones.
        for e in state.extents.iter_mut() {
            if matches!(e, ExtentState::Free { .. }) {
                *e = ExtentState::DIRTY;
            }
        }
    }
    state.mark_all_dirty();
    write_dirty_pages(device, &mut state)?;
    device.flush()?;
    let next = Superblock {
        version: crate::format::FORMAT_VERSION,
        generation: sb.generation + 1,
        journal_tail_seq: head_seq,
        journal_tail_position: head_seq % layout.journal_blocks,
        clean: false,
        journal_epoch: 1,
        ..sb.clone()
    };
    write_superblock(device, &next)?;
    tracing::info!(store = %sb.store_id, "store upgraded to format v2");
    Ok(())
}

/// The runtime view of a journaled state.
pub(crate) struct Built {
    pub volumes: HashMap<VolumeId, Arc<VolumeState>>,
    pub slots_used: Vec<bool>,
    pub free: FreeExtents,
    pub to_zero: Vec<u32>,
    pub stray_extents: u64,
}

/// Builds each live volume's logical→physical map, the free set and the
/// extents to zero. Extents that belong to no live volume's range are
/// freed (dirty) in `state` with a warning: this engine never leaves any.
pub(crate) fn build_runtime(state: &mut MetaState) -> Built {
    let layout = state.layout;
    let mut by_slot: HashMap<u32, Arc<VolumeState>> = HashMap::new();
    let mut volumes = HashMap::new();
    let mut slots_used = vec![false; state.slots.len()];
    for (i, s) in state.slots.iter().enumerate() {
        match s {
            SlotState::Free => {}
            SlotState::Quarantined => slots_used[i] = true,
            SlotState::Live(s) => {
                slots_used[i] = true;
                let extents = layout.extents_for_size(s.size) as usize;
                let v = Arc::new(VolumeState::with_map(
                    s.id,
                    s.size,
                    s.created_unix,
                    LayerMap::new(i as u32 + 1, extents),
                    s.is_snapshot().then_some(s.origin),
                ));
                v.set_last_scrub(s.last_scrub_unix);
                if s.is_retired() {
                    v.retire();
                }
                by_slot.insert(i as u32 + 1, v.clone());
                volumes.insert(s.id, v);
            }
        }
    }
    // Link each layer to its parent. A parent that is not a live snapshot
    // (never written by this engine) is dropped with an error: the layer's
    // own blocks stay readable.
    for (i, s) in state.slots.iter().enumerate() {
        let Some(s) = s.live().filter(|s| s.parent_slot != 0) else {
            continue;
        };
        let child = &by_slot[&(i as u32 + 1)];
        match by_slot.get(&s.parent_slot).filter(|p| p.is_snapshot()) {
            Some(parent) => child.map.write().parent = Some(parent.clone()),
            None => tracing::error!(
                volume = %s.id,
                parent_slot = s.parent_slot,
                "the layer's parent is not a live snapshot; reading it without one"
            ),
        }
    }
    let mut free = FreeExtents::new(layout.extent_count);
    let mut to_zero = Vec::new();
    let mut stray = Vec::new();
    for (phys, e) in state.extents.iter().enumerate() {
        let phys = phys as u32;
        let virtual_extent = layout.is_virtual(phys);
        match *e {
            // Free virtual extents and pack extents: `Packing::load`.
            ExtentState::Free { .. } if virtual_extent => {}
            ExtentState::Owned {
                slot: crate::format::PACK_SLOT,
                ..
            } if !virtual_extent => {}
            ExtentState::Free { dirty: false } => free.release(phys),
            ExtentState::Free { dirty: true } => to_zero.push(phys),
            ExtentState::Owned { slot, logical, .. } => {
                let quarantined = slot == crate::format::QUARANTINE_SLOT
                    || state
                        .slots
                        .get((slot as usize).wrapping_sub(1))
                        .is_some_and(|s| *s == SlotState::Quarantined);
                if quarantined {
                    continue;
                }
                let mapped = by_slot
                    .get(&slot)
                    .is_some_and(|v| v.set_mapping_at_open(logical, phys));
                if !mapped {
                    stray.push(phys);
                }
            }
        }
    }
    if !stray.is_empty() {
        tracing::warn!(extents = stray.len(), "freeing extents with no valid owner");
        let mut ignored = Vec::new();
        for &phys in &stray {
            // Cannot fail: phys is in range.
            let _ = state.apply(
                &JournalEntry::Free {
                    first: phys,
                    count: 1,
                },
                &mut ignored,
            );
            if !layout.is_virtual(phys) {
                to_zero.push(phys);
            }
        }
    }
    Built {
        volumes,
        slots_used,
        free,
        to_zero,
        stray_extents: stray.len() as u64,
    }
}

/// Writes every checksum page of a freshly formatted store: each block
/// holds zeros.
pub(crate) fn write_zero_checksum_pages(
    device: &dyn BlockDevice,
    layout: &Layout,
) -> Result<(), StoreError> {
    let sums = DataChecksums::new(layout.data_blocks());
    let pages: Vec<u64> = (0..layout.checksum_pages).collect();
    write_pages(device, layout, &sums, &pages)
}

/// A store's data checksums and write intent, as an open finds them.
pub(crate) struct LoadedIntegrity {
    pub checksums: DataChecksums,
    pub intent: Intent,
    pub hot_extents: u64,
    pub recomputed_extents: u64,
    pub bad_pages: u64,
}

/// Reads the checksum region. Free extents hold zeros (dirty ones are
/// zeroed before reuse); a hot extent's blocks are unknown, taken as they
/// are at their first read (no data is read here, whatever the size of
/// the hot set); a cold extent covered by a page that fails to verify gets
/// its checksums from its data, and the failed pages are rewritten (the
/// open's checkpoint flushes them).
pub(crate) fn load_checksums(
    device: &dyn BlockDevice,
    state: &MetaState,
    options: &crate::engine::OpenOptions,
) -> Result<LoadedIntegrity, StoreError> {
    let layout = state.layout;
    let per = CHECKSUMS_PER_PAGE as u64;
    let bpe = layout.blocks_per_extent();
    let sums = DataChecksums::new(layout.data_blocks());
    let needed = layout.checksum_pages_needed();
    let region = read_region(device, layout.checksum_offset, needed * PAGE)?;
    let mut bad_pages = Vec::new();
    for page in 0..needed {
        let at = (page * PAGE) as usize;
        match decode_checksum_page(page, &region[at..at + PAGE as usize]) {
            Some(values) => {
                let first = page * per;
                for (i, v) in values.into_iter().enumerate() {
                    if first + (i as u64) < sums.blocks() {
                        sums.set(first + i as u64, v);
                    }
                }
            }
            None => bad_pages.push(page),
        }
    }
    drop(region);
    let zero = zero_block_crc();
    let in_bad_page = |phys: u64| {
        let (first, last) = (phys * bpe / per, (phys * bpe + bpe - 1) / per);
        bad_pages.iter().any(|&p| (first..=last).contains(&p))
    };
    let mut recompute = Vec::new();
    let mut hot_extents = 0;
    let physical = &state.extents[..layout.extent_count as usize];
    for (phys, e) in physical.iter().enumerate() {
        match *e {
            ExtentState::Free { .. } => sums.set_range(phys as u64 * bpe, bpe, zero),
            // Runs carry their own checksums.
            ExtentState::Owned {
                slot: crate::format::PACK_SLOT,
                ..
            } => sums.set_range(phys as u64 * bpe, bpe, CHECKSUM_UNKNOWN),
            ExtentState::Owned { hot: true, .. } => {
                hot_extents += 1;
                sums.set_range(phys as u64 * bpe, bpe, CHECKSUM_UNKNOWN);
            }
            ExtentState::Owned { hot: false, .. } => {
                if !bad_pages.is_empty() && in_bad_page(phys as u64) {
                    recompute.push(phys as u32);
                }
            }
        }
    }
    for &page in bad_pages.iter().take(16) {
        tracing::warn!(
            page,
            "checksum page fails to verify (torn by a stop, or damaged); recomputing the checksums it holds from the data"
        );
    }
    let es = layout.extent_size as usize;
    let mut buf = AlignedBuf::zeroed(es);
    for &phys in &recompute {
        device.read_at(&mut buf, layout.extent_offset(phys))?;
        for (i, block) in buf.chunks(PAGE as usize).enumerate() {
            sums.set(phys as u64 * bpe + i as u64, crc32c::crc32c(block));
        }
    }
    if !bad_pages.is_empty() {
        write_pages(device, &layout, &sums, &bad_pages)?;
    }
    let max_hot = options.max_hot_bytes.map_or(usize::MAX, |b| {
        (b / layout.extent_size as u64).max(16) as usize
    });
    let idle_rounds = (options.cool_after.as_millis() / options.cooling_interval.as_millis().max(1))
        .clamp(1, u32::MAX as u128) as u32;
    let intent = Intent::new(
        layout.extent_count,
        |p| {
            matches!(
                state.extents[p as usize],
                ExtentState::Owned { hot: true, .. }
            )
        },
        max_hot,
        idle_rounds,
    );
    Ok(LoadedIntegrity {
        checksums: sums,
        intent,
        hot_extents,
        recomputed_extents: recompute.len() as u64,
        bad_pages: bad_pages.len() as u64,
    })
}
