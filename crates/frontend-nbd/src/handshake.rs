//! The server side of the fixed newstyle handshake.
//!
//! Job: greet, check the client flags, answer options until the client picks
//! an export (`NBD_OPT_GO` or `NBD_OPT_EXPORT_NAME`) or leaves, and hand the
//! transmission phase what was negotiated.
//!
//! Invariants:
//! - Every option except `NBD_OPT_EXPORT_NAME` and `NBD_OPT_ABORT`-then-close
//!   gets a final reply (ACK or an error) and the handshake continues; only a
//!   broken stream (bad magic, an option longer than the wire crate's limit,
//!   EOF), unknown client flags or an unanswerable EXPORT_NAME end it.
//! - Messages are read with exact-length reads: nothing after the final
//!   option is consumed, so the transmission phase starts at the first byte
//!   of the first request.
//! - Metadata contexts count only if they were selected for the export that
//!   is finally chosen (the protocol makes BLOCK_STATUS invalid otherwise).

use crate::stream::Stream;
use crate::tls::TlsPsk;
use crate::{Exports, Scope};
use crate::{HandshakeError, MAX_PAYLOAD, MIN_BLOCK_SIZE, PREFERRED_BLOCK_SIZE};
use basalt_nbd_wire::handshake::{CLIENT_FLAGS_LEN, OPTION_HEADER_LEN};
use basalt_nbd_wire::{
    encode_export_name_reply, encode_option_reply, encode_server_greeting, parse_client_flags,
    parse_option_frame, ClientFlags, ClientOption, ErrorReply, HandshakeFlags, InfoReply,
    InfoRequest, InfoType, MetaContextRequest, OptionReply, TransmissionFlags, WireError,
    BASE_ALLOCATION,
};
use basalt_volume::VolumeHandle;
use std::io::{self, Read, Write};
use std::thread::JoinHandle;
use std::time::Duration;

/// Options a client may send before choosing an export; a client that sends
/// more is treated as a denial of service attempt (the protocol allows a
/// hard disconnect for that).
pub const MAX_OPTIONS: usize = 4096;

/// The metadata context id the server assigns to `base:allocation`.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Transmission flags every export advertises: FLUSH/FUA/TRIM/WRITE_ZEROES,
/// FAST_ZERO (zeroing is a metadata update or a punch, never a data write),
/// CACHE (a no-op), and MULTI_CONN (a flush on any connection covers writes
/// completed on every connection, see `VolumeHandle::flush`).
pub const BASE_TRANSMISSION_FLAGS: TransmissionFlags = TransmissionFlags::HAS_FLAGS
    .union(TransmissionFlags::SEND_FLUSH)
    .union(TransmissionFlags::SEND_FUA)
    .union(TransmissionFlags::SEND_TRIM)
    .union(TransmissionFlags::SEND_WRITE_ZEROES)
    .union(TransmissionFlags::SEND_FAST_ZERO)
    .union(TransmissionFlags::SEND_CACHE)
    .union(TransmissionFlags::CAN_MULTI_CONN);

