//! Unit tests of the header parser, reader and writer on images built by
//! hand in memory, byte by byte from the format's description, so that they
//! do not depend on the writer being right.

use std::io::Cursor;

use crate::header::{COMPRESSED, COPIED, ZERO};
use crate::{probe, Extent, ExtentKind, ImageError, ImageFormat, Qcow2Reader, Qcow2Writer};

const CB: u32 = 12; // 4 KiB clusters keep the hand-built images small
const CS: usize = 1 << CB;

fn put32(img: &mut [u8], at: usize, v: u32) {
    img[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn put64(img: &mut [u8], at: usize, v: u64) {
    img[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// A hand-built image: cluster 0 header, cluster 1 L1, cluster 2 the one
/// L2 table, clusters 3.. data. `virtual_size` must fit one L2 table.
struct Img {
    bytes: Vec<u8>,
}

impl Img {
    fn new(version: u32, virtual_size: u64) -> Img {
        let mut bytes = vec![0u8; 3 * CS];
        bytes[..4].copy_from_slice(b"QFI\xfb");
        put32(&mut bytes, 4, version);
        put32(&mut bytes, 20, CB);
        put64(&mut bytes, 24, virtual_size);
        put32(&mut bytes, 36, 1);
        put64(&mut bytes, 40, CS as u64);
        if version == 3 {
            put32(&mut bytes, 96, 4);
            put32(&mut bytes, 100, 104);
        }
        put64(&mut bytes, CS, (2 * CS as u64) | COPIED);
        Img { bytes }
    }

    fn l2(&mut self, cluster: usize, entry: u64) {
        put64(&mut self.bytes, 2 * CS + cluster * 8, entry);
    }

    /// Appends a data cluster of `fill` and maps guest `cluster` to it.
    fn data(&mut self, cluster: usize, fill: u8) -> u64 {
        let host = self.bytes.len() as u64;
        self.bytes.extend(std::iter::repeat_n(fill, CS));
        self.l2(cluster, host | COPIED);
        host
    }

    fn open(self) -> Result<Qcow2Reader<Vec<u8>>, ImageError> {
        Qcow2Reader::open(self.bytes)
    }
}

fn read_all(r: &Qcow2Reader<Vec<u8>>) -> Vec<u8> {
    let mut buf = vec![0u8; r.virtual_size() as usize];
    r.read(0, &mut buf).unwrap();
    buf
}

fn ext(offset: u64, len: u64, kind: ExtentKind) -> Extent {
    Extent { offset, len, kind }
}

#[test]
fn v2_image_reads_data_and_holes() {
    let mut img = Img::new(2, 4 * CS as u64 - 100);
    img.data(1, 0xab);
    img.data(3, 0xcd);
    let r = img.open().unwrap();
    assert_eq!((r.version(), r.cluster_size()), (2, CS as u64));
    let all = read_all(&r);
    assert!(all[..CS].iter().all(|&b| b == 0));
    assert!(all[CS..2 * CS].iter().all(|&b| b == 0xab));
    assert!(all[2 * CS..3 * CS].iter().all(|&b| b == 0));
    assert!(all[3 * CS..].iter().all(|&b| b == 0xcd));
    // A read straddling clusters, and one past the end.
    let mut buf = [0u8; 8];
    r.read(2 * CS as u64 - 4, &mut buf).unwrap();
    assert_eq!(buf, [0xab, 0xab, 0xab, 0xab, 0, 0, 0, 0]);
    assert!(matches!(
        r.read(r.virtual_size() - 4, &mut buf),
        Err(ImageError::OutOfRange { .. })
    ));
    let cs = CS as u64;
    assert_eq!(
        r.extents().unwrap(),
        vec![
            ext(0, cs, ExtentKind::Zero),
            ext(cs, cs, ExtentKind::Data),
            ext(2 * cs, cs, ExtentKind::Zero),
            ext(3 * cs, cs - 100, ExtentKind::Data),
        ]
    );
}

#[test]
fn v3_zero_flag_reads_zeros_even_over_data() {
    let mut img = Img::new(3, 3 * CS as u64);
    img.data(0, 0x11);
    let host = img.data(1, 0x22);
    // Preallocated zero cluster: the data behind it must not show.
    img.l2(1, host | ZERO);
    // Zero cluster without an allocation.
    img.l2(2, ZERO);
    let r = img.open().unwrap();
    let all = read_all(&r);
    assert!(all[..CS].iter().all(|&b| b == 0x11));
    assert!(all[CS..].iter().all(|&b| b == 0));
    let cs = CS as u64;
    assert_eq!(
        r.extents().unwrap(),
        vec![
            ext(0, cs, ExtentKind::Data),
            ext(cs, 2 * cs, ExtentKind::Zero)
        ]
    );
}

#[test]
fn unallocated_l1_reads_zeros_and_empty_image_opens() {
    let mut img = Img::new(3, 2 * CS as u64);
    put64(&mut img.bytes, CS, 0);
    let r = img.open().unwrap();
    assert!(read_all(&r).iter().all(|&b| b == 0));
    assert_eq!(
        r.extents().unwrap(),
        vec![ext(0, 2 * CS as u64, ExtentKind::Zero)]
    );

    let mut img = Img::new(3, 0);
    put32(&mut img.bytes, 36, 0);
    put64(&mut img.bytes, 40, 0);
    let r = img.open().unwrap();
    assert_eq!(r.extents().unwrap(), vec![]);
    r.read(0, &mut []).unwrap();
}

#[test]
fn truncated_pointers_are_errors() {
    // L2 table past the end of the file: refused at open.
    let mut img = Img::new(3, CS as u64);
    put64(&mut img.bytes, CS, 16 * CS as u64);
    let err = img.open().unwrap_err();
    assert!(matches!(err, ImageError::Truncated { offset, .. } if offset == 16 * CS as u64));
    assert!(err.to_string().starts_with("truncated image: "), "{err}");

    // Data cluster past the end: refused when read or mapped.
    let mut img = Img::new(3, 2 * CS as u64);
    img.data(0, 1);
    img.l2(1, 64 * CS as u64);
    let r = img.open().unwrap();
    let mut buf = [0u8; 16];
    r.read(0, &mut buf).unwrap();
    let err = r.read(CS as u64, &mut buf).unwrap_err();
    assert!(matches!(err, ImageError::Truncated { .. }), "{err}");
    assert!(
        err.to_string().contains(&format!("byte {}", 64 * CS)),
        "{err}"
    );
    assert!(matches!(r.extents(), Err(ImageError::Truncated { .. })));

    // L1 table past the end.
    let mut img = Img::new(3, CS as u64);
    put64(&mut img.bytes, 40, 8 * CS as u64);
    assert!(matches!(img.open(), Err(ImageError::Truncated { .. })));
}

#[test]
fn misaligned_offsets_are_errors() {
    let mut img = Img::new(3, CS as u64);
    put64(&mut img.bytes, CS, 2 * CS as u64 + 512);
    assert!(matches!(img.open(), Err(ImageError::Misaligned { .. })));

    let mut img = Img::new(3, CS as u64);
    img.data(0, 1);
    img.l2(0, 3 * CS as u64 + 512);
    let r = img.open().unwrap();
    assert!(matches!(r.extents(), Err(ImageError::Misaligned { .. })));

    let mut img = Img::new(3, CS as u64);
    put64(&mut img.bytes, 40, CS as u64 + 8);
    assert!(matches!(img.open(), Err(ImageError::Misaligned { .. })));
}

#[test]
fn backing_file_is_refused_with_its_name() {
    let mut img = Img::new(3, CS as u64);
    img.bytes[512..520].copy_from_slice(b"base.img");
    put64(&mut img.bytes, 8, 512);
    put32(&mut img.bytes, 16, 8);
    let err = img.open().unwrap_err();
    assert!(matches!(err, ImageError::BackingFile(_)));
    let msg = err.to_string();
    assert!(
        msg.contains("\"base.img\"") && msg.contains("qemu-img convert"),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
}

#[test]
fn unknown_incompatible_feature_is_refused_by_name() {
    let mut img = Img::new(3, CS as u64);
    put64(&mut img.bytes, 72, 1 << 9);
    // Feature-name table naming bit 9.
    put32(&mut img.bytes, 104, 0x6803_f857);
    put32(&mut img.bytes, 108, 48);
    img.bytes[112] = 0;
    img.bytes[113] = 9;
    img.bytes[114..121].copy_from_slice(b"shiny-9");
    let err = img.open().unwrap_err();
    assert!(matches!(err, ImageError::UnknownIncompatibleFeatures { bits, .. } if bits == 1 << 9));
    assert!(err.to_string().contains("shiny-9"), "{err}");
}

#[test]
fn unsupported_headers_are_refused() {
    let refused = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut img = Img::new(3, CS as u64);
        edit(&mut img.bytes);
        img.open().unwrap_err()
    };
    use ImageError as E;
    assert!(matches!(refused(&|b| b[0] = b'X'), E::NotQcow2(_)));
    assert!(matches!(refused(&|b| b.truncate(3)), E::NotQcow2(_)));
    assert!(matches!(refused(&|b| b.truncate(60)), E::Truncated { .. }));
    assert!(matches!(
        refused(&|b| put32(b, 4, 4)),
        E::UnsupportedVersion(4)
    ));
    assert!(matches!(
        refused(&|b| put32(b, 4, 1)),
        E::UnsupportedVersion(1)
    ));
    assert!(matches!(refused(&|b| put32(b, 32, 2)), E::Encrypted(2)));
    assert!(matches!(refused(&|b| put64(b, 72, 2)), E::Corrupt));
    assert!(matches!(
        refused(&|b| put64(b, 72, 4)),
        E::ExternalDataFile(_)
    ));
    assert!(matches!(refused(&|b| put64(b, 72, 16)), E::ExtendedL2));
    assert!(matches!(refused(&|b| put32(b, 20, 8)), E::ClusterBits(8)));
    assert!(matches!(refused(&|b| put32(b, 20, 22)), E::ClusterBits(22)));
    assert!(matches!(
        refused(&|b| put32(b, 100, 100)),
        E::InvalidHeader(_)
    ));
    assert!(matches!(
        refused(&|b| put64(b, 24, (1 << 56) + 1)),
        E::VirtualSizeTooLarge { .. }
    ));
    // 4 KiB clusters: one L1 entry maps 2 MiB, so 3 MiB needs two.
    assert!(matches!(
        refused(&|b| put64(b, 24, 3 << 20)),
        E::L1SizeMismatch {
            l1_size: 1,
            needed: 2
        }
    ));
    // zstd compression type without the feature bit, and an unknown type.
    let with_type = |t: u8, bit: bool| {
        move |b: &mut Vec<u8>| {
            put32(b, 100, 112);
            b[104] = t;
            if bit {
                put64(b, 72, 8);
            }
        }
    };
    assert!(matches!(refused(&with_type(1, false)), E::InvalidHeader(_)));
    assert!(matches!(
        refused(&with_type(2, true)),
        E::UnsupportedCompressionType(2)
    ));
    // The dirty bit alone is fine: refcounts are not read.
    let mut img = Img::new(3, CS as u64);
    put64(&mut img.bytes, 72, 1);
    img.open().unwrap();
}

/// A compressed-cluster descriptor for 4 KiB clusters.
fn compressed_entry(host: u64, len: u64) -> u64 {
    let x = 62 - (CB - 8);
    let sectors = (host + len - 1) / 512 - host / 512;
    COMPRESSED | (sectors << x) | host
}

#[test]
fn deflate_compressed_cluster_reads_back() {
    use flate2::{Compress, Compression, FlushCompress};
    let data: Vec<u8> = (0..CS).map(|i| (i % 13) as u8).collect();
    let mut c = Compress::new(Compression::default(), false);
    let mut packed = Vec::with_capacity(2 * CS);
    c.compress_vec(&data, &mut packed, FlushCompress::Finish)
        .unwrap();

    let mut img = Img::new(3, 2 * CS as u64);
    // Compressed data need not be aligned: put it 100 bytes into a cluster.
    let host = img.bytes.len() as u64 + 100;
    img.bytes.extend(std::iter::repeat_n(0, 100));
    img.bytes.extend_from_slice(&packed);
    img.l2(1, compressed_entry(host, packed.len() as u64));
    let r = img.open().unwrap();
    let all = read_all(&r);
    assert_eq!(&all[CS..], &data[..]);
    // Small reads inside the cluster (served from the decompressed copy).
    let mut buf = [0u8; 10];
    r.read(CS as u64 + 20, &mut buf).unwrap();
    assert_eq!(&buf[..], &data[20..30]);
    assert_eq!(
        r.extents().unwrap()[1],
        ext(CS as u64, CS as u64, ExtentKind::Data)
    );

    // Corrupt the stream: an error, not garbage.
    let mut img = Img::new(3, 2 * CS as u64);
    let host = img.bytes.len() as u64;
    img.bytes.extend(std::iter::repeat_n(0xff, packed.len()));
    img.l2(1, compressed_entry(host, packed.len() as u64));
    let r = img.open().unwrap();
    let mut buf = vec![0u8; CS];
    assert!(matches!(
        r.read(CS as u64, &mut buf),
        Err(ImageError::Decompress { .. })
    ));
}

#[test]
fn writer_output_reads_back() {
    let cs = 1u64 << CB;
    let size = 5 * cs + 1024;
    let mut w = Qcow2Writer::create(Cursor::new(Vec::new()), size, CB).unwrap();
    let fill = |b: u8| vec![b; CS];
    w.write_cluster(4, &fill(4)).unwrap();
    w.write_cluster(1, &fill(1)).unwrap();
    w.write_cluster(5, &fill(5)).unwrap();
    assert!(matches!(
        w.write_cluster(1, &fill(1)),
        Err(ImageError::ClusterWrittenTwice(1))
    ));
    assert!(matches!(
        w.write_cluster(6, &fill(6)),
        Err(ImageError::ClusterIndexOutOfRange { .. })
    ));
    assert!(matches!(
        w.write_cluster(2, &[0; 10]),
        Err(ImageError::ClusterLength { .. })
    ));
    let bytes = w.finish().unwrap().into_inner();
    assert_eq!(bytes.len() % CS, 0);
    let r = Qcow2Reader::open(bytes).unwrap();
    assert_eq!(r.virtual_size(), size);
    let all = read_all(&r);
    for (i, chunk) in all.chunks(CS).enumerate() {
        let want = if [1, 4, 5].contains(&i) { i as u8 } else { 0 };
        assert!(chunk.iter().all(|&b| b == want), "cluster {i}");
    }
    assert_eq!(
        r.extents().unwrap(),
        vec![
            ext(0, cs, ExtentKind::Zero),
            ext(cs, cs, ExtentKind::Data),
            ext(2 * cs, 2 * cs, ExtentKind::Zero),
            ext(4 * cs, cs + 1024, ExtentKind::Data),
        ]
    );
}

#[test]
fn writer_refuses_bad_parameters() {
    let out = || Cursor::new(Vec::new());
    assert!(matches!(
        Qcow2Writer::create(out(), 1 << 20, 8),
        Err(ImageError::ClusterBits(8))
    ));
    assert!(matches!(
        Qcow2Writer::create(out(), (1 << 56) + 1, 16),
        Err(ImageError::VirtualSizeTooLarge { .. })
    ));
    assert!(matches!(
        Qcow2Writer::create(out(), 1000, 16),
        Err(ImageError::VirtualSizeUnaligned(1000))
    ));
    // 512-byte clusters map 32 KiB per L1 entry: 1 PiB is far too much.
    assert!(matches!(
        Qcow2Writer::create(out(), 1 << 50, 9),
        Err(ImageError::L1TooLarge { .. })
    ));
}

#[test]
fn probe_and_format_names() {
    assert_eq!(probe(b"QFI\xfb\0\0\0\x03"), ImageFormat::Qcow2);
    assert_eq!(probe(b"QFI"), ImageFormat::Raw);
    assert_eq!(probe(&[0; 512]), ImageFormat::Raw);
    assert!(matches!(
        crate::probe_auto(b"KDMV\x01\0\0\0"),
        Err(ImageError::ForeignFormat("VMDK"))
    ));
    assert!(matches!(
        crate::probe_auto(b"vhdxfile"),
        Err(ImageError::ForeignFormat("VHDX"))
    ));
    assert_eq!(crate::probe_auto(&[0; 64]).unwrap(), ImageFormat::Raw);
    assert_eq!("qcow2".parse::<ImageFormat>().unwrap(), ImageFormat::Qcow2);
    assert_eq!("RAW".parse::<ImageFormat>().unwrap(), ImageFormat::Raw);
    assert!("vmdk".parse::<ImageFormat>().is_err());
    assert_eq!(ImageFormat::parse_choice("auto").unwrap(), None);
    assert_eq!(
        ImageFormat::parse_choice("qcow2").unwrap(),
        Some(ImageFormat::Qcow2)
    );
    assert_eq!(ImageFormat::Qcow2.to_string(), "qcow2");
}

/// Counts the reads that reach the source.
struct Counting(Vec<u8>, std::sync::atomic::AtomicUsize);

impl crate::ReadAt for Counting {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.read_at(buf, offset)
    }

    fn len(&self) -> std::io::Result<u64> {
        crate::ReadAt::len(&self.0)
    }
}

#[test]
fn sequential_read_loads_each_l2_table_once() {
    // 512-byte clusters: an L2 table maps 64 clusters, so 4096 data clusters
    // need 64 tables, far more than the cache holds at once.
    let bits = 9;
    let clusters = 4096u64;
    let mut w = Qcow2Writer::create(Cursor::new(Vec::new()), clusters << bits, bits).unwrap();
    for i in 0..clusters {
        w.write_cluster(i, &[i as u8; 512]).unwrap();
    }
    let image = w.finish().unwrap().into_inner();
    let r = Qcow2Reader::open(Counting(image, Default::default())).unwrap();
    let at_open = r.into_inner();
    let opened = at_open.1.load(std::sync::atomic::Ordering::Relaxed);
    let r = Qcow2Reader::open(at_open).unwrap();
    let mut buf = [0u8; 512];
    for i in 0..clusters {
        r.read(i << bits, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == i as u8));
    }
    let reads = r.into_inner().1.into_inner() - 2 * opened;
    assert_eq!(
        reads as u64,
        clusters + 64,
        "one read per data cluster and per L2 table"
    );
}
