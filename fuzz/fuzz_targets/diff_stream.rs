//! Parses arbitrary bytes as a changed-block stream (`basalt volume
//! import-diff`'s input), as they are and behind the stream's magic. Beyond
//! "never panics": every record the parser accepts encodes back to exactly
//! the bytes it was parsed from.

#![no_main]

use basalt_image::diff_stream::{encode_record, DiffParser, DIFF_MAGIC};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    parse(data);
    let mut framed = DIFF_MAGIC.to_vec();
    framed.extend_from_slice(data);
    parse(&framed);
});

fn parse(bytes: &[u8]) {
    let mut parser = DiffParser::new();
    let mut at = 0;
    while at <= bytes.len() {
        let Ok((record, used)) = parser.next(&bytes[at..]) else {
            return;
        };
        if let Some(record) = record {
            let mut again = Vec::new();
            encode_record(&record, &mut again).expect("an accepted record encodes");
            assert_eq!(&again[..], &bytes[at..at + used]);
        }
        at += used;
        if parser.is_finished() {
            return;
        }
    }
}
