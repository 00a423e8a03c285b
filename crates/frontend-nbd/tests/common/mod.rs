//! Test fixtures: a real store (on a `SimDevice` or a `FileDevice`) behind an
//! `Exports` implementation, and a small NBD client built on the wire crate
//! that talks to the server over a real TCP socket.

#![allow(dead_code)]

pub mod relayed;

use basalt_frontend_nbd::{Exports, NbdServer, Scope};
use basalt_nbd_wire::handshake::{opt, OPTION_HEADER_LEN};
use basalt_nbd_wire::transmission::CHUNK_HEADER_LEN;
use basalt_nbd_wire::*;
use basalt_store::{BlockDevice, FileDevice, FormatOptions, SimDevice, Store, VolumeId};
use basalt_volume::{VolumeHandle, VolumeStats};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;
/// Extent size of test stores: small, so holes and allocations are visible
/// at test-sized offsets.
pub const EXTENT: u64 = 64 * KIB;

pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// Volumes of one store, exported by name.
pub struct StoreExports {
    pub store: Arc<Store>,
    volumes: Mutex<BTreeMap<String, (VolumeId, Arc<VolumeStats>)>>,
    /// Opens get this data path instead of the store's (a stand-in for a
    /// replicated volume's, made from the local volume).
    pub relay: Mutex<Option<Relay>>,
}

/// Makes the data path an open uses from the volume on the store.
pub type Relay = Box<dyn Fn(basalt_store::LocalVolume) -> Arc<dyn basalt_volume::BlockIo> + Send>;

impl StoreExports {
    pub fn on_device(device: Arc<dyn BlockDevice>) -> Arc<StoreExports> {
        let store = Store::create(
            device,
            &FormatOptions {
                extent_size: Some(EXTENT as u32),
                ..Default::default()
            },
        )
        .expect("format test store");
        Arc::new(StoreExports {
            store,
            volumes: Mutex::new(BTreeMap::new()),
            relay: Mutex::new(None),
        })
    }

    /// A store on an in-memory simulated device.
    pub fn sim(device_size: u64) -> Arc<StoreExports> {
        StoreExports::on_device(SimDevice::new(device_size, 7))
    }

    /// A store on a data file in `dir`.
    pub fn file(dir: &std::path::Path, device_size: u64) -> Arc<StoreExports> {
        let device = FileDevice::create(&dir.join("basalt.data"), device_size, false)
            .expect("create data file");
        StoreExports::on_device(device)
    }

    pub fn add_volume(&self, name: &str, size: u64) {
        let id = uuid::Uuid::new_v4();
        self.store.create_volume(id, size).expect("create volume");
        self.volumes
            .lock()
            .insert(name.to_owned(), (id, Arc::new(VolumeStats::default())));
    }

    pub fn delete_volume(&self, name: &str) {
        let (id, _) = self.volumes.lock().remove(name).expect("volume exists");
        self.store.delete_volume(id).expect("delete volume");
    }

    pub fn open_handles(&self, name: &str) -> usize {
        self.volumes
            .lock()
            .get(name)
            .map_or(0, |(_, stats)| stats.open_handles())
    }
}

impl Exports for StoreExports {
    fn list(&self, _scope: &Scope) -> Vec<String> {
        self.volumes.lock().keys().cloned().collect()
    }

    fn open(&self, _scope: &Scope, name: &str) -> Option<VolumeHandle> {
        let (id, stats) = self.volumes.lock().get(name).cloned()?;
        let local = self.store.volume(id).ok()?;
        if let Some(relay) = &*self.relay.lock() {
            return Some(VolumeHandle::clustered(
                relay(local),
                id,
                name.to_owned(),
                stats,
            ));
        }
        Some(VolumeHandle::new(local, name.to_owned(), stats))
    }

    fn describe(&self, name: &str) -> Option<String> {
        Some(format!("test volume {name}"))
    }
}

/// A server on 127.0.0.1:0 over a fresh simulated store with the given
/// volumes.
pub fn server_with(volumes: &[(&str, u64)]) -> (NbdServer, Arc<StoreExports>) {
    server_with_limits(volumes, basalt_frontend_nbd::ServerLimits::default())
}

/// [`server_with`] with explicit limits.
pub fn server_with_limits(
    volumes: &[(&str, u64)],
    limits: basalt_frontend_nbd::ServerLimits,
) -> (NbdServer, Arc<StoreExports>) {
    init_logging();
    let exports = StoreExports::sim(64 * MIB);
    for (name, size) in volumes {
        exports.add_volume(name, *size);
    }
    let server = NbdServer::start_with_limits(
        "127.0.0.1:0".parse().expect("address"),
        Arc::clone(&exports) as Arc<dyn Exports>,
        limits,
    )
    .expect("start server");
    (server, exports)
}

