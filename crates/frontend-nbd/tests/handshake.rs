//! Handshake behaviour over a real socket: every option, its variants and
//! the ways a handshake can break.

mod common;

use basalt_frontend_nbd::{BASE_ALLOCATION_ID, MAX_PAYLOAD, MIN_BLOCK_SIZE, PREFERRED_BLOCK_SIZE};
use basalt_nbd_wire::handshake::opt;
use basalt_nbd_wire::*;
use common::*;
use std::io::{Read, Write};

fn required_flags() -> TransmissionFlags {
    TransmissionFlags::HAS_FLAGS
        | TransmissionFlags::SEND_FLUSH
        | TransmissionFlags::SEND_FUA
        | TransmissionFlags::SEND_TRIM
        | TransmissionFlags::SEND_WRITE_ZEROES
        | TransmissionFlags::SEND_FAST_ZERO
        | TransmissionFlags::SEND_CACHE
        | TransmissionFlags::CAN_MULTI_CONN
}

#[test]
fn greeting_advertises_fixed_newstyle_and_no_zeroes() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let c = Client::connect(server.local_addr().expect("a TCP server"));
    assert_eq!(
        c.handshake_flags,
        HandshakeFlags::FIXED_NEWSTYLE | HandshakeFlags::NO_ZEROES
    );
    server.shutdown();
}

#[test]
fn go_reports_export_block_sizes_name_and_description() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    let infos = c
        .go(
            "vol",
            &[InfoType::Name, InfoType::Description, InfoType::BlockSize],
        )
        .expect("GO");
    assert!(infos.contains(&InfoReply::Export {
        size: 16 * MIB,
        flags: required_flags(),
    }));
    assert!(infos.contains(&InfoReply::Name("vol".into())));
    assert!(infos.contains(&InfoReply::Description("test volume vol".into())));
    assert!(infos.contains(&InfoReply::BlockSize {
        minimum: MIN_BLOCK_SIZE,
        preferred: PREFERRED_BLOCK_SIZE,
        maximum: MAX_PAYLOAD,
    }));
    assert_eq!(
        (MIN_BLOCK_SIZE, PREFERRED_BLOCK_SIZE, MAX_PAYLOAD),
        (512, 4096, 32 << 20)
    );
    // Transmission works right after the ACK.
    assert_eq!(c.read(0, 4096).expect("read"), vec![0u8; 4096]);
    c.disconnect();
    server.shutdown();
}

#[test]
fn go_without_requests_sends_export_info_and_df_only_with_structured_replies() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    let infos = c.go("vol", &[]).expect("GO");
    assert!(matches!(infos.first(), Some(InfoReply::Export { .. })));
    assert!(!infos
        .iter()
        .any(|i| matches!(i, InfoReply::Name(_) | InfoReply::Description(_))));
    assert!(!c.flags.contains(TransmissionFlags::SEND_DF));
    assert!(c.flags.contains(required_flags()));

    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    c.structured_reply();
    c.go("vol", &[]).expect("GO");
    assert!(c
        .flags
        .contains(required_flags() | TransmissionFlags::SEND_DF));
    server.shutdown();
}

#[test]
fn info_then_go_and_unknown_exports() {
    let (server, _exports) = server_with(&[("a", 16 * MIB), ("b", 8 * MIB)]);
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    let replies = c.option(&ClientOption::Info(InfoRequest {
        export: "b".into(),
        requests: vec![],
    }));
    assert!(matches!(
        replies.first(),
        Some(OptionReply::Info(InfoReply::Export { size, .. })) if *size == 8 * MIB
    ));
    assert_eq!(replies.last(), Some(&OptionReply::Ack));
    // Unknown export: ERR_UNKNOWN, and the handshake goes on.
    match c.go("nope", &[]) {
        Err(OptionReply::Error { error, .. }) => assert_eq!(error, ErrorReply::UnknownExport),
        other => panic!("{other:?}"),
    }
    // The default export (empty name) is ambiguous with two exports.
    match c.go("", &[]) {
        Err(OptionReply::Error { error, .. }) => assert_eq!(error, ErrorReply::UnknownExport),
        other => panic!("{other:?}"),
    }
    c.go("a", &[]).expect("GO a");
    assert_eq!(c.size, 16 * MIB);
    c.disconnect();
    server.shutdown();
}

#[test]
fn empty_name_selects_the_only_export() {
    let (server, _exports) = server_with(&[("only", 4 * MIB)]);
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    let infos = c.go("", &[InfoType::Name]).expect("GO default");
    assert!(infos.contains(&InfoReply::Name("only".into())));
    assert_eq!(c.size, 4 * MIB);
    server.shutdown();
}

