//! Writing the report as results.md (GitHub-flavoured Markdown): a header
//! per run with its facts, then per view its charts (as images of the files
//! under `charts/`, with their failed points listed) and its tables, then
//! the before/after comparisons.
//!
//! Invariants: the content is that of `report::Report`, the same as
//! report.html; table cells are escaped so that no text (a pipe, a newline,
//! an HTML tag in an error) can break a table; a failed cell reads
//! `FAILED: <error>`, never a number.

use super::report::{Report, RunReport};
use super::table::{Row, Table};
use std::fmt::Write as _;

pub(crate) fn render(report: &Report<'_>) -> String {
    let mut md = String::from("# Basalt bench results\n\n");
    let several = report.runs.len() > 1;
    if several {
        let _ = writeln!(md, "Merged from {} runs:\n", report.runs.len());
        for run in &report.runs {
            let _ = writeln!(md, "- Run {}: {}", run.number, inline(&run.label));
        }
        md.push('\n');
    }
    md.push_str(
        "Figures are fio's, aggregated over all jobs of a cell; latency is total latency \
         (submission to completion, fio's lat). \
         Only ratios measured in the same run mean much: absolute numbers move with the host.\n\n",
    );
    for run in &report.runs {
        write_run(&mut md, run, several);
    }
    if !report.before_after.is_empty() {
        md.push_str("## Before/after\n\n");
        for comparison in &report.before_after {
            let _ = writeln!(md, "### {}\n", inline(&comparison.title));
            for table in &comparison.tables {
                write_table(&mut md, table, "####");
            }
        }
    }
    md
}

fn write_run(md: &mut String, run: &RunReport<'_>, several: bool) {
    if several {
        let _ = writeln!(md, "## Run {}: {}\n", run.number, inline(&run.label));
    } else {
        let _ = writeln!(md, "## {}\n", inline(&run.label));
    }
    md.push_str("| | |\n|---|---|\n");
    for (label, value) in run.facts() {
        let _ = writeln!(md, "| {label} | {} |", cell(&value));
    }
    md.push('\n');
    for view in &run.views {
        let _ = writeln!(md, "### {}\n", inline(&view.title));
        for chart in &view.charts {
            let _ = writeln!(md, "![{}]({})\n", inline(&chart.title), chart.file);
            if !chart.failed.is_empty() {
                let _ = writeln!(md, "Failed points in “{}”:\n", inline(&chart.title));
                for failed in &chart.failed {
                    let _ = writeln!(md, "- ✕ {}", inline(failed));
                }
                md.push('\n');
            }
        }
        for table in &view.tables {
            write_table(md, table, "####");
        }
    }
}

fn write_table(md: &mut String, table: &Table, heading: &str) {
    let _ = writeln!(md, "{heading} {}\n", inline(&table.title));
    if let Some(note) = &table.note {
        let _ = writeln!(md, "{}\n", inline(note));
    }
    if table.rows.is_empty() {
        md.push_str("_No cells._\n\n");
        return;
    }
    let headers: Vec<String> = table.columns.iter().map(|c| cell(&c.header)).collect();
    let _ = writeln!(md, "| {} |", headers.join(" | "));
    let aligns: Vec<&str> = table
        .columns
        .iter()
        .map(|c| if c.numeric { "---:" } else { "---" })
        .collect();
    let _ = writeln!(md, "|{}|", aligns.join("|"));
    for row in &table.rows {
        let cells: Vec<String> = match row {
            Row::Values(cells) => cells.iter().map(|c| cell(c.text())).collect(),
            Row::Failed { key, error } => {
                let mut cells: Vec<String> = key.iter().map(|c| cell(c.text())).collect();
                cells.push(cell(&Row::failed_text(error)));
                while cells.len() < table.columns.len() {
                    cells.push(String::new());
                }
                cells
            }
        };
        let _ = writeln!(md, "| {} |", cells.join(" | "));
    }
    md.push('\n');
}

/// Text for a table cell: one line, pipes escaped, no raw HTML.
fn cell(text: &str) -> String {
    inline(text).replace('|', "\\|")
}

/// Text for a heading, list item or paragraph: one line, no raw HTML.
fn inline(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_cannot_break_a_table() {
        assert_eq!(cell("a|b\nc <b>"), "a\\|b c &lt;b&gt;");
    }
}
