//! The login phase of one connection, on its own thread: Login Request
//! PDUs are read from the blocking socket, run through the pure
//! `basalt_iscsi_wire::login::LoginMachine`, and its responses written
//! back, until the connection is in the full-feature phase or refused.
//!
//! Policy (`LoginPolicy` over [`crate::Targets`]):
//! - A normal session names a Basalt target (`iqn.2026-11.io.basalt:
//!   volume:<name>`). An initiator not attached to the volume is refused
//!   with "authorization failure" (0x0202) whether the volume exists or
//!   not, so names cannot be probed; a name that is not a Basalt target is
//!   "not found" (0x0203).
//! - An attachment with CHAP credentials requires CHAP (one-way, or mutual
//!   when the initiator challenges the target and the attachment has the
//!   target's credentials); otherwise no authentication is asked.
//! - Discovery sessions need no authentication: SendTargets lists only the
//!   targets the initiator may log in to.
//!
//! Invariants: at most `MAX_LOGIN_PDUS` requests (the machine's bound) and
//! `login_timeout` per read; a failed login gets its Login Response before
//! the connection closes.

use crate::server::Shared;
use crate::{ConnectionError, Targets};
use basalt_iscsi_wire::decoder::{decode_initiator, Decoded, DecoderConfig};
use basalt_iscsi_wire::digest::Digests;
use basalt_iscsi_wire::login::{
    Authorization, LoginEvent, LoginMachine, LoginOutcome, LoginPolicy, LoginRequest,
    LoginResponse, LoginStatus, Stage,
};
use basalt_iscsi_wire::negotiation::TargetLimits;
use basalt_iscsi_wire::pdu::{self, InitiatorPdu, LoginStage, TargetPdu};
use std::io::{Read, Write};
use std::net::TcpStream;

/// A finished login.
pub(crate) struct LoggedIn {
    pub outcome: LoginOutcome,
    /// The TSIH of the session (assigned here for a new session).
    pub tsih: u16,
    /// Bytes received after the last Login Request (the first
    /// full-feature PDUs, if the initiator did not wait).
    pub leftover: Vec<u8>,
}

/// [`LoginPolicy`] over the server's targets.
struct Policy<'a> {
    targets: &'a dyn Targets,
}

impl LoginPolicy for Policy<'_> {
    fn target_exists(&self, target_name: &str) -> bool {
        basalt_volume::volume_of_target_name(target_name).is_some()
    }

    fn authorization(&self, initiator: &str, target: Option<&str>) -> Authorization {
        let Some(target) = target else {
            return Authorization::Open;
        };
        let Some(volume) = basalt_volume::volume_of_target_name(target) else {
            return Authorization::Denied;
        };
        if !self.targets.allowed(initiator, &volume) {
            return Authorization::Denied;
        }
        match self.targets.chap(initiator, &volume) {
            Some(chap) => Authorization::Chap {
                initiator_user: chap.user,
                initiator_secret: chap.secret,
                mutual: chap.mutual,
            },
            None => Authorization::Open,
        }
    }
}

fn stage(stage: LoginStage) -> Stage {
    Stage::from_bits(stage.code())
}

fn wire_stage(stage: Stage) -> LoginStage {
    LoginStage::from_code(stage.bits())
}

/// The limits the target offers at login.
pub(crate) fn target_limits(shared: &Shared) -> TargetLimits {
    let l = &shared.limits;
    TargetLimits {
        max_recv_data_segment_length: l.max_recv_data_segment,
        max_burst_length: l.max_burst,
        first_burst_length: l.first_burst,
        header_digest_crc32c: l.digests,
        data_digest_crc32c: l.digests,
        target_portal_group_tag: shared.port_group,
        ..TargetLimits::default()
    }
}

