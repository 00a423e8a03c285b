//! Property tests: every encodable value parses back to itself, a truncated
//! encoding is reported as incomplete, and arbitrary bytes never make a
//! parser panic.

use basalt_nbd_wire::handshake::{opt, rep};
use basalt_nbd_wire::transmission::chunk_type;
use basalt_nbd_wire::*;
use proptest::collection::vec;
use proptest::prelude::*;

/// Protocol strings: UTF-8 without NUL, at most a few hundred characters
/// (long enough to cross interesting sizes, short enough to stay fast).
fn name() -> impl Strategy<Value = String> {
    "[^\u{0}]{0,64}"
}

fn info_type() -> impl Strategy<Value = InfoType> {
    any::<u16>().prop_map(InfoType::from_code)
}

fn info_request() -> impl Strategy<Value = InfoRequest> {
    (name(), vec(info_type(), 0..8)).prop_map(|(export, requests)| InfoRequest { export, requests })
}

fn meta_request() -> impl Strategy<Value = MetaContextRequest> {
    (name(), vec(name(), 0..6)).prop_map(|(export, queries)| MetaContextRequest { export, queries })
}

fn client_option() -> impl Strategy<Value = ClientOption> {
    prop_oneof![
        name().prop_map(ClientOption::ExportName),
        Just(ClientOption::Abort),
        Just(ClientOption::List),
        Just(ClientOption::StartTls),
        info_request().prop_map(ClientOption::Info),
        info_request().prop_map(ClientOption::Go),
        Just(ClientOption::StructuredReply),
        meta_request().prop_map(ClientOption::ListMetaContext),
        meta_request().prop_map(ClientOption::SetMetaContext),
        (
            any::<u32>().prop_filter("unknown option code", |c| !(1..=10).contains(c)
                || *c == opt::PEEK_EXPORT),
            vec(any::<u8>(), 0..64)
        )
            .prop_map(|(option, payload)| ClientOption::Unknown { option, payload }),
    ]
}

fn error_reply() -> impl Strategy<Value = ErrorReply> {
    (1u32..=0x7fff_ffff)
        .prop_map(|low| ErrorReply::from_code(low | rep::ERROR_BIT).expect("bit 31 is set"))
}

fn option_reply() -> impl Strategy<Value = OptionReply> {
    let info = prop_oneof![
        (any::<u64>(), any::<u16>()).prop_map(|(size, flags)| InfoReply::Export {
            size,
            flags: TransmissionFlags::from_bits(flags)
        }),
        name().prop_map(InfoReply::Name),
        "\\PC{0,64}".prop_map(InfoReply::Description),
        (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(minimum, preferred, maximum)| {
            InfoReply::BlockSize {
                minimum,
                preferred,
                maximum,
            }
        }),
        (4u16.., vec(any::<u8>(), 0..32))
            .prop_map(|(info_type, payload)| InfoReply::Unknown { info_type, payload }),
    ];
    prop_oneof![
        Just(OptionReply::Ack),
        (name(), "\\PC{0,64}")
            .prop_map(|(name, description)| OptionReply::Server { name, description }),
        info.prop_map(OptionReply::Info),
        (any::<u32>(), name())
            .prop_map(|(context_id, name)| OptionReply::MetaContext { context_id, name }),
        (error_reply(), "\\PC{0,64}")
            .prop_map(|(error, message)| OptionReply::Error { error, message }),
        (5u32..0x8000_0000, vec(any::<u8>(), 0..32)).prop_map(|(reply_type, payload)| {
            OptionReply::Unknown {
                reply_type,
                payload,
            }
        }),
    ]
}

fn nbd_error() -> impl Strategy<Value = NbdError> {
    (1u32..).prop_map(|code| NbdError::from_code(code).expect("nonzero"))
}

