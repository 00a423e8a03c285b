//! Decoding of qcow2 compressed clusters, raw deflate or zstd: the output is
//! exactly one whole cluster or an error. A stream that is corrupt, ends
//! early or would need more memory than a cluster never yields data.
//!
//! The input is the descriptor's whole sector run, which may carry padding
//! after the stream; like QEMU, decoding stops once the cluster is full.

use std::io::Read;

use flate2::{Decompress, FlushDecompress, Status};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

use crate::header::Compression;

/// Largest zstd window accepted. A cluster is at most 2 MiB, so QEMU's
/// frames never need more; the cap keeps a hostile frame from making the
/// decoder reserve gigabytes.
const MAX_ZSTD_WINDOW: u64 = 8 << 20;

/// Decodes `input` into all of `out`, or says why it cannot.
pub(crate) fn decompress(kind: Compression, input: &[u8], out: &mut [u8]) -> Result<(), String> {
    match kind {
        Compression::Deflate => inflate(input, out),
        Compression::Zstd => unzstd(input, out),
    }
}

fn inflate(input: &[u8], out: &mut [u8]) -> Result<(), String> {
    // Raw deflate: QEMU writes no zlib header or checksum.
    let mut d = Decompress::new(false);
    loop {
        let (read, written) = (d.total_in() as usize, d.total_out() as usize);
        if written >= out.len() {
            return Ok(());
        }
        let src = input.get(read..).unwrap_or(&[]);
        let dst = out.get_mut(written..).unwrap_or(&mut []);
        let status = d
            .decompress(src, dst, FlushDecompress::Finish)
            .map_err(|e| format!("deflate: {e}"))?;
        let progressed = d.total_in() as usize != read || d.total_out() as usize != written;
        if d.total_out() as usize >= out.len() {
            return Ok(());
        }
        if status == Status::StreamEnd || !progressed {
            return Err(format!(
                "deflate stream ends after {} of {} bytes",
                d.total_out(),
                out.len()
            ));
        }
    }
}

/// Checks a zstd frame header before the decoder sees it: a plain frame
/// (no skippable frames, no dictionary) whose window fits [`MAX_ZSTD_WINDOW`].
fn check_zstd_frame(input: &[u8]) -> Result<(), String> {
    let magic = input
        .get(..4)
        .map(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]));
    if magic != Some(0xFD2F_B528) {
        return Err("zstd: no frame magic".into());
    }
    let Some(&descriptor) = input.get(4) else {
        return Err("zstd: frame header cut short".into());
    };
    if descriptor & 0x3 != 0 {
        return Err("zstd: frame needs a dictionary".into());
    }
    let single_segment = descriptor & 0x20 != 0;
    let window = if single_segment {
        // The window is the content size, whose field follows the
        // descriptor directly: 1, 2 (biased by 256), 4 or 8 bytes.
        let size_len = [1usize, 2, 4, 8][usize::from(descriptor >> 6)];
        let field = input
            .get(5..5 + size_len)
            .ok_or("zstd: frame header cut short")?;
        let mut le = [0u8; 8];
        le[..size_len].copy_from_slice(field);
        u64::from_le_bytes(le) + if size_len == 2 { 256 } else { 0 }
    } else {
        let &w = input.get(5).ok_or("zstd: frame header cut short")?;
        let base = 1u64 << (10 + u32::from(w >> 3));
        base + base / 8 * u64::from(w & 7)
    };
    if window > MAX_ZSTD_WINDOW {
        return Err(format!(
            "zstd: frame window of {window} bytes is above the {MAX_ZSTD_WINDOW}-byte limit"
        ));
    }
    Ok(())
}

fn unzstd(mut input: &[u8], out: &mut [u8]) -> Result<(), String> {
    let mut dec = FrameDecoder::new();
    let mut filled = 0;
    // A cluster may in principle span several frames; decode until full.
    while filled < out.len() {
        check_zstd_frame(input)?;
        dec.init(&mut input).map_err(|e| format!("zstd: {e}"))?;
        loop {
            let want = out.len() - filled;
            if !dec.is_finished() {
                dec.decode_blocks(&mut input, BlockDecodingStrategy::UptoBytes(want))
                    .map_err(|e| format!("zstd: {e}"))?;
            }
            let dst = out.get_mut(filled..).unwrap_or(&mut []);
            filled += dec.read(dst).map_err(|e| format!("zstd: {e}"))?;
            if filled >= out.len() {
                return Ok(());
            }
            if dec.is_finished() && dec.can_collect() == 0 {
                break;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deflate_raw(data: &[u8]) -> Vec<u8> {
        use flate2::{Compress, Compression as Level, FlushCompress};
        let mut c = Compress::new(Level::default(), false);
        let mut out = Vec::with_capacity(data.len() + 1024);
        c.compress_vec(data, &mut out, FlushCompress::Finish)
            .unwrap();
        out
    }

    #[test]
    fn deflate_round_trip_with_padding() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut packed = deflate_raw(&data);
        packed.extend_from_slice(&[0xee; 300]);
        let mut out = vec![0u8; 4096];
        decompress(Compression::Deflate, &packed, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn deflate_short_or_corrupt_is_an_error() {
        let data = vec![5u8; 4096];
        let packed = deflate_raw(&data);
        let mut out = vec![0u8; 8192];
        assert!(decompress(Compression::Deflate, &packed, &mut out).is_err());
        let mut out = vec![0u8; 4096];
        assert!(decompress(Compression::Deflate, &packed[..packed.len() / 2], &mut out).is_err());
        assert!(decompress(Compression::Deflate, &[0xff; 64], &mut out).is_err());
        assert!(decompress(Compression::Deflate, &[], &mut out).is_err());
    }

    #[test]
    fn zstd_garbage_and_huge_windows_are_errors() {
        let mut out = vec![0u8; 4096];
        assert!(decompress(Compression::Zstd, &[], &mut out).is_err());
        assert!(decompress(Compression::Zstd, &[0x28, 0xb5, 0x2f, 0xfd], &mut out).is_err());
        // Window descriptor asking for 2^41 bytes.
        let huge = [0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xf8, 0, 0, 0];
        let err = decompress(Compression::Zstd, &huge, &mut out).unwrap_err();
        assert!(err.contains("window"), "{err}");
    }

    #[test]
    fn zstd_raw_block_frame_decodes() {
        // A hand-built frame: single segment, 1-byte content size 8, one
        // raw last block of 8 bytes.
        let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd, 0x20, 8];
        let block_header: u32 = 1 | (8 << 3); // last, raw, size 8
        frame.extend_from_slice(&block_header.to_le_bytes()[..3]);
        frame.extend_from_slice(b"abcdefgh");
        frame.extend_from_slice(&[0; 5]); // sector padding
        let mut out = [0u8; 8];
        decompress(Compression::Zstd, &frame, &mut out).unwrap();
        assert_eq!(&out, b"abcdefgh");
        let mut out = [0u8; 16];
        assert!(decompress(Compression::Zstd, &frame, &mut out).is_err());
    }
}
