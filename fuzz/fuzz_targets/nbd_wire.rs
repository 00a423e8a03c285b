//! Feeds arbitrary bytes through every parser of `basalt-nbd-wire`, both as
//! isolated messages and as whole simulated conversations (the server reading
//! a client's handshake and requests, the client reading a server's replies).
//!
//! Beyond "never panics", it checks that whatever parses re-encodes to a
//! stable form: `encode(parse(encode(parse(x))))` equals `encode(parse(x))`,
//! and fixed-size messages re-encode to exactly the bytes they came from.

#![no_main]

use basalt_nbd_wire::*;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    isolated_messages(data);
    server_reads_client(data);
    client_reads_server(data);
});

fn isolated_messages(data: &[u8]) {
    if let Ok((flags, used)) = parse_server_greeting(data) {
        let mut out = Vec::new();
        encode_server_greeting(flags, &mut out);
        assert_eq!(out, data[..used]);
    }
    if let Ok((flags, used)) = parse_client_flags(data) {
        let mut out = Vec::new();
        encode_client_flags(flags, &mut out);
        assert_eq!(out, data[..used]);
    }
    if let Ok((frame, used)) = parse_option_frame(data) {
        assert_eq!(used, 16 + frame.payload.len());
        if let Ok(option) = frame.decode() {
            check_option_stable(&option);
        }
    }
    if let Ok(((option, reply), _)) = parse_option_reply(data) {
        check_option_reply_stable(option, &reply);
    }
    for no_zeroes in [false, true] {
        if let Ok(((size, flags), used)) = parse_export_name_reply(data, no_zeroes) {
            let mut out = Vec::new();
            encode_export_name_reply(size, flags, no_zeroes, &mut out);
            assert_eq!(out.len(), used);
            assert_eq!(out[..10], data[..10]);
        }
    }
    if let Ok((request, used)) = parse_request(data) {
        let mut out = Vec::new();
        encode_request(&request, &mut out);
        assert_eq!(out, data[..used]);
        assert_eq!(request.command, Command::from_code(request.command.code()));
    }
    if let Ok((reply, used)) = parse_simple_reply(data) {
        let mut out = Vec::new();
        encode_simple_reply(reply.cookie, reply.error, &mut out);
        assert_eq!(out, data[..used]);
    }
    let _ = peek_reply_kind(data);
    let _ = parse_chunk_header(data);
    if let Ok((chunk, _)) = parse_chunk(data) {
        check_chunk_stable(&chunk);
    }
}

fn check_option_stable(option: &ClientOption) {
    let mut first = Vec::new();
    if encode_option(option, &mut first).is_err() {
        return;
    }
    let (again, used) = parse_option(&first).expect("an encoded option parses");
    assert_eq!(used, first.len());
    assert_eq!(&again, option);
}

fn check_option_reply_stable(option: u32, reply: &OptionReply) {
    let mut first = Vec::new();
    if encode_option_reply(option, reply, &mut first).is_err() {
        return;
    }
    let ((option2, reply2), used) = parse_option_reply(&first).expect("an encoded reply parses");
    assert_eq!((option2, used), (option, first.len()));
    // Lossy text may have been truncated once; after that it is stable.
    let mut second = Vec::new();
    encode_option_reply(option2, &reply2, &mut second).expect("re-encoding succeeds");
    assert_eq!(first, second);
}

fn check_chunk_stable(chunk: &ReplyChunk<'_>) {
    let mut first = Vec::new();
    if encode_chunk(chunk, &mut first).is_err() {
        return;
    }
    let (chunk2, used) = parse_chunk(&first).expect("an encoded chunk parses");
    assert_eq!(used, first.len());
    let mut second = Vec::new();
    encode_chunk(&chunk2, &mut second).expect("re-encoding succeeds");
    assert_eq!(first, second);
}

