//! Helpers shared by the store's integration tests.
#![allow(dead_code)] // each test crate uses some of them

use basalt_store::{FormatOptions, OpenOptions as StoreOpenOptions, SimDevice, Store};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// Flips bit `bit` of the byte at `offset` of a file, durably: damage as a
/// disk does it after the data was durable.
pub fn flip(path: &Path, offset: u64, bit: u8) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 1 << bit;
    f.write_all_at(&b, offset).unwrap();
    f.sync_all().unwrap();
}

/// Open options without the background zeroing thread (deterministic).
pub fn quiet() -> StoreOpenOptions {
    StoreOpenOptions {
        background_zeroing: false,
        ..Default::default()
    }
}

/// A fresh store on `dev` with `extent` byte extents and a 16-block
/// journal.
pub fn format_small(dev: &Arc<SimDevice>, extent: u64) -> Arc<Store> {
    Store::create_with(
        dev.clone(),
        &FormatOptions {
            extent_size: Some(extent as u32),
            journal_blocks: Some(16),
            ..Default::default()
        },
        &quiet(),
    )
    .unwrap()
}

/// Volume id `n`.
pub fn id(n: u128) -> uuid::Uuid {
    uuid::Uuid::from_u128(n)
}
