//! One NBD connection: the handshake (greeting, optional STARTTLS, structured
//! replies, `base:allocation`, `NBD_OPT_GO`) and the transmission phase with
//! a window of requests in flight.

use crate::endpoint::{Endpoint, PskCredentials};
use crate::error::ClientError;
use basalt_nbd_wire::handshake::{
    encode_client_flags, encode_option, parse_option_reply, parse_server_greeting, ClientOption,
    InfoReply, InfoRequest, MetaContextRequest, OptionReply,
};
use basalt_nbd_wire::transmission::{
    encode_request, parse_chunk, parse_simple_reply, peek_reply_kind, ChunkPayload, Command,
    Request,
};
use basalt_nbd_wire::{
    BlockStatusFlags, ClientFlags, CommandFlags, HandshakeFlags, NbdError, ReplyFlags,
    TransmissionFlags, WireError,
};
use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode, SslVersion};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A server that stays silent this long is taken for dead.
const REPLY_TIMEOUT: Duration = Duration::from_secs(300);

/// The largest BLOCK_STATUS range asked at once (a u32 on the wire).
const MAX_STATUS_LEN: u64 = 1 << 30;

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// Whether a range holds data or reads as zeros (`base:allocation`: a hole
/// or a range the server knows is zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    Data,
    Zero,
}

/// A write the pipeline sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    Data {
        offset: u64,
        data: Vec<u8>,
    },
    /// WRITE_ZEROES, letting the server deallocate (`trim`) or not.
    Zeroes {
        offset: u64,
        len: u32,
        trim: bool,
    },
}

/// What an in-flight request is waiting for.
enum Pending {
    Read {
        offset: u64,
        buf: Vec<u8>,
        covered: u64,
        error: Option<ClientError>,
    },
    Other {
        what: &'static str,
        offset: u64,
        error: Option<ClientError>,
        extents: Vec<(u64, Allocation)>,
    },
}

/// A connection in the transmission phase.
pub struct NbdClient {
    stream: Box<dyn Stream>,
    export: String,
    size: u64,
    flags: TransmissionFlags,
    allocation_context: Option<u32>,
    next_cookie: u64,
    in_flight: HashMap<u64, Pending>,
    rbuf: Vec<u8>,
}

impl std::fmt::Debug for NbdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NbdClient({}, {} bytes)", self.export, self.size)
    }
}

fn connect_error(endpoint: &Endpoint) -> impl Fn(std::io::Error) -> ClientError + '_ {
    move |source| ClientError::Connect {
        endpoint: endpoint.to_string(),
        source,
    }
}

impl NbdClient {
    /// Connects to `export` at `endpoint` and negotiates.
    pub fn connect(endpoint: &Endpoint, export: &str) -> Result<NbdClient, ClientError> {
        let on_error = connect_error(endpoint);
        let mut client = match endpoint {
            Endpoint::Unix(path) => {
                let s = UnixStream::connect(path).map_err(&on_error)?;
                s.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(&on_error)?;
                NbdClient::new(Box::new(s), export)
            }
            Endpoint::Tcp(address) => {
                let s = TcpStream::connect(address).map_err(&on_error)?;
                s.set_nodelay(true).map_err(&on_error)?;
                s.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(&on_error)?;
                NbdClient::new(Box::new(s), export)
            }
            Endpoint::Tls { address, psk } => {
                let s = TcpStream::connect(address).map_err(&on_error)?;
                s.set_nodelay(true).map_err(&on_error)?;
                s.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(&on_error)?;
                let mut plain = NbdClient::new(Box::new(s.try_clone()?), export);
                plain.greet()?;
                plain.option(&ClientOption::StartTls, |_| Ok(()))?;
                // The options so far went over `s` itself; TLS takes it over.
                let mut tls = NbdClient::new(start_tls(s, psk)?, export);
                tls.negotiate()?;
                return Ok(tls);
            }
        };
        client.greet()?;
        client.negotiate()?;
        Ok(client)
    }

    fn new(stream: Box<dyn Stream>, export: &str) -> NbdClient {
        NbdClient {
            stream,
            export: export.to_string(),
            size: 0,
            flags: TransmissionFlags::empty(),
            allocation_context: None,
            next_cookie: 1,
            in_flight: HashMap::new(),
            rbuf: Vec::new(),
        }
    }