/// The server side of a connection: client flags, options until one enters
/// transmission, then requests (with WRITE payloads) until DISC or the end.
fn server_reads_client(mut rest: &[u8]) {
    let mut replies = Vec::new();
    let Ok((flags, used)) = parse_client_flags(rest) else {
        return;
    };
    rest = &rest[used..];
    if flags.unknown_bits() != 0 {
        return;
    }
    let mut structured = false;
    loop {
        let Ok((frame, used)) = parse_option_frame(rest) else {
            return;
        };
        rest = &rest[used..];
        replies.clear();
        match frame.decode() {
            Err(err) => {
                let reply = OptionReply::error(ErrorReply::Invalid, err.to_string());
                encode_option_reply(frame.option, &reply, &mut replies).expect("error reply");
            }
            Ok(ClientOption::Abort) => return,
            Ok(ClientOption::ExportName(_)) => {
                encode_export_name_reply(
                    1 << 30,
                    TransmissionFlags::HAS_FLAGS,
                    false,
                    &mut replies,
                );
                break;
            }
            Ok(ClientOption::StructuredReply) => structured = true,
            Ok(ClientOption::Go(req)) => {
                let info = OptionReply::Info(InfoReply::Name(req.export));
                encode_option_reply(frame.option, &info, &mut replies).expect("name reply");
                break;
            }
            Ok(ClientOption::SetMetaContext(req)) | Ok(ClientOption::ListMetaContext(req)) => {
                for query in req.queries {
                    let reply = OptionReply::MetaContext {
                        context_id: 1,
                        name: query,
                    };
                    encode_option_reply(frame.option, &reply, &mut replies).expect("context");
                }
            }
            Ok(other) => check_option_stable(&other),
        }
    }
    loop {
        let Ok((request, used)) = parse_request(rest) else {
            return;
        };
        rest = &rest[used..];
        let payload = request.payload_len() as usize;
        let Some(data) = rest.get(..payload) else {
            return;
        };
        rest = &rest[payload..];
        replies.clear();
        match request.command {
            Command::Disc => return,
            Command::Read if structured && request.length > 0 => {
                let len = request.length.min(4096);
                encode_offset_data_header(
                    request.cookie,
                    ReplyFlags::DONE,
                    request.offset,
                    len,
                    &mut replies,
                )
                .expect("data header");
            }
            Command::BlockStatus if structured && request.length > 0 => {
                let d = BlockDescriptor {
                    length: request.length,
                    status: BlockStatusFlags::HOLE,
                };
                encode_block_status_chunk(request.cookie, ReplyFlags::DONE, 1, &[d], &mut replies)
                    .expect("block status");
            }
            Command::Unknown(_) => {
                encode_error_chunk(
                    request.cookie,
                    ReplyFlags::DONE,
                    NbdError::Invalid,
                    "unknown",
                    None,
                    &mut replies,
                )
                .expect("error chunk");
            }
            _ => encode_simple_reply(request.cookie, None, &mut replies),
        }
        assert!(data.len() == payload);
    }
}

/// The client side: greeting, option replies until an ACK to GO, then a
/// stream of simple replies and structured chunks.
fn client_reads_server(mut rest: &[u8]) {
    let Ok((_, used)) = parse_server_greeting(rest) else {
        return;
    };
    rest = &rest[used..];
    loop {
        let Ok(((option, reply), used)) = parse_option_reply(rest) else {
            return;
        };
        rest = &rest[used..];
        check_option_reply_stable(option, &reply);
        if option == handshake::opt::GO && reply == OptionReply::Ack {
            break;
        }
    }
    loop {
        match peek_reply_kind(rest) {
            Ok(ReplyKind::Simple) => {
                let Ok((_, used)) = parse_simple_reply(rest) else {
                    return;
                };
                rest = &rest[used..];
            }
            Ok(ReplyKind::Structured) => {
                let Ok((chunk, used)) = parse_chunk(rest) else {
                    return;
                };
                check_chunk_stable(&chunk);
                rest = &rest[used..];
            }
            Err(_) => return,
        }
    }
}
