//! A discovery session (SessionType=Discovery), served on its connection's
//! thread: Text Requests with SendTargets list the targets the initiator
//! may log in to (every portal of this node: the advertised one, with this
//! node's portal group tag), NOP-Outs are answered, and a Logout ends it.
//! SCSI commands and task management have no place here and are rejected.
//!
//! Invariants: a text response longer than the initiator's
//! MaxRecvDataSegmentLength goes out in pieces (C bit, a target transfer
//! tag the initiator returns to ask for the next); each answer carries the
//! next StatSN; the session ends at Logout, EOF or the first protocol
//! error.

use crate::connection::portal;
use crate::login::LoggedIn;
use crate::server::Shared;
use crate::ConnectionError;
use basalt_iscsi_wire::decoder::{decode_initiator, Decoded, DecoderConfig};
use basalt_iscsi_wire::digest::Digests;
use basalt_iscsi_wire::login::send_targets::{
    answer_text_request, split_text_response, TextContext,
};
use basalt_iscsi_wire::negotiation::{Digest, SessionType};
use basalt_iscsi_wire::pdu::{
    InitiatorPdu, LogoutResponse, LogoutResponseCode, NopIn, Reject, RejectReason, TargetPdu,
    TextResponse, BHS_LEN, RESERVED_TAG,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// Text of one Text Request (continued over PDUs) at most.
const MAX_TEXT_REQUEST: usize = 64 * 1024;

/// Serves the discovery session until it ends.
pub(crate) fn serve(
    shared: &Shared,
    stream: &mut TcpStream,
    peer: SocketAddr,
    logged_in: LoggedIn,
) -> Result<(), ConnectionError> {
    let outcome = logged_in.outcome;
    let c = &outcome.connection;
    let digests = Digests {
        header: c.header_digest == Digest::Crc32c,
        data: c.data_digest == Digest::Crc32c,
    };
    let send_segment = c.initiator_max_recv_data_segment_length;
    let config = DecoderConfig {
        digests,
        max_data_segment: c.target_max_recv_data_segment_length,
    };
    let mut stat_sn = outcome.next_stat_sn;
    let mut exp_cmd_sn = outcome.exp_cmd_sn;
    let mut recv = logged_in.leftover;
    let mut chunk = vec![0u8; 16 * 1024];
    let mut out = Vec::new();
    // A text request being received (C bit) and a response being sent in
    // pieces: its text, how much went, and the tag of the next piece.
    let mut request: Vec<u8> = Vec::new();
    let mut response: Option<(Vec<u8>, usize, u32)> = None;
    let mut next_ttt: u32 = 1;
    // The session lives as long as the initiator wants; only a login has a
    // deadline.
    stream.set_read_timeout(None)?;
    loop {
        let decoded = decode_initiator(&recv, &config);
        let (pdu, data, consumed) = match decoded {
            Ok(Decoded::Pdu {
                pdu,
                data,
                consumed,
            }) => (pdu, recv.get(data).unwrap_or(&[]).to_vec(), consumed),
            Ok(Decoded::NeedMore(_)) => {
                let n = stream.read(&mut chunk)?;
                if n == 0 {
                    return match recv.is_empty() {
                        true => Ok(()),
                        false => Err(ConnectionError::Truncated),
                    };
                }
                recv.extend_from_slice(&chunk[..n]);
                continue;
            }
            Err(err) => return Err(err.into()),
        };
        let bhs: [u8; BHS_LEN] = recv
            .get(..BHS_LEN)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0; BHS_LEN]);
        recv.drain(..consumed);
        out.clear();
        if !pdu.immediate() {
            exp_cmd_sn = exp_cmd_sn.wrapping_add(1);
        }
        let max_cmd_sn = exp_cmd_sn;
        let mut take_stat_sn = || {
            let sn = stat_sn;
            stat_sn = stat_sn.wrapping_add(1);
            sn
        };
        match pdu {
            InitiatorPdu::TextRequest(text) => {
                if text.ttt == RESERVED_TAG {
                    // A new request (or its next piece).
                    request.extend_from_slice(&data);
                    if request.len() > MAX_TEXT_REQUEST {
                        return Err(ConnectionError::Protocol("text request too long"));
                    }
                    if text.cont {
                        // Acknowledge the piece; the rest follows.
                        let pdu = text_response(
                            &text,
                            false,
                            false,
                            RESERVED_TAG,
                            take_stat_sn(),
                            exp_cmd_sn,
                            max_cmd_sn,
                        );
                        encode(&pdu, &[], digests, &mut out);
                    } else {
                        let targets = visible_targets(shared, &outcome.initiator_name);
                        let ctx = TextContext {
                            session_type: SessionType::Discovery,
                            current_target: None,
                            targets: &targets,
                        };
                        let mut text_out = Vec::new();
                        let answered = answer_text_request(&request, &ctx, &mut text_out);
                        request.clear();
                        if answered.is_err() {
                            let reject = TargetPdu::Reject(Reject {
                                reason: RejectReason::ProtocolError,
                                stat_sn: take_stat_sn(),
                                exp_cmd_sn,
                                max_cmd_sn,
                                data_sn: 0,
                            });
                            encode(&reject, &bhs, digests, &mut out);
                        } else {
                            response = Some((text_out, 0, 0));
                        }
                    }
                } else if response.as_ref().is_none_or(|r| r.2 != text.ttt) {
                    return Err(ConnectionError::Protocol(
                        "text request continues an unknown response",
                    ));
                }
                if let Some((text_all, sent, _)) = response.take() {
                    let pieces = split_text_response(&text_all[sent..], send_segment);
                    let piece = pieces.first().copied().unwrap_or(&[]);
                    let last = pieces.len() <= 1;
                    let ttt = match last {
                        true => RESERVED_TAG,
                        false => {
                            next_ttt = next_ttt.wrapping_add(1).max(1);
                            next_ttt
                        }
                    };
                    let pdu = text_response(
                        &text,
                        last,
                        !last,
                        ttt,
                        take_stat_sn(),
                        exp_cmd_sn,
                        max_cmd_sn,
                    );
                    encode(&pdu, piece, digests, &mut out);
                    if !last {
                        let sent = sent + piece.len();
                        response = Some((text_all, sent, ttt));
                    }
                }
            }
            InitiatorPdu::NopOut(nop) if nop.itt != RESERVED_TAG => {
                let pdu = TargetPdu::NopIn(NopIn {
                    lun: nop.lun,
                    itt: nop.itt,
                    ttt: RESERVED_TAG,
                    stat_sn: take_stat_sn(),
                    exp_cmd_sn,
                    max_cmd_sn,
                });
                let ping = &data[..data.len().min(send_segment as usize)];
                encode(&pdu, ping, digests, &mut out);
            }
            InitiatorPdu::NopOut(_) => {}
            InitiatorPdu::LogoutRequest(logout) => {
                let pdu = TargetPdu::LogoutResponse(LogoutResponse {
                    response: LogoutResponseCode::ClosedSuccessfully,
                    itt: logout.itt,
                    stat_sn: take_stat_sn(),
                    exp_cmd_sn,
                    max_cmd_sn,
                    time2wait: 0,
                    time2retain: 0,
                });
                encode(&pdu, &[], digests, &mut out);
                stream.write_all(&out)?;
                tracing::debug!(%peer, "iSCSI discovery session logged out");
                return Ok(());
            }
            _ => {
                // SCSI commands, task management, Data-Out, SNACK, login:
                // not in a discovery session (RFC 7143 §4.3).
                let pdu = TargetPdu::Reject(Reject {
                    reason: RejectReason::ProtocolError,
                    stat_sn: take_stat_sn(),
                    exp_cmd_sn,
                    max_cmd_sn,
                    data_sn: 0,
                });
                encode(&pdu, &bhs, digests, &mut out);
            }
        }
        stream.write_all(&out)?;
    }
}

