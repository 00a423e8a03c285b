//! The logical units of the volumes logged in to on this node: one per
//! volume, shared by every session of it, holding what SCSI says a logical
//! unit keeps across I_T nexuses (`basalt_scsi_wire::lu::LuState`: mode
//! parameters, persistent reservations, unit attentions) and its
//! configuration snapshot (`LuConfig`: identity, limits, capacity, ALUA
//! port groups).
//!
//! Hot path: a session decides READ and WRITE with the pure
//! `basalt_scsi_wire::lu::plan` on its cached [`UnitView`] (config and mode
//! snapshot) without taking the unit's lock, as long as the view says its
//! nexus is quiet (no unit attention pending, no reservation) and the
//! unit's generation has not moved. Anything else goes through the locked
//! `LuState::execute`.
//!
//! Invariants:
//! - The generation changes whenever the config or the state changes in a
//!   way that can change a decision, so a view with the current generation
//!   decides exactly as the locked state would.
//! - The watchdog ([`Units::watch`]) turns a resize into CAPACITY DATA HAS
//!   CHANGED and a change of any port group's ALUA state into ASYMMETRIC
//!   ACCESS STATE CHANGED, posted to every nexus, with a new config. READ
//!   CAPACITY does not wait for its next tick: it catches up with a resize
//!   itself, so an initiator that rescans right after a resize returned
//!   (`iscsiadm -m session --rescan`) sees the new capacity.
//! - A unit lives while a session holds it; a volume logged in to again
//!   later starts with a fresh unit (no state outlives the last session).

use crate::{PathState, Targets};
use basalt_scsi_wire::cdb;
use basalt_scsi_wire::data::mode::ModeState;
use basalt_scsi_wire::data::{AluaState, BlockLimits, PortGroup, Provisioning, UnitIdentity};
use basalt_scsi_wire::lu::{self, LuConfig, LuState, Pending, Plan, Response, Transfer};
use basalt_scsi_wire::reservation::Nexus;
use basalt_scsi_wire::sense::{self, Sense};
use basalt_volume::VolumeHandle;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// REPORT LUNS, the one command every LUN number answers.
const REPORT_LUNS: u8 = 0xa0;

/// A session's snapshot of its unit.
#[derive(Clone)]
pub(crate) struct UnitView {
    pub generation: u64,
    config: Arc<LuConfig>,
    mode: ModeState,
    /// The nexus has no unit attention pending and no reservation exists.
    quiet: bool,
}

/// One volume's logical unit.
pub(crate) struct Unit {
    volume: VolumeHandle,
    config: RwLock<Arc<LuConfig>>,
    state: Mutex<LuState>,
    generation: AtomicU64,
    /// What the watchdog saw last: size in bytes and the port groups'
    /// states.
    seen: Mutex<(u64, Vec<(u16, PathState)>)>,
    /// COMPARE AND WRITE runs one at a time per unit.
    pub compare_and_write: Mutex<()>,
    /// The connection each I_T nexus is on now (by initiator port): a
    /// reinstated session's nexus is the old one's, and the old
    /// connection's end must not end the new one's (locked before
    /// `state`).
    owners: Mutex<HashMap<String, u64>>,
}

impl Unit {
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub fn config(&self) -> Arc<LuConfig> {
        Arc::clone(&self.config.read())
    }

    /// Connection `connection` serves `nexus` from now on: its first view.
    /// A nexus another connection served (a reinstated session) is lost
    /// first, here and now, so the new session starts as a new nexus (one
    /// POWER ON RESET attention, no SPC-2 reservation of the old one)
    /// whenever the old connection's end is seen.
    pub fn connect(&self, nexus: &Nexus, connection: u64) -> UnitView {
        let mut owners = self.owners.lock();
        let previous = owners.insert(nexus.initiator_port.clone(), connection);
        if previous.is_some_and(|old| old != connection) {
            self.state.lock().nexus_lost(nexus);
            self.bump();
        }
        self.view(nexus)
    }

    /// A fresh view for `nexus` (registers the nexus with the unit).
    pub fn view(&self, nexus: &Nexus) -> UnitView {
        let mut state = self.state.lock();
        state.nexus_connected(nexus);
        // Read under the state lock: a change of either bumps after it.
        let generation = self.generation();
        UnitView {
            generation,
            config: self.config(),
            mode: *state.mode(),
            quiet: !state.needs_check(nexus),
        }
    }