/// What the transmission phase runs with.
pub struct Negotiated {
    /// The chosen export, opened.
    pub handle: VolumeHandle,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` was selected for this export: its context id.
    pub base_allocation: Option<u32>,
    /// The transmission flags sent to the client.
    pub flags: TransmissionFlags,
}

/// How a handshake ended without error.
pub enum HandshakeOutcome {
    /// The client chose an export; transmission starts.
    Transmission(Negotiated),
    /// The client sent `NBD_OPT_ABORT` (soft disconnect).
    Aborted,
}

/// Metadata contexts selected by the last `NBD_OPT_SET_META_CONTEXT`.
struct MetaSelection {
    export: String,
    base_allocation: bool,
}

/// How the listener a connection came through treats TLS.
#[derive(Clone, Copy)]
pub enum Security<'a> {
    /// No TLS: every export is in scope (the Unix socket, whose file
    /// permissions admitted the client, or `--nbd-insecure` TCP).
    Open,
    /// TLS first: no option but STARTTLS and ABORT is answered until the
    /// client proved it holds a key, which sets its scope.
    TlsRequired {
        tls: &'a TlsPsk,
        /// Bound on each read of the TLS handshake.
        timeout: Duration,
    },
}

struct Handshake<'a> {
    stream: &'a mut Stream,
    exports: &'a dyn Exports,
    security: Security<'a>,
    /// What the client may see; nothing (a tenant with no name) until TLS
    /// when the listener requires it.
    scope: Scope,
    /// TLS is required and not negotiated yet.
    awaiting_tls: bool,
    /// The pump of the TLS session, once there is one.
    pump: &'a mut Option<JoinHandle<()>>,
    no_zeroes: bool,
    structured: bool,
    meta: Option<MetaSelection>,
    out: Vec<u8>,
}

/// Runs the handshake on a freshly accepted connection. After STARTTLS,
/// `stream` is the plaintext side of the TLS session and `pump` the thread
/// that carries it (the caller joins it when the server stops).
pub fn negotiate<'a>(
    stream: &'a mut Stream,
    exports: &'a dyn Exports,
    security: Security<'a>,
    pump: &'a mut Option<JoinHandle<()>>,
) -> Result<HandshakeOutcome, HandshakeError> {
    let mut greeting = Vec::with_capacity(18);
    encode_server_greeting(
        HandshakeFlags::FIXED_NEWSTYLE | HandshakeFlags::NO_ZEROES,
        &mut greeting,
    );
    stream.write_all(&greeting)?;

    let mut flags = [0u8; CLIENT_FLAGS_LEN];
    read_exact_or_closed(stream, &mut flags)?;
    let (client_flags, _) = parse_client_flags(&flags)?;
    if client_flags.unknown_bits() != 0 {
        return Err(HandshakeError::UnknownClientFlags(client_flags.bits()));
    }
    // A client without FIXED_NEWSTYLE still gets fixed newstyle replies: the
    // protocol allows it and every client of the last decade sets the flag.
    let awaiting_tls = matches!(security, Security::TlsRequired { .. });
    let mut hs = Handshake {
        stream,
        exports,
        security,
        scope: if awaiting_tls {
            Scope::Tenant(String::new())
        } else {
            Scope::All
        },
        awaiting_tls,
        pump,
        no_zeroes: client_flags.contains(ClientFlags::NO_ZEROES),
        structured: false,
        meta: None,
        out: Vec::with_capacity(256),
    };
    let mut frame_buf = Vec::with_capacity(OPTION_HEADER_LEN);
    for _ in 0..MAX_OPTIONS {
        read_option(hs.stream, &mut frame_buf)?;
        let (frame, _) = parse_option_frame(&frame_buf)?;
        let option = frame.option;
        hs.out.clear();
        let outcome = match frame.decode() {
            Ok(decoded) => hs.answer(option, decoded)?,
            Err(err) => {
                if option == basalt_nbd_wire::handshake::opt::EXPORT_NAME {
                    // EXPORT_NAME cannot be answered with an error.
                    return Err(HandshakeError::Protocol(err));
                }
                hs.reply(
                    option,
                    &OptionReply::error(ErrorReply::Invalid, err.to_string()),
                );
                None
            }
        };
        hs.stream.write_all(&hs.out)?;
        if let Some(outcome) = outcome {
            return Ok(outcome);
        }
    }
    Err(HandshakeError::TooManyOptions(MAX_OPTIONS))
}

/// Reads one whole option (header and payload) into `buf`.
fn read_option(stream: &mut Stream, buf: &mut Vec<u8>) -> Result<(), HandshakeError> {
    buf.clear();
    buf.resize(OPTION_HEADER_LEN, 0);
    read_exact_or_closed(stream, buf)?;
    match parse_option_frame(buf) {
        Ok(_) => Ok(()),
        // The header is valid and announces a payload (already checked
        // against the option size limit): read exactly that much.
        Err(WireError::Incomplete(total)) => {
            buf.resize(total.max(OPTION_HEADER_LEN), 0);
            let payload = buf.get_mut(OPTION_HEADER_LEN..).unwrap_or(&mut []);
            read_exact_or_closed(stream, payload)
        }
        Err(err) => Err(err.into()),
    }
}

fn read_exact_or_closed(stream: &mut Stream, buf: &mut [u8]) -> Result<(), HandshakeError> {
    match stream.read_exact(buf) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(HandshakeError::ClosedByClient),
        Err(e) => Err(e.into()),
    }
}

impl Handshake<'_> {
    fn reply(&mut self, option: u32, reply: &OptionReply) {
        if let Err(err) = encode_option_reply(option, reply, &mut self.out) {
            // Only names longer than the protocol allows can fail to encode;
            // tell the client instead of sending a broken reply.
            let fallback = OptionReply::error(ErrorReply::Invalid, err.to_string());
            let _ = encode_option_reply(option, &fallback, &mut self.out);
        }
    }

    /// Answers one decoded option; `Some` ends the handshake.
    fn answer(
        &mut self,
        option: u32,
        decoded: ClientOption,
    ) -> Result<Option<HandshakeOutcome>, HandshakeError> {
        if self.awaiting_tls {
            match decoded {
                ClientOption::StartTls | ClientOption::Abort => {}
                ClientOption::ExportName(_) => return Err(HandshakeError::TlsRequired),
                _ => {
                    self.reply(
                        option,
                        &OptionReply::error(
                            ErrorReply::TlsRequired,
                            "this listener requires TLS with a pre-shared key (NBD_OPT_STARTTLS)",
                        ),
                    );
                    return Ok(None);
                }
            }
        }
        match decoded {
            ClientOption::ExportName(name) => {
                let Some(handle) = self.open(&name) else {
                    return Err(HandshakeError::UnknownExport(name));
                };
                let negotiated = self.negotiated(handle);
                encode_export_name_reply(
                    negotiated.handle.size(),
                    negotiated.flags,
                    self.no_zeroes,
                    &mut self.out,
                );
                Ok(Some(HandshakeOutcome::Transmission(negotiated)))
            }
            ClientOption::Abort => {
                self.reply(option, &OptionReply::Ack);
                Ok(Some(HandshakeOutcome::Aborted))
            }
            ClientOption::List => {
                for name in self.exports.list(&self.scope) {
                    let description = self.exports.describe(&name).unwrap_or_default();
                    self.reply(option, &OptionReply::Server { name, description });
                }
                self.reply(option, &OptionReply::Ack);
                Ok(None)
            }
            ClientOption::StartTls => self.start_tls(option),
            ClientOption::StructuredReply => {
                if self.structured {
                    self.reply(
                        option,
                        &OptionReply::error(
                            ErrorReply::Invalid,
                            "structured replies are already negotiated",
                        ),
                    );
                } else {
                    self.structured = true;
                    self.reply(option, &OptionReply::Ack);
                }
                Ok(None)
            }
            ClientOption::Info(request) => {
                self.info(option, &request);
                Ok(None)
            }
            ClientOption::Go(request) => Ok(self
                .info(option, &request)
                .map(HandshakeOutcome::Transmission)),
            ClientOption::ListMetaContext(request) => {
                self.meta_context(option, &request, false);
                Ok(None)
            }
            ClientOption::SetMetaContext(request) => {
                self.meta_context(option, &request, true);
                Ok(None)
            }
            ClientOption::Unknown { .. } => {
                self.reply(
                    option,
                    &OptionReply::error(ErrorReply::Unsupported, "option not supported"),
                );
                Ok(None)
            }
        }
    }

    /// NBD_OPT_STARTTLS: ACK, then the TLS handshake; afterwards the
    /// handshake goes on inside TLS with the key's scope.
    fn start_tls(&mut self, option: u32) -> Result<Option<HandshakeOutcome>, HandshakeError> {
        let Security::TlsRequired { tls, timeout } = self.security else {
            self.reply(
                option,
                &OptionReply::error(
                    ErrorReply::Policy,
                    "TLS is not offered on this listener (NBD over TLS is served on the server's --nbd-listen address)",
                ),
            );
            return Ok(None);
        };
        if !self.awaiting_tls {
            self.reply(
                option,
                &OptionReply::error(ErrorReply::Invalid, "TLS is already negotiated"),
            );
            return Ok(None);
        }
        let tcp = match &*self.stream {
            Stream::Tcp(tcp) => tcp.try_clone()?,
            Stream::Unix(_) => {
                self.reply(
                    option,
                    &OptionReply::error(ErrorReply::Policy, "TLS is only offered over TCP"),
                );
                return Ok(None);
            }
        };
        self.reply(option, &OptionReply::Ack);
        self.stream.write_all(&self.out)?;
        self.out.clear();
        let session = tls.accept(tcp, timeout).map_err(HandshakeError::Tls)?;
        tracing::debug!(identity = %session.identity, "NBD client negotiated TLS");
        *self.stream = Stream::Unix(session.plain);
        *self.pump = Some(session.pump);
        self.scope = session.scope;
        self.awaiting_tls = false;
        // Nothing negotiated before TLS holds after it (the protocol).
        self.structured = false;
        self.meta = None;
        Ok(None)
    }

    /// Opens an export by name; the empty name means the default export,
    /// which exists when the client's scope has exactly one export.
    fn open(&self, name: &str) -> Option<VolumeHandle> {
        if name.is_empty() {
            let names = self.exports.list(&self.scope);
            return match names.as_slice() {
                [only] => self.exports.open(&self.scope, only),
                _ => None,
            };
        }
        self.exports.open(&self.scope, name)
    }

    /// Opens `name` for `option`, or answers the option with
    /// NBD_REP_ERR_UNKNOWN.
    fn open_or_refuse(&mut self, option: u32, name: &str) -> Option<VolumeHandle> {
        let handle = self.open(name);
        if handle.is_none() {
            self.reply(
                option,
                &OptionReply::error(
                    ErrorReply::UnknownExport,
                    format!("no export named {name:?}"),
                ),
            );
        }
        handle
    }

    fn transmission_flags(&self, read_only: bool) -> TransmissionFlags {
        let mut flags = BASE_TRANSMISSION_FLAGS;
        if self.structured {
            // DF only means something with structured replies.
            flags |= TransmissionFlags::SEND_DF;
        }
        if read_only {
            // A snapshot: writes would get EPERM anyway.
            flags |= TransmissionFlags::READ_ONLY;
        }
        flags
    }

    fn negotiated(&self, handle: VolumeHandle) -> Negotiated {
        let base_allocation = match &self.meta {
            Some(m) if m.base_allocation && m.export == handle.name() && self.structured => {
                Some(BASE_ALLOCATION_ID)
            }
            _ => None,
        };
        Negotiated {
            flags: self.transmission_flags(handle.is_read_only()),
            structured: self.structured,
            base_allocation,
            handle,
        }
    }

    /// NBD_OPT_INFO / NBD_OPT_GO: INFO replies then ACK, or an error. Returns
    /// the opened export for GO.
    fn info(&mut self, option: u32, request: &InfoRequest) -> Option<Negotiated> {
        let handle = self.open_or_refuse(option, &request.export)?;
        let negotiated = self.negotiated(handle);
        let name = negotiated.handle.name().to_owned();
        self.reply(
            option,
            &OptionReply::Info(InfoReply::Export {
                size: negotiated.handle.size(),
                flags: negotiated.flags,
            }),
        );
        if request.requests.contains(&InfoType::Name) {
            self.reply(option, &OptionReply::Info(InfoReply::Name(name.clone())));
        }
        if request.requests.contains(&InfoType::Description) {
            if let Some(text) = self.exports.describe(&name) {
                self.reply(option, &OptionReply::Info(InfoReply::Description(text)));
            }
        }
        // Sent even when not asked for: the minimum differs from the
        // protocol's default of 1, and clients ignore what they did not ask.
        self.reply(
            option,
            &OptionReply::Info(InfoReply::BlockSize {
                minimum: MIN_BLOCK_SIZE,
                preferred: PREFERRED_BLOCK_SIZE,
                maximum: MAX_PAYLOAD,
            }),
        );
        self.reply(option, &OptionReply::Ack);
        (option == basalt_nbd_wire::handshake::opt::GO).then_some(negotiated)
    }

    /// NBD_OPT_LIST_META_CONTEXT (`select == false`) and
    /// NBD_OPT_SET_META_CONTEXT (`select == true`); the only context is
    /// `base:allocation`.
    fn meta_context(&mut self, option: u32, request: &MetaContextRequest, select: bool) {
        if select {
            // SET replaces the selection even when it fails.
            self.meta = None;
        }
        if !self.structured {
            self.reply(
                option,
                &OptionReply::error(
                    ErrorReply::Invalid,
                    "metadata contexts need structured replies first",
                ),
            );
            return;
        }
        let Some(handle) = self.open_or_refuse(option, &request.export) else {
            return;
        };
        let export = handle.name().to_owned();
        drop(handle);
        if let Some(bad) = request.queries.iter().find(|q| !q.contains(':')) {
            self.reply(
                option,
                &OptionReply::error(
                    ErrorReply::Invalid,
                    format!("query {bad:?} has no namespace"),
                ),
            );
            return;
        }
        let matches = if select {
            // Only the exact name selects; "base:" is ignored for SET and
            // unknown namespaces or leaves are ignored, as the protocol says.
            request.queries.iter().any(|q| q == BASE_ALLOCATION)
        } else {
            request.queries.is_empty()
                || request
                    .queries
                    .iter()
                    .any(|q| q == BASE_ALLOCATION || q == "base:")
        };
        if matches {
            self.reply(
                option,
                &OptionReply::MetaContext {
                    // LIST replies carry a reserved id of 0.
                    context_id: if select { BASE_ALLOCATION_ID } else { 0 },
                    name: BASE_ALLOCATION.to_owned(),
                },
            );
        }
        if select {
            self.meta = Some(MetaSelection {
                export,
                base_allocation: matches,
            });
        }
        self.reply(option, &OptionReply::Ack);
    }
}
