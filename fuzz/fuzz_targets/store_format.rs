//! Feeds arbitrary bytes to the store's metadata decoders (superblock,
//! volume slot, extent entry, journal block of both versions, checksum
//! page, presence sector, key slot entry, virtual extent entry, packed run
//! header and records): raw, and
//! with magic and checksums fixed up so that the field parsers behind them
//! are reached, which random bytes behind a CRC almost never do.
//!
//! Beyond "never panics": whatever decodes re-encodes to something that
//! decodes to the same value, and a run compressed from any extent content
//! decodes back to it.

#![no_main]

use basalt_store::format::{
    decode_checksum_page, decode_journal_block, decode_journal_block_v1, decode_key_slot,
    decode_presence_sector, decode_virtual_entry, encode_checksum_page, encode_journal_block,
    encode_key_slot, encode_presence_sector, encode_run, encode_virtual_entry, run_header_len,
    Codec, ExtentState, RunHeader, RunIdentity, Sealing, SlotState, Superblock,
    JOURNAL_ENTRIES_PER_BLOCK, KEY_SLOT_SIZE, PRESENCE_SECTOR,
};
use libfuzzer_sys::fuzz_target;

const PAGE: usize = 4096;

fn page_of(data: &[u8]) -> Vec<u8> {
    let mut page = vec![0u8; PAGE];
    let n = data.len().min(PAGE);
    page[..n].copy_from_slice(&data[..n]);
    page
}

/// CRC32C of `block` with its checksum field (at `at`) as zero, stored there.
fn fix_crc(block: &mut [u8], at: usize) {
    block[at..at + 4].fill(0);
    let crc = crc32c::crc32c(block);
    block[at..at + 4].copy_from_slice(&crc.to_le_bytes());
}

fn salted(index: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), bytes)
}

fn superblock(data: &[u8]) {
    let _ = Superblock::decode(data);
    let mut page = page_of(data);
    page[..8].copy_from_slice(b"BASALTSB");
    page[8..12].copy_from_slice(&(1 + (data.first().copied().unwrap_or(0) % 2) as u32).to_le_bytes());
    // Any combination of the known incompatible features (data checksums,
    // layers, key slots, packed extents).
    let features = data.get(1).map_or(0u64, |b| (*b % 16) as u64);
    page[16..24].copy_from_slice(&features.to_le_bytes());
    fix_crc(&mut page, 12);
    if let Ok(sb) = Superblock::decode(&page) {
        assert_eq!(Superblock::decode(&sb.encode()), Ok(sb));
    }
}

fn table_entries(data: &[u8]) {
    let index = data.len() as u32;
    let mut slot = [0u8; 128];
    let n = data.len().min(128);
    slot[..n].copy_from_slice(&data[..n]);
    for s in [SlotState::decode(index, &slot), SlotState::decode_any(index, &slot)] {
        if let Some(s) = s {
            assert_eq!(SlotState::decode(index, &s.encode(index)), Some(s));
        }
    }
    let crc = salted(index, &slot[..124]);
    slot[124..].copy_from_slice(&crc.to_le_bytes());
    if let Some(s) = SlotState::decode(index, &slot) {
        assert_eq!(SlotState::decode(index, &s.encode(index)), Some(s));
    }
    for chunk in data.chunks(16) {
        let mut e = [0u8; 16];
        e[..chunk.len()].copy_from_slice(chunk);
        for d in [ExtentState::decode(index, &e), ExtentState::decode_any(index, &e)] {
            if let Some(d) = d {
                assert_eq!(ExtentState::decode(index, &d.encode(index)), Some(d));
            }
        }
        let crc = salted(index, &e[..12]);
        e[12..].copy_from_slice(&crc.to_le_bytes());
        if let Some(d) = ExtentState::decode(index, &e) {
            assert_eq!(ExtentState::decode(index, &d.encode(index)), Some(d));
        }
    }
}

fn journal_block(data: &[u8]) {
    let id = uuid::Uuid::from_u128(0x5707e);
    let (epoch, seq) = (3u64, 11u64);
    let _ = decode_journal_block(id, epoch, seq, data);
    let _ = decode_journal_block_v1(id, seq, data);
    for magic in [*b"BJN2", *b"BJNL"] {
        let mut page = page_of(data);
        page[0..4].copy_from_slice(&magic);
        page[8..16].copy_from_slice(&seq.to_le_bytes());
        page[16..32].copy_from_slice(id.as_bytes());
        let count = data.first().map_or(0, |c| *c as usize % (JOURNAL_ENTRIES_PER_BLOCK + 2));
        page[32..36].copy_from_slice(&(count as u32).to_le_bytes());
        page[40..48].copy_from_slice(&epoch.to_le_bytes());
        page[48..56].copy_from_slice(&(seq - (count as u64 % 3)).to_le_bytes());
        fix_crc(&mut page, 4);
        let _ = decode_journal_block_v1(id, seq, &page);
        if let Ok(Some(block)) = decode_journal_block(id, epoch, seq, &page) {
            let mut again = vec![0u8; PAGE];
            encode_journal_block(id, epoch, seq, block.commit_first, &block.entries, &mut again);
            assert_eq!(decode_journal_block(id, epoch, seq, &again), Ok(Some(block)));
        }
    }
}

