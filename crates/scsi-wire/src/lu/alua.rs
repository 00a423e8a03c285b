//! Asymmetric logical unit access (SPC-5 §5.16): which commands a target
//! port group in each access state processes.
//!
//! Invariant: a port that is in no configured group (or a unit without
//! groups) is active/optimized; the standby and unavailable lists follow
//! SPC-5 §5.16.2.4.4-5 plus READ CAPACITY in standby (as Linux LIO does,
//! so initiators can size a standby path).

use super::LuConfig;
use crate::cdb::Command;
use crate::data::AluaState;
use crate::sense::{
    Sense, ASYMMETRIC_ACCESS_STATE_TRANSITION, TARGET_PORT_IN_STANDBY_STATE,
    TARGET_PORT_IN_UNAVAILABLE_STATE,
};

/// The access state of the group holding `port`.
pub fn access_state(config: &LuConfig, port: u16) -> AluaState {
    config
        .port_groups
        .iter()
        .find(|g| g.relative_ports.contains(&port))
        .map_or(AluaState::ActiveOptimized, |g| g.state)
}

/// NOT READY with the state's ASC/ASCQ if `port`'s access state refuses
/// `command`.
pub(super) fn admit(config: &LuConfig, port: u16, command: &Command) -> Result<(), Sense> {
    if config.port_groups.is_empty() {
        return Ok(());
    }
    // Allowed in every state.
    let always = matches!(
        command,
        Command::Inquiry { .. }
            | Command::ReportLuns { .. }
            | Command::ReportTargetPortGroups { .. }
            | Command::ReportSupportedOpcodes { .. }
            | Command::RequestSense { .. }
            | Command::SendDiagnostic { .. }
    );
    match access_state(config, port) {
        AluaState::ActiveOptimized | AluaState::ActiveNonOptimized => Ok(()),
        _ if always => Ok(()),
        AluaState::Standby => {
            let allowed = matches!(
                command,
                Command::ModeSense { .. }
                    | Command::ModeSelect { .. }
                    | Command::PersistentReserveIn { .. }
                    | Command::PersistentReserveOut { .. }
                    | Command::ReadCapacity10
                    | Command::ReadCapacity16 { .. }
            );
            if allowed {
                Ok(())
            } else {
                Err(TARGET_PORT_IN_STANDBY_STATE)
            }
        }
        AluaState::Unavailable => Err(TARGET_PORT_IN_UNAVAILABLE_STATE),
        AluaState::Transitioning => Err(ASYMMETRIC_ACCESS_STATE_TRANSITION),
    }
}
