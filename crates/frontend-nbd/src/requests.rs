//! NBD requests between parsing and replying, shared by both ways of
//! serving a connection (threads taking turns, `transmission`; an event
//! loop, `evented`): validation, the outcome of each request, running the
//! commands that are not reads or writes, and encoding replies.
//!
//! Invariants:
//! - Validation happens before anything touches the store; an invalid
//!   request becomes a `Failed` outcome and costs one error reply.
//! - Every entry encodes to exactly one complete reply: a READ answered
//!   with structured replies never gets a simple reply, and its last chunk
//!   carries the DONE flag. Read data is not copied into the encoding but
//!   listed as segments of the entry's buffer.

use crate::handshake::Negotiated;
use crate::stream::Peer;
use crate::MAX_PAYLOAD;
use basalt_loop_io::BufferPool;
use basalt_nbd_wire::transmission::MAX_BLOCK_STATUS_DESCRIPTORS;
use basalt_nbd_wire::{
    encode_block_status_chunk, encode_error_chunk, encode_none_chunk, encode_offset_data_header,
    encode_offset_hole_chunk, encode_simple_reply, BlockDescriptor, BlockStatusFlags, Command,
    CommandFlags, NbdError, ReplyFlags, Request, WireError,
};
use basalt_store::AlignedBuf;
use basalt_volume::{IoError, MappingRun, VolumeHandle};
use std::borrow::Cow;
use std::ops::Range;

/// Structured READs at least this long (and without DF) are checked against
/// the volume's mapping, and unallocated parts are sent as OFFSET_HOLE
/// chunks instead of zeros. Smaller reads are not worth the lookup.
pub const SPARSE_READ_MIN: u32 = 64 * 1024;

pub(crate) enum Outcome {
    /// Valid, not executed yet.
    Pending,
    /// Succeeded; a READ's data is in the entry's payload buffer.
    Done,
    /// Succeeded, and this READ covers unallocated runs (sent as holes).
    Sparse(Vec<MappingRun>),
    /// BLOCK_STATUS result.
    Extents(Vec<BlockDescriptor>),
    Failed {
        error: NbdError,
        message: Cow<'static, str>,
    },
}

impl Outcome {
    pub(crate) fn failed(error: NbdError, message: impl Into<Cow<'static, str>>) -> Outcome {
        Outcome::Failed {
            error,
            message: message.into(),
        }
    }
}

pub(crate) struct Entry {
    pub request: Request,
    /// READ destination or WRITE source; `None` for zero-length data
    /// requests and every other command.
    pub payload: Option<AlignedBuf>,
    pub outcome: Outcome,
}

/// Where one piece of the reply stream comes from.
pub(crate) enum Segment {
    /// Bytes of the encoded reply headers.
    Encoded(Range<usize>),
    /// Read data in the payload buffer of the batch entry at this index.
    Data(usize, Range<usize>),
}

/// Checks a request's flags and range against the negotiated options and
/// the export's size before anything touches the store.
pub(crate) fn validate(negotiated: &Negotiated, request: &Request) -> Result<(), Outcome> {
    let structured = negotiated.structured;
    let allowed = match request.command {
        Command::Read if structured => CommandFlags::FUA | CommandFlags::DF,
        Command::Read | Command::Write | Command::Flush | Command::Trim | Command::Cache => {
            CommandFlags::FUA
        }
        Command::WriteZeroes => CommandFlags::FUA | CommandFlags::NO_HOLE | CommandFlags::FAST_ZERO,
        Command::BlockStatus => CommandFlags::FUA | CommandFlags::REQ_ONE,
        Command::Disc => CommandFlags::empty(),
        Command::Unknown(_) => return Err(Outcome::failed(NbdError::Invalid, "unknown command")),
    };
    if !allowed.contains(request.flags) {
        return Err(Outcome::failed(
            NbdError::Invalid,
            "command flag not valid for this command",
        ));
    }
    match request.command {
        // FLUSH's offset and length are reserved; nothing to check.
        Command::Flush => return Ok(()),
        Command::Read if request.length > MAX_PAYLOAD => {
            return Err(Outcome::failed(
                NbdError::Overflow,
                "READ longer than the maximum payload of 32 MiB",
            ))
        }
        Command::BlockStatus if negotiated.base_allocation.is_none() => {
            return Err(Outcome::failed(
                NbdError::Invalid,
                "BLOCK_STATUS without a negotiated metadata context",
            ))
        }
        Command::BlockStatus if request.length == 0 => {
            return Err(Outcome::failed(
                NbdError::Invalid,
                "zero-length BLOCK_STATUS",
            ))
        }
        _ => {}
    }
    let size = negotiated.handle.size();
    match request.end() {
        Some(end) if end <= size => Ok(()),
        // The protocol asks for ENOSPC on writes beyond the end and
        // EINVAL on everything else.
        _ if matches!(request.command, Command::Write | Command::WriteZeroes) => {
            Err(Outcome::failed(
                NbdError::NoSpace,
                "request extends beyond the end of the export",
            ))
        }
        _ => Err(Outcome::failed(
            NbdError::Invalid,
            "request extends beyond the end of the export",
        )),
    }
}