/// [`server_with`], served by lanes (no event loops) with `lanes` threads
/// per connection.
pub fn server_with_lanes(volumes: &[(&str, u64)], lanes: usize) -> (NbdServer, Arc<StoreExports>) {
    server_with_limits(
        volumes,
        basalt_frontend_nbd::ServerLimits {
            lanes_per_connection: lanes,
            event_loops: 0,
            ..Default::default()
        },
    )
}

/// Waits until `cond` holds (polling), failing the test after 10 s.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One reply, reassembled from a simple reply or structured chunks.
#[derive(Debug, Default)]
pub struct Reply {
    pub cookie: u64,
    pub error: Option<NbdError>,
    pub message: Option<String>,
    /// READ data (holes filled with zeros).
    pub data: Vec<u8>,
    pub extents: Vec<BlockDescriptor>,
    pub context_id: Option<u32>,
    /// Chunk types received, in order ("simple" for a simple reply).
    pub chunks: Vec<&'static str>,
}

/// A minimal NBD client over a real socket.
pub struct Client {
    pub stream: TcpStream,
    rbuf: Vec<u8>,
    pub handshake_flags: HandshakeFlags,
    pub structured: bool,
    pub size: u64,
    pub flags: TransmissionFlags,
    next_cookie: u64,
    in_flight: HashMap<u64, Request>,
}

