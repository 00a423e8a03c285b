//! `basalt bench`: reproduces the fio methodologies of published cloud
//! block-storage evaluations against Basalt and its peers in one run, and
//! renders the results as tables, charts and a self-contained HTML report.

pub mod failover;
pub mod fio;
pub mod floor;
pub mod machine;
pub mod model;
pub mod profiles;
pub mod render;
pub mod runner;
pub mod stats;
pub mod switches;
pub mod targets;