fn checksum_page(data: &[u8]) {
    let index = data.len() as u64;
    let _ = decode_checksum_page(index, data);
    let mut page = page_of(data);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), &page[..PAGE - 4]);
    page[PAGE - 4..].copy_from_slice(&crc.to_le_bytes());
    let values = decode_checksum_page(index, &page).expect("a page with its checksum verifies");
    let mut again = vec![0u8; PAGE];
    encode_checksum_page(index, &values, &mut again);
    assert_eq!(again, page);
}

fn presence_sector(data: &[u8]) {
    let index = data.len() as u64;
    let _ = decode_presence_sector(index, data);
    let mut sector = [0u8; PRESENCE_SECTOR];
    let n = data.len().min(PRESENCE_SECTOR);
    sector[..n].copy_from_slice(&data[..n]);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), &sector[4..]);
    sector[..4].copy_from_slice(&crc.to_le_bytes());
    let words = decode_presence_sector(index, &sector).expect("a sector with its checksum verifies");
    let mut again = [0u8; PRESENCE_SECTOR];
    encode_presence_sector(index, &words, &mut again);
    assert_eq!(again, sector);
}

fn key_slot(data: &[u8]) {
    let index = data.len() as u32;
    let _ = decode_key_slot(index, data);
    let mut entry = [0u8; KEY_SLOT_SIZE];
    let n = data.len().min(KEY_SLOT_SIZE);
    entry[..n].copy_from_slice(&data[..n]);
    // A plausible header, so that the field checks behind the CRC run.
    entry[0] = data.first().map_or(1, |b| b % 4);
    let crc = salted(index, &entry[..124]);
    entry[124..].copy_from_slice(&crc.to_le_bytes());
    if let Some(slot) = decode_key_slot(index, &entry) {
        let mut again = [0u8; KEY_SLOT_SIZE];
        encode_key_slot(index, &slot, &mut again);
        assert_eq!(decode_key_slot(index, &again), Some(slot));
        assert_eq!(again, entry, "the encoding is canonical");
    }
}

fn virtual_entry(data: &[u8]) {
    let index = data.len() as u32;
    let mut e = [0u8; 32];
    let n = data.len().min(32);
    e[..n].copy_from_slice(&data[..n]);
    let _ = decode_virtual_entry(index, &e);
    let crc = salted(index, &e[..28]);
    e[28..].copy_from_slice(&crc.to_le_bytes());
    if let Some((state, run)) = decode_virtual_entry(index, &e) {
        let again = encode_virtual_entry(index, state, run);
        assert_eq!(decode_virtual_entry(index, &again), Some((state, run)));
    }
}

fn packed_run(data: &[u8]) {
    let blocks = data.first().map_or(1, |b| (*b as usize % 32) + 1);
    let _ = RunHeader::decode(data, blocks);
    // A header that verifies, over whatever descriptors the input holds.
    let mut run = vec![0u8; run_header_len(blocks) + data.len()];
    let n = data.len().min(run.len());
    run[..n].copy_from_slice(&data[..n]);
    run[..4].copy_from_slice(b"BRUN");
    run[24..28].copy_from_slice(&(blocks as u32).to_le_bytes());
    let described = 32 + 8 * blocks;
    let crc = crc32c::crc32c_append(
        crc32c::crc32c_append(crc32c::crc32c(&run[..4]), &[0u8; 4]),
        &run[8..described],
    );
    run[4..8].copy_from_slice(&crc.to_le_bytes());
    if let Ok(header) = RunHeader::decode(&run, blocks) {
        let mut out = [0u8; 4096];
        for b in 0..blocks {
            let _ = header.decode_block(b, &run, 0, &mut out, Some(&|_, _| true));
        }
    }
    // Any extent content round-trips through a run.
    let mut extent = vec![0u8; 16 * 4096];
    for (i, chunk) in data.chunks(64).enumerate() {
        let at = (i * 4099) % (extent.len() - 64);
        extent[at..at + chunk.len()].copy_from_slice(chunk);
    }
    let id = RunIdentity { virt: 9, slot: 1, logical: 2 };
    let codec = if data.len() % 2 == 0 { Codec::Lz4 } else { Codec::Zstd(1) };
    if let Some((bytes, _units)) = encode_run(&extent, id, codec, 8192, None) {
        let header = RunHeader::decode(&bytes, 16).expect("an encoded run decodes");
        let mut out = [0u8; 4096];
        for b in 0..16 {
            header.decode_block(b, &bytes, 0, &mut out, None).expect("its records decode");
            assert_eq!(&out[..], &extent[b * 4096..(b + 1) * 4096]);
        }
    }
    // Sealed with a stand-in cipher (an involution): the same.
    let xor = |i: u32, rec: &mut [u8]| {
        rec.iter_mut().for_each(|x| *x ^= i as u8 ^ 0x3c);
        true
    };
    let sealing = Sealing { plain: &extent, seal: &xor };
    if let Some((bytes, _units)) = encode_run(&extent, id, codec, 8192, Some(&sealing)) {
        let header = RunHeader::decode(&bytes, 16).expect("a sealed run decodes");
        let mut out = [0u8; 4096];
        for b in 0..16 {
            header.decode_block(b, &bytes, 0, &mut out, Some(&xor)).expect("its records open");
            assert_eq!(&out[..], &extent[b * 4096..(b + 1) * 4096]);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    virtual_entry(data);
    packed_run(data);
    superblock(data);
    table_entries(data);
    journal_block(data);
    checksum_page(data);
    presence_sector(data);
    key_slot(data);
});
