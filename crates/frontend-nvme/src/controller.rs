//! Controllers: the state an admin-queue Connect creates and its I/O queues
//! share (registers CC/CSTS, features, keep-alive deadline, held
//! Asynchronous Event Requests, the sockets of its queues), the registry
//! that hands out controller IDs, and the data structures a controller
//! returns (Identify pages and log pages).
//!
//! Invariants:
//! - A controller ID is in the registry exactly while its admin queue is
//!   connected and the controller has not been torn down; tearing down
//!   (admin queue gone, keep-alive expired, server stopping) removes it and
//!   shuts down the socket of every queue it owns, so no I/O queue outlives
//!   its controller.
//! - Controller IDs are within the registry's range (a subrange of
//!   1..=0xFFEF) and unique among live controllers.
//! - Clearing CC.EN of an enabled controller resets it: its I/O queues are
//!   shut down and unregistered, held Asynchronous Event Requests dropped,
//!   host-set features back to defaults; the admin queue (and so the
//!   controller ID) stays. CSTS.RDY follows CC.EN, CSTS.SHST reads
//!   "complete" while CC.SHN is set.
//! - A controller's ANA group (ID [`ANA_GROUP`], NSID 1) is in the state
//!   last given to [`Controller::set_path_state`] (initially the state at
//!   Connect); every change bumps the ANA log's change count and, when the
//!   host enabled ANA change notices, queues one ANA Change asynchronous
//!   event. At most one event of each kind is pending.
//! - Everything here is pure computation under short locks; the only socket
//!   write is an Asynchronous Event completion, done under the admin
//!   queue's writer lock like the queue's own writes.

use crate::{subsystem_nqn, PathState, BLOCK_SIZE, FIRMWARE_REVISION, MODEL, NSID};
use basalt_nvme_wire::command::{async_event, async_event_result, log_id};
use basalt_nvme_wire::fabrics::DISCOVERY_NQN;
use basalt_nvme_wire::identify::{
    active_namespace_list, namespace_id_descriptors, IdentifyController, IdentifyNamespace,
    NsIdDescriptor,
};
use basalt_nvme_wire::log_page::{
    changed_namespace_list, encode_error_log, AnaGroup, AnaLog, AnaState, DiscoveryLog,
    DiscoveryLogEntry, SmartLog,
};
use basalt_nvme_wire::pdu::Negotiated;
use basalt_nvme_wire::properties::{shst, Cc, Csts};
use basalt_nvme_wire::{CapsuleResp, Cqe, Status};
use basalt_volume::VolumeHandle;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

/// Largest controller ID of the dynamic model.
pub(crate) const MAX_CNTLID: u16 = 0xffef;
/// Asynchronous Event Configuration bit: namespace attribute notices.
const AEN_NAMESPACE_ATTRIBUTE: u32 = 1 << 8;
/// Asynchronous Event Configuration bit: ANA change notices.
const AEN_ANA_CHANGE: u32 = 1 << 11;
/// ANA group of every namespace.
pub(crate) const ANA_GROUP: u32 = 1;

/// The write side of a queue's socket, shared by the queue's thread and
/// (for the admin queue) the watchdog completing asynchronous events.
pub(crate) struct Writer {
    pub stream: TcpStream,
    pub negotiated: Negotiated,
    /// SQHD to report in completions not tied to a received command.
    pub sqhd: u16,
    pub scratch: Vec<u8>,
}

/// What kind of subsystem a controller belongs to.
pub(crate) enum Kind {
    Discovery,
    /// An I/O controller of a volume's subsystem; the volume is NSID 1.
    Io {
        volume: VolumeHandle,
    },
}

/// An asynchronous event waiting for a held request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// The namespace changed (resize): read the Changed Namespace List.
    NamespaceAttribute,
    /// The ANA state changed: read the ANA log.
    AnaChange,
}

