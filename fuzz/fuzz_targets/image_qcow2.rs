//! Opens arbitrary bytes as a qcow2 image with `basalt-image`'s reader,
//! maps it and reads from it: raw, and with a valid header laid over the
//! input so that the L1/L2 tables, cluster descriptors and compressed
//! streams behind it are reached, which random bytes almost never do.
//!
//! Beyond "never panics": every run that `extents()` calls zero reads as
//! zeros, and the extents cover the virtual size exactly.

#![no_main]

use basalt_image::{ExtentKind, Qcow2Reader};
use libfuzzer_sys::fuzz_target;

/// Reads larger than this are split or skipped: the input is small, but
/// the virtual size it declares may be huge.
const MAX_READ: u64 = 256 << 10;

fuzz_target!(|data: &[u8]| {
    exercise(data.to_vec(), data);
    exercise(with_header(data), data);
});

/// The input behind a version 2 or 3 header with small clusters whose L1
/// table starts at cluster 1, so the input's bytes become table entries.
fn with_header(data: &[u8]) -> Vec<u8> {
    let byte = |i: usize| data.get(i).copied().unwrap_or(0);
    let version = 2 + u32::from(byte(0) & 1);
    let cluster_bits = 9 + u32::from(byte(1) % 4);
    let cluster_size = 1usize << cluster_bits;
    // Up to 4 L2 tables' worth of guest clusters, ending anywhere.
    let span = 1u64 << (2 * cluster_bits - 3);
    let virtual_size =
        u64::from(u32::from_le_bytes([byte(2), byte(3), byte(4), byte(5)])) % (4 * span + 1);
    let l1_size = virtual_size.div_ceil(span) as u32;
    let zstd = version == 3 && byte(6) & 1 == 1;

    let mut img = vec![0u8; cluster_size];
    img[..4].copy_from_slice(b"QFI\xfb");
    img[4..8].copy_from_slice(&version.to_be_bytes());
    img[20..24].copy_from_slice(&cluster_bits.to_be_bytes());
    img[24..32].copy_from_slice(&virtual_size.to_be_bytes());
    img[36..40].copy_from_slice(&l1_size.to_be_bytes());
    img[40..48].copy_from_slice(&(cluster_size as u64).to_be_bytes());
    if version == 3 {
        if zstd {
            img[72..80].copy_from_slice(&8u64.to_be_bytes());
        }
        img[96..100].copy_from_slice(&4u32.to_be_bytes());
        img[100..104].copy_from_slice(&112u32.to_be_bytes());
        img[104] = u8::from(zstd);
    }
    img.extend_from_slice(data.get(7..).unwrap_or(&[]));
    img
}

fn exercise(image: Vec<u8>, data: &[u8]) {
    let Ok(reader) = Qcow2Reader::open(image) else {
        return;
    };
    let size = reader.virtual_size();
    if let Ok(extents) = reader.extents() {
        let mut next = 0;
        for e in &extents {
            assert_eq!(e.offset, next);
            next += e.len;
            if e.kind == ExtentKind::Zero {
                let len = e.len.min(MAX_READ);
                let mut buf = vec![0xffu8; len as usize];
                if reader.read(e.offset, &mut buf).is_ok() {
                    assert!(buf.iter().all(|&b| b == 0), "zero extent {e:?} reads data");
                }
            }
        }
        assert_eq!(next, size);
    }
    // A whole read of small images, then a few ranges chosen by the input.
    if size <= MAX_READ {
        let mut buf = vec![0u8; size as usize];
        let _ = reader.read(0, &mut buf);
    }
    for chunk in data.chunks(8).take(4) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let offset = if size == 0 { 0 } else { word % size };
        let len = ((word >> 40) % (MAX_READ + 1)).min(size - offset);
        let mut buf = vec![0u8; len as usize];
        let _ = reader.read(offset, &mut buf);
    }
    // Past the end is an error, not a panic.
    assert!(reader.read(size, &mut [0u8; 1]).is_err());
}
