//! Sans-I/O SCSI block target (SBC-4, SPC-5), independent of the transport
//! that carries it: CDB decoding ([`cdb`]), sense data ([`sense`]), the data
//! a logical unit returns ([`data`]: INQUIRY and its VPD pages, READ
//! CAPACITY, mode pages, REPORT LUNS, REPORT TARGET PORT GROUPS, REPORT
//! SUPPORTED OPERATION CODES, GET LBA STATUS, UNMAP parameter lists),
//! persistent reservations and SPC-2 reservations ([`reservation`]), and the
//! logical unit's command logic ([`lu`]): what each command does, as a plan
//! the caller carries out with its own I/O.
//!
//! Invariants:
//! - Nothing here touches a disk or a socket; every function is bytes or
//!   values in, values out, and never panics on any input.
//! - Every error a command can meet is sense data with the key, ASC and
//!   ASCQ SPC-5 gives it (and a field pointer where one applies).
//! - No `unsafe`.

#![forbid(unsafe_code)]

pub mod cdb;
pub mod data;
pub mod lu;
pub mod reservation;
pub mod sense;