impl Event {
    fn result(self) -> u32 {
        match self {
            Event::NamespaceAttribute => async_event_result(
                async_event::TYPE_NOTICE,
                async_event::NOTICE_NAMESPACE_ATTRIBUTE_CHANGED,
                log_id::CHANGED_NAMESPACES,
            ),
            Event::AnaChange => async_event_result(
                async_event::TYPE_NOTICE,
                async_event::NOTICE_ANA_CHANGE,
                log_id::ASYMMETRIC_NAMESPACE_ACCESS,
            ),
        }
    }
}

/// Mutable controller state.
pub(crate) struct State {
    pub cc: Cc,
    pub csts: Csts,
    /// Keep alive timeout in ms, 0 = disabled.
    pub kato_ms: u32,
    pub last_keep_alive: Instant,
    pub async_event_config: u32,
    /// I/O queues granted by Set Features Number of Queues.
    pub io_queues: Option<u16>,
    /// Socket clones of the connected queues, by QID.
    pub queues: HashMap<u16, TcpStream>,
    /// Held Asynchronous Event Requests (CIDs).
    pub aers: Vec<u16>,
    /// Events that occurred while no request was held (each kind once).
    pub pending: Vec<Event>,
    /// The admin queue's writer, to complete held requests.
    pub admin_writer: Option<Arc<Mutex<Writer>>>,
    /// The namespace changed since the Changed Namespace List was read.
    pub changed_ns: bool,
    /// Volume size last seen, to notice resizes.
    pub size_seen: u64,
    /// The ANA state of the group as this controller reports it.
    pub ana_state: PathState,
    /// ANA log change count: starts at 1, bumped on every state change.
    pub ana_change_count: u64,
    pub dead: bool,
}

impl State {
    /// Controller Level Reset: the I/O queues are deleted (their sockets
    /// shut down, so their threads end and in-flight commands are
    /// abandoned, as a reset aborts them), held Asynchronous Event Requests
    /// are dropped without completion, and the features a host sets
    /// return to their defaults. The admin queue stays connected; the
    /// caller clears CSTS.RDY. The host re-enables the controller and
    /// connects new I/O queues.
    fn reset(&mut self) {
        self.queues.retain(|&qid, stream| {
            if qid != 0 {
                let _ = stream.shutdown(Shutdown::Both);
            }
            qid == 0
        });
        self.aers.clear();
        self.pending.clear();
        self.async_event_config = 0;
        self.io_queues = None;
    }
}

pub(crate) struct Controller {
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub kind: Kind,
    pub state: Mutex<State>,
}

impl Controller {
    pub fn new(
        cntlid: u16,
        subnqn: String,
        hostnqn: String,
        hostid: [u8; 16],
        kind: Kind,
        kato_ms: u32,
        ana_state: PathState,
    ) -> Controller {
        let size_seen = match &kind {
            Kind::Io { volume } => volume.size(),
            Kind::Discovery => 0,
        };
        Controller {
            cntlid,
            subnqn,
            hostnqn,
            hostid,
            kind,
            state: Mutex::new(State {
                cc: Cc::default(),
                csts: Csts::default(),
                kato_ms,
                last_keep_alive: Instant::now(),
                async_event_config: 0,
                io_queues: None,
                queues: HashMap::new(),
                aers: Vec::new(),
                pending: Vec::new(),
                admin_writer: None,
                changed_ns: false,
                size_seen,
                ana_state,
                ana_change_count: 1,
                dead: false,
            }),
        }
    }

    pub fn is_discovery(&self) -> bool {
        matches!(self.kind, Kind::Discovery)
    }

    pub fn volume(&self) -> Option<&VolumeHandle> {
        match &self.kind {
            Kind::Io { volume } => Some(volume),
            Kind::Discovery => None,
        }
    }

