//! Rendering `basalt bench` results: from run summaries to `results.md`,
//! `charts/*.svg` and a self-contained `report.html` in an output
//! directory, and loading the `summary.json` of earlier runs for
//! `basalt bench report DIR…` (re-render one run, or merge several, e.g.
//! before and after a change).
//!
//! Invariants: the three outputs are written from one `report::Report`, so
//! they always agree; every cell of every run appears in results.md and
//! report.html, a failed one as `FAILED: <error>` and never as a number; a
//! summary whose `schema_version` this build does not know is refused, never
//! guessed at.
//!
//! Modules, one job each: `figures` reads figures out of cells, `format`
//! writes numbers, `table` builds tables, `charts` chooses and fills the
//! charts of each profile, `svg` draws them, `merge` compares runs,
//! `report` assembles it all, `markdown` and `html` write it out.

mod charts;
mod figures;
mod format;
mod html;
mod markdown;
mod merge;
mod report;
mod svg;
mod table;
#[cfg(test)]
mod tests;

use crate::model::{RunSummary, SCHEMA_VERSION};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The file each run directory holds its summary in.
pub const SUMMARY_FILE: &str = "summary.json";
/// The Markdown tables, in the output directory.
pub const RESULTS_FILE: &str = "results.md";
/// The self-contained HTML report, in the output directory.
pub const REPORT_FILE: &str = "report.html";
/// The directory of the SVG charts, in the output directory.
pub const CHARTS_DIR: &str = "charts";

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("nothing to render: no run summaries given")]
    NoRuns,
    #[error("cannot read {}: {cause}", path.display())]
    Read { path: PathBuf, cause: io::Error },
    #[error("{} is not a basalt bench summary: {cause}", path.display())]
    Parse {
        path: PathBuf,
        cause: serde_json::Error,
    },
    #[error("{} has no schema_version: not a basalt bench summary.json", path.display())]
    MissingSchemaVersion { path: PathBuf },
    #[error(
        "{} has schema_version {found}, but this basalt reads only schema_version {supported}: \
         render it with the basalt version that wrote it",
        path.display()
    )]
    UnsupportedSchema {
        path: PathBuf,
        found: String,
        supported: u32,
    },
    #[error("cannot write {}: {cause}", path.display())]
    Write { path: PathBuf, cause: io::Error },
}

/// Writes `results.md`, `charts/*.svg` and `report.html` for `runs` into
/// `out_dir` (created if missing; files of the same names are replaced) and
/// returns the paths written: results.md, the charts, then report.html.
///
/// One run renders that run; several are merged: each labelled by profile
/// and start time, ordered by start time, and every pair sharing a target
/// and workload compared side by side with the after/before ratio.
pub fn render_run(out_dir: &Path, runs: &[RunSummary]) -> Result<Vec<PathBuf>, RenderError> {
    if runs.is_empty() {
        return Err(RenderError::NoRuns);
    }
    let report = report::Report::build(runs);
    let charts_dir = out_dir.join(CHARTS_DIR);
    create_dir(&charts_dir)?;

    let mut written = Vec::new();
    let results = out_dir.join(RESULTS_FILE);
    write(&results, &markdown::render(&report))?;
    written.push(results);
    for run in &report.runs {
        for view in &run.views {
            for chart in &view.charts {
                let path = out_dir.join(&chart.file);
                write(&path, &svg::standalone(&chart.svg))?;
                written.push(path);
            }
        }
    }
    let html = out_dir.join(REPORT_FILE);
    write(&html, &html::render(&report))?;
    written.push(html);
    Ok(written)
}

/// Reads the summary of each run directory (`DIR/summary.json`; a path to
/// a summary file itself is accepted too), in the order given. Refuses a
/// summary without `schema_version` or with one other than
/// [`SCHEMA_VERSION`], naming the file.
pub fn load_summaries(dirs: &[PathBuf]) -> Result<Vec<RunSummary>, RenderError> {
    dirs.iter().map(|dir| load_summary(dir)).collect()
}

fn load_summary(dir: &Path) -> Result<RunSummary, RenderError> {
    let path = if dir.is_file() {
        dir.to_path_buf()
    } else {
        dir.join(SUMMARY_FILE)
    };
    let text = fs::read_to_string(&path).map_err(|cause| RenderError::Read {
        path: path.clone(),
        cause,
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|cause| RenderError::Parse {
            path: path.clone(),
            cause,
        })?;
    match value.get("schema_version") {
        None => return Err(RenderError::MissingSchemaVersion { path }),
        Some(version) if version.as_u64() != Some(u64::from(SCHEMA_VERSION)) => {
            return Err(RenderError::UnsupportedSchema {
                path,
                found: version.to_string(),
                supported: SCHEMA_VERSION,
            })
        }
        Some(_) => {}
    }
    serde_json::from_value(value).map_err(|cause| RenderError::Parse { path, cause })
}

fn create_dir(path: &Path) -> Result<(), RenderError> {
    fs::create_dir_all(path).map_err(|cause| RenderError::Write {
        path: path.to_path_buf(),
        cause,
    })
}

fn write(path: &Path, contents: &str) -> Result<(), RenderError> {
    fs::write(path, contents).map_err(|cause| RenderError::Write {
        path: path.to_path_buf(),
        cause,
    })
}