#[test]
fn list_exports() {
    let (server, _exports) = server_with(&[("a", 4 * MIB), ("b", 4 * MIB)]);
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    let replies = c.option(&ClientOption::List);
    assert_eq!(
        replies,
        vec![
            OptionReply::Server {
                name: "a".into(),
                description: "test volume a".into()
            },
            OptionReply::Server {
                name: "b".into(),
                description: "test volume b".into()
            },
            OptionReply::Ack,
        ]
    );
    // LIST must not carry data.
    c.send(&raw_option(opt::LIST, b"x"));
    let replies = c.read_option_replies(opt::LIST);
    assert!(matches!(
        replies.as_slice(),
        [OptionReply::Error {
            error: ErrorReply::Invalid,
            ..
        }]
    ));
    c.go("a", &[]).expect("GO after errors");
    server.shutdown();
}

#[test]
fn export_name_with_and_without_zeroes() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    // NO_ZEROES negotiated: exactly 10 bytes, then transmission.
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    c.export_name("vol");
    assert_eq!(c.size, 16 * MIB);
    assert!(c.flags.contains(required_flags()));
    c.write(4096, &[7u8; 512], CommandFlags::empty())
        .expect("write");
    assert_eq!(c.read(4096, 512).expect("read"), vec![7u8; 512]);
    c.disconnect();

    // Without NO_ZEROES: 124 zero bytes follow.
    let mut c = Client::connect_with_flags(
        server.local_addr().expect("a TCP server"),
        ClientFlags::FIXED_NEWSTYLE,
    );
    c.send_option(&ClientOption::ExportName("vol".into()));
    let reply = c.read_raw(134);
    assert_eq!(&reply[..8], &(16 * MIB).to_be_bytes());
    assert!(reply[10..].iter().all(|&b| b == 0));
    assert_eq!(c.read(4096, 512).expect("read"), vec![7u8; 512]);
    c.disconnect();
    server.shutdown();
}

#[test]
fn export_name_for_unknown_export_closes_the_connection() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    c.send_option(&ClientOption::ExportName("missing".into()));
    assert!(c.server_closed());
    eventually("connection to be released", || server.connections() == 0);
    server.shutdown();
}

#[test]
fn starttls_unknown_options_and_abort() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    let replies = c.option(&ClientOption::StartTls);
    assert!(matches!(
        replies.as_slice(),
        [OptionReply::Error {
            error: ErrorReply::Policy,
            ..
        }]
    ));
    for unknown in [opt::PEEK_EXPORT, opt::EXTENDED_HEADERS, 0x1234_5678] {
        let replies = c.option(&ClientOption::Unknown {
            option: unknown,
            payload: vec![1, 2, 3],
        });
        assert!(
            matches!(
                replies.as_slice(),
                [OptionReply::Error {
                    error: ErrorReply::Unsupported,
                    ..
                }]
            ),
            "{unknown}: {replies:?}"
        );
    }
    // A second STRUCTURED_REPLY is refused, the first is kept.
    c.structured_reply();
    let replies = c.option(&ClientOption::StructuredReply);
    assert!(matches!(
        replies.as_slice(),
        [OptionReply::Error {
            error: ErrorReply::Invalid,
            ..
        }]
    ));
    // ABORT: ACK, then the server closes.
    let replies = c.option(&ClientOption::Abort);
    assert_eq!(replies, vec![OptionReply::Ack]);
    assert!(c.server_closed());
    eventually("connection to be released", || server.connections() == 0);
    server.shutdown();
}

#[test]
fn malformed_option_payload_gets_err_invalid_and_the_handshake_continues() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    // GO whose name length points past the payload.
    c.send(&raw_option(opt::GO, &[0, 0, 0, 200, b'v', 0, 0]));
    let replies = c.read_option_replies(opt::GO);
    assert!(matches!(
        replies.as_slice(),
        [OptionReply::Error {
            error: ErrorReply::Invalid,
            ..
        }]
    ));
    // A GO export name that is not UTF-8.
    c.send(&raw_option(opt::GO, &[0, 0, 0, 1, 0xff, 0, 0]));
    let replies = c.read_option_replies(opt::GO);
    assert!(matches!(
        replies.as_slice(),
        [OptionReply::Error {
            error: ErrorReply::Invalid,
            ..
        }]
    ));
    c.go("vol", &[]).expect("GO still works");
    assert_eq!(c.read(0, 512).expect("read"), vec![0; 512]);
    server.shutdown();
}