/// Runs the login on `stream` (blocking, with the login timeout set).
pub(crate) fn run(shared: &Shared, stream: &mut TcpStream) -> Result<LoggedIn, ConnectionError> {
    let challenge: [u8; 16] = rand::random();
    let mut machine = LoginMachine::new(target_limits(shared), challenge, rand::random());
    let policy = Policy {
        targets: shared.targets.as_ref(),
    };
    let mut recv: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut out = Vec::with_capacity(16 * 1024);
    loop {
        let (request, data, consumed) = read_login_request(stream, &mut recv)?;
        let login = LoginRequest {
            transit: request.transit,
            cont: request.cont,
            csg: stage(request.csg),
            nsg: stage(request.nsg),
            version_max: request.version_max,
            version_min: request.version_min,
            isid: request.isid,
            tsih: request.tsih,
            itt: request.itt,
            cid: request.cid,
            cmd_sn: request.cmd_sn,
            exp_stat_sn: request.exp_stat_sn,
            data,
        };
        recv.drain(..consumed);
        let (mut response, event) = machine.receive(&login, &policy);
        match event {
            LoginEvent::Continue => send(stream, &response, &mut out)?,
            LoginEvent::Failed(status) => {
                send(stream, &response, &mut out)?;
                return Err(ConnectionError::Login(status.code()));
            }
            LoginEvent::Complete(outcome) => {
                let tsih = match outcome.new_session {
                    true => shared.new_tsih(),
                    false => {
                        // One connection per session (MaxConnections=1):
                        // there is no session to add a connection to.
                        let response = machine.reject(LoginStatus::SessionDoesNotExist);
                        send(stream, &response, &mut out)?;
                        return Err(ConnectionError::Login(
                            LoginStatus::SessionDoesNotExist.code(),
                        ));
                    }
                };
                response.tsih = tsih;
                // Open the full command window from the first response on.
                response.max_cmd_sn = response
                    .exp_cmd_sn
                    .wrapping_add(shared.limits.command_window - 1);
                send(stream, &response, &mut out)?;
                return Ok(LoggedIn {
                    outcome: *outcome,
                    tsih,
                    leftover: recv,
                });
            }
        }
    }
}

/// Reads until one whole Login Request is buffered; returns it, its data
/// segment and the bytes it took. Any other PDU ends the login.
fn read_login_request(
    stream: &mut TcpStream,
    recv: &mut Vec<u8>,
) -> Result<(pdu::LoginRequest, Vec<u8>, usize), ConnectionError> {
    let config = DecoderConfig::LOGIN;
    let mut chunk = [0u8; 8192];
    loop {
        match decode_initiator(recv, &config)? {
            Decoded::Pdu {
                pdu: InitiatorPdu::LoginRequest(request),
                data,
                consumed,
            } => {
                let data = recv.get(data).unwrap_or(&[]).to_vec();
                return Ok((request, data, consumed));
            }
            Decoded::Pdu { .. } => {
                return Err(ConnectionError::Protocol(
                    "a PDU other than Login Request during login",
                ))
            }
            Decoded::NeedMore(_) => {}
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(match recv.is_empty() {
                true => ConnectionError::Io(std::io::ErrorKind::UnexpectedEof.into()),
                false => ConnectionError::Truncated,
            });
        }
        recv.extend_from_slice(&chunk[..n]);
    }
}

fn send(
    stream: &mut TcpStream,
    response: &LoginResponse,
    out: &mut Vec<u8>,
) -> Result<(), ConnectionError> {
    out.clear();
    let pdu = TargetPdu::LoginResponse(pdu::LoginResponse {
        transit: response.transit,
        cont: response.cont,
        csg: wire_stage(response.csg),
        nsg: wire_stage(response.nsg),
        version_max: response.version_max,
        version_active: response.version_active,
        isid: response.isid,
        tsih: response.tsih,
        itt: response.itt,
        stat_sn: response.stat_sn,
        exp_cmd_sn: response.exp_cmd_sn,
        max_cmd_sn: response.max_cmd_sn,
        status_class: response.status_class,
        status_detail: response.status_detail,
    });
    pdu.encode(&response.data, Digests::NONE, out)
        .map_err(|_| ConnectionError::Protocol("login response too long"))?;
    stream.write_all(out)?;
    Ok(())
}
