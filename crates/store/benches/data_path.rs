//! Software cost of the store's data path on a RAM disk (`MemDevice`), so
//! the disk does not hide it: overwrite of mapped space (the fast path), a
//! batch of 32 writes as one NBD batch at QD32 brings, reads of mapped and
//! unmapped space, the allocation map lookup, and a FLUSH with nothing
//! queued. Run: `cargo bench -p basalt-store`.

use basalt_store::{AlignedBuf, DataOp, FormatOptions, MemDevice, Store};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const MIB: u64 = 1 << 20;

fn data_path(c: &mut Criterion) {
    let store =
        Store::create(MemDevice::new(512 * MIB), &FormatOptions::default()).expect("format");
    let id = uuid::Uuid::new_v4();
    store.create_volume(id, 256 * MIB).expect("create");
    let vol = store.volume(id).expect("volume");
    // Map the first 64 MiB; leave the rest as holes.
    let mut block = AlignedBuf::zeroed(MIB as usize);
    block.fill(0x5a);
    for e in 0..64 {
        vol.write(e * MIB, &block, false).expect("fill");
    }
    store.flush().expect("flush");

    let mut g = c.benchmark_group("store_data_path");
    g.throughput(Throughput::Elements(1));
    let mut buf = AlignedBuf::zeroed(4096);
    let mut i = 0u64;
    g.bench_function("write_4k_overwrite", |b| {
        b.iter(|| {
            i = (i + 7919) % (64 * 256);
            vol.write(black_box(i * 4096), &buf, false).expect("write")
        })
    });
    g.bench_function("read_4k_mapped", |b| {
        b.iter(|| {
            i = (i + 7919) % (64 * 256);
            vol.read(black_box(i * 4096), &mut buf).expect("read")
        })
    });
    g.bench_function("read_4k_hole", |b| {
        b.iter(|| {
            i = (i + 7919) % (64 * 256);
            vol.read(black_box(128 * MIB + i * 4096), &mut buf)
                .expect("read")
        })
    });
    g.bench_function("mapping_lookup_1m", |b| {
        b.iter(|| {
            i = (i + 7919) % 200;
            black_box(vol.mapping(black_box(i * MIB), MIB).expect("mapping"))
        })
    });
    g.bench_function("flush_nothing_queued", |b| {
        b.iter(|| vol.flush().expect("flush"))
    });

    let bufs: Vec<AlignedBuf> = (0..32).map(|_| AlignedBuf::zeroed(4096)).collect();
    g.throughput(Throughput::Elements(32));
    g.bench_function("write_4k_batch_of_32", |b| {
        b.iter_batched_ref(
            || (),
            |_| {
                let mut ops: Vec<DataOp<'_>> = bufs
                    .iter()
                    .enumerate()
                    .map(|(k, buf)| {
                        DataOp::write(((k as u64 * 7919) % (64 * 256)) * 4096, buf, false)
                    })
                    .collect();
                vol.submit(&mut ops);
                black_box(ops.iter().all(|o| o.result.is_ok()))
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, data_path);
criterion_main!(benches);
