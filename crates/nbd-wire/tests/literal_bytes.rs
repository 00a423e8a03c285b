//! Every message against literal byte vectors written from the protocol
//! description, in both directions where the crate offers both.

use basalt_nbd_wire::handshake::{opt, rep};
use basalt_nbd_wire::*;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

/// Asserts that every strict prefix of `bytes` is reported incomplete.
fn assert_prefixes_incomplete(bytes: &[u8], parse: impl Fn(&[u8]) -> Result<usize, WireError>) {
    for cut in 0..bytes.len() {
        match parse(&bytes[..cut]) {
            Err(WireError::Incomplete(needed)) => {
                assert!(
                    needed > cut && needed <= bytes.len(),
                    "cut {cut}: needs {needed}"
                )
            }
            other => panic!("prefix of {cut} bytes: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------- handshake

#[test]
fn server_greeting() {
    let expected = hex("4e42444d41474943 49484156454f5054 0003");
    let mut out = Vec::new();
    encode_server_greeting(
        HandshakeFlags::FIXED_NEWSTYLE | HandshakeFlags::NO_ZEROES,
        &mut out,
    );
    assert_eq!(out, expected);
    let (flags, used) = parse_server_greeting(&expected).unwrap();
    assert_eq!(used, 18);
    assert_eq!(flags.bits(), 3);
    assert_prefixes_incomplete(&expected, |b| {
        parse_server_greeting(b).map(|(_, used)| used)
    });

    // An oldstyle server sends cliserv_magic instead of IHAVEOPT.
    let oldstyle = hex("4e42444d41474943 0000420281861253 0000");
    assert!(matches!(
        parse_server_greeting(&oldstyle),
        Err(WireError::BadMagic { .. })
    ));
}

#[test]
fn client_flags() {
    let bytes = hex("00000003");
    let (flags, used) = parse_client_flags(&bytes).unwrap();
    assert_eq!(used, 4);
    assert!(flags.contains(ClientFlags::FIXED_NEWSTYLE | ClientFlags::NO_ZEROES));
    assert_eq!(flags.unknown_bits(), 0);
    let mut out = Vec::new();
    encode_client_flags(flags, &mut out);
    assert_eq!(out, bytes);

    let (flags, _) = parse_client_flags(&hex("80000001")).unwrap();
    assert_eq!(flags.unknown_bits(), 0x8000_0000);
    assert_prefixes_incomplete(&bytes, |b| parse_client_flags(b).map(|(_, used)| used));
}

#[test]
fn option_export_name() {
    let bytes = hex("49484156454f5054 00000001 00000004 64697363");
    let (option, used) = parse_option(&bytes).unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(option, ClientOption::ExportName("disc".into()));
    let mut out = Vec::new();
    encode_option(&option, &mut out).unwrap();
    assert_eq!(out, bytes);
    assert_prefixes_incomplete(&bytes, |b| parse_option_frame(b).map(|(_, used)| used));

    // The empty name (default export).
    let (option, _) = parse_option(&hex("49484156454f5054 00000001 00000000")).unwrap();
    assert_eq!(option, ClientOption::ExportName(String::new()));
}

#[test]
fn option_without_data() {
    for (code, expected) in [
        (opt::ABORT, ClientOption::Abort),
        (opt::LIST, ClientOption::List),
        (opt::STARTTLS, ClientOption::StartTls),
        (opt::STRUCTURED_REPLY, ClientOption::StructuredReply),
    ] {
        let mut bytes = hex("49484156454f5054");
        bytes.extend_from_slice(&code.to_be_bytes());
        bytes.extend_from_slice(&[0, 0, 0, 0]);
        let (option, used) = parse_option(&bytes).unwrap();
        assert_eq!((option.clone(), used), (expected, 16));
        let mut out = Vec::new();
        encode_option(&option, &mut out).unwrap();
        assert_eq!(out, bytes);

        // With data: framing is fine, the payload is refused, except for
        // ABORT whose data the server ignores.
        let mut with_data = hex("49484156454f5054");
        with_data.extend_from_slice(&code.to_be_bytes());
        with_data.extend_from_slice(&hex("00000002 abcd"));
        let (frame, used) = parse_option_frame(&with_data).unwrap();
        assert_eq!(used, 18);
        assert_eq!(frame.option, code);
        if code == opt::ABORT {
            assert_eq!(frame.decode().unwrap(), ClientOption::Abort);
        } else {
            assert!(matches!(frame.decode(), Err(WireError::Malformed { .. })));
        }
    }
}

#[test]
fn option_info_and_go() {
    // name "vol1", two requests: NAME (1) and BLOCK_SIZE (3).
    let payload = hex("00000004 766f6c31 0002 0001 0003");
    for (code, wrap) in [
        (
            opt::INFO,
            ClientOption::Info as fn(InfoRequest) -> ClientOption,
        ),
        (opt::GO, ClientOption::Go),
    ] {
        let mut bytes = hex("49484156454f5054");
        bytes.extend_from_slice(&code.to_be_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&payload);
        let (option, used) = parse_option(&bytes).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(
            option,
            wrap(InfoRequest {
                export: "vol1".into(),
                requests: vec![InfoType::Name, InfoType::BlockSize],
            })
        );
        let mut out = Vec::new();
        encode_option(&option, &mut out).unwrap();
        assert_eq!(out, bytes);
    }

    // Unknown information types are kept as values.
    let (option, _) = parse_option(&hex(
        "49484156454f5054 00000007 0000000a 00000000 0002 0000 7777",
    ))
    .unwrap();
    assert_eq!(
        option,
        ClientOption::Go(InfoRequest {
            export: String::new(),
            requests: vec![InfoType::Export, InfoType::Unknown(0x7777)],
        })
    );
}

#[test]
fn option_info_malformed_payloads() {
    let cases = [
        // name length points past the payload
        "00000010 766f6c31 0000",
        // request count larger than the list
        "00000004 766f6c31 0003 0001",
        // trailing byte
        "00000004 766f6c31 0000 00",
        // missing request count
        "00000004 766f6c31",
    ];
    for case in cases {
        let payload = hex(case);
        let mut bytes = hex("49484156454f5054 00000007");
        bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&payload);
        let (frame, used) = parse_option_frame(&bytes).unwrap();
        assert_eq!(used, bytes.len());
        assert!(frame.decode().is_err(), "{case} decoded");
    }
    // An export name with invalid UTF-8 or NUL.
    for name in ["00000002 c328", "00000002 6100"] {
        let mut payload = hex(name);
        payload.extend_from_slice(&[0, 0]);
        let mut bytes = hex("49484156454f5054 00000006");
        bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&payload);
        assert!(matches!(
            parse_option(&bytes),
            Err(WireError::BadString { .. })
        ));
    }
}

#[test]
fn option_meta_context() {
    // export "v", queries "base:allocation" and "base:".
    let payload =
        hex("00000001 76 00000002 0000000f 626173653a616c6c6f636174696f6e 00000005 626173653a");
    for (code, wrap) in [
        (
            opt::LIST_META_CONTEXT,
            ClientOption::ListMetaContext as fn(MetaContextRequest) -> ClientOption,
        ),
        (opt::SET_META_CONTEXT, ClientOption::SetMetaContext),
    ] {
        let mut bytes = hex("49484156454f5054");
        bytes.extend_from_slice(&code.to_be_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&payload);
        let (option, used) = parse_option(&bytes).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(
            option,
            wrap(MetaContextRequest {
                export: "v".into(),
                queries: vec!["base:allocation".into(), "base:".into()],
            })
        );
        let mut out = Vec::new();
        encode_option(&option, &mut out).unwrap();
        assert_eq!(out, bytes);
    }

    // A query count of 2^32-1 with no queries is rejected without looping.
    let bytes = hex("49484156454f5054 0000000a 00000009 00000001 76 ffffffff");
    assert!(matches!(
        parse_option(&bytes),
        Err(WireError::Malformed { .. })
    ));
    // A query longer than the string limit.
    let bytes = hex("49484156454f5054 0000000a 0000000d 00000001 76 00000001 00001001");
    assert!(matches!(
        parse_option(&bytes),
        Err(WireError::StringTooLong { .. })
    ));
}

#[test]
fn option_unknown_and_framing_errors() {
    let bytes = hex("49484156454f5054 00000063 00000003 010203");
    let (option, used) = parse_option(&bytes).unwrap();
    assert_eq!(used, 19);
    assert_eq!(
        option,
        ClientOption::Unknown {
            option: 0x63,
            payload: vec![1, 2, 3]
        }
    );
    let mut out = Vec::new();
    encode_option(&option, &mut out).unwrap();
    assert_eq!(out, bytes);

    // Bad magic.
    assert!(matches!(
        parse_option_frame(&hex("49484156454f5055 00000001 00000000")),
        Err(WireError::BadMagic { .. })
    ));
    // Oversize payload is refused from the header alone.
    assert!(matches!(
        parse_option_frame(&hex("49484156454f5054 00000001 00010001")),
        Err(WireError::TooLarge { .. })
    ));
    assert!(matches!(
        parse_option_frame(&hex("49484156454f5054 00000001 ffffffff")),
        Err(WireError::TooLarge { .. })
    ));
    // Exactly the limit is fine (and incomplete here).
    assert_eq!(
        parse_option_frame(&hex("49484156454f5054 00000001 00010000")),
        Err(WireError::Incomplete(16 + 65536))
    );
}

fn reply_bytes(option: u32, reply_type: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = hex("0003e889045565a9");
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&reply_type.to_be_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

fn assert_reply(option: u32, reply: OptionReply, bytes: &[u8]) {
    let mut out = Vec::new();
    encode_option_reply(option, &reply, &mut out).unwrap();
    assert_eq!(out, bytes, "encoding {reply:?}");
    let ((parsed_option, parsed), used) = parse_option_reply(bytes).unwrap();
    assert_eq!((parsed_option, parsed, used), (option, reply, bytes.len()));
    assert_prefixes_incomplete(bytes, |b| parse_option_reply(b).map(|(_, used)| used));
}

#[test]
fn option_reply_ack_and_server() {
    assert_reply(
        opt::STRUCTURED_REPLY,
        OptionReply::Ack,
        &hex("0003e889045565a9 00000008 00000001 00000000"),
    );
    assert_reply(
        opt::LIST,
        OptionReply::Server {
            name: "db".into(),
            description: String::new(),
        },
        &reply_bytes(opt::LIST, rep::SERVER, &hex("00000002 6462")),
    );
    assert_reply(
        opt::LIST,
        OptionReply::Server {
            name: "db".into(),
            description: "10G".into(),
        },
        &reply_bytes(opt::LIST, rep::SERVER, &hex("00000002 6462 313047")),
    );
}

#[test]
fn option_reply_info() {
    let flags = TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_FLUSH;
    assert_reply(
        opt::GO,
        OptionReply::Info(InfoReply::Export {
            size: 1 << 30,
            flags,
        }),
        &reply_bytes(opt::GO, rep::INFO, &hex("0000 0000000040000000 0005")),
    );
    assert_reply(
        opt::GO,
        OptionReply::Info(InfoReply::Name("vol".into())),
        &reply_bytes(opt::GO, rep::INFO, &hex("0001 766f6c")),
    );
    assert_reply(
        opt::INFO,
        OptionReply::Info(InfoReply::Description("a disk".into())),
        &reply_bytes(opt::INFO, rep::INFO, &hex("0002 61206469736b")),
    );
    assert_reply(
        opt::GO,
        OptionReply::Info(InfoReply::BlockSize {
            minimum: 512,
            preferred: 4096,
            maximum: 32 << 20,
        }),
        &reply_bytes(opt::GO, rep::INFO, &hex("0003 00000200 00001000 02000000")),
    );
    // A wrong length for a fixed-size info is malformed.
    let bad = reply_bytes(opt::GO, rep::INFO, &hex("0000 0000000040000000"));
    assert!(matches!(
        parse_option_reply(&bad),
        Err(WireError::Malformed { .. })
    ));
}

#[test]
fn option_reply_meta_context_and_errors() {
    assert_reply(
        opt::SET_META_CONTEXT,
        OptionReply::MetaContext {
            context_id: 1,
            name: BASE_ALLOCATION.into(),
        },
        &reply_bytes(
            opt::SET_META_CONTEXT,
            rep::META_CONTEXT,
            &hex("00000001 626173653a616c6c6f636174696f6e"),
        ),
    );
    let errors = [
        (ErrorReply::Unsupported, 0x8000_0001u32),
        (ErrorReply::Policy, 0x8000_0002),
        (ErrorReply::Invalid, 0x8000_0003),
        (ErrorReply::Platform, 0x8000_0004),
        (ErrorReply::TlsRequired, 0x8000_0005),
        (ErrorReply::UnknownExport, 0x8000_0006),
        (ErrorReply::Shutdown, 0x8000_0007),
        (ErrorReply::BlockSizeRequired, 0x8000_0008),
        (ErrorReply::TooBig, 0x8000_0009),
        (ErrorReply::ExtHeaderRequired, 0x8000_000a),
        (ErrorReply::Other(0x8000_00ff), 0x8000_00ff),
    ];
    for (error, code) in errors {
        assert_eq!(error.code(), code);
        assert_reply(
            opt::GO,
            OptionReply::error(error, ""),
            &reply_bytes(opt::GO, code, &[]),
        );
        assert_reply(
            opt::GO,
            OptionReply::error(error, "no"),
            &reply_bytes(opt::GO, code, b"no"),
        );
    }
    // Long messages are cut to the string limit on a character boundary.
    let long = "é".repeat(3000);
    let mut out = Vec::new();
    encode_option_reply(
        opt::GO,
        &OptionReply::error(ErrorReply::Invalid, long),
        &mut out,
    )
    .unwrap();
    assert_eq!(out.len(), 20 + 4096);
    // Unknown non-error reply types are kept.
    assert_reply(
        opt::GO,
        OptionReply::Unknown {
            reply_type: 77,
            payload: vec![9],
        },
        &reply_bytes(opt::GO, 77, &[9]),
    );
}

#[test]
fn option_reply_rejects_bad_input() {
    // Bad magic, oversize payload, names that break the string rules.
    assert!(matches!(
        parse_option_reply(&hex("0003e889045565aa 00000001 00000001 00000000")),
        Err(WireError::BadMagic { .. })
    ));
    assert!(matches!(
        parse_option_reply(&hex("0003e889045565a9 00000001 00000001 00010001")),
        Err(WireError::TooLarge { .. })
    ));
    let mut out = Vec::new();
    let too_long = OptionReply::Info(InfoReply::Name("x".repeat(MAX_STRING_LEN + 1)));
    assert!(encode_option_reply(opt::GO, &too_long, &mut out).is_err());
    assert!(
        out.is_empty(),
        "a failed encode leaves the output untouched"
    );
    let with_nul = OptionReply::MetaContext {
        context_id: 0,
        name: "base:\0".into(),
    };
    assert!(encode_option_reply(opt::GO, &with_nul, &mut out).is_err());
    assert!(out.is_empty());
}

#[test]
fn export_name_reply() {
    let flags = TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_FUA;
    let mut short = Vec::new();
    encode_export_name_reply(0x1000, flags, true, &mut short);
    assert_eq!(short, hex("0000000000001000 0009"));
    let mut long = Vec::new();
    encode_export_name_reply(0x1000, flags, false, &mut long);
    assert_eq!(long.len(), 134);
    assert!(long[10..].iter().all(|&b| b == 0));
    assert_eq!(
        parse_export_name_reply(&short, true).unwrap(),
        ((0x1000, flags), 10)
    );
    assert_eq!(
        parse_export_name_reply(&long, false).unwrap(),
        ((0x1000, flags), 134)
    );
    assert_eq!(
        parse_export_name_reply(&short, false),
        Err(WireError::Incomplete(134))
    );
}

// ------------------------------------------------------------- transmission

#[test]
fn request_headers() {
    let cases = [
        (0u16, Command::Read),
        (1, Command::Write),
        (2, Command::Disc),
        (3, Command::Flush),
        (4, Command::Trim),
        (5, Command::Cache),
        (6, Command::WriteZeroes),
        (7, Command::BlockStatus),
        (8, Command::Unknown(8)),
        (0xffff, Command::Unknown(0xffff)),
    ];
    for (code, command) in cases {
        let mut bytes = hex("25609513 0001");
        bytes.extend_from_slice(&code.to_be_bytes());
        bytes.extend_from_slice(&hex("0102030405060708 0000000000100000 00001000"));
        let (request, used) = parse_request(&bytes).unwrap();
        assert_eq!(used, 28);
        assert_eq!(
            request,
            Request {
                flags: CommandFlags::FUA,
                command,
                cookie: 0x0102_0304_0506_0708,
                offset: 0x10_0000,
                length: 0x1000,
            }
        );
        assert_eq!(
            request.payload_len(),
            if command == Command::Write { 0x1000 } else { 0 }
        );
        let mut out = Vec::new();
        encode_request(&request, &mut out);
        assert_eq!(out, bytes);
        assert_prefixes_incomplete(&bytes, |b| parse_request(b).map(|(_, used)| used));
    }
    assert!(matches!(
        parse_request(&hex(
            "25609514 0000 0000 00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00 00000000"
        )),
        Err(WireError::BadMagic { .. })
    ));
    let request = parse_request(&hex(
        "25609513 0000 0000 0000000000000000 ffffffffffffff00 00000200",
    ))
    .unwrap()
    .0;
    assert_eq!(request.end(), None, "offset + length overflows");
}

#[test]
fn simple_replies() {
    let mut out = Vec::new();
    encode_simple_reply(7, None, &mut out);
    assert_eq!(out, hex("67446698 00000000 0000000000000007"));
    assert_eq!(
        parse_simple_reply(&out).unwrap(),
        (
            SimpleReply {
                cookie: 7,
                error: None
            },
            16
        )
    );
    assert_eq!(peek_reply_kind(&out), Ok(ReplyKind::Simple));
    let errors = [
        (NbdError::Perm, 1u32),
        (NbdError::Io, 5),
        (NbdError::NoMem, 12),
        (NbdError::Invalid, 22),
        (NbdError::NoSpace, 28),
        (NbdError::Overflow, 75),
        (NbdError::NotSupported, 95),
        (NbdError::Shutdown, 108),
        (NbdError::Unknown(4), 4),
    ];
    for (error, code) in errors {
        assert_eq!(error.code(), code);
        assert_eq!(NbdError::from_code(code), Some(error));
        let mut out = Vec::new();
        encode_simple_reply(0xfeed, Some(error), &mut out);
        let mut expected = hex("67446698");
        expected.extend_from_slice(&code.to_be_bytes());
        expected.extend_from_slice(&hex("000000000000feed"));
        assert_eq!(out, expected);
        assert_eq!(parse_simple_reply(&out).unwrap().0.error, Some(error));
    }
    assert_eq!(NbdError::from_code(0), None);
    assert!(matches!(
        peek_reply_kind(&hex("12345678")),
        Err(WireError::BadMagic { .. })
    ));
}

fn assert_chunk(chunk: ReplyChunk<'_>, bytes: &[u8]) {
    let mut out = Vec::new();
    encode_chunk(&chunk, &mut out).unwrap();
    assert_eq!(out, bytes, "encoding {chunk:?}");
    assert_eq!(peek_reply_kind(bytes), Ok(ReplyKind::Structured));
    let (parsed, used) = parse_chunk(bytes).unwrap();
    assert_eq!((parsed, used), (chunk, bytes.len()));
    assert_prefixes_incomplete(bytes, |b| parse_chunk(b).map(|(_, used)| used));
}

#[test]
fn structured_chunks() {
    assert_chunk(
        ReplyChunk {
            flags: ReplyFlags::DONE,
            cookie: 1,
            payload: ChunkPayload::None,
        },
        &hex("668e33ef 0001 0000 0000000000000001 00000000"),
    );
    let mut none = Vec::new();
    encode_none_chunk(1, &mut none);
    assert_eq!(none, hex("668e33ef 0001 0000 0000000000000001 00000000"));

    let data = [0xaa, 0xbb, 0xcc];
    assert_chunk(
        ReplyChunk {
            flags: ReplyFlags::DONE,
            cookie: 2,
            payload: ChunkPayload::OffsetData {
                offset: 0x200,
                data: &data,
            },
        },
        &hex("668e33ef 0001 0001 0000000000000002 0000000b 0000000000000200 aabbcc"),
    );
    let mut header = Vec::new();
    encode_offset_data_header(2, ReplyFlags::DONE, 0x200, 3, &mut header).unwrap();
    assert_eq!(
        header,
        hex("668e33ef 0001 0001 0000000000000002 0000000b 0000000000000200")
    );

    assert_chunk(
        ReplyChunk {
            flags: ReplyFlags::empty(),
            cookie: 3,
            payload: ChunkPayload::OffsetHole {
                offset: 0x1000,
                length: 0x2000,
            },
        },
        &hex("668e33ef 0000 0002 0000000000000003 0000000c 0000000000001000 00002000"),
    );
    assert_chunk(
        ReplyChunk {
            flags: ReplyFlags::DONE,
            cookie: 4,
            payload: ChunkPayload::BlockStatus {
                context_id: 1,
                descriptors: vec![
                    BlockDescriptor {
                        length: 0x10000,
                        status: BlockStatusFlags::HOLE | BlockStatusFlags::ZERO,
                    },
                    BlockDescriptor {
                        length: 0x1000,
                        status: BlockStatusFlags::empty(),
                    },
                ],
            },
        },
        &hex(
            "668e33ef 0001 0005 0000000000000004 00000014 00000001 00010000 00000003 00001000 00000000",
        ),
    );
    assert_chunk(
        ReplyChunk {
            flags: ReplyFlags::DONE,
            cookie: 5,
            payload: ChunkPayload::Error {
                error: NbdError::Invalid,
                message: "bad".into(),
            },
        },
        &hex("668e33ef 0001 8001 0000000000000005 00000009 00000016 0003 626164"),
    );
    assert_chunk(
        ReplyChunk {
            flags: ReplyFlags::empty(),
            cookie: 6,
            payload: ChunkPayload::ErrorOffset {
                error: NbdError::Io,
                message: String::new(),
                offset: 0x400,
            },
        },
        &hex("668e33ef 0000 8002 0000000000000006 0000000e 00000005 0000 0000000000000400"),
    );
    assert_chunk(
        ReplyChunk {
            flags: ReplyFlags::DONE,
            cookie: 7,
            payload: ChunkPayload::UnknownError {
                chunk_type: 0x8123,
                error: NbdError::Shutdown,
                message: "x".into(),
            },
        },
        &hex("668e33ef 0001 8123 0000000000000007 00000007 0000006c 0001 78"),
    );
    assert_chunk(
        ReplyChunk {
            flags: ReplyFlags::DONE,
            cookie: 8,
            payload: ChunkPayload::Unknown {
                chunk_type: 0x0042,
                payload: &[1, 2],
            },
        },
        &hex("668e33ef 0001 0042 0000000000000008 00000002 0102"),
    );
}

#[test]
fn structured_chunks_malformed() {
    let cases = [
        // NONE with a payload
        "668e33ef 0001 0000 0000000000000001 00000001 00",
        // NONE without DONE
        "668e33ef 0000 0000 0000000000000001 00000000",
        // OFFSET_DATA with no data
        "668e33ef 0001 0001 0000000000000001 00000008 0000000000000000",
        // OFFSET_HOLE of size zero
        "668e33ef 0001 0002 0000000000000001 0000000c 0000000000000000 00000000",
        // OFFSET_HOLE with a wrong length
        "668e33ef 0001 0002 0000000000000001 00000008 0000000000000000",
        // BLOCK_STATUS without descriptors
        "668e33ef 0001 0005 0000000000000001 00000004 00000001",
        // BLOCK_STATUS with a zero-length descriptor
        "668e33ef 0001 0005 0000000000000001 0000000c 00000001 00000000 00000000",
        // BLOCK_STATUS length not 4 + 8k
        "668e33ef 0001 0005 0000000000000001 00000007 00000001 000000 ",
        // ERROR with error value 0
        "668e33ef 0001 8001 0000000000000001 00000006 00000000 0000",
        // ERROR whose message length passes the chunk
        "668e33ef 0001 8001 0000000000000001 00000006 00000005 0001",
        // ERROR with trailing bytes
        "668e33ef 0001 8001 0000000000000001 00000007 00000005 0000 00",
    ];
    for case in cases {
        let bytes = hex(case);
        assert!(
            matches!(parse_chunk(&bytes), Err(WireError::Malformed { .. })),
            "{case}: {:?}",
            parse_chunk(&bytes)
        );
    }
    assert!(matches!(
        parse_chunk_header(&hex("668e33ef 0001 0001 0000000000000001 ffffffff")),
        Err(WireError::TooLarge { .. })
    ));
    let mut out = Vec::new();
    assert!(encode_offset_hole_chunk(1, ReplyFlags::DONE, 0, 0, &mut out).is_err());
    assert!(encode_block_status_chunk(1, ReplyFlags::DONE, 1, &[], &mut out).is_err());
    assert!(encode_offset_data_header(1, ReplyFlags::DONE, 0, 0, &mut out).is_err());
    assert!(encode_error_chunk(
        1,
        ReplyFlags::DONE,
        NbdError::Unknown(0),
        "",
        None,
        &mut out
    )
    .is_err());
    assert!(out.is_empty());
}