fn request() -> impl Strategy<Value = Request> {
    (
        any::<u16>(),
        any::<u16>(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(|(flags, command, cookie, offset, length)| Request {
            flags: CommandFlags::from_bits(flags),
            command: Command::from_code(command),
            cookie,
            offset,
            length,
        })
}

/// Owned description of a chunk, turned into a borrowed [`ReplyChunk`].
#[derive(Debug, Clone)]
enum OwnedChunk {
    None(u64),
    Data(u64, u16, u64, Vec<u8>),
    Hole(u64, u16, u64, u32),
    Status(u64, u16, u32, Vec<BlockDescriptor>),
    Error(u64, u16, NbdError, String),
    ErrorOffset(u64, u16, NbdError, String, u64),
    UnknownError(u64, u16, u16, NbdError, String),
    Unknown(u64, u16, u16, Vec<u8>),
}

impl OwnedChunk {
    fn borrow(&self) -> ReplyChunk<'_> {
        let f = ReplyFlags::from_bits;
        match self {
            OwnedChunk::None(cookie) => ReplyChunk {
                flags: ReplyFlags::DONE,
                cookie: *cookie,
                payload: ChunkPayload::None,
            },
            OwnedChunk::Data(cookie, flags, offset, data) => ReplyChunk {
                flags: f(*flags),
                cookie: *cookie,
                payload: ChunkPayload::OffsetData {
                    offset: *offset,
                    data,
                },
            },
            OwnedChunk::Hole(cookie, flags, offset, length) => ReplyChunk {
                flags: f(*flags),
                cookie: *cookie,
                payload: ChunkPayload::OffsetHole {
                    offset: *offset,
                    length: *length,
                },
            },
            OwnedChunk::Status(cookie, flags, context_id, descriptors) => ReplyChunk {
                flags: f(*flags),
                cookie: *cookie,
                payload: ChunkPayload::BlockStatus {
                    context_id: *context_id,
                    descriptors: descriptors.clone(),
                },
            },
            OwnedChunk::Error(cookie, flags, error, message) => ReplyChunk {
                flags: f(*flags),
                cookie: *cookie,
                payload: ChunkPayload::Error {
                    error: *error,
                    message: message.clone(),
                },
            },
            OwnedChunk::ErrorOffset(cookie, flags, error, message, offset) => ReplyChunk {
                flags: f(*flags),
                cookie: *cookie,
                payload: ChunkPayload::ErrorOffset {
                    error: *error,
                    message: message.clone(),
                    offset: *offset,
                },
            },
            OwnedChunk::UnknownError(cookie, flags, chunk_type, error, message) => ReplyChunk {
                flags: f(*flags),
                cookie: *cookie,
                payload: ChunkPayload::UnknownError {
                    chunk_type: *chunk_type,
                    error: *error,
                    message: message.clone(),
                },
            },
            OwnedChunk::Unknown(cookie, flags, chunk_type, payload) => ReplyChunk {
                flags: f(*flags),
                cookie: *cookie,
                payload: ChunkPayload::Unknown {
                    chunk_type: *chunk_type,
                    payload,
                },
            },
        }
    }
}

fn chunk() -> impl Strategy<Value = OwnedChunk> {
    let descriptor = (1u32.., any::<u32>()).prop_map(|(length, status)| BlockDescriptor {
        length,
        status: BlockStatusFlags::from_bits(status),
    });
    prop_oneof![
        any::<u64>().prop_map(OwnedChunk::None),
        (
            any::<u64>(),
            any::<u16>(),
            any::<u64>(),
            vec(any::<u8>(), 1..256)
        )
            .prop_map(|(c, f, o, d)| OwnedChunk::Data(c, f, o, d)),
        (any::<u64>(), any::<u16>(), any::<u64>(), 1u32..)
            .prop_map(|(c, f, o, l)| OwnedChunk::Hole(c, f, o, l)),
        (
            any::<u64>(),
            any::<u16>(),
            any::<u32>(),
            vec(descriptor, 1..16)
        )
            .prop_map(|(c, f, id, d)| OwnedChunk::Status(c, f, id, d)),
        (any::<u64>(), any::<u16>(), nbd_error(), "\\PC{0,64}")
            .prop_map(|(c, f, e, m)| OwnedChunk::Error(c, f, e, m)),
        (
            any::<u64>(),
            any::<u16>(),
            nbd_error(),
            "\\PC{0,64}",
            any::<u64>()
        )
            .prop_map(|(c, f, e, m, o)| OwnedChunk::ErrorOffset(c, f, e, m, o)),
        (
            any::<u64>(),
            any::<u16>(),
            (0x8003u16..),
            nbd_error(),
            "\\PC{0,64}"
        )
            .prop_map(|(c, f, t, e, m)| OwnedChunk::UnknownError(c, f, t, e, m)),
        (
            any::<u64>(),
            any::<u16>(),
            (0u16..0x8000).prop_filter("unknown chunk type", |t| ![0, 1, 2, 5].contains(t)),
            vec(any::<u8>(), 0..64)
        )
            .prop_map(|(c, f, t, p)| OwnedChunk::Unknown(c, f, t, p)),
    ]
}

/// Every strict prefix of a message must be `Incomplete`, never an error or
/// a success.
fn check_prefixes(
    bytes: &[u8],
    parse: impl Fn(&[u8]) -> Result<usize, WireError>,
) -> Result<(), TestCaseError> {
    for cut in 0..bytes.len() {
        match parse(&bytes[..cut]) {
            Err(WireError::Incomplete(needed)) => {
                prop_assert!(needed > cut && needed <= bytes.len())
            }
            other => prop_assert!(false, "prefix {cut}/{}: {other:?}", bytes.len()),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn client_option_roundtrip(option in client_option(), trailing in vec(any::<u8>(), 0..8)) {
        let mut bytes = Vec::new();
        encode_option(&option, &mut bytes).unwrap();
        let len = bytes.len();
        bytes.extend_from_slice(&trailing);
        let (parsed, used) = parse_option(&bytes).unwrap();
        prop_assert_eq!(used, len);
        // ABORT is the one option whose payload is ignored, so it is the only
        // one whose decoded form may not re-encode identically; ours has none.
        prop_assert_eq!(parsed, option);
        check_prefixes(&bytes[..len], |b| parse_option_frame(b).map(|(_, used)| used))?;
    }

    #[test]
    fn option_reply_roundtrip(option in any::<u32>(), reply in option_reply()) {
        let mut bytes = Vec::new();
        encode_option_reply(option, &reply, &mut bytes).unwrap();
        let ((parsed_option, parsed), used) = parse_option_reply(&bytes).unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(parsed_option, option);
        prop_assert_eq!(parsed, reply);
        check_prefixes(&bytes, |b| parse_option_reply(b).map(|(_, used)| used))?;
    }

    #[test]
    fn greeting_and_flags_roundtrip(hs in any::<u16>(), client in any::<u32>()) {
        let mut bytes = Vec::new();
        encode_server_greeting(HandshakeFlags::from_bits(hs), &mut bytes);
        prop_assert_eq!(parse_server_greeting(&bytes).unwrap(), (HandshakeFlags::from_bits(hs), 18));
        let mut bytes = Vec::new();
        encode_client_flags(ClientFlags::from_bits(client), &mut bytes);
        prop_assert_eq!(parse_client_flags(&bytes).unwrap(), (ClientFlags::from_bits(client), 4));
    }

    #[test]
    fn export_name_reply_roundtrip(size in any::<u64>(), flags in any::<u16>(), no_zeroes in any::<bool>()) {
        let flags = TransmissionFlags::from_bits(flags);
        let mut bytes = Vec::new();
        encode_export_name_reply(size, flags, no_zeroes, &mut bytes);
        let parse = |b: &[u8]| parse_export_name_reply(b, no_zeroes);
        prop_assert_eq!(parse(&bytes).unwrap(), ((size, flags), bytes.len()));
        check_prefixes(&bytes, |b| parse(b).map(|(_, used)| used))?;
    }

    #[test]
    fn request_roundtrip(request in request()) {
        let mut bytes = Vec::new();
        encode_request(&request, &mut bytes);
        prop_assert_eq!(parse_request(&bytes).unwrap(), (request, 28));
        check_prefixes(&bytes, |b| parse_request(b).map(|(_, used)| used))?;
    }

    #[test]
    fn simple_reply_roundtrip(cookie in any::<u64>(), error in proptest::option::of(nbd_error())) {
        let mut bytes = Vec::new();
        encode_simple_reply(cookie, error, &mut bytes);
        prop_assert_eq!(parse_simple_reply(&bytes).unwrap(), (SimpleReply { cookie, error }, 16));
    }

    #[test]
    fn chunk_roundtrip(owned in chunk()) {
        let chunk = owned.borrow();
        let mut bytes = Vec::new();
        encode_chunk(&chunk, &mut bytes).unwrap();
        let (parsed, used) = parse_chunk(&bytes).unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(parsed, chunk);
        check_prefixes(&bytes, |b| parse_chunk(b).map(|(_, used)| used))?;
    }

    /// A stream of several chunks parses back message by message.
    #[test]
    fn chunk_stream_roundtrip(chunks in vec(chunk(), 1..8)) {
        let mut bytes = Vec::new();
        for c in &chunks {
            encode_chunk(&c.borrow(), &mut bytes).unwrap();
        }
        let mut rest = &bytes[..];
        for c in &chunks {
            let (parsed, used) = parse_chunk(rest).unwrap();
            prop_assert_eq!(parsed, c.borrow());
            rest = &rest[used..];
        }
        prop_assert!(rest.is_empty());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..512)) {
        let _ = parse_server_greeting(&bytes);
        let _ = parse_client_flags(&bytes);
        let _ = parse_option(&bytes);
        if let Ok((frame, _)) = parse_option_frame(&bytes) {
            let _ = frame.decode();
        }
        let _ = parse_option_reply(&bytes);
        let _ = parse_export_name_reply(&bytes, false);
        let _ = parse_export_name_reply(&bytes, true);
        let _ = parse_request(&bytes);
        let _ = parse_simple_reply(&bytes);
        let _ = peek_reply_kind(&bytes);
        let _ = parse_chunk_header(&bytes);
        let _ = parse_chunk(&bytes);
    }

    /// Arbitrary payloads behind a valid header reach every payload decoder.
    #[test]
    fn arbitrary_payloads_never_panic(
        code in 0u32..12,
        reply_type in prop_oneof![1u32..5, Just(rep::ERR_INVALID), any::<u32>()],
        kind in prop_oneof![
            Just(chunk_type::NONE), Just(chunk_type::OFFSET_DATA), Just(chunk_type::OFFSET_HOLE),
            Just(chunk_type::BLOCK_STATUS), Just(chunk_type::ERROR), Just(chunk_type::ERROR_OFFSET),
            any::<u16>()
        ],
        payload in vec(any::<u8>(), 0..256),
    ) {
        let len = (payload.len() as u32).to_be_bytes();
        let mut option = IHAVEOPT.to_be_bytes().to_vec();
        option.extend_from_slice(&code.to_be_bytes());
        option.extend_from_slice(&len);
        option.extend_from_slice(&payload);
        let _ = parse_option(&option);

        let mut reply = OPTION_REPLY_MAGIC.to_be_bytes().to_vec();
        reply.extend_from_slice(&code.to_be_bytes());
        reply.extend_from_slice(&reply_type.to_be_bytes());
        reply.extend_from_slice(&len);
        reply.extend_from_slice(&payload);
        let _ = parse_option_reply(&reply);

        let mut chunk = STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec();
        chunk.extend_from_slice(&[0, 1]);
        chunk.extend_from_slice(&kind.to_be_bytes());
        chunk.extend_from_slice(&[0; 8]);
        chunk.extend_from_slice(&len);
        chunk.extend_from_slice(&payload);
        if let Ok((parsed, used)) = parse_chunk(&chunk) {
            prop_assert_eq!(used, chunk.len());
            // Whatever parses must re-encode to the same bytes, except that
            // error values outside the defined set are canonicalised.
            let mut again = Vec::new();
            if encode_chunk(&parsed, &mut again).is_ok() {
                prop_assert_eq!(parse_chunk(&again).unwrap().0, parsed);
            }
        }
    }
}
