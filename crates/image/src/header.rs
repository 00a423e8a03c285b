//! The qcow2 header: parses and validates every field the reader depends on,
//! refusing each feature it cannot honour, and encodes the one header the
//! writer produces. Facts follow QEMU's docs/interop/qcow2.txt; every
//! multi-byte field is big-endian.

use crate::{ImageError, ReadAt};

/// The first four bytes of every qcow2 image.
pub const QCOW2_MAGIC: [u8; 4] = *b"QFI\xfb";
/// Smallest supported cluster size: 512 bytes.
pub const MIN_CLUSTER_BITS: u32 = 9;
/// Largest supported cluster size: 2 MiB.
pub const MAX_CLUSTER_BITS: u32 = 21;
/// The writer's usual cluster size, 64 KiB (QEMU's default too).
pub const DEFAULT_CLUSTER_BITS: u32 = 16;
/// Largest virtual size read or written: far above any real disk, and low
/// enough that offset arithmetic on it cannot overflow.
pub const MAX_VIRTUAL_SIZE: u64 = 1 << 56;
/// QEMU's own limit on the active L1 table (32 MiB of entries): the reader
/// loads the table whole, so this also bounds that allocation.
pub(crate) const MAX_L1_ENTRIES: u64 = (32 << 20) / 8;

const V2_HEADER_LEN: u64 = 72;
/// Version 3 header without the optional compression-type byte.
pub(crate) const V3_HEADER_LEN: u64 = 104;
/// Longest backing file name the format allows.
const MAX_BACKING_NAME: u64 = 1023;

pub(crate) const INCOMPAT_DIRTY: u64 = 1 << 0;
pub(crate) const INCOMPAT_CORRUPT: u64 = 1 << 1;
pub(crate) const INCOMPAT_EXTERNAL_DATA: u64 = 1 << 2;
pub(crate) const INCOMPAT_COMPRESSION_TYPE: u64 = 1 << 3;
pub(crate) const INCOMPAT_EXTENDED_L2: u64 = 1 << 4;
const INCOMPAT_KNOWN: u64 = INCOMPAT_DIRTY
    | INCOMPAT_CORRUPT
    | INCOMPAT_EXTERNAL_DATA
    | INCOMPAT_COMPRESSION_TYPE
    | INCOMPAT_EXTENDED_L2;

const EXT_FEATURE_NAMES: u32 = 0x6803_f857;
const EXT_EXTERNAL_DATA_FILE: u32 = 0x4441_5441;

/// Bits 9..=55 of an L1 or standard L2 entry: a host offset.
pub(crate) const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
/// Entry flag: the cluster's refcount is exactly 1.
pub(crate) const COPIED: u64 = 1 << 63;
/// L2 entry flag: a compressed cluster descriptor.
pub(crate) const COMPRESSED: u64 = 1 << 62;
/// Standard L2 entry flag: the cluster reads as zeros.
pub(crate) const ZERO: u64 = 1;

/// How compressed clusters are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    /// Raw deflate (no zlib header): compression type 0.
    Deflate,
    /// One or more zstd frames: compression type 1.
    Zstd,
}

/// The validated fields of a qcow2 header the reader needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub version: u32,
    pub cluster_bits: u32,
    pub virtual_size: u64,
    pub l1_size: u64,
    pub l1_table_offset: u64,
    pub compression: Compression,
}

impl Header {
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// log2 of the entries in one L2 table (a cluster of 8-byte entries).
    pub fn l2_bits(&self) -> u32 {
        self.cluster_bits - 3
    }

    /// L1 entries that cover the virtual size; any beyond are never read.
    pub fn l1_entries_needed(&self) -> u64 {
        l1_entries_for(self.virtual_size, self.cluster_bits)
    }
}

