//! Disk-image formats for `basalt volume import/export`: tells raw from qcow2,
//! reads qcow2 (versions 2 and 3, plain and compressed clusters) and writes
//! qcow2 in one streaming pass.
//!
//! Invariants shared by every module:
//! - Nothing here trusts an image: every length and offset read from a file
//!   is checked against the file's size or a fixed limit before it is used
//!   to allocate or to read, and a bad image is a typed [`ImageError`] with a
//!   message a person can act on, never a panic or garbage data.
//! - What the reader does not understand (backing files, encryption,
//!   external data files, unknown incompatible features...) it refuses at
//!   [`Qcow2Reader::open`] rather than reading wrong data later.
//! - Holes read as zeros; the reader never reports a zero run where the
//!   image holds data ([`Qcow2Reader::extents`] may call zeros data, not the
//!   reverse).
//! - The writer produces a version-3 image that `qemu-img check` finds
//!   clean: every cluster of the file is referenced and counted exactly once.
//!
//! Modules by job: [`error`] (the error type), `read_at` (positional reads
//! from files and memory), `header` (the qcow2 header: parse, validate,
//! encode), `compress` (compressed-cluster decoding), `reader` and `writer`.

mod compress;
pub mod diff_stream;
pub mod error;
mod header;
mod read_at;
mod reader;
mod writer;

#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

pub use error::ImageError;
pub use header::{
    DEFAULT_CLUSTER_BITS, MAX_CLUSTER_BITS, MAX_VIRTUAL_SIZE, MIN_CLUSTER_BITS, QCOW2_MAGIC,
};
pub use read_at::ReadAt;
pub use reader::{Extent, ExtentKind, Qcow2Reader};
pub use writer::Qcow2Writer;

/// A disk-image format an import reads or an export writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// The guest's bytes as they are, one file byte per disk byte.
    Raw,
    /// QEMU's copy-on-write format (versions 2 and 3).
    Qcow2,
}

impl ImageFormat {
    /// The name used on the command line and in messages.
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Raw => "raw",
            ImageFormat::Qcow2 => "qcow2",
        }
    }

    /// Parses a `--format raw|qcow2|auto` argument: `None` for "auto", which
    /// asks the caller to [`probe`] the image.
    pub fn parse_choice(s: &str) -> Result<Option<ImageFormat>, ImageError> {
        if s.eq_ignore_ascii_case("auto") {
            Ok(None)
        } else {
            s.parse().map(Some)
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ImageFormat {
    type Err = ImageError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("raw") {
            Ok(ImageFormat::Raw)
        } else if s.eq_ignore_ascii_case("qcow2") {
            Ok(ImageFormat::Qcow2)
        } else {
            Err(ImageError::UnknownFormat(s.to_string()))
        }
    }
}

/// Guesses an image's format from its first bytes (4 are enough): qcow2 when
/// they start with the qcow2 magic, raw otherwise.
///
/// A raw disk whose guest wrote the qcow2 magic at byte 0 probes as qcow2;
/// callers importing untrusted raw data should pass the format explicitly.
pub fn probe(first_bytes: &[u8]) -> ImageFormat {
    if first_bytes.starts_with(&QCOW2_MAGIC) {
        ImageFormat::Qcow2
    } else {
        ImageFormat::Raw
    }
}

/// Image formats `--format auto` recognises but does not import, by the
/// magic they start with (QEMU's own probes look for these).
const FOREIGN: &[(&[u8], &str)] = &[
    (b"KDMV", "VMDK"),
    (b"# Disk DescriptorFile", "VMDK (descriptor)"),
    (b"vhdxfile", "VHDX"),
    (b"conectix", "VHD (VPC)"),
    (b"QED\0", "QED"),
    (b"<<< Oracle VM VirtualBox Disk Image >>>", "VDI"),
    (b"<<< Sun xVM VirtualBox Disk Image >>>", "VDI"),
    (b"<<< Sun VirtualBox Disk Image >>>", "VDI"),
    (b"<<< innotek VirtualBox Disk Image >>>", "VDI"),
];

/// [`probe`] for `--format auto`: refuses images of other formats that it
/// recognises (VMDK, VHD/VHDX, VDI, QED) instead of importing their bytes as
/// a raw disk. Needs the first 64 bytes (fewer: only what they show).
pub fn probe_auto(first_bytes: &[u8]) -> Result<ImageFormat, ImageError> {
    for (magic, name) in FOREIGN {
        if first_bytes.starts_with(magic) {
            return Err(ImageError::ForeignFormat(name));
        }
    }
    Ok(probe(first_bytes))
}
