//! Everything about fio, in three parts with one job each:
//! - `jobfile`: what to run — job files from a `JobSpec` and a target (pure);
//! - `process`: running it — finding fio, checking its version, running a
//!   job file locally or on load hosts (client/server), with a time limit;
//! - `parse`: what it measured — fio's JSON output into `model::Metrics`
//!   (pure; tested on real fio outputs recorded in `testdata/`).

pub mod jobfile;
pub mod parse;
pub mod process;

pub use jobfile::{FileEngine, TargetIo};
pub use process::{Fio, FioError};
