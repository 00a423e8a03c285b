//! Feeds arbitrary bytes to `basalt-peer-wire`'s decoder: once as a raw
//! stream of frames, and once wrapped in a valid header (kind from the first
//! byte, CRCs computed) so that the payload parsers are reached, which random
//! bytes behind a CRC almost never do.
//!
//! Beyond "never panics", whatever decodes must re-encode to exactly the
//! bytes it came from (the encoding is canonical), have the length
//! `encoded_len` predicts, and decode again to the same frame; and
//! `decode_shared` (write data sliced from the frame's buffer) must decode
//! exactly what `decode` does, refusing what it refuses.

#![no_main]

use basalt_peer_wire::{decode, decode_shared, encode, encoded_len, MAGIC, VERSION};
use basalt_replication::Payload;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check_stream(data);
    if let Some((&kind, payload)) = data.split_first() {
        let mut framed = Vec::from(MAGIC);
        // Every kind (1..=14) and a few that do not exist.
        framed.extend_from_slice(&[VERSION, kind % 16, 0, 0]);
        framed.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        framed.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
        let crc = crc32c::crc32c(&framed);
        framed.extend_from_slice(&crc.to_le_bytes());
        framed.extend_from_slice(payload);
        check_stream(&framed);
    }
});

fn check_stream(mut rest: &[u8]) {
    let shared = Payload::copy_from_slice(rest);
    assert_eq!(decode_shared(&shared), decode(rest));
    while let Ok(Some((frame, used))) = decode(rest) {
        assert!(used > 0 && used <= rest.len());
        let mut again = Vec::new();
        encode(&frame, &mut again).expect("a decoded frame encodes");
        assert_eq!(again, rest[..used]);
        assert_eq!(encoded_len(&frame), Ok(used));
        assert_eq!(decode(&again), Ok(Some((frame, used))));
        rest = &rest[used..];
    }
}
