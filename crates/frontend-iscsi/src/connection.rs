//! One accepted connection, from its thread: the login (module `login`),
//! then a discovery session on the same thread (module `discovery`), or a
//! normal session handed to an event loop (module `evented`) with its
//! volume opened, its logical unit found and its session recorded with the
//! server (for reinstatement and disconnects).
//!
//! Invariant: the connection's guards (its registration and admission) go
//! wherever the connection goes, so it is counted until it really ends.

use crate::login::{self, LoggedIn};
use crate::server::{Guards, SessionEntry, Shared};
use crate::session::{Params, Session};
use crate::{evented, ConnectionError, OpenError};
use basalt_iscsi_wire::digest::Digests;
use basalt_iscsi_wire::negotiation::{Digest, SessionType};
use basalt_scsi_wire::reservation::Nexus;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

/// Serves connection `id` until it ends or moves to an event loop.
pub(crate) fn serve(
    shared: &Arc<Shared>,
    id: u64,
    mut stream: TcpStream,
    peer: SocketAddr,
    guards: Guards,
) {
    let setup = stream
        .set_nodelay(true)
        .and_then(|()| stream.set_read_timeout(Some(shared.limits.login_timeout)))
        .and_then(|()| stream.set_write_timeout(Some(shared.limits.send_timeout)));
    if let Err(err) = setup {
        tracing::warn!(%peer, "iSCSI connection dropped: {err}");
        return;
    }
    let logged_in = match login::run(shared, &mut stream) {
        Ok(logged_in) => logged_in,
        Err(err) => {
            log_end(shared, peer, &err, "iSCSI login failed");
            return;
        }
    };
    let outcome = &logged_in.outcome;
    tracing::info!(%peer, initiator = %outcome.initiator_name, target = ?outcome.target_name,
        session_type = ?outcome.session_type, tsih = logged_in.tsih, "iSCSI login");
    match outcome.session_type {
        SessionType::Discovery => {
            if let Err(err) = crate::discovery::serve(shared, &mut stream, peer, logged_in) {
                log_end(shared, peer, &err, "iSCSI discovery session ended");
            }
        }
        SessionType::Normal => normal(shared, id, stream, peer, logged_in, guards),
    }
}

fn log_end(shared: &Shared, peer: SocketAddr, err: &ConnectionError, what: &str) {
    match err {
        _ if shared.stopping() => tracing::debug!(%peer, "{what} (server shutdown): {err}"),
        ConnectionError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            tracing::debug!(%peer, "{what}: the initiator closed the connection")
        }
        _ => tracing::info!(%peer, "{what}: {err}"),
    }
}

/// Opens the session's volume and moves the connection to an event loop.
fn normal(
    shared: &Arc<Shared>,
    id: u64,
    stream: TcpStream,
    peer: SocketAddr,
    logged_in: LoggedIn,
    guards: Guards,
) {
    let LoggedIn {
        outcome,
        tsih,
        leftover,
    } = logged_in;
    let target = outcome.target_name.clone().unwrap_or_default();
    let Some(volume_name) = basalt_volume::volume_of_target_name(&target) else {
        return;
    };
    // The login admitted the initiator; the volume may still have gone
    // (or failed to open) since: the connection then just ends, and the
    // initiator's next login is refused with the reason.
    let volume = match shared.targets.open(&outcome.initiator_name, &volume_name) {
        Ok(volume) => volume,
        Err(err) => {
            let level_warn = matches!(err, OpenError::Failed(_));
            match level_warn {
                true => tracing::warn!(%peer, volume = %volume_name, "iSCSI session ended: {err}"),
                false => tracing::info!(%peer, volume = %volume_name, "iSCSI session ended: {err}"),
            }
            return;
        }
    };
    let reinstated = shared.register_session(
        id,
        SessionEntry {
            initiator: outcome.initiator_name.clone(),
            isid: outcome.isid,
            volume: volume_name.clone(),
            tsih,
        },
    );
    if reinstated > 0 {
        tracing::info!(%peer, initiator = %outcome.initiator_name, volume = %volume_name,
            "iSCSI session reinstated: the old session's connection was closed");
    }
    let nexus = Nexus {
        initiator_port: format!(
            "{},i,0x{}",
            outcome.initiator_name,
            outcome
                .isid
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ),
        relative_target_port: shared.port_group,
    };
    let unit = shared
        .units
        .get(&volume, shared.targets.as_ref(), shared.port_group);
    let s = &outcome.session;
    let c = &outcome.connection;
    let params = Params {
        send_segment: c.initiator_max_recv_data_segment_length,
        recv_segment: c.target_max_recv_data_segment_length,
        max_burst: s.max_burst_length,
        first_burst: s.first_burst_length,
        immediate_data: s.immediate_data,
        initial_r2t: s.initial_r2t,
        digests: Digests {
            header: c.header_digest == Digest::Crc32c,
            data: c.data_digest == Digest::Crc32c,
        },
        window: shared.limits.command_window,
        max_transfer: shared.limits.max_transfer,
        target_name: target,
        portal: format!("{},{}", portal(shared.advertise), shared.port_group),
    };
    let session = Session::new(params, outcome.next_stat_sn, outcome.exp_cmd_sn);
    evented::hand_off(
        shared, id, stream, peer, session, unit, volume, nexus, leftover, guards,
    );
}

/// A portal address as TargetAddress writes it (IPv6 in brackets).
pub(crate) fn portal(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}