    /// The export's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn is_read_only(&self) -> bool {
        self.flags.contains(TransmissionFlags::READ_ONLY)
    }

    fn greet(&mut self) -> Result<(), ClientError> {
        let flags = self.read_message(parse_server_greeting)?;
        if !flags.contains(HandshakeFlags::FIXED_NEWSTYLE) {
            return Err(ClientError::Protocol(
                "the server does not speak fixed newstyle".into(),
            ));
        }
        let mut out = Vec::new();
        let mut client = ClientFlags::FIXED_NEWSTYLE;
        if flags.contains(HandshakeFlags::NO_ZEROES) {
            client |= ClientFlags::NO_ZEROES;
        }
        encode_client_flags(client, &mut out);
        self.stream.write_all(&out)?;
        Ok(())
    }

    fn negotiate(&mut self) -> Result<(), ClientError> {
        let export = self.export.clone();
        self.option(&ClientOption::StructuredReply, |_| Ok(()))?;
        let mut context = None;
        self.option(
            &ClientOption::SetMetaContext(MetaContextRequest {
                export: export.clone(),
                queries: vec!["base:allocation".into()],
            }),
            |reply| {
                if let OptionReply::MetaContext { context_id, name } = reply {
                    if name == "base:allocation" {
                        context = Some(*context_id);
                    }
                }
                Ok(())
            },
        )?;
        self.allocation_context = context;
        let mut info = None;
        self.option(
            &ClientOption::Go(InfoRequest {
                export,
                requests: Vec::new(),
            }),
            |reply| {
                if let OptionReply::Info(InfoReply::Export { size, flags }) = reply {
                    info = Some((*size, *flags));
                }
                Ok(())
            },
        )?;
        let (size, flags) = info.ok_or_else(|| {
            ClientError::Protocol("NBD_OPT_GO succeeded without the export's size".into())
        })?;
        self.size = size;
        self.flags = flags;
        Ok(())
    }

    /// Sends one option and reads its replies up to ACK; an error reply
    /// becomes [`ClientError::Refused`].
    fn option(
        &mut self,
        option: &ClientOption,
        mut each: impl FnMut(&OptionReply) -> Result<(), ClientError>,
    ) -> Result<(), ClientError> {
        let mut out = Vec::new();
        encode_option(option, &mut out)?;
        self.stream.write_all(&out)?;
        loop {
            let (code, reply) = self.read_message(parse_option_reply)?;
            if code != option.code() {
                return Err(ClientError::Protocol(format!(
                    "a reply to option {code} while option {} was asked",
                    option.code()
                )));
            }
            match reply {
                OptionReply::Ack => return Ok(()),
                OptionReply::Error { error, message } => {
                    return Err(ClientError::Refused {
                        export: self.export.clone(),
                        message: if message.is_empty() {
                            format!("{error:?}")
                        } else {
                            message
                        },
                    })
                }
                other => each(&other)?,
            }
        }
    }

    /// Reads until `parse` accepts the buffer's start; consumes what it used.
    fn read_message<T>(
        &mut self,
        parse: impl Fn(&[u8]) -> Result<(T, usize), WireError>,
    ) -> Result<T, ClientError> {
        loop {
            match parse(&self.rbuf) {
                Ok((value, used)) => {
                    self.rbuf.drain(..used);
                    return Ok(value);
                }
                Err(WireError::Incomplete(need)) => {
                    let have = self.rbuf.len();
                    let want = need.max(have + 1);
                    self.rbuf.resize(want, 0);
                    let got = self.stream.read(&mut self.rbuf[have..]);
                    match got {
                        Ok(0) => {
                            self.rbuf.truncate(have);
                            return Err(ClientError::Protocol(
                                "the server closed the connection".into(),
                            ));
                        }
                        Ok(n) => self.rbuf.truncate(have + n),
                        Err(e) => {
                            self.rbuf.truncate(have);
                            return Err(e.into());
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ClientError::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    fn send(
        &mut self,
        command: Command,
        flags: CommandFlags,
        offset: u64,
        length: u32,
        payload: &[u8],
        pending: Pending,
    ) -> Result<(), ClientError> {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let mut out = Vec::with_capacity(28);
        encode_request(
            &Request {
                flags,
                command,
                cookie,
                offset,
                length,
            },
            &mut out,
        );
        self.stream.write_all(&out)?;
        if !payload.is_empty() {
            self.stream.write_all(payload)?;
        }
        self.in_flight.insert(cookie, pending);
        Ok(())
    }

    /// Receives replies until one request is complete; returns it.
    fn receive_one(&mut self) -> Result<Pending, ClientError> {
        loop {
            let kind = self.read_message(|b| peek_reply_kind(b).map(|k| (k, 0)))?;
            match kind {
                basalt_nbd_wire::ReplyKind::Simple => {
                    let reply = self.read_message(parse_simple_reply)?;
                    let mut pending = self.in_flight.remove(&reply.cookie).ok_or_else(|| {
                        ClientError::Protocol(format!("a reply to unknown cookie {}", reply.cookie))
                    })?;
                    if let Pending::Read { .. } = pending {
                        return Err(ClientError::Protocol(
                            "a simple reply to a READ after structured replies were agreed".into(),
                        ));
                    }
                    if let Some(error) = reply.error {
                        set_error(&mut pending, error, String::new());
                    }
                    return Ok(pending);
                }
                basalt_nbd_wire::ReplyKind::Structured => {
                    if let Some(done) = self.receive_chunk()? {
                        return Ok(done);
                    }
                }
            }
        }
    }

    /// Applies one structured chunk; returns its request when it was the
    /// last chunk.
    fn receive_chunk(&mut self) -> Result<Option<Pending>, ClientError> {
        // Make sure the whole chunk is buffered, then parse it in place.
        self.read_message(|b| parse_chunk(b).map(|_| ((), 0)))?;
        let (chunk, used) = parse_chunk(&self.rbuf)?;
        let cookie = chunk.cookie;
        let done = chunk.flags.contains(ReplyFlags::DONE);
        let context = self.allocation_context;
        let pending = self.in_flight.get_mut(&cookie).ok_or_else(|| {
            ClientError::Protocol(format!("a reply chunk for unknown cookie {cookie}"))
        })?;
        match (&chunk.payload, &mut *pending) {
            (ChunkPayload::None, _) => {}
            (
                ChunkPayload::OffsetData { offset, data },
                Pending::Read {
                    offset: start,
                    buf,
                    covered,
                    ..
                },
            ) => {
                let at = piece_in(*start, buf.len(), *offset, data.len() as u64)?;
                buf[at..at + data.len()].copy_from_slice(data);
                *covered += data.len() as u64;
            }
            (
                ChunkPayload::OffsetHole { offset, length },
                Pending::Read {
                    offset: start,
                    buf,
                    covered,
                    ..
                },
            ) => {
                let at = piece_in(*start, buf.len(), *offset, u64::from(*length))?;
                buf[at..at + *length as usize].fill(0);
                *covered += u64::from(*length);
            }
            (
                ChunkPayload::BlockStatus {
                    context_id,
                    descriptors,
                },
                Pending::Other { extents, .. },
            ) if Some(*context_id) == context => {
                for d in descriptors {
                    let zero = d.status.contains(BlockStatusFlags::ZERO)
                        || d.status.contains(BlockStatusFlags::HOLE);
                    let kind = if zero {
                        Allocation::Zero
                    } else {
                        Allocation::Data
                    };
                    extents.push((u64::from(d.length), kind));
                }
            }
            (ChunkPayload::BlockStatus { .. }, Pending::Other { .. }) => {}
            (
                ChunkPayload::Error { error, message }
                | ChunkPayload::ErrorOffset { error, message, .. }
                | ChunkPayload::UnknownError { error, message, .. },
                _,
            ) => {
                let (error, message) = (*error, message.clone());
                set_error(pending, error, message);
            }
            (other, _) => {
                return Err(ClientError::Protocol(format!(
                    "unexpected reply chunk type {} for cookie {cookie}",
                    other.chunk_type()
                )))
            }
        }
        self.rbuf.drain(..used);
        if !done {
            return Ok(None);
        }
        let finished = self.in_flight.remove(&cookie);
        if let Some(Pending::Read {
            buf,
            covered,
            error: None,
            offset,
        }) = &finished
        {
            if *covered != buf.len() as u64 {
                return Err(ClientError::Protocol(format!(
                    "the READ at {offset} got {covered} of {} bytes",
                    buf.len()
                )));
            }
        }
        Ok(finished)
    }

    /// Reads `ranges` with up to `window` requests in flight; `done` gets
    /// each range's offset and bytes as it completes (in any order).
    pub fn read_pipelined<E: From<ClientError>>(
        &mut self,
        ranges: impl IntoIterator<Item = (u64, u32)>,
        window: usize,
        mut done: impl FnMut(u64, Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut ranges = ranges.into_iter();
        let window = window.max(1);
        loop {
            while self.in_flight.len() < window {
                let Some((offset, len)) = ranges.next() else {
                    break;
                };
                self.check_range(offset, u64::from(len))?;
                self.send(
                    Command::Read,
                    CommandFlags::empty(),
                    offset,
                    len,
                    &[],
                    Pending::Read {
                        offset,
                        buf: vec![0; len as usize],
                        covered: 0,
                        error: None,
                    },
                )?;
            }
            if self.in_flight.is_empty() {
                return Ok(());
            }
            match self.receive_one()? {
                Pending::Read { error: Some(e), .. } | Pending::Other { error: Some(e), .. } => {
                    return Err(e.into())
                }
                Pending::Read { offset, buf, .. } => done(offset, buf)?,
                Pending::Other { .. } => {}
            }
        }
    }

    /// Sends `ops` with up to `window` in flight; stops at the first error
    /// (the producer's or the server's).
    pub fn write_pipelined<E: From<ClientError>>(
        &mut self,
        ops: impl IntoIterator<Item = Result<WriteOp, E>>,
        window: usize,
    ) -> Result<(), E> {
        if self.is_read_only() {
            return Err(ClientError::ReadOnly.into());
        }
        let mut ops = ops.into_iter();
        let window = window.max(1);
        loop {
            while self.in_flight.len() < window {
                let Some(op) = ops.next() else {
                    break;
                };
                match op? {
                    WriteOp::Data { offset, data } => {
                        let len =
                            u32::try_from(data.len()).map_err(|_| ClientError::OutOfRange {
                                offset,
                                len: data.len() as u64,
                                size: self.size,
                            })?;
                        self.check_range(offset, u64::from(len))?;
                        self.send(
                            Command::Write,
                            CommandFlags::empty(),
                            offset,
                            len,
                            &data,
                            other("WRITE", offset),
                        )?;
                    }
                    WriteOp::Zeroes { offset, len, trim } => {
                        self.check_range(offset, u64::from(len))?;
                        let flags = if trim {
                            CommandFlags::empty()
                        } else {
                            CommandFlags::NO_HOLE
                        };
                        self.send(
                            Command::WriteZeroes,
                            flags,
                            offset,
                            len,
                            &[],
                            other("WRITE_ZEROES", offset),
                        )?;
                    }
                }
            }
            if self.in_flight.is_empty() {
                return Ok(());
            }
            if let Pending::Other { error: Some(e), .. } = self.receive_one()? {
                return Err(e.into());
            }
        }
    }

    /// Waits for every request in flight (their errors included).
    fn drain(&mut self) -> Result<(), ClientError> {
        while !self.in_flight.is_empty() {
            match self.receive_one()? {
                Pending::Read { error: Some(e), .. } | Pending::Other { error: Some(e), .. } => {
                    return Err(e)
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// FLUSH: everything written before is durable on return.
    pub fn flush(&mut self) -> Result<(), ClientError> {
        self.drain()?;
        self.send(
            Command::Flush,
            CommandFlags::empty(),
            0,
            0,
            &[],
            other("FLUSH", 0),
        )?;
        self.drain()
    }

    /// Data and zero runs of [offset, offset+len), from `base:allocation`
    /// (all data when the server has no such context). Adjacent runs of one
    /// kind are merged.
    pub fn allocation(
        &mut self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, u64, Allocation)>, ClientError> {
        self.check_range(offset, len)?;
        self.drain()?;
        let mut runs: Vec<(u64, u64, Allocation)> = Vec::new();
        let mut push = |at: u64, n: u64, kind: Allocation| match runs.last_mut() {
            Some(last) if last.2 == kind && last.0 + last.1 == at => last.1 += n,
            _ => runs.push((at, n, kind)),
        };
        if self.allocation_context.is_none() {
            push(offset, len, Allocation::Data);
            return Ok(runs);
        }
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let ask = (end - at).min(MAX_STATUS_LEN) as u32;
            self.send(
                Command::BlockStatus,
                CommandFlags::empty(),
                at,
                ask,
                &[],
                other("BLOCK_STATUS", at),
            )?;
            let extents = match self.receive_one()? {
                Pending::Other { error: Some(e), .. } | Pending::Read { error: Some(e), .. } => {
                    return Err(e)
                }
                Pending::Other { extents, .. } => extents,
                Pending::Read { .. } => Vec::new(),
            };
            if extents.is_empty() {
                return Err(ClientError::Protocol(format!(
                    "BLOCK_STATUS at {at} described nothing"
                )));
            }
            for (n, kind) in extents {
                let n = n.min(end - at);
                if n == 0 {
                    break;
                }
                push(at, n, kind);
                at += n;
            }
        }
        Ok(runs)
    }

    /// Waits for what is in flight and says goodbye (NBD_CMD_DISC).
    pub fn disconnect(mut self) -> Result<(), ClientError> {
        self.drain()?;
        let mut out = Vec::new();
        encode_request(
            &Request {
                flags: CommandFlags::empty(),
                command: Command::Disc,
                cookie: 0,
                offset: 0,
                length: 0,
            },
            &mut out,
        );
        self.stream.write_all(&out)?;
        self.stream.flush()?;
        Ok(())
    }
}

fn other(what: &'static str, offset: u64) -> Pending {
    Pending::Other {
        what,
        offset,
        error: None,
        extents: Vec::new(),
    }
}

fn set_error(pending: &mut Pending, error: NbdError, message: String) {
    let (what, offset, slot) = match pending {
        Pending::Read { offset, error, .. } => ("READ", *offset, error),
        Pending::Other {
            what,
            offset,
            error,
            ..
        } => (*what, *offset, error),
    };
    slot.get_or_insert(ClientError::Server {
        what,
        offset,
        error,
        message,
    });
}

/// Where a reply piece at `offset` of `len` bytes lands in a READ of
/// `buf_len` bytes at `start`; an error if it is not inside.
fn piece_in(start: u64, buf_len: usize, offset: u64, len: u64) -> Result<usize, ClientError> {
    let at = offset.checked_sub(start);
    match at {
        Some(at) if at.checked_add(len).is_some_and(|end| end <= buf_len as u64) => Ok(at as usize),
        _ => Err(ClientError::Protocol(format!(
            "a READ reply piece at {offset} (+{len}) outside the request at {start} (+{buf_len})"
        ))),
    }
}

/// Runs the TLS-PSK handshake over `tcp` (after STARTTLS was acknowledged).
fn start_tls(tcp: TcpStream, psk: &PskCredentials) -> Result<Box<dyn Stream>, ClientError> {
    let tls = |e: &dyn std::fmt::Display| ClientError::Tls(e.to_string());
    let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(|e| tls(&e))?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(|e| tls(&e))?;
    b.set_cipher_list(basalt_nbd_wire::TLS_PSK_CIPHERS)
        .map_err(|e| tls(&e))?;
    let (identity, key) = (psk.identity.clone(), psk.key.clone());
    b.set_psk_client_callback(move |_, _hint, id_out, key_out| {
        let id = identity.as_bytes();
        if id.len() >= id_out.len() || key.len() > key_out.len() {
            return Err(openssl::error::ErrorStack::get());
        }
        id_out[..id.len()].copy_from_slice(id);
        id_out[id.len()] = 0;
        key_out[..key.len()].copy_from_slice(&key);
        Ok(key.len())
    });
    let connector = b.build();
    let mut config = connector.configure().map_err(|e| tls(&e))?;
    config.set_verify_hostname(false);
    config.set_verify(SslVerifyMode::NONE);
    let stream = config.connect("basalt", tcp).map_err(|e| tls(&e))?;
    Ok(Box::new(stream))
}
