//! The admin side of a queue thread: the Fabrics commands (Connect,
//! which binds the queue to a new or existing controller; Property
//! Get/Set; Disconnect) and the admin commands of an admin queue
//! (Identify, Get Log Page, features, keep-alive, Asynchronous Event
//! Requests).
//!
//! Invariants:
//! - A queue connects once; a Connect that names a controller joins it
//!   only if the subsystem, host NQN and host ID match and the controller
//!   is ready, and registers the queue's socket under the same lock that
//!   checked it, so a teardown cannot miss the queue.
//! - Property Get/Set and admin commands are only accepted on the admin
//!   queue of a ready controller.
//! - A queue whose host has a DH-HMAC-CHAP secret for the subsystem runs
//!   nothing but Authentication Send/Receive (and Disconnect) until its
//!   transaction succeeded; a failed one ends the connection.

use super::{data_reply, fail, Queue, Reply, AER_LIMIT};
use crate::auth::Authenticator;
use crate::controller::{self, Controller, IdentifySettings, Kind};
use crate::transport::Ready;
use crate::{volume_of_nqn, OpenError, PathState, NSID};
use basalt_nvme_wire::auth::{SECP_NVME, SPSP};
use basalt_nvme_wire::command::{
    cns, feature_id, log_id, number_of_queues_result, AdminCommand, GetLogPage, Identify,
};
use basalt_nvme_wire::fabrics::{
    connect_data_offset, connect_invalid_parameter_result, connect_sqe_offset,
    connect_success_result, Authentication, FabricsCommand, CNTLID_DYNAMIC, CNTLID_STATIC_ANY,
    CONNECT_DATA_LEN,
};
use basalt_nvme_wire::log_page::{copy_log_window, ANA_LSP_RETURN_GROUPS_ONLY};
use basalt_nvme_wire::properties::{Cap, Property, Vs};
use basalt_nvme_wire::{Sqe, Status};
use std::sync::Arc;
use std::time::Instant;

/// Connect's authentication requirements: ATR, an authentication
/// transaction is required before other commands.
const AUTHREQ_ATR: u16 = 1 << 1;