    /// Applies a write of CC: enabling makes the controller ready;
    /// clearing CC.EN of an enabled controller resets it
    /// ([`State::reset`]); a shutdown notification (CC.SHN) completes at
    /// once (there is nothing to write back: completed writes are in the
    /// store), so CSTS.SHST reads "complete" right after it.
    pub fn set_cc(&self, value: u32) {
        let cc = Cc::from_u32(value);
        let mut st = self.state.lock();
        if st.cc.en && !cc.en {
            tracing::info!(cntlid = self.cntlid, subnqn = %self.subnqn, "NVMe controller reset (CC.EN cleared)");
            st.reset();
        }
        st.csts.rdy = cc.en;
        st.csts.shst = if cc.shn != 0 {
            shst::COMPLETE
        } else {
            shst::NORMAL
        };
        st.cc = cc;
    }

    /// Shuts down every queue's socket and marks the controller dead.
    pub fn tear_down(&self) {
        let mut st = self.state.lock();
        st.dead = true;
        for stream in st.queues.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        st.aers.clear();
        st.admin_writer = None;
    }

    /// Records a namespace attribute change (a resize) and completes a held
    /// Asynchronous Event Request if the host enabled such notices.
    pub fn namespace_changed(&self) {
        let mut st = self.state.lock();
        st.changed_ns = true;
        if st.async_event_config & AEN_NAMESPACE_ATTRIBUTE == 0 {
            return;
        }
        queue_event(&mut st, Event::NamespaceAttribute);
    }

    /// Sets the ANA state this controller reports; on a change bumps the
    /// ANA change count and notifies the host if it enabled ANA change
    /// notices. Returns whether the state changed.
    pub fn set_path_state(&self, state: PathState) -> bool {
        let mut st = self.state.lock();
        if st.ana_state == state {
            return false;
        }
        st.ana_state = state;
        st.ana_change_count = st.ana_change_count.wrapping_add(1).max(1);
        if st.async_event_config & AEN_ANA_CHANGE != 0 {
            queue_event(&mut st, Event::AnaChange);
        }
        true
    }

    /// Holds an Asynchronous Event Request; returns false when the limit
    /// is reached. Completes it at once if an event is pending.
    pub fn hold_aer(&self, cid: u16, limit: usize) -> bool {
        let mut st = self.state.lock();
        if st.aers.len() >= limit {
            return false;
        }
        st.aers.push(cid);
        complete_pending_event(&mut st);
        true
    }
}

/// Records `event` as pending (once) and completes held requests.
fn queue_event(st: &mut State, event: Event) {
    if !st.pending.contains(&event) {
        st.pending.push(event);
    }
    complete_pending_event(st);
}

/// Completes held requests with pending events, oldest first.
fn complete_pending_event(st: &mut State) {
    while !st.pending.is_empty() && !st.aers.is_empty() {
        let Some(writer) = st.admin_writer.clone() else {
            return;
        };
        let cid = st.aers.remove(0);
        let event = st.pending.remove(0);
        send_event(&writer, cid, event.result());
    }
}

/// Sends the completion of Asynchronous Event Request `cid`.
fn send_event(writer: &Mutex<Writer>, cid: u16, result: u32) {
    let mut w = writer.lock();
    let w = &mut *w;
    let cqe = Cqe::new(cid, 0, w.sqhd, Status::SUCCESS).with_result(u64::from(result));
    w.scratch.clear();
    CapsuleResp { cqe }.encode(&w.negotiated, &mut w.scratch);
    if let Err(err) = w.stream.write_all(&w.scratch) {
        tracing::debug!("cannot send an asynchronous event: {err}");
    }
}

/// The live controllers.
pub(crate) struct Registry {
    inner: Mutex<RegistryInner>,
    /// Controller IDs handed out: `first..=last`, within 1..=0xFFEF.
    first: u16,
    last: u16,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::with_range(1, MAX_CNTLID)
    }
}

#[derive(Default)]
struct RegistryInner {
    controllers: HashMap<u16, Arc<Controller>>,
    next: u16,
}