#[test]
fn meta_contexts() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB), ("other", 4 * MIB)]);
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    let set = |export: &str, queries: &[&str]| {
        ClientOption::SetMetaContext(MetaContextRequest {
            export: export.into(),
            queries: queries.iter().map(|q| q.to_string()).collect(),
        })
    };
    let list = |export: &str, queries: &[&str]| {
        ClientOption::ListMetaContext(MetaContextRequest {
            export: export.into(),
            queries: queries.iter().map(|q| q.to_string()).collect(),
        })
    };
    // Before structured replies: refused.
    assert!(matches!(
        c.option(&set("vol", &[BASE_ALLOCATION])).as_slice(),
        [OptionReply::Error {
            error: ErrorReply::Invalid,
            ..
        }]
    ));
    c.structured_reply();
    let base = |id| OptionReply::MetaContext {
        context_id: id,
        name: BASE_ALLOCATION.into(),
    };
    // LIST: no query, "base:" and the full name all list base:allocation
    // with the reserved id 0; other namespaces are ignored.
    for queries in [
        &[][..],
        &["base:"],
        &[BASE_ALLOCATION],
        &["qemu:dirty-bitmap:x", "base:"],
    ] {
        assert_eq!(
            c.option(&list("vol", queries)),
            vec![base(0), OptionReply::Ack],
            "{queries:?}"
        );
    }
    assert_eq!(
        c.option(&list("vol", &["qemu:dirty-bitmap:x"])),
        vec![OptionReply::Ack]
    );
    // A query without a namespace is invalid; an unknown export is unknown.
    assert!(matches!(
        c.option(&list("vol", &["allocation"])).as_slice(),
        [OptionReply::Error {
            error: ErrorReply::Invalid,
            ..
        }]
    ));
    assert!(matches!(
        c.option(&set("nope", &[BASE_ALLOCATION])).as_slice(),
        [OptionReply::Error {
            error: ErrorReply::UnknownExport,
            ..
        }]
    ));
    // SET: "base:" selects nothing; the full name selects with a real id.
    assert_eq!(c.option(&set("vol", &["base:"])), vec![OptionReply::Ack]);
    assert_eq!(
        c.option(&set("vol", &[BASE_ALLOCATION, BASE_ALLOCATION])),
        vec![base(BASE_ALLOCATION_ID), OptionReply::Ack]
    );
    c.go("vol", &[]).expect("GO");
    let extents = c
        .block_status(0, 1 << 20, CommandFlags::empty())
        .expect("block status");
    assert_eq!(extents.len(), 1);
    server.shutdown();
}

#[test]
fn meta_context_for_another_export_does_not_enable_block_status() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB), ("other", 4 * MIB)]);
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    c.structured_reply();
    c.option(&ClientOption::SetMetaContext(MetaContextRequest {
        export: "other".into(),
        queries: vec![BASE_ALLOCATION.into()],
    }));
    c.go("vol", &[]).expect("GO");
    assert_eq!(
        c.block_status(0, 4096, CommandFlags::empty()),
        Err(NbdError::Invalid)
    );
    // Reads still work afterwards.
    assert_eq!(c.read(0, 4096).expect("read"), vec![0; 4096]);
    server.shutdown();
}

#[test]
fn broken_handshakes_close_the_connection_and_the_server_carries_on() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let addr = server.local_addr().expect("a TCP server");

    // Unknown client flags.
    let mut c = Client::connect_with_flags(addr, ClientFlags::from_bits(0x8000_0001));
    assert!(c.server_closed());

    // Bad option magic.
    let mut c = Client::connect(addr);
    c.send(b"NOTAMAGICOPTIONHEADER...");
    assert!(c.server_closed());

    // An option longer than the server accepts: closed without reading it.
    let mut c = Client::connect(addr);
    let mut header = IHAVEOPT.to_be_bytes().to_vec();
    header.extend_from_slice(&opt::GO.to_be_bytes());
    header.extend_from_slice(&(1u32 << 30).to_be_bytes());
    c.send(&header);
    assert!(c.server_closed());

    // EOF in the middle of an option.
    let mut c = Client::connect(addr);
    c.send(&raw_option(opt::GO, &[0, 0, 0, 3, b'v'])[..20]);
    c.stream
        .shutdown(std::net::Shutdown::Write)
        .expect("half close");
    assert!(c.server_closed());

    // EOF before the client flags.
    let mut raw = std::net::TcpStream::connect(addr).expect("connect");
    let mut greeting = [0u8; 18];
    raw.read_exact(&mut greeting).expect("greeting");
    raw.write_all(&[0, 0]).expect("half the flags");
    drop(raw);

    eventually("broken connections to be released", || {
        server.connections() == 0
    });
    // A well-behaved client still gets served.
    let mut c = Client::open(addr, "vol");
    assert_eq!(c.read(0, 512).expect("read"), vec![0; 512]);
    c.disconnect();
    server.shutdown();
}