    /// Decides a command of `nexus` to `lun`.
    pub fn decide(
        &self,
        view: &UnitView,
        nexus: &Nexus,
        lun: u64,
        cdb: &[u8],
        transfer: Transfer,
    ) -> Plan {
        if lun != 0 && cdb.first() != Some(&REPORT_LUNS) {
            return Plan::Respond(Response::check(sense::LOGICAL_UNIT_NOT_SUPPORTED));
        }
        if is_read_capacity(cdb) {
            self.catch_up_resize();
        }
        let plan = match view.quiet && view.generation == self.generation() {
            true => match cdb::parse(cdb) {
                Ok(command) => lu::plan(
                    &view.config,
                    &view.mode,
                    nexus.relative_target_port,
                    &command,
                    transfer,
                ),
                Err(sense) => Plan::Respond(Response::check(sense)),
            },
            false => Plan::NeedsState,
        };
        let plan = match plan {
            Plan::NeedsState => self.execute(nexus, cdb, transfer),
            plan => plan,
        };
        match plan {
            Plan::ReportLuns {
                select_report,
                alloc_len,
                expected_length,
            } => Plan::Respond(lu::report_luns(
                &[0],
                select_report,
                alloc_len,
                expected_length,
            )),
            plan => plan,
        }
    }

    /// Does now what the watchdog would do at its next tick for a resize:
    /// the new capacity in the config, CAPACITY DATA HAS CHANGED posted to
    /// every nexus (the generation moves, so the caller's command goes
    /// through the locked state and takes the attention first).
    fn catch_up_resize(&self) {
        let size = self.volume.size();
        {
            let mut seen = self.seen.lock();
            if seen.0 == size {
                return;
            }
            seen.0 = size;
        }
        let mut config = (*self.config()).clone();
        config.blocks = size / crate::LOGICAL_BLOCK_SIZE;
        *self.config.write() = Arc::new(config);
        tracing::info!(
            volume = self.volume.name(),
            size,
            "iSCSI logical unit resized: notifying initiators"
        );
        self.post_to_all(sense::CAPACITY_DATA_HAS_CHANGED);
    }

    fn execute(&self, nexus: &Nexus, cdb: &[u8], transfer: Transfer) -> Plan {
        let config = self.config();
        let mut state = self.state.lock();
        let before = state.generation();
        let plan = state.execute(&config, nexus, cdb, transfer);
        if state.generation() != before {
            self.bump();
        }
        plan
    }

    /// The Data-Out bytes the unit takes from a command (pure: consumes no
    /// unit attention; a command the state then refuses had its data
    /// collected for nothing, which is harmless).
    pub fn data_out_len(
        &self,
        view: &UnitView,
        nexus: &Nexus,
        cdb: &[u8],
        edtl: u32,
        read: bool,
        write: bool,
    ) -> u32 {
        let Ok(command) = cdb::parse(cdb) else {
            return 0;
        };
        let transfer = Transfer {
            expected_length: edtl,
            read,
            write,
        };
        let config = &view.config;
        let plan = lu::plan(
            config,
            &view.mode,
            nexus.relative_target_port,
            &command,
            transfer,
        );
        u32::try_from(plan.data_out_len(config.limits.block_size)).unwrap_or(0)
    }

    /// Finishes a command that waited for its parameter list.
    pub fn with_parameters(&self, nexus: &Nexus, pending: Pending, params: &[u8]) -> Plan {
        let config = self.config();
        let mut state = self.state.lock();
        let before = state.generation();
        let plan = state.with_parameters(&config, nexus, pending, params);
        if state.generation() != before {
            self.bump();
        }
        plan
    }

    /// Connection `connection` of `nexus` ended (logout or loss): unless a
    /// newer connection serves the nexus now (reinstatement), the nexus is
    /// lost (SPC-2 reservations it held end; persistent ones stay).
    pub fn nexus_lost(&self, nexus: &Nexus, connection: u64) {
        let mut owners = self.owners.lock();
        if owners.get(&nexus.initiator_port) != Some(&connection) {
            return;
        }
        owners.remove(&nexus.initiator_port);
        self.state.lock().nexus_lost(nexus);
        self.bump();
    }

    /// LOGICAL UNIT RESET from `nexus`.
    pub fn lun_reset(&self, nexus: &Nexus) {
        tracing::info!(volume = self.volume.name(), initiator = %nexus.initiator_port, "iSCSI logical unit reset");
        self.state
            .lock()
            .reset(sense::BUS_DEVICE_RESET_FUNCTION_OCCURRED);
        self.bump();
    }

    /// Sense data as sent: fixed format (D_SENSE is not offered).
    pub fn sense_bytes(&self, _view: &UnitView, sense: &Sense) -> Vec<u8> {
        let mut out = Vec::with_capacity(18);
        sense.encode_fixed(&mut out);
        out
    }

    fn post_to_all(&self, sense: Sense) {
        self.state.lock().post_unit_attention(sense);
        self.bump();
    }
}

/// Every live unit, by volume.
pub(crate) struct Units {
    units: Mutex<HashMap<uuid::Uuid, Weak<Unit>>>,
    /// The largest transfer of one command (Block Limits).
    max_transfer: u32,
}

impl Units {
    pub fn new(max_transfer: u32) -> Units {
        Units {
            units: Mutex::new(HashMap::new()),
            max_transfer,
        }
    }

