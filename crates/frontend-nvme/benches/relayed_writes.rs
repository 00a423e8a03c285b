//! QD1 4 KiB writes through an NVMe/TCP I/O queue on an event loop, to a
//! volume whose batches complete on another thread (a replicated volume's
//! kind of data path, `tests/common/relayed.rs`, with no delay of its
//! own): what a write costs between the host and the data path, the
//! loop's wake-up included or not (the thread that completes a write
//! sends its CapsuleResp itself).
//!
//!   cargo bench -p basalt-frontend-nvme --bench relayed_writes

#[path = "../tests/common/mod.rs"]
mod common;

use basalt_nvme_wire::Digests;
use common::*;
use criterion::{criterion_group, criterion_main, Criterion};
use std::sync::atomic::Ordering;

fn qd1_writes(c: &mut Criterion) {
    let mut group = c.benchmark_group("nvme-tcp QD1 4k write");
    for (name, delay) in [("local volume", u64::MAX), ("relayed volume", 0)] {
        let (server, subsystems) = target_with(&[("v", 64 * MIB)]);
        subsystems.relay_delay_us.store(delay, Ordering::Relaxed);
        let addr = server.local_addr();
        let admin = Host::admin(addr, Digests::NONE, "v", 0);
        let mut io = Host::io_queue(addr, Digests::NONE, &admin, "v", 1);
        let data = pattern(4096, 7);
        let mut lba = 0u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                lba = (lba + 1) % (64 * MIB / 4096);
                let cmd = io.write_cmd(lba, data.clone(), false, true);
                io.one(cmd).ok();
            })
        });
        drop(io);
        drop(admin);
        server.shutdown();
    }
    group.finish();
}

criterion_group!(benches, qd1_writes);
criterion_main!(benches);