impl Client {
    /// Connects and reads the greeting; sends client flags.
    pub fn connect_with_flags(addr: SocketAddr, client_flags: ClientFlags) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        let mut client = Client {
            stream,
            rbuf: Vec::new(),
            handshake_flags: HandshakeFlags::empty(),
            structured: false,
            size: 0,
            flags: TransmissionFlags::empty(),
            next_cookie: 1,
            in_flight: HashMap::new(),
        };
        let (flags, used) = client.read_message(parse_server_greeting);
        client.consume(used);
        client.handshake_flags = flags;
        let mut out = Vec::new();
        encode_client_flags(client_flags, &mut out);
        client.send(&out);
        client
    }

    pub fn connect(addr: SocketAddr) -> Client {
        Client::connect_with_flags(addr, ClientFlags::FIXED_NEWSTYLE | ClientFlags::NO_ZEROES)
    }

    /// Connects, negotiates structured replies and base:allocation, and GOes
    /// into `export`.
    pub fn open(addr: SocketAddr, export: &str) -> Client {
        let mut c = Client::connect(addr);
        c.structured_reply();
        let replies = c.option(&ClientOption::SetMetaContext(MetaContextRequest {
            export: export.into(),
            queries: vec![BASE_ALLOCATION.into()],
        }));
        assert!(
            matches!(replies.last(), Some(OptionReply::Ack)),
            "{replies:?}"
        );
        c.go(export, &[]).expect("GO succeeds");
        c
    }

    /// Connects and GOes into `export` without structured replies.
    pub fn open_simple(addr: SocketAddr, export: &str) -> Client {
        let mut c = Client::connect(addr);
        c.go(export, &[]).expect("GO succeeds");
        c
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    fn consume(&mut self, n: usize) {
        self.rbuf.drain(..n);
    }

    /// Reads until `parse` succeeds on the buffered bytes.
    fn read_message<T>(
        &mut self,
        parse: impl Fn(&[u8]) -> Result<(T, usize), WireError>,
    ) -> (T, usize) {
        loop {
            match parse(&self.rbuf) {
                Ok(v) => return v,
                Err(WireError::Incomplete(_)) => self.read_more(),
                Err(e) => panic!("server sent an invalid message: {e}"),
            }
        }
    }

    fn read_more(&mut self) {
        let mut chunk = [0u8; 64 * 1024];
        let n = self.stream.read(&mut chunk).expect("read from server");
        assert!(n > 0, "server closed the connection");
        self.rbuf.extend_from_slice(&chunk[..n]);
    }

    /// True if the server closes the connection (EOF or reset) before
    /// sending anything more.
    pub fn server_closed(&mut self) -> bool {
        if !self.rbuf.is_empty() {
            return false;
        }
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
        }
    }

    // ------------------------------------------------------------ options

    pub fn send_option(&mut self, option: &ClientOption) {
        let mut out = Vec::new();
        encode_option(option, &mut out).expect("encode option");
        self.send(&out);
    }

    pub fn read_option_reply(&mut self) -> (u32, OptionReply) {
        let (reply, used) = self.read_message(parse_option_reply);
        self.consume(used);
        reply
    }

    /// Reads replies to `option` until the final one (ACK or an error).
    pub fn read_option_replies(&mut self, option: u32) -> Vec<OptionReply> {
        let mut replies = Vec::new();
        loop {
            let (code, reply) = self.read_option_reply();
            assert_eq!(code, option, "reply for another option");
            let last = matches!(reply, OptionReply::Ack | OptionReply::Error { .. });
            replies.push(reply);
            if last {
                return replies;
            }
        }
    }

    pub fn option(&mut self, option: &ClientOption) -> Vec<OptionReply> {
        self.send_option(option);
        self.read_option_replies(option.code())
    }

    pub fn structured_reply(&mut self) {
        let replies = self.option(&ClientOption::StructuredReply);
        assert_eq!(replies, vec![OptionReply::Ack]);
        self.structured = true;
    }

    /// NBD_OPT_GO: the INFO replies on success, the error otherwise.
    pub fn go(
        &mut self,
        export: &str,
        requests: &[InfoType],
    ) -> Result<Vec<InfoReply>, OptionReply> {
        let replies = self.option(&ClientOption::Go(InfoRequest {
            export: export.into(),
            requests: requests.to_vec(),
        }));
        let mut infos = Vec::new();
        for reply in replies {
            match reply {
                OptionReply::Info(info) => {
                    if let InfoReply::Export { size, flags } = info {
                        self.size = size;
                        self.flags = flags;
                    }
                    infos.push(info);
                }
                OptionReply::Ack => return Ok(infos),
                other => return Err(other),
            }
        }
        unreachable!("read_option_replies ends with ACK or an error")
    }

    /// NBD_OPT_EXPORT_NAME; the server sends size and flags (and zeroes
    /// unless NO_ZEROES was negotiated).
    pub fn export_name(&mut self, export: &str) {
        self.send_option(&ClientOption::ExportName(export.into()));
        let no_zeroes = true;
        let ((size, flags), used) = self.read_message(|b| parse_export_name_reply(b, no_zeroes));
        self.consume(used);
        self.size = size;
        self.flags = flags;
    }

    pub fn read_raw(&mut self, n: usize) -> Vec<u8> {
        while self.rbuf.len() < n {
            self.read_more();
        }
        let out = self.rbuf[..n].to_vec();
        self.consume(n);
        out
    }

    // ------------------------------------------------------- transmission

    /// Sends a request (and WRITE data) without waiting; returns its cookie.
    pub fn submit(
        &mut self,
        command: Command,
        flags: CommandFlags,
        offset: u64,
        length: u32,
        data: &[u8],
    ) -> u64 {
        let mut out = Vec::new();
        let cookie = self.queue(&mut out, command, flags, offset, length, data);
        self.send(&out);
        cookie
    }

    /// Appends a request to `out` (for pipelining several in one send).
    pub fn queue(
        &mut self,
        out: &mut Vec<u8>,
        command: Command,
        flags: CommandFlags,
        offset: u64,
        length: u32,
        data: &[u8],
    ) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let request = Request {
            flags,
            command,
            cookie,
            offset,
            length,
        };
        encode_request(&request, out);
        out.extend_from_slice(data);
        if command != Command::Disc {
            self.in_flight.insert(cookie, request);
        }
        cookie
    }

    /// Reads the next complete reply, whatever request it answers.
    pub fn reply(&mut self) -> Reply {
        let kind = {
            let (kind, _) = self.read_message(|b| peek_reply_kind(b).map(|k| (k, 4)));
            kind
        };
        match kind {
            ReplyKind::Simple => self.simple_reply(),
            ReplyKind::Structured => self.structured_reply_chunks(),
        }
    }

    fn simple_reply(&mut self) -> Reply {
        let (simple, used) = self.read_message(parse_simple_reply);
        self.consume(used);
        let request = self
            .in_flight
            .remove(&simple.cookie)
            .unwrap_or_else(|| panic!("reply for unknown cookie {}", simple.cookie));
        assert!(
            !(self.structured && request.command == Command::Read),
            "simple reply to a READ after structured replies were negotiated"
        );
        let mut reply = Reply {
            cookie: simple.cookie,
            error: simple.error,
            chunks: vec!["simple"],
            ..Reply::default()
        };
        if request.command == Command::Read && simple.error.is_none() {
            reply.data = self.read_raw(request.length as usize);
        }
        reply
    }

    fn structured_reply_chunks(&mut self) -> Reply {
        let mut reply = Reply::default();
        let mut request: Option<Request> = None;
        let mut covered = 0u64;
        loop {
            // Make sure the whole chunk is buffered, then parse it.
            let (header, _) = self.read_message(parse_chunk_header);
            let total = CHUNK_HEADER_LEN + header.length as usize;
            while self.rbuf.len() < total {
                self.read_more();
            }
            let (chunk, used) = parse_chunk(&self.rbuf).expect("valid chunk");
            let req = *request.get_or_insert_with(|| {
                *self
                    .in_flight
                    .get(&chunk.cookie)
                    .unwrap_or_else(|| panic!("chunk for unknown cookie {}", chunk.cookie))
            });
            assert_eq!(
                chunk.cookie, req.cookie,
                "chunks of two replies interleaved"
            );
            reply.cookie = chunk.cookie;
            if req.command == Command::Read && reply.data.is_empty() {
                reply.data = vec![0xEE; req.length as usize];
            }
            match &chunk.payload {
                ChunkPayload::None => reply.chunks.push("none"),
                ChunkPayload::OffsetData { offset, data } => {
                    reply.chunks.push("data");
                    assert_eq!(req.command, Command::Read);
                    let at = (offset - req.offset) as usize;
                    assert!(
                        at + data.len() <= req.length as usize,
                        "data outside the request"
                    );
                    reply.data[at..at + data.len()].copy_from_slice(data);
                    covered += data.len() as u64;
                }
                ChunkPayload::OffsetHole { offset, length } => {
                    reply.chunks.push("hole");
                    assert_eq!(req.command, Command::Read);
                    let at = (offset - req.offset) as usize;
                    assert!(
                        at + *length as usize <= req.length as usize,
                        "hole outside the request"
                    );
                    reply.data[at..at + *length as usize].fill(0);
                    covered += u64::from(*length);
                }
                ChunkPayload::BlockStatus {
                    context_id,
                    descriptors,
                } => {
                    reply.chunks.push("block_status");
                    reply.context_id = Some(*context_id);
                    reply.extents = descriptors.clone();
                }
                ChunkPayload::Error { error, message } => {
                    reply.chunks.push("error");
                    reply.error = Some(*error);
                    reply.message = Some(message.clone());
                }
                ChunkPayload::ErrorOffset { error, message, .. } => {
                    reply.chunks.push("error_offset");
                    reply.error = Some(*error);
                    reply.message = Some(message.clone());
                }
                other => panic!("unexpected chunk {other:?}"),
            }
            let done = chunk.flags.contains(ReplyFlags::DONE);
            self.consume(used);
            if done {
                break;
            }
        }
        let req = request.expect("at least one chunk");
        self.in_flight.remove(&req.cookie);
        if req.command == Command::Read && reply.error.is_none() {
            assert_eq!(
                covered,
                u64::from(req.length),
                "read reply does not cover the request"
            );
        }
        reply
    }

    /// Sends one request and waits for its reply.
    pub fn call(
        &mut self,
        command: Command,
        flags: CommandFlags,
        offset: u64,
        length: u32,
        data: &[u8],
    ) -> Reply {
        let cookie = self.submit(command, flags, offset, length, data);
        let reply = self.reply();
        assert_eq!(reply.cookie, cookie);
        reply
    }

    pub fn read(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, NbdError> {
        let r = self.call(Command::Read, CommandFlags::empty(), offset, length, &[]);
        r.error.map_or(Ok(r.data), Err)
    }

    pub fn write(&mut self, offset: u64, data: &[u8], flags: CommandFlags) -> Result<(), NbdError> {
        let r = self.call(Command::Write, flags, offset, data.len() as u32, data);
        r.error.map_or(Ok(()), Err)
    }

    pub fn flush(&mut self) -> Result<(), NbdError> {
        let r = self.call(Command::Flush, CommandFlags::empty(), 0, 0, &[]);
        r.error.map_or(Ok(()), Err)
    }

    pub fn trim(&mut self, offset: u64, length: u32) -> Result<(), NbdError> {
        let r = self.call(Command::Trim, CommandFlags::empty(), offset, length, &[]);
        r.error.map_or(Ok(()), Err)
    }

    pub fn write_zeroes(
        &mut self,
        offset: u64,
        length: u32,
        flags: CommandFlags,
    ) -> Result<(), NbdError> {
        let r = self.call(Command::WriteZeroes, flags, offset, length, &[]);
        r.error.map_or(Ok(()), Err)
    }

    pub fn block_status(
        &mut self,
        offset: u64,
        length: u32,
        flags: CommandFlags,
    ) -> Result<Vec<BlockDescriptor>, NbdError> {
        let r = self.call(Command::BlockStatus, flags, offset, length, &[]);
        r.error.map_or(Ok(r.extents), Err)
    }

    /// Sends DISC and checks that the server then closes the connection.
    pub fn disconnect(mut self) {
        let mut out = Vec::new();
        self.queue(&mut out, Command::Disc, CommandFlags::empty(), 0, 0, &[]);
        self.send(&out);
        assert!(
            self.server_closed(),
            "server kept the connection open after DISC"
        );
    }

    pub fn hang_up(self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// Deterministic test data.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Raw option bytes with an arbitrary payload (for malformed options).
pub fn raw_option(option: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OPTION_HEADER_LEN + payload.len());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

pub const GO: u32 = opt::GO;
