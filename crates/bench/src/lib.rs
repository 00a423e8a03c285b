//! `basalt bench`: reproduces the fio methodologies of published cloud
//! block-storage evaluations against Basalt and its peers in one run, and
//! renders the results as tables, charts and a self-contained HTML report.

pub mod model;