/// L1 entries needed to map `virtual_size` bytes with `cluster_bits`.
pub(crate) fn l1_entries_for(virtual_size: u64, cluster_bits: u32) -> u64 {
    // One L1 entry maps an L2 table of cluster_size / 8 clusters.
    let span_bits = 2 * cluster_bits - 3;
    virtual_size.div_ceil(1u64 << span_bits)
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// What the header extensions say that the refusals can name.
#[derive(Default)]
struct Extensions {
    /// (feature type, bit, name) from the feature-name table.
    feature_names: Vec<(u8, u8, String)>,
    external_data_file: Option<String>,
}

/// Walks the header extensions in `area` (the rest of the first cluster).
/// Best effort: they only improve messages, so a malformed one ends the walk
/// instead of failing the open.
fn extensions(area: &[u8]) -> Extensions {
    let mut ext = Extensions::default();
    let mut at = 0usize;
    while at + 8 <= area.len() {
        let kind = be32(area, at);
        let len = be32(area, at + 4) as usize;
        at += 8;
        if kind == 0 {
            break;
        }
        let Some(data) = at.checked_add(len).and_then(|end| area.get(at..end)) else {
            break;
        };
        match kind {
            EXT_FEATURE_NAMES => {
                for entry in data.chunks_exact(48) {
                    let name = &entry[2..];
                    let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                    let name = String::from_utf8_lossy(name).into_owned();
                    ext.feature_names.push((entry[0], entry[1], name));
                }
            }
            EXT_EXTERNAL_DATA_FILE => {
                ext.external_data_file = Some(format!("{:?}", String::from_utf8_lossy(data)));
            }
            _ => {}
        }
        // Extension data is padded to a multiple of 8 bytes.
        at += len.next_multiple_of(8);
    }
    ext
}

/// Reads and validates the header of the qcow2 image `src` of `file_len`
/// bytes.
pub(crate) fn parse<R: ReadAt + ?Sized>(src: &R, file_len: u64) -> Result<Header, ImageError> {
    // Every fixed field the reader uses lies in the first 112 bytes.
    let mut fixed = [0u8; 112];
    let have = file_len.min(fixed.len() as u64) as usize;
    src.read_at(&mut fixed[..have], 0)?;
    if have < 4 || fixed[..4] != QCOW2_MAGIC {
        return Err(ImageError::NotQcow2(
            "the file does not start with the qcow2 magic \"QFI\\xfb\"".into(),
        ));
    }
    let version = be32(&fixed, 4);
    if !(2..=3).contains(&version) {
        return Err(ImageError::UnsupportedVersion(version));
    }
    let header_len = if version == 2 {
        V2_HEADER_LEN
    } else {
        u64::from(be32(&fixed, 100))
    };
    if file_len < header_len.max(V2_HEADER_LEN) {
        return Err(ImageError::Truncated {
            what: "the qcow2 header",
            offset: header_len.max(V2_HEADER_LEN),
            file_len,
        });
    }
    if version == 3 && (header_len < V3_HEADER_LEN || header_len % 8 != 0) {
        return Err(ImageError::InvalidHeader(format!(
            "version 3 header length {header_len} is not a multiple of 8 of at least {V3_HEADER_LEN}"
        )));
    }
    let cluster_bits = be32(&fixed, 20);
    if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
        return Err(ImageError::ClusterBits(cluster_bits));
    }
    let cluster_size = 1u64 << cluster_bits;
    if header_len > cluster_size {
        return Err(ImageError::InvalidHeader(format!(
            "header length {header_len} is larger than the {cluster_size}-byte cluster"
        )));
    }
    let (incompatible, refcount_order) = if version == 3 {
        (be64(&fixed, 72), be32(&fixed, 96))
    } else {
        (0, 4)
    };
    let compression_type = if header_len > V3_HEADER_LEN {
        fixed[104]
    } else {
        0
    };

    // The extensions live in the rest of the first cluster (bounded by the
    // file and 2 MiB, so this allocation is safe).
    let mut cluster0 = vec![0u8; file_len.min(cluster_size) as usize];
    src.read_at(&mut cluster0, 0)?;
    let ext = extensions(cluster0.get(header_len as usize..).unwrap_or(&[]));

    let unknown = incompatible & !INCOMPAT_KNOWN;
    if unknown != 0 {
        let names: Vec<&str> = ext
            .feature_names
            .iter()
            .filter(|(kind, bit, _)| *kind == 0 && *bit < 64 && unknown & (1u64 << bit) != 0)
            .map(|(_, _, name)| name.as_str())
            .collect();
        let names = if names.is_empty() {
            String::new()
        } else {
            format!(": {}", names.join(", "))
        };
        return Err(ImageError::UnknownIncompatibleFeatures {
            bits: unknown,
            names,
        });
    }
    if incompatible & INCOMPAT_CORRUPT != 0 {
        return Err(ImageError::Corrupt);
    }
    if incompatible & INCOMPAT_EXTERNAL_DATA != 0 {
        return Err(ImageError::ExternalDataFile(
            ext.external_data_file
                .unwrap_or_else(|| "its name is not recorded".into()),
        ));
    }
    if incompatible & INCOMPAT_EXTENDED_L2 != 0 {
        return Err(ImageError::ExtendedL2);
    }
    let crypt_method = be32(&fixed, 32);
    if crypt_method != 0 {
        return Err(ImageError::Encrypted(crypt_method));
    }
    let backing_offset = be64(&fixed, 8);
    if backing_offset != 0 {
        let len = u64::from(be32(&fixed, 16)).min(MAX_BACKING_NAME);
        let name = match backing_offset.checked_add(len) {
            Some(end) if end <= file_len => {
                let mut name = vec![0u8; len as usize];
                src.read_at(&mut name, backing_offset)?;
                format!("{:?}", String::from_utf8_lossy(&name))
            }
            _ => "its name lies past the end of the file".into(),
        };
        return Err(ImageError::BackingFile(name));
    }
    let compression = match (
        incompatible & INCOMPAT_COMPRESSION_TYPE != 0,
        compression_type,
    ) {
        (false, 0) => Compression::Deflate,
        (true, 1) => Compression::Zstd,
        (true, 0) => {
            return Err(ImageError::InvalidHeader(
                "the compression-type feature is set but the compression type is deflate".into(),
            ))
        }
        (false, t) => {
            return Err(ImageError::InvalidHeader(format!(
                "compression type {t} without the compression-type feature bit"
            )))
        }
        (true, t) => return Err(ImageError::UnsupportedCompressionType(t)),
    };
    if refcount_order > 6 {
        return Err(ImageError::InvalidHeader(format!(
            "refcount order {refcount_order} is above 6"
        )));
    }

    let virtual_size = be64(&fixed, 24);
    if virtual_size > MAX_VIRTUAL_SIZE {
        return Err(ImageError::VirtualSizeTooLarge {
            size: virtual_size,
            max: MAX_VIRTUAL_SIZE,
        });
    }
    let header = Header {
        version,
        cluster_bits,
        virtual_size,
        l1_size: u64::from(be32(&fixed, 36)),
        l1_table_offset: be64(&fixed, 40),
        compression,
    };
    let needed = header.l1_entries_needed();
    if needed > MAX_L1_ENTRIES {
        return Err(ImageError::L1TooLarge {
            entries: needed,
            max: MAX_L1_ENTRIES,
        });
    }
    if header.l1_size < needed {
        return Err(ImageError::L1SizeMismatch {
            l1_size: header.l1_size,
            needed,
        });
    }
    if header.l1_size > 0 {
        check_table(
            "the L1 table",
            header.l1_table_offset,
            header.l1_size * 8,
            cluster_size,
            file_len,
        )?;
    }
    Ok(header)
}