    /// The unit of `volume`, made on first use.
    pub fn get(&self, volume: &VolumeHandle, targets: &dyn Targets, port_group: u16) -> Arc<Unit> {
        let mut units = self.units.lock();
        units.retain(|_, u| u.strong_count() > 0);
        let id = volume.id();
        if let Some(unit) = units.get(&id).and_then(Weak::upgrade) {
            return unit;
        }
        let groups = targets.port_groups(volume, port_group);
        let config = unit_config(volume, groups.clone(), port_group, self.max_transfer);
        let unit = Arc::new(Unit {
            volume: volume.clone(),
            config: RwLock::new(Arc::new(config)),
            state: Mutex::new(LuState::new(ModeState::default())),
            generation: AtomicU64::new(0),
            seen: Mutex::new((volume.size(), groups)),
            compare_and_write: Mutex::new(()),
            owners: Mutex::new(HashMap::new()),
        });
        units.insert(id, Arc::downgrade(&unit));
        unit
    }

    /// Posts the unit attentions of resizes and ALUA changes.
    pub fn watch(&self, targets: &dyn Targets, port_group: u16) {
        let live: Vec<Arc<Unit>> = self
            .units
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for unit in live {
            let size = unit.volume.size();
            let groups = targets.port_groups(&unit.volume, port_group);
            let (resized, moved) = {
                let mut seen = unit.seen.lock();
                let changed = (seen.0 != size, seen.1 != groups);
                *seen = (size, groups.clone());
                changed
            };
            if !resized && !moved {
                continue;
            }
            *unit.config.write() = Arc::new(unit_config(
                &unit.volume,
                groups.clone(),
                port_group,
                self.max_transfer,
            ));
            if resized {
                tracing::info!(
                    volume = unit.volume.name(),
                    size,
                    "iSCSI logical unit resized: notifying initiators"
                );
                unit.post_to_all(sense::CAPACITY_DATA_HAS_CHANGED);
            }
            if moved {
                tracing::info!(
                    volume = unit.volume.name(),
                    ?groups,
                    "iSCSI ALUA state changed: notifying initiators"
                );
                unit.post_to_all(sense::ASYMMETRIC_ACCESS_STATE_CHANGED);
            }
        }
    }
}

/// READ CAPACITY (10) or (16).
fn is_read_capacity(cdb: &[u8]) -> bool {
    match cdb {
        [cdb::opcode::READ_CAPACITY_10, ..] => true,
        [cdb::opcode::SERVICE_ACTION_IN_16, action, ..] => {
            action & 0x1f == cdb::service_action::READ_CAPACITY_16
        }
        _ => false,
    }
}

fn alua_state(path: PathState) -> AluaState {
    match path {
        PathState::Optimized => AluaState::ActiveOptimized,
        PathState::NonOptimized => AluaState::ActiveNonOptimized,
        PathState::Unavailable => AluaState::Unavailable,
    }
}

/// Space-padded ASCII of a fixed width.
fn padded<const N: usize>(text: &str) -> [u8; N] {
    let mut out = [b' '; N];
    for (o, b) in out.iter_mut().zip(text.bytes()) {
        *o = b;
    }
    out
}

/// The configuration of `volume`'s unit as seen through this node's port.
fn unit_config(
    volume: &VolumeHandle,
    groups: Vec<(u16, PathState)>,
    port_group: u16,
    max_transfer: u32,
) -> LuConfig {
    let block = crate::LOGICAL_BLOCK_SIZE;
    let per_physical = (crate::PHYSICAL_BLOCK_SIZE / block) as u32;
    let uuid = volume.id();
    LuConfig {
        identity: UnitIdentity {
            vendor: padded("BASALT"),
            product: padded("Basalt volume"),
            revision: padded(env!("CARGO_PKG_VERSION").trim_end_matches(".0")),
            serial: uuid.simple().to_string(),
            uuid: *uuid.as_bytes(),
            target_name: basalt_volume::iscsi_target_name(volume.name()),
            target_port_group: port_group,
            relative_target_port: port_group,
            alua: true,
        },
        limits: BlockLimits {
            block_size: block as u32,
            max_transfer_blocks: max_transfer / block as u32,
            // 128 KiB: what the store's extents and the loops' batches
            // like best.
            optimal_transfer_blocks: 32 * per_physical,
            // 512 MiB: libiscsi holds targets to at most 2^20.
            max_unmap_blocks: 1 << 20,
            max_unmap_descriptors: 256,
            unmap_granularity_blocks: per_physical,
            // Below 65536 blocks, so an initiator never sends one WRITE
            // SAME of more than 16 MiB without UNMAP.
            max_write_same_blocks: 1 << 15,
            max_compare_and_write_blocks: 16,
            physical_block_exponent: per_physical.trailing_zeros() as u8,
        },
        provisioning: Provisioning {
            thin: true,
            unmap: true,
            write_same_unmap: true,
            // Trimmed blocks read as zeros (the store frees or zeroes them).
            zeroes_after_unmap: true,
        },
        blocks: volume.size() / block,
        read_only: volume.is_read_only(),
        port_groups: groups
            .into_iter()
            .map(|(id, path)| PortGroup {
                id,
                state: alua_state(path),
                relative_ports: vec![id],
            })
            .collect(),
        implicit_transition_secs: 10,
    }
}
