//! Helpers shared by the store's integration tests.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

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