impl Registry {
    /// A registry handing out IDs `first..=last`, clamped to 1..=0xFFEF
    /// (an empty range becomes the single ID `first`).
    pub fn with_range(first: u16, last: u16) -> Registry {
        let first = first.clamp(1, MAX_CNTLID);
        let last = last.clamp(first, MAX_CNTLID);
        Registry {
            inner: Mutex::new(RegistryInner::default()),
            first,
            last,
        }
    }

    /// Registers a controller built by `make` with a fresh ID; `None` when
    /// every ID is in use.
    pub fn create(&self, make: impl FnOnce(u16) -> Controller) -> Option<Arc<Controller>> {
        let mut inner = self.inner.lock();
        for _ in self.first..=self.last {
            inner.next = if inner.next < self.first || inner.next >= self.last {
                self.first
            } else {
                inner.next + 1
            };
            let id = inner.next;
            if let std::collections::hash_map::Entry::Vacant(slot) = inner.controllers.entry(id) {
                let ctrl = Arc::new(make(id));
                slot.insert(Arc::clone(&ctrl));
                return Some(ctrl);
            }
        }
        None
    }

    pub fn get(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.inner.lock().controllers.get(&cntlid).cloned()
    }

    /// Removes the controller (if it is still this one) and tears it down.
    pub fn remove(&self, ctrl: &Arc<Controller>) {
        {
            let mut inner = self.inner.lock();
            if inner
                .controllers
                .get(&ctrl.cntlid)
                .is_some_and(|c| Arc::ptr_eq(c, ctrl))
            {
                inner.controllers.remove(&ctrl.cntlid);
            }
        }
        ctrl.tear_down();
    }

    pub fn all(&self) -> Vec<Arc<Controller>> {
        self.inner.lock().controllers.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().controllers.len()
    }
}

/// Serial number of a volume's subsystem: the first 20 hex digits of its
/// UUID (stable, unique per volume).
pub(crate) fn serial_of(volume: &VolumeHandle) -> String {
    volume.id().simple().to_string().chars().take(20).collect()
}

/// Settings of the Identify Controller page that come from the server.
pub(crate) struct IdentifySettings {
    pub in_capsule_data: u32,
    pub max_queue_entries: u16,
    /// MDTS in units of 4 KiB pages as a power of two.
    pub mdts: u8,
    pub aerl: u8,
}

/// Identify Controller for `ctrl`.
pub(crate) fn identify_controller(ctrl: &Controller, s: &IdentifySettings) -> Option<Vec<u8>> {
    let mut id = match &ctrl.kind {
        Kind::Discovery => IdentifyController::discovery(ctrl.cntlid),
        Kind::Io { volume } => {
            let mut id = IdentifyController::io(ctrl.cntlid, &ctrl.subnqn, s.in_capsule_data);
            id.serial = serial_of(volume);
            id.nn = NSID;
            id.mnan = NSID;
            id.aerl = s.aerl;
            id
        }
    };
    if ctrl.is_discovery() {
        id.serial = "basalt-discovery".into();
    }
    id.model = MODEL.into();
    id.firmware = FIRMWARE_REVISION.chars().take(8).collect();
    id.mdts = s.mdts;
    id.maxcmd = s.max_queue_entries;
    id.elpe = 0;
    id.to_bytes().ok().map(|b| b.to_vec())
}

/// Identify Namespace for the volume: NSZE and NCAP are the volume's
/// blocks, NUSE the blocks its allocated extents hold (thin provisioning),
/// NSATTR says whether it is write protected (a snapshot).
pub(crate) fn identify_namespace(volume: &VolumeHandle) -> Option<Vec<u8>> {
    let blocks = volume.size() / BLOCK_SIZE;
    let mut ns = IdentifyNamespace::new(blocks, BLOCK_SIZE.trailing_zeros() as u8, ANA_GROUP);
    ns.nguid = *volume.id().as_bytes();
    ns.nsfeat = basalt_nvme_wire::identify::nsfeat::THIN_PROVISIONING;
    ns.nuse = volume.allocated_bytes().div_ceil(BLOCK_SIZE).min(blocks);
    if volume.is_read_only() {
        // NSATTR bit 0: write protected (a snapshot).
        ns.nsattr = 1;
    }
    ns.to_bytes().ok().map(|b| b.to_vec())
}

