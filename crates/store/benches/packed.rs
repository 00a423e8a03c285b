//! What compression costs and saves in the store, on a RAM disk
//! (`MemDevice`, so the disk hides nothing): packing a 1 MiB extent with
//! LZ4 and zstd (throughput of compaction, per core), a 4 KiB read of a
//! packed extent next to one of a plain extent, and the first 4 KiB write
//! into a packed extent (which unpacks it) next to an overwrite. The data
//! is this benchmark's own executable — machine code, symbols and debug
//! information, about what an operating system image holds — and the
//! ratio each codec reaches on it is printed first. A packed read on a
//! real disk costs one more device read (the run's header) than a plain
//! one; this measures the CPU side. Run: `cargo bench -p basalt-store
//! --bench packed`.

use basalt_store::{AlignedBuf, Codec, FormatOptions, MemDevice, PackOutcome, Store};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const MIB: u64 = 1 << 20;
/// Extents of the corpus volume.
const EXTENTS: u64 = 32;

/// The executable's bytes, repeated to fill the volume (each 4 KiB block
/// is compressed on its own, so repeating changes no ratio).
fn corpus() -> Vec<u8> {
    let exe = std::env::current_exe().expect("own executable");
    let exe = std::fs::read(exe).expect("read own executable");
    println!("corpus: this executable, {} bytes, repeated", exe.len());
    exe.iter()
        .cycle()
        .take((EXTENTS * MIB) as usize)
        .copied()
        .collect()
}

fn packed(c: &mut Criterion) {
    let data = corpus();
    let store =
        Store::create(MemDevice::new(512 * MIB), &FormatOptions::default()).expect("format");
    for (name, codec) in [("lz4", Codec::Lz4), ("zstd", Codec::Zstd(3))] {
        let id = uuid::Uuid::new_v4();
        store.create_volume(id, EXTENTS * MIB).expect("create");
        store
            .volume(id)
            .unwrap()
            .write(0, &data, false)
            .expect("fill");
        let (mut packed, mut stored) = (0u64, 0u64);
        for l in 0..EXTENTS as u32 {
            if let PackOutcome::Packed { stored: s } = store.pack_extent(id, l, codec).unwrap() {
                packed += MIB;
                stored += s;
            }
        }
        println!(
            "{name}: {packed} of {} bytes packed into {stored}: ratio {:.2} on what packed, {:.2} overall",
            EXTENTS * MIB,
            packed as f64 / stored.max(1) as f64,
            (EXTENTS * MIB) as f64 / (stored + EXTENTS * MIB - packed) as f64
        );
        store.delete_volume(id).expect("delete");
    }

    let mut g = c.benchmark_group("store_packed");
    for (name, codec) in [("lz4", Codec::Lz4), ("zstd3", Codec::Zstd(3))] {
        let id = uuid::Uuid::new_v4();
        store.create_volume(id, EXTENTS * MIB).expect("create");
        let vol = store.volume(id).unwrap();
        vol.write(0, &data, false).expect("fill");
        let mut l = 0u32;
        g.throughput(Throughput::Bytes(MIB));
        g.bench_function(format!("pack_1m_{name}"), |b| {
            b.iter_batched(
                || {
                    // An unpacked extent to pack (rewriting it unpacks it).
                    l = (l + 1) % EXTENTS as u32;
                    let at = l as u64 * MIB;
                    vol.write(at, &data[at as usize..(at + MIB) as usize], false)
                        .expect("rewrite");
                    l
                },
                |l| black_box(store.pack_extent(id, l, codec).expect("pack")),
                BatchSize::PerIteration,
            )
        });
        store.delete_volume(id).expect("delete");
    }

    // Reads: half the volume packed (lz4), half plain.
    let id = uuid::Uuid::new_v4();
    store.create_volume(id, EXTENTS * MIB).expect("create");
    let vol = store.volume(id).unwrap();
    vol.write(0, &data, false).expect("fill");
    for l in 0..(EXTENTS / 2) as u32 {
        store.pack_extent(id, l, Codec::Lz4).expect("pack");
    }
    let half = EXTENTS / 2 * 256;
    let mut buf = AlignedBuf::zeroed(4096);
    let mut i = 0u64;
    g.throughput(Throughput::Elements(1));
    g.bench_function("read_4k_plain", |b| {
        b.iter(|| {
            i = (i + 7919) % half;
            vol.read(black_box((half + i) * 4096), &mut buf)
                .expect("read")
        })
    });
    g.bench_function("read_4k_packed_lz4", |b| {
        b.iter(|| {
            i = (i + 7919) % half;
            vol.read(black_box(i * 4096), &mut buf).expect("read")
        })
    });
    g.bench_function("write_4k_overwrite", |b| {
        b.iter(|| {
            i = (i + 7919) % half;
            vol.write(black_box((half + i) * 4096), &buf, false)
                .expect("write")
        })
    });
    g.bench_function("write_4k_into_packed_extent", |b| {
        b.iter_batched(
            || {
                i = (i + 1) % (EXTENTS / 2);
                store.pack_extent(id, i as u32, Codec::Lz4).expect("pack");
                i
            },
            |l| vol.write(black_box(l * MIB), &buf, false).expect("write"),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, packed);
criterion_main!(benches);
