//! Hot-path cost of the NBD codec: decoding requests (one, and a pipelined
//! batch of 32 as fio sends at QD32) and encoding the replies the server
//! sends per request. Run: `cargo bench -p basalt-nbd-wire`.

use basalt_nbd_wire::{
    encode_offset_data_header, encode_request, encode_simple_reply, parse_request, Command,
    CommandFlags, ReplyFlags, Request,
};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

fn request(i: u64) -> Request {
    Request {
        flags: CommandFlags::empty(),
        command: Command::Read,
        cookie: i,
        offset: i * 4096,
        length: 4096,
    }
}

fn codec(c: &mut Criterion) {
    let mut one = Vec::new();
    encode_request(&request(1), &mut one);
    let mut batch = Vec::new();
    for i in 0..32 {
        encode_request(&request(i), &mut batch);
    }

    let mut g = c.benchmark_group("nbd_request_decode");
    g.throughput(Throughput::Elements(1));
    g.bench_function("one", |b| b.iter(|| parse_request(black_box(&one))));
    g.throughput(Throughput::Elements(32));
    g.bench_function("pipelined_32", |b| {
        b.iter(|| {
            let mut at = 0;
            while let Ok((r, used)) = parse_request(black_box(&batch[at..])) {
                black_box(r);
                at += used;
            }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("nbd_reply_encode");
    g.throughput(Throughput::Elements(1));
    let mut out = Vec::with_capacity(64);
    g.bench_function("simple", |b| {
        b.iter(|| {
            out.clear();
            encode_simple_reply(black_box(7), None, &mut out);
        })
    });
    g.bench_function("structured_read_header", |b| {
        b.iter(|| {
            out.clear();
            let _ = encode_offset_data_header(black_box(7), ReplyFlags::DONE, 4096, 4096, &mut out);
        })
    });
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