impl Queue<'_> {
    pub(super) fn fabrics(&mut self, f: FabricsCommand, r: &Ready) -> Reply {
        if self.auth.is_some()
            && !matches!(
                f,
                FabricsCommand::AuthenticationSend(_)
                    | FabricsCommand::AuthenticationReceive(_)
                    | FabricsCommand::Disconnect { .. }
            )
        {
            return fail(Status::AUTHENTICATION_REQUIRED);
        }
        match f {
            FabricsCommand::Connect(c) => self.connect(c, r.data.as_deref().unwrap_or(&[])),
            FabricsCommand::PropertyGet(p) => {
                let Some(ctrl) = self.ctrl.clone().filter(|_| self.transport.qid == 0) else {
                    return fail(Status::COMMAND_SEQUENCE_ERROR);
                };
                let limits = &self.shared.limits;
                let st = ctrl.state.lock();
                match Property::from_offset(p.offset) {
                    Some(Property::Cap) => {
                        let mut cap = Cap::fabrics(limits.max_queue_entries);
                        if ctrl.is_discovery() {
                            cap.css = Cap::CSS_NVM;
                        }
                        Reply::Result(cap.to_u64())
                    }
                    Some(Property::Vs) => Reply::Result(u64::from(Vs::V1_4.to_u32())),
                    Some(Property::Cc) => Reply::Result(u64::from(st.cc.to_u32())),
                    Some(Property::Csts) => Reply::Result(u64::from(st.csts.to_u32())),
                    Some(Property::Nssr) | None => fail(Status::INVALID_FIELD),
                }
            }
            FabricsCommand::PropertySet(p) => {
                let Some(ctrl) = self.ctrl.clone().filter(|_| self.transport.qid == 0) else {
                    return fail(Status::COMMAND_SEQUENCE_ERROR);
                };
                match Property::from_offset(p.offset) {
                    Some(Property::Cc) => {
                        ctrl.set_cc(p.value as u32);
                        Reply::Status(Status::SUCCESS)
                    }
                    _ => fail(Status::INVALID_FIELD),
                }
            }
            FabricsCommand::Disconnect { .. } => {
                self.disconnect = true;
                Reply::Status(Status::SUCCESS)
            }
            FabricsCommand::AuthenticationSend(a) => self.auth_send(a, r),
            FabricsCommand::AuthenticationReceive(a) => self.auth_receive(a, &r.sqe),
            FabricsCommand::Other { .. } => fail(Status::INVALID_OPCODE),
        }
    }

    /// Authentication Send: a host message of the queue's transaction.
    fn auth_send(&mut self, a: Authentication, r: &Ready) -> Reply {
        let Some(auth) = self.auth.as_mut() else {
            return fail(Status::COMMAND_SEQUENCE_ERROR);
        };
        let data = r.data.as_deref().unwrap_or(&[]);
        if a.secp != SECP_NVME
            || a.spsp0 != SPSP
            || a.spsp1 != SPSP
            || a.length as usize != data.len()
        {
            return fail(Status::INVALID_FIELD);
        }
        auth.send(data);
        // Only AUTH_Success2 (bidirectional) or AUTH_Failure2 end a
        // transaction on a Send.
        self.auth_progress();
        Reply::Status(Status::SUCCESS)
    }

    /// Ends a finished transaction: the queue becomes usable, or (failed)
    /// its connection ends.
    fn auth_progress(&mut self) {
        let Some(auth) = &self.auth else {
            return;
        };
        if auth.failed() {
            tracing::warn!(peer = %self.peer, qid = self.transport.qid,
                hostnqn = ?self.ctrl.as_ref().map(|c| c.hostnqn.clone()),
                "NVMe in-band authentication failed (DH-HMAC-CHAP): the connection is closed");
            self.disconnect = true;
        } else if auth.is_done() {
            self.auth = None;
            if let Some(ctrl) = &self.ctrl {
                tracing::debug!(peer = %self.peer, cntlid = ctrl.cntlid, qid = self.transport.qid,
                    "NVMe host authenticated (DH-HMAC-CHAP)");
            }
            self.clear_connect_timeout();
        }
    }

    /// Authentication Receive: the controller's next message; the queue
    /// ends after a failure and is usable after a success.
    fn auth_receive(&mut self, a: Authentication, sqe: &Sqe) -> Reply {
        let Some(auth) = self.auth.as_mut() else {
            return fail(Status::COMMAND_SEQUENCE_ERROR);
        };
        if a.secp != SECP_NVME || a.spsp0 != SPSP || a.spsp1 != SPSP {
            return fail(Status::INVALID_FIELD);
        }
        let message = auth.receive();
        self.auth_progress();
        data_reply(sqe, message)
    }

    /// The queue may be used: the connect timeout no longer applies.
    fn clear_connect_timeout(&mut self) {
        if let Err(e) = self.reader.set_read_timeout(None) {
            tracing::warn!(peer = %self.peer, "cannot clear the connect timeout: {e}");
        }
    }

    fn connect(&mut self, c: basalt_nvme_wire::fabrics::Connect, data: &[u8]) -> Reply {
        let invalid = |in_data: bool, offset: u16| {
            Reply::Result(u64::from(connect_invalid_parameter_result(in_data, offset)))
                .with_status(Status::CONNECT_INVALID_PARAMETERS.with_dnr())
        };
        if self.ctrl.is_some() {
            return fail(Status::COMMAND_SEQUENCE_ERROR);
        }
        if c.recfmt != 0 {
            return fail(Status::CONNECT_INCOMPATIBLE_FORMAT);
        }
        if data.len() < CONNECT_DATA_LEN {
            return fail(Status::DATA_SGL_LENGTH_INVALID);
        }
        let cd = match basalt_nvme_wire::ConnectData::parse(data) {
            Ok(cd) => cd,
            Err(basalt_nvme_wire::WireError::BadField { offset, .. }) => {
                return invalid(true, offset as u16)
            }
            Err(_) => return invalid(true, connect_data_offset::SUBNQN),
        };
        let limits = &self.shared.limits;
        if c.sqsize == 0 || c.queue_entries() > u32::from(limits.max_queue_entries) {
            return invalid(false, connect_sqe_offset::SQSIZE);
        }
        // The queue's socket, registered with the controller so that
        // tearing the controller down ends this connection too.
        let socket = match self.reader.try_clone() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(peer = %self.peer, "cannot register an NVMe queue: {e}");
                return fail(Status::INTERNAL_ERROR);
            }
        };
        let ctrl = if c.qid == 0 {
            if cd.cntlid != CNTLID_DYNAMIC && cd.cntlid != CNTLID_STATIC_ANY {
                return invalid(true, connect_data_offset::CNTLID);
            }
            let kind = if controller::is_discovery_nqn(&cd.subnqn) {
                Kind::Discovery
            } else {
                let Some(volume) = volume_of_nqn(&cd.subnqn) else {
                    return invalid(true, connect_data_offset::SUBNQN);
                };
                match self.shared.subsystems.open(&cd.hostnqn, volume) {
                    Ok(handle) => Kind::Io { volume: handle },
                    Err(OpenError::HostNotAllowed) => {
                        tracing::warn!(peer = %self.peer, hostnqn = %cd.hostnqn, subnqn = %cd.subnqn,
                            "NVMe Connect refused: host not allowed");
                        return fail(Status::CONNECT_INVALID_HOST);
                    }
                    Err(OpenError::NotFound) => {
                        tracing::info!(peer = %self.peer, subnqn = %cd.subnqn, "NVMe Connect to an unknown subsystem");
                        return invalid(true, connect_data_offset::SUBNQN);
                    }
                    Err(OpenError::Failed(e)) => {
                        tracing::error!(peer = %self.peer, subnqn = %cd.subnqn, "NVMe Connect failed: {e}");
                        return fail(Status::INTERNAL_ERROR);
                    }
                }
            };
            let ana_state = match &kind {
                Kind::Io { volume } => self.shared.subsystems.path_state(volume),
                Kind::Discovery => PathState::Optimized,
            };
            let made = self.shared.controllers.create(|id| {
                Controller::new(
                    id,
                    cd.subnqn.clone(),
                    cd.hostnqn.clone(),
                    cd.hostid,
                    kind,
                    c.kato,
                    ana_state,
                )
            });
            let Some(ctrl) = made else {
                return fail(Status::CONNECT_CONTROLLER_BUSY);
            };
            {
                let mut st = ctrl.state.lock();
                st.admin_writer = Some(Arc::clone(&self.writer));
                st.queues.insert(0, socket);
            }
            tracing::info!(peer = %self.peer, cntlid = ctrl.cntlid, subnqn = %cd.subnqn,
                hostnqn = %cd.hostnqn, kato_ms = c.kato, "NVMe controller created");
            ctrl
        } else {
            let Some(ctrl) = self.shared.controllers.get(cd.cntlid) else {
                return invalid(true, connect_data_offset::CNTLID);
            };
            if ctrl.subnqn != cd.subnqn {
                return invalid(true, connect_data_offset::SUBNQN);
            }
            if ctrl.hostnqn != cd.hostnqn {
                return invalid(true, connect_data_offset::HOSTNQN);
            }
            if ctrl.hostid != cd.hostid {
                return invalid(true, connect_data_offset::HOSTID);
            }
            if ctrl.is_discovery() {
                return invalid(false, connect_sqe_offset::QID);
            }
            let mut st = ctrl.state.lock();
            if !st.csts.rdy || st.dead {
                return fail(Status::COMMAND_SEQUENCE_ERROR);
            }
            let max = st.io_queues.unwrap_or(limits.max_io_queues);
            if c.qid > max || st.queues.contains_key(&c.qid) {
                return invalid(false, connect_sqe_offset::QID);
            }
            // Registered under the same lock that checked the controller
            // is alive, so a teardown cannot miss this queue.
            st.queues.insert(c.qid, socket);
            drop(st);
            ctrl
        };
        self.transport
            .connected(c.qid, c.queue_entries(), !c.disable_sq_flow_control());
        let cntlid = ctrl.cntlid;
        if c.qid != 0 {
            tracing::debug!(peer = %self.peer, cntlid, qid = c.qid, size = c.queue_entries(), "NVMe I/O queue connected");
        }
        // In-band authentication, when the host has a secret for this
        // subsystem: every queue proves it before its first other command
        // (and keeps the connect timeout until then).
        let keys = volume_of_nqn(&ctrl.subnqn)
            .filter(|_| !ctrl.is_discovery())
            .and_then(|volume| self.shared.subsystems.dhchap_keys(&ctrl.hostnqn, volume));
        let authreq = match keys {
            Some(keys) => {
                self.auth = Some(Authenticator::new(keys, &ctrl.hostnqn, &ctrl.subnqn));
                AUTHREQ_ATR
            }
            None => {
                self.clear_connect_timeout();
                0
            }
        };
        self.ctrl = Some(ctrl);
        Reply::Result(u64::from(connect_success_result(cntlid, authreq)))
    }

    pub(super) fn admin(&mut self, ctrl: &Arc<Controller>, a: AdminCommand, sqe: &Sqe) -> Reply {
        let discovery = ctrl.is_discovery();
        match a {
            AdminCommand::Identify(id) => self.identify(ctrl, id, sqe),
            AdminCommand::GetLogPage(g) => self.get_log_page(ctrl, g, sqe),
            AdminCommand::KeepAlive => {
                ctrl.state.lock().last_keep_alive = Instant::now();
                Reply::Status(Status::SUCCESS)
            }
            AdminCommand::SetFeatures(f) => {
                if f.save {
                    return fail(Status::FEATURE_NOT_SAVEABLE);
                }
                let mut st = ctrl.state.lock();
                match f.fid {
                    feature_id::NUMBER_OF_QUEUES if !discovery => {
                        let nsq = (f.cdw11 & 0xffff) as u16;
                        let ncq = (f.cdw11 >> 16) as u16;
                        if nsq == 0xffff || ncq == 0xffff {
                            return fail(Status::INVALID_FIELD);
                        }
                        if st.queues.len() > 1 {
                            return fail(Status::COMMAND_SEQUENCE_ERROR);
                        }
                        let max = self.shared.limits.max_io_queues;
                        let granted = (nsq.max(ncq).saturating_add(1)).min(max);
                        st.io_queues = Some(granted);
                        Reply::Result(u64::from(number_of_queues_result(granted, granted)))
                    }
                    feature_id::KEEP_ALIVE_TIMER => {
                        st.kato_ms = f.cdw11;
                        st.last_keep_alive = Instant::now();
                        Reply::Status(Status::SUCCESS)
                    }
                    feature_id::ASYNC_EVENT_CONFIG => {
                        st.async_event_config = f.cdw11;
                        Reply::Status(Status::SUCCESS)
                    }
                    feature_id::VOLATILE_WRITE_CACHE if !discovery => {
                        Reply::Status(Status::SUCCESS)
                    }
                    _ => fail(Status::INVALID_FIELD),
                }
            }
            AdminCommand::GetFeatures(f) => {
                let st = ctrl.state.lock();
                match f.fid {
                    feature_id::NUMBER_OF_QUEUES if !discovery => {
                        let n = st.io_queues.unwrap_or(self.shared.limits.max_io_queues);
                        Reply::Result(u64::from(number_of_queues_result(n, n)))
                    }
                    feature_id::KEEP_ALIVE_TIMER => Reply::Result(u64::from(st.kato_ms)),
                    feature_id::ASYNC_EVENT_CONFIG => {
                        Reply::Result(u64::from(st.async_event_config))
                    }
                    feature_id::VOLATILE_WRITE_CACHE if !discovery => Reply::Result(1),
                    _ => fail(Status::INVALID_FIELD),
                }
            }
            AdminCommand::AsyncEventRequest => {
                if ctrl.hold_aer(sqe.cid, usize::from(AER_LIMIT)) {
                    Reply::Held
                } else {
                    fail(Status::ASYNC_EVENT_LIMIT_EXCEEDED)
                }
            }
            // Nothing is ever long enough to abort: report "not aborted".
            AdminCommand::Abort(_) if !discovery => Reply::Result(1),
            AdminCommand::Abort(_) | AdminCommand::Other { .. } => fail(Status::INVALID_OPCODE),
        }
    }

    fn settings(&self) -> IdentifySettings {
        let limits = &self.shared.limits;
        IdentifySettings {
            in_capsule_data: limits.in_capsule_data,
            max_queue_entries: limits.max_queue_entries,
            mdts: (limits.max_transfer / 4096).trailing_zeros() as u8,
            aerl: AER_LIMIT - 1,
        }
    }

    fn identify(&mut self, ctrl: &Arc<Controller>, id: Identify, sqe: &Sqe) -> Reply {
        let page = match (id.cns, ctrl.volume()) {
            (cns::CONTROLLER, _) => controller::identify_controller(ctrl, &self.settings()),
            (cns::NAMESPACE, Some(v)) if id.nsid == NSID => controller::identify_namespace(v),
            (cns::NAMESPACE, Some(_)) => return fail(Status::INVALID_NAMESPACE),
            (cns::ACTIVE_NAMESPACES, Some(_)) => {
                if id.nsid >= 0xffff_fffe {
                    return fail(Status::INVALID_NAMESPACE);
                }
                Some(controller::active_namespaces(id.nsid))
            }
            (cns::NAMESPACE_ID_DESCRIPTORS, Some(v)) if id.nsid == NSID => {
                controller::namespace_descriptors(v)
            }
            (cns::NAMESPACE_ID_DESCRIPTORS, Some(_)) => return fail(Status::INVALID_NAMESPACE),
            // NVM command set specific structures: no limits to report.
            (cns::CSI_NAMESPACE | cns::CSI_CONTROLLER, Some(_)) if id.csi == 0 => {
                Some(vec![0u8; 4096])
            }
            _ => return fail(Status::INVALID_FIELD),
        };
        match page {
            Some(page) => data_reply(sqe, page),
            None => fail(Status::INTERNAL_ERROR),
        }
    }

    fn get_log_page(&mut self, ctrl: &Arc<Controller>, g: GetLogPage, sqe: &Sqe) -> Reply {
        let discovery = ctrl.is_discovery();
        let page = match g.lid {
            log_id::ERROR_INFORMATION => Some(controller::error_log()),
            log_id::SMART_HEALTH if !discovery => Some(controller::smart_log()),
            log_id::CHANGED_NAMESPACES if !discovery => Some(controller::changed_namespaces(ctrl)),
            log_id::ASYMMETRIC_NAMESPACE_ACCESS if !discovery => {
                controller::ana_log(ctrl, g.lsp & ANA_LSP_RETURN_GROUPS_ONLY != 0)
            }
            log_id::DISCOVERY if discovery => {
                let visible = self.shared.subsystems.visible(&ctrl.hostnqn);
                let mut ports = vec![(self.shared.advertise, self.shared.port_id)];
                ports.extend(self.shared.subsystems.other_ports());
                controller::discovery_log(&visible, &ports)
            }
            _ => return fail(Status::INVALID_LOG_PAGE),
        };
        let Some(page) = page else {
            return fail(Status::INTERNAL_ERROR);
        };
        if g.offset_is_index || !g.offset.is_multiple_of(4) {
            return fail(Status::INVALID_FIELD);
        }
        let len = g.len().min(u64::from(self.shared.limits.max_transfer)) as usize;
        let mut out = vec![0u8; len];
        if copy_log_window(&page, g.offset, &mut out).is_err() {
            return fail(Status::INVALID_FIELD);
        }
        data_reply(sqe, out)
    }
}