/// Namespace Identification Descriptors: NGUID and UUID (the volume's
/// UUID) and the NVM command set.
pub(crate) fn namespace_descriptors(volume: &VolumeHandle) -> Option<Vec<u8>> {
    let id = *volume.id().as_bytes();
    namespace_id_descriptors(&[
        NsIdDescriptor::Nguid(id),
        NsIdDescriptor::Uuid(id),
        NsIdDescriptor::Csi(0),
    ])
    .ok()
    .map(|b| b.to_vec())
}

/// Active Namespace ID list (only NSID 1).
pub(crate) fn active_namespaces(after: u32) -> Vec<u8> {
    active_namespace_list(&[NSID], after).to_vec()
}

/// Error Information log: no entries recorded.
pub(crate) fn error_log() -> Vec<u8> {
    let mut out = Vec::new();
    encode_error_log(&[], 1, &mut out);
    out
}

/// SMART / Health log: healthy, full spare.
pub(crate) fn smart_log() -> Vec<u8> {
    SmartLog {
        available_spare: 100,
        available_spare_threshold: 10,
        temperature: 300,
        ..SmartLog::default()
    }
    .to_bytes()
    .to_vec()
}

/// ANA log: one group holding NSID 1, in the controller's path state.
pub(crate) fn ana_log(ctrl: &Controller, groups_only: bool) -> Option<Vec<u8>> {
    let (state, change_count) = {
        let st = ctrl.state.lock();
        (st.ana_state, st.ana_change_count)
    };
    let log = AnaLog {
        change_count,
        groups: vec![AnaGroup {
            id: ANA_GROUP,
            change_count,
            state: match state {
                PathState::Optimized => AnaState::Optimized,
                PathState::NonOptimized => AnaState::NonOptimized,
            },
            nsids: vec![NSID],
        }],
    };
    let mut out = Vec::new();
    log.encode(groups_only, &mut out).ok()?;
    Some(out)
}

/// Changed Namespace List; reading it clears the change.
pub(crate) fn changed_namespaces(ctrl: &Controller) -> Vec<u8> {
    let mut st = ctrl.state.lock();
    let changed = std::mem::take(&mut st.changed_ns);
    let list: &[u32] = if changed { &[NSID] } else { &[] };
    changed_namespace_list(list).to_vec()
}

/// Discovery log page listing `volumes` at each of `ports` (address, port
/// ID), in that order per volume.
pub(crate) fn discovery_log(volumes: &[String], ports: &[(SocketAddr, u16)]) -> Option<Vec<u8>> {
    let mut names: Vec<&String> = volumes.iter().collect();
    names.sort();
    let entries: Vec<DiscoveryLogEntry> = names
        .iter()
        .flat_map(|v| {
            let nqn = subsystem_nqn(v);
            ports.iter().map(move |(addr, port_id)| {
                DiscoveryLogEntry::tcp(
                    &nqn,
                    &addr.ip().to_string(),
                    &addr.port().to_string(),
                    *port_id,
                )
            })
        })
        .collect();
    // The generation counter changes whenever the entries do.
    let mut digest = basalt_nvme_wire::DataDigest::new();
    for e in &entries {
        digest.update(e.subnqn.as_bytes());
        digest.update(&[0]);
        digest.update(e.traddr.as_bytes());
        digest.update(e.trsvcid.as_bytes());
        digest.update(&e.portid.to_le_bytes());
    }
    let log = DiscoveryLog {
        genctr: u64::from(digest.value()) + 1,
        recfmt: 0,
        entries,
    };
    let mut out = Vec::new();
    log.encode(&mut out).ok()?;
    Some(out)
}

/// The discovery subsystem's NQN.
pub(crate) fn is_discovery_nqn(nqn: &str) -> bool {
    nqn == DISCOVERY_NQN
}