/// The targets `initiator` may log in to, each at this node's portal and
/// then at the other nodes' (a cluster's every path).
fn visible_targets(shared: &Shared, initiator: &str) -> Vec<(String, Vec<String>)> {
    let mut addresses = vec![format!(
        "{},{}",
        portal(shared.advertise),
        shared.port_group
    )];
    addresses.extend(
        shared
            .targets
            .other_portals()
            .into_iter()
            .map(|(address, tag)| format!("{},{tag}", portal(address))),
    );
    shared
        .targets
        .visible(initiator)
        .into_iter()
        .map(|volume| (basalt_volume::iscsi_target_name(&volume), addresses.clone()))
        .collect()
}

fn text_response(
    request: &basalt_iscsi_wire::pdu::TextRequest,
    final_pdu: bool,
    cont: bool,
    ttt: u32,
    stat_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
) -> TargetPdu {
    TargetPdu::TextResponse(TextResponse {
        final_pdu,
        cont,
        lun: request.lun,
        itt: request.itt,
        ttt,
        stat_sn,
        exp_cmd_sn,
        max_cmd_sn,
    })
}

fn encode(pdu: &TargetPdu, data: &[u8], digests: Digests, out: &mut Vec<u8>) {
    crate::session::emit(pdu, data, digests, out);
}