/// A received request as an entry to execute: validated (an invalid one
/// is `Failed` already), a READ given its buffer from `pool`. A WRITE
/// brings its payload.
pub(crate) fn admit(
    negotiated: &Negotiated,
    pool: &mut BufferPool,
    request: Request,
    payload: Option<AlignedBuf>,
) -> Entry {
    let (outcome, payload) = match validate(negotiated, &request) {
        Err(failed) => (failed, payload),
        // Zero-length data requests succeed without touching the store
        // (the protocol leaves them unspecified and clients only use them
        // as probes). FLUSH always has length 0 and must run.
        Ok(()) if request.length == 0 && request.command != Command::Flush => {
            (Outcome::Done, payload)
        }
        Ok(()) => match request.command {
            Command::Read => (Outcome::Pending, Some(pool.take(request.length as usize))),
            _ => (Outcome::Pending, payload),
        },
    };
    Entry {
        request,
        payload,
        outcome,
    }
}

/// Runs a command that is not a READ or WRITE (blocking: FLUSH commits,
/// TRIM and WRITE_ZEROES may wait for the volume's map); its outcome.
pub(crate) fn run_command(handle: &VolumeHandle, request: &Request, peer: Peer) -> Outcome {
    let fua = request.flags.contains(CommandFlags::FUA);
    let offset = request.offset;
    let len = u64::from(request.length);
    let result = match request.command {
        Command::Flush => handle.flush(),
        Command::Trim => handle.trim(offset, len, fua),
        // FAST_ZERO needs no check: zeroing is a metadata update or a
        // punch here, never slower than writing zeros.
        Command::WriteZeroes => handle.write_zeroes(
            offset,
            len,
            !request.flags.contains(CommandFlags::NO_HOLE),
            fua,
        ),
        // Nothing to prefetch: reads are served from the device directly.
        Command::Cache => Ok(()),
        Command::BlockStatus => {
            return match handle.mapping(offset, len) {
                Ok(runs) => block_status(&runs, request.flags.contains(CommandFlags::REQ_ONE)),
                Err(err) => failure(&err, request, peer),
            };
        }
        Command::Read | Command::Write | Command::Disc | Command::Unknown(_) => {
            return Outcome::failed(NbdError::Invalid, "not a command");
        }
    };
    match result {
        Ok(()) => Outcome::Done,
        Err(err) => failure(&err, request, peer),
    }
}

/// The outcome of a READ or WRITE the store finished with `result`: a
/// long structured READ is checked for holes (`mapping` of its range, if
/// known) to send as such.
pub(crate) fn data_outcome(
    structured: bool,
    request: &Request,
    result: Result<(), IoError>,
    peer: Peer,
    mapping: impl FnOnce(u64, u64) -> Option<Vec<MappingRun>>,
) -> Outcome {
    match result {
        Err(err) => failure(&err, request, peer),
        Ok(())
            if request.command == Command::Read
                && structured
                && request.length >= SPARSE_READ_MIN
                && !request.flags.contains(CommandFlags::DF) =>
        {
            match mapping(request.offset, u64::from(request.length)) {
                Some(runs) if runs.iter().any(|r| !r.allocated) => Outcome::Sparse(runs),
                // Fully allocated, or unknown: the data itself is correct
                // either way.
                _ => Outcome::Done,
            }
        }
        Ok(()) => Outcome::Done,
    }
}

/// Encodes the replies of `entries` into `encoded`, listing in `segments`
/// the reply stream in order: encoded ranges and read data in entries'
/// buffers.
pub(crate) fn encode_replies(
    entries: &[Entry],
    negotiated: &Negotiated,
    encoded: &mut Vec<u8>,
    segments: &mut Vec<Segment>,
) {
    let mut marked = encoded.len(); // start of encoded bytes not yet in a segment
    let context_id = negotiated.base_allocation.unwrap_or(0);
    let mut data = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let before = encoded.len();
        if encode_reply(
            entry,
            index,
            negotiated.structured,
            context_id,
            encoded,
            &mut data,
        )
        .is_err()
        {
            // Cannot happen for values this module builds; still, never
            // leave a request without a reply.
            encoded.truncate(before);
            data.clear();
            encode_failure(
                entry.request.cookie,
                negotiated.structured,
                NbdError::Io,
                "internal error encoding the reply",
                encoded,
            );
        }
        for (at, piece) in data.drain(..) {
            segments.push(Segment::Encoded(marked..at));
            segments.push(piece);
            marked = at;
        }
    }
    segments.push(Segment::Encoded(marked..encoded.len()));
}

