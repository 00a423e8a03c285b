//! Sans-I/O SCSI block target (SBC-4, SPC-5).
//!
//! Module owners while the crate is being built (do not edit another's):
//! cdb/sense/lu: helper B1; data/reservation: helper B2.

#![forbid(unsafe_code)]

pub mod cdb;
pub mod data;
pub mod lu;
pub mod reservation;
pub mod sense;
