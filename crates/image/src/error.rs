//! The crate's one error type: every way an image can be refused or an
//! operation can fail, each with a one-line message that says what is wrong
//! and, where there is one, what to do about it.

use thiserror::Error;

/// Why an image could not be read or written.
#[derive(Debug, Error)]
pub enum ImageError {
    /// A `--format` argument that names no supported format.
    #[error("unknown image format {0:?}: expected raw, qcow2 or auto")]
    UnknownFormat(String),

    /// `--format auto` found an image of a format Basalt does not read.
    #[error("this is a {0} image, which cannot be imported directly; convert it first: qemu-img convert -O qcow2 <image> <new.qcow2>")]
    ForeignFormat(&'static str),

    /// The file does not start with the qcow2 magic (or is too short to).
    #[error("not a qcow2 image: {0}")]
    NotQcow2(String),

    #[error("unsupported qcow2 version {0}: only versions 2 and 3 can be imported; convert it first: qemu-img convert -O qcow2 -o compat=1.1 <image> <new.qcow2>")]
    UnsupportedVersion(u32),

    #[error("qcow2 image has a backing file ({0}); import the flattened image: qemu-img convert -O qcow2 <image> <flat.qcow2>")]
    BackingFile(String),

    #[error("qcow2 image is encrypted (method {0}); decrypt it first with qemu-img convert (given its key) into an unencrypted qcow2 or raw image")]
    Encrypted(u32),

    #[error("qcow2 image is marked corrupt; repair it first: qemu-img check -r all <image>")]
    Corrupt,

    #[error("qcow2 image keeps its data in an external file ({0}); import the flattened image: qemu-img convert -O qcow2 <image> <flat.qcow2>")]
    ExternalDataFile(String),

    #[error("qcow2 image uses extended L2 entries (subclusters), which are not supported; convert it: qemu-img convert -O qcow2 <image> <new.qcow2>")]
    ExtendedL2,

    #[error("qcow2 image uses unknown incompatible features (bits {bits:#x}{names}); convert it: qemu-img convert -O qcow2 <image> <new.qcow2>")]
    UnknownIncompatibleFeatures {
        /// The unknown bits of the incompatible-features field.
        bits: u64,
        /// `": name, name"` from the image's feature-name table, or empty.
        names: String,
    },

    #[error(
        "qcow2 image uses compression type {0}, which is not supported (only deflate and zstd)"
    )]
    UnsupportedCompressionType(u8),

    #[error("qcow2 cluster_bits {0} out of range (9..=21)")]
    ClusterBits(u32),

    #[error("qcow2 virtual size {size} bytes is above the supported maximum of {max} bytes")]
    VirtualSizeTooLarge { size: u64, max: u64 },

    #[error(
        "qcow2 L1 table has {l1_size} entries, too few for the virtual size ({needed} needed)"
    )]
    L1SizeMismatch { l1_size: u64, needed: u64 },

    #[error("qcow2 L1 table of {entries} entries is above the supported maximum of {max} entries")]
    L1TooLarge { entries: u64, max: u64 },

    /// A header field or extension that contradicts the format.
    #[error("invalid qcow2 header: {0}")]
    InvalidHeader(String),

    #[error("corrupt qcow2 image: {what} at byte {offset} is not aligned to the {alignment}-byte cluster")]
    Misaligned {
        what: &'static str,
        offset: u64,
        alignment: u64,
    },

    #[error("truncated image: {what} points at byte {offset} past the end ({file_len} bytes)")]
    Truncated {
        what: &'static str,
        offset: u64,
        file_len: u64,
    },

    #[error(
        "corrupt qcow2 image: compressed cluster at byte {offset} does not decompress: {reason}"
    )]
    Decompress { offset: u64, reason: String },

    #[error(
        "read of {len} bytes at offset {offset} is past the virtual size ({virtual_size} bytes)"
    )]
    OutOfRange {
        offset: u64,
        len: u64,
        virtual_size: u64,
    },

    #[error("virtual size {0} is not a multiple of 512 bytes: QEMU would ignore the partial last sector")]
    VirtualSizeUnaligned(u64),

    #[error("cluster {index} is past the image's {clusters} clusters")]
    ClusterIndexOutOfRange { index: u64, clusters: u64 },

    #[error("cluster {0} written twice")]
    ClusterWrittenTwice(u64),

    #[error("cluster data of {len} bytes, expected exactly one cluster ({cluster_size} bytes)")]
    ClusterLength { len: usize, cluster_size: u64 },

    #[error("the image writer failed earlier and its output is incomplete")]
    WriterFailed,

    #[error("image I/O: {0}")]
    Io(#[from] std::io::Error),
}