/// Maps a store error to the NBD error the client sees.
fn nbd_error(err: &IoError, command: Command) -> NbdError {
    match err {
        // The export shrank under the request: same codes as the range check.
        IoError::OutOfRange { .. } => match command {
            Command::Write | Command::WriteZeroes => NbdError::NoSpace,
            _ => NbdError::Invalid,
        },
        IoError::NoSpace => NbdError::NoSpace,
        IoError::Io(_) | IoError::Failed | IoError::Corrupt { .. } => NbdError::Io,
        // The volume was deleted: the client must disconnect, which is what
        // ESHUTDOWN tells it.
        IoError::Gone => NbdError::Shutdown,
        IoError::ReadOnly => NbdError::Perm,
    }
}

pub(crate) fn failure(err: &IoError, request: &Request, peer: Peer) -> Outcome {
    let error = nbd_error(err, request.command);
    if error == NbdError::Io {
        tracing::warn!(%peer, command = ?request.command, offset = request.offset,
            length = request.length, "NBD request failed: {err}");
    } else {
        tracing::debug!(%peer, command = ?request.command, offset = request.offset,
            length = request.length, "NBD request failed: {err}");
    }
    Outcome::failed(error, err.to_string())
}

/// Converts mapping runs into `base:allocation` descriptors.
pub(crate) fn block_status(runs: &[MappingRun], req_one: bool) -> Outcome {
    let mut descriptors = Vec::new();
    for run in runs {
        // Runs cover at most the request's 32-bit length; stop rather than
        // send a wrong length if that ever changed (fewer extents is valid).
        let Ok(length) = u32::try_from(run.len) else {
            break;
        };
        if length == 0 {
            continue;
        }
        let status = if run.allocated {
            BlockStatusFlags::empty()
        } else {
            BlockStatusFlags::HOLE | BlockStatusFlags::ZERO
        };
        descriptors.push(BlockDescriptor { length, status });
        if req_one || descriptors.len() >= MAX_BLOCK_STATUS_DESCRIPTORS {
            break;
        }
    }
    if descriptors.is_empty() {
        return Outcome::failed(NbdError::Io, "no allocation information for the range");
    }
    Outcome::Extents(descriptors)
}

pub(crate) fn encode_failure(
    cookie: u64,
    structured: bool,
    error: NbdError,
    message: &str,
    out: &mut Vec<u8>,
) {
    // A structured error chunk carries the message, so prefer it; error
    // chunks only fail to encode for error value 0, which NbdError never is
    // here.
    if !structured
        || encode_error_chunk(cookie, ReplyFlags::DONE, error, message, None, out).is_err()
    {
        encode_simple_reply(cookie, Some(error), out);
    }
}

/// Encodes the reply to one entry; read data is not copied but listed in
/// `data` as (position in `out` where it goes, segment).
pub(crate) fn encode_reply(
    entry: &Entry,
    index: usize,
    structured: bool,
    context_id: u32,
    out: &mut Vec<u8>,
    data: &mut Vec<(usize, Segment)>,
) -> Result<(), WireError> {
    let request = &entry.request;
    let cookie = request.cookie;
    let len = request.length;
    match (&entry.outcome, request.command) {
        (Outcome::Failed { error, message }, _) => {
            encode_failure(cookie, structured, *error, message, out)
        }
        (Outcome::Pending, _) => encode_failure(
            cookie,
            structured,
            NbdError::Io,
            "request was not executed",
            out,
        ),
        (Outcome::Done, Command::Read) if structured => {
            if len == 0 {
                encode_none_chunk(cookie, out);
            } else {
                encode_offset_data_header(cookie, ReplyFlags::DONE, request.offset, len, out)?;
                data.push((out.len(), Segment::Data(index, 0..len as usize)));
            }
        }
        (Outcome::Done, Command::Read) => {
            encode_simple_reply(cookie, None, out);
            if len > 0 {
                data.push((out.len(), Segment::Data(index, 0..len as usize)));
            }
        }
        (Outcome::Sparse(runs), _) => {
            let mut position: u32 = 0;
            let count = runs.len();
            for (k, run) in runs.iter().enumerate() {
                let run_len = u32::try_from(run.len).map_err(|_| WireError::Malformed {
                    what: "read reply",
                    reason: "mapping run longer than the request",
                })?;
                let flags = if k + 1 == count {
                    ReplyFlags::DONE
                } else {
                    ReplyFlags::empty()
                };
                let offset = request.offset + u64::from(position);
                if run.allocated {
                    encode_offset_data_header(cookie, flags, offset, run_len, out)?;
                    let start = position as usize;
                    data.push((
                        out.len(),
                        Segment::Data(index, start..start + run_len as usize),
                    ));
                } else {
                    encode_offset_hole_chunk(cookie, flags, offset, run_len, out)?;
                }
                position = position.saturating_add(run_len);
            }
        }
        (Outcome::Extents(descriptors), _) => {
            encode_block_status_chunk(cookie, ReplyFlags::DONE, context_id, descriptors, out)?
        }
        (Outcome::Done, _) => encode_simple_reply(cookie, None, out),
    }
    Ok(())
}