#[test]
fn too_many_options_close_the_connection() {
    let (server, _exports) = server_with(&[("vol", 16 * MIB)]);
    let mut c = Client::connect(server.local_addr().expect("a TCP server"));
    // Exactly the limit: each gets its ERR_UNSUP, then the server closes
    // (with nothing unread, so the close is a clean FIN).
    let mut reader = c.stream.try_clone().expect("clone");
    let drain = std::thread::spawn(move || {
        let mut sink = Vec::new();
        reader
            .read_to_end(&mut sink)
            .expect("read replies until EOF");
        sink
    });
    let code = 0x4242;
    let all: Vec<u8> = raw_option(code, &[]).repeat(basalt_frontend_nbd::MAX_OPTIONS);
    c.stream.write_all(&all).expect("send options");
    let received = drain.join().expect("drain");
    let mut one = Vec::new();
    encode_option_reply(
        code,
        &OptionReply::error(ErrorReply::Unsupported, "option not supported"),
        &mut one,
    )
    .expect("encode");
    assert_eq!(received.len(), basalt_frontend_nbd::MAX_OPTIONS * one.len());
    assert!(received.starts_with(&one));
    eventually("connection to be released", || server.connections() == 0);
    server.shutdown();
}

fn limited_server(limits: basalt_frontend_nbd::ServerLimits) -> basalt_frontend_nbd::NbdServer {
    init_logging();
    let exports = StoreExports::sim(64 * MIB);
    exports.add_volume("vol", MIB);
    basalt_frontend_nbd::NbdServer::start_with_limits(
        "127.0.0.1:0".parse().expect("address"),
        exports as std::sync::Arc<dyn basalt_frontend_nbd::Exports>,
        limits,
    )
    .expect("start server")
}

/// Reads until EOF (true) or the test's own timeout (false).
fn closed_by_server(stream: &mut std::net::TcpStream) -> bool {
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let mut sink = [0u8; 256];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn a_client_stalling_in_the_handshake_is_disconnected() {
    let server = limited_server(basalt_frontend_nbd::ServerLimits {
        handshake_timeout: std::time::Duration::from_millis(200),
        ..Default::default()
    });
    // Reads the greeting, then never answers.
    let mut stalled =
        std::net::TcpStream::connect(server.local_addr().expect("a TCP server")).expect("connect");
    assert!(
        closed_by_server(&mut stalled),
        "a stalled handshake must be cut off"
    );
    eventually("the stalled connection is gone", || {
        server.connections() == 0
    });
    // A client that completes the handshake is not affected, even when it
    // idles longer than the handshake timeout, before its first request
    // (the kernel's `nbd-client -C N` opens such connections) or after one
    // (NBD has no keep-alive).
    let mut c = Client::open(server.local_addr().expect("a TCP server"), "vol");
    std::thread::sleep(std::time::Duration::from_millis(400));
    assert_eq!(
        server.connections(),
        1,
        "an idle negotiated connection stays"
    );
    c.write(0, &[1u8; 4096], CommandFlags::empty())
        .expect("first write after idling");
    std::thread::sleep(std::time::Duration::from_millis(400));
    c.write(0, &[1u8; 4096], CommandFlags::empty())
        .expect("write after idling again");
    c.disconnect();
    server.shutdown();
}

#[test]
fn connections_beyond_the_limit_are_closed_at_once() {
    let server = limited_server(basalt_frontend_nbd::ServerLimits {
        max_connections: 2,
        ..Default::default()
    });
    let a = Client::open(server.local_addr().expect("a TCP server"), "vol");
    let b = Client::open(server.local_addr().expect("a TCP server"), "vol");
    eventually("two connections", || server.connections() == 2);
    let mut third =
        std::net::TcpStream::connect(server.local_addr().expect("a TCP server")).expect("connect");
    assert!(
        closed_by_server(&mut third),
        "the third connection must be refused"
    );
    a.disconnect();
    eventually("one connection left", || server.connections() == 1);
    let c = Client::open(server.local_addr().expect("a TCP server"), "vol");
    c.disconnect();
    b.disconnect();
    server.shutdown();
}