/// Checks that a table of `len` bytes at `offset` starts on a cluster
/// boundary and lies wholly inside the file.
pub(crate) fn check_table(
    what: &'static str,
    offset: u64,
    len: u64,
    cluster_size: u64,
    file_len: u64,
) -> Result<(), ImageError> {
    if !offset.is_multiple_of(cluster_size) {
        return Err(ImageError::Misaligned {
            what,
            offset,
            alignment: cluster_size,
        });
    }
    match offset.checked_add(len) {
        Some(end) if end <= file_len => Ok(()),
        _ => Err(ImageError::Truncated {
            what,
            offset,
            file_len,
        }),
    }
}

/// Where the writer's metadata lives, for [`encode_v3`].
pub(crate) struct Layout {
    pub cluster_bits: u32,
    pub virtual_size: u64,
    pub l1_size: u32,
    pub l1_table_offset: u64,
    pub refcount_table_offset: u64,
    pub refcount_table_clusters: u32,
}

/// The writer's header: version 3, no features, 16-bit refcounts, no
/// compression-type byte, followed by the end-of-extensions marker.
pub(crate) fn encode_v3(l: &Layout) -> [u8; 112] {
    let mut h = [0u8; 112];
    let mut put = |at: usize, bytes: &[u8]| h[at..at + bytes.len()].copy_from_slice(bytes);
    put(0, &QCOW2_MAGIC);
    put(4, &3u32.to_be_bytes());
    put(20, &l.cluster_bits.to_be_bytes());
    put(24, &l.virtual_size.to_be_bytes());
    put(36, &l.l1_size.to_be_bytes());
    put(40, &l.l1_table_offset.to_be_bytes());
    put(48, &l.refcount_table_offset.to_be_bytes());
    put(56, &l.refcount_table_clusters.to_be_bytes());
    put(96, &4u32.to_be_bytes());
    put(100, &(V3_HEADER_LEN as u32).to_be_bytes());
    // Bytes 104..112 stay zero: the end-of-extensions marker.
    h
}
