//! Writing the report as report.html: one self-contained page (inline CSS,
//! the SVG charts inlined) with a header, a contents list, each run's facts,
//! charts (each listing its failed points) and tables, and the before/after
//! comparisons; failed cells are highlighted.
//!
//! Invariants: the content is that of `report::Report`, the same as
//! results.md; the page loads nothing (no script, no stylesheet, image or
//! font link; its only `href`s are `#anchors` within the page); all text is
//! escaped.

use super::report::{Report, RunReport, View};
use super::svg::escape;
use super::table::{Cell, Row, Table};
use std::fmt::Write as _;

const STYLE: &str = r#"
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1a1a1a;
  background: #ffffff; max-width: 1240px; margin: 0 auto; padding: 1rem 2rem 4rem; line-height: 1.4; }
h1 { font-size: 1.7rem; margin-bottom: .2rem; }
h2 { font-size: 1.35rem; border-bottom: 2px solid #d9dde3; padding-bottom: .2rem; margin-top: 2.5rem; }
h3 { font-size: 1.1rem; margin-top: 2rem; }
nav ul { padding-left: 1.2rem; margin: .3rem 0; }
nav a, nav a:visited { color: #0b5cad; text-decoration: none; }
.note { color: #555555; font-size: 13px; font-weight: normal; margin: .2rem 0 .4rem; }
.alert { background: #fde8e8; color: #8a0010; border: 1px solid #f3b4b4; padding: .5rem .8rem; border-radius: 4px; }
.table-wrap { overflow-x: auto; margin: .3rem 0 1.6rem; }
table { border-collapse: collapse; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding: .3rem 0; caption-side: top; }
th, td { border: 1px solid #d0d4da; padding: 3px 8px; text-align: left; white-space: nowrap; vertical-align: top; }
thead th { background: #eef1f5; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #f8f9fb; }
tr.failed td, td.failed { background: #fde8e8; color: #8a0010; font-weight: 600; }
td.failed-error { white-space: normal; min-width: 20rem; }
table.facts th { background: #eef1f5; width: 8rem; }
table.facts td { white-space: normal; }
.charts { display: flex; flex-wrap: wrap; gap: 1rem; }
figure { margin: .5rem 0; max-width: 100%; }
figure svg { max-width: 100%; height: auto; border: 1px solid #e3e6ea; }
"#;

pub(crate) fn render(report: &Report<'_>) -> String {
    let mut html = String::new();
    let title = match report.runs.as_slice() {
        [run] => format!("Basalt bench: {}", run.label),
        runs => format!("Basalt bench: {} runs", runs.len()),
    };
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        escape(&title)
    );
    let _ = writeln!(html, "<header>\n<h1>Basalt bench results</h1>");
    html.push_str(
        "<p class=\"note\">Figures are fio's, aggregated over all jobs of a cell; latency is \
         total latency (submission to completion, fio's lat). \
         Only ratios measured in the same run mean much: absolute numbers \
         move with the host.</p>\n",
    );
    let failed: usize = report
        .runs
        .iter()
        .map(|r| {
            r.summary
                .cells
                .iter()
                .filter(|c| super::figures::failure(c).is_some())
                .count()
        })
        .sum();
    if failed > 0 {
        let _ = writeln!(
            html,
            "<p class=\"alert\">{failed} cell{} FAILED: highlighted below, with the error.</p>",
            if failed == 1 { "" } else { "s" }
        );
    }
    write_contents(&mut html, report);
    html.push_str("</header>\n<main>\n");
    let several = report.runs.len() > 1;
    for run in &report.runs {
        write_run(&mut html, run, several);
    }
    if !report.before_after.is_empty() {
        html.push_str("<section id=\"before-after\">\n<h2>Before/after</h2>\n");
        for comparison in &report.before_after {
            let _ = writeln!(
                html,
                "<section id=\"{}\">\n<h3>{}</h3>",
                escape(&comparison.anchor),
                escape(&comparison.title)
            );
            for table in &comparison.tables {
                write_table(&mut html, table);
            }
            html.push_str("</section>\n");
        }
        html.push_str("</section>\n");
    }
    html.push_str("</main>\n</body>\n</html>\n");
    html
}

fn write_contents(html: &mut String, report: &Report<'_>) {
    html.push_str("<nav>\n<ul>\n");
    for run in &report.runs {
        let _ = writeln!(
            html,
            "<li><a href=\"#{}\">Run {}: {}</a>\n<ul>",
            escape(&run.anchor),
            run.number,
            escape(&run.label)
        );
        for view in &run.views {
            let _ = writeln!(
                html,
                "<li><a href=\"#{}\">{}</a></li>",
                escape(&view.anchor),
                escape(&view.title)
            );
        }
        html.push_str("</ul></li>\n");
    }
    if !report.before_after.is_empty() {
        html.push_str("<li><a href=\"#before-after\">Before/after</a>\n<ul>\n");
        for comparison in &report.before_after {
            let _ = writeln!(
                html,
                "<li><a href=\"#{}\">{}</a></li>",
                escape(&comparison.anchor),
                escape(&comparison.title)
            );
        }
        html.push_str("</ul></li>\n");
    }
    html.push_str("</ul>\n</nav>\n");
}

fn write_run(html: &mut String, run: &RunReport<'_>, several: bool) {
    let heading = if several {
        format!("Run {}: {}", run.number, run.label)
    } else {
        run.label.clone()
    };
    let _ = writeln!(
        html,
        "<section id=\"{}\">\n<h2>{}</h2>\n<table class=\"facts\">",
        escape(&run.anchor),
        escape(&heading)
    );
    for (label, value) in run.facts() {
        let _ = writeln!(
            html,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(label),
            escape(&value)
        );
    }
    html.push_str("</table>\n");
    for view in &run.views {
        write_view(html, view);
    }
    html.push_str("</section>\n");
}

fn write_view(html: &mut String, view: &View) {
    let _ = writeln!(
        html,
        "<section id=\"{}\">\n<h3>{}</h3>",
        escape(&view.anchor),
        escape(&view.title)
    );
    if !view.charts.is_empty() {
        html.push_str("<div class=\"charts\">\n");
        for chart in &view.charts {
            // The chart lists its failed points itself, under the plot.
            html.push_str("<figure>\n");
            html.push_str(&chart.svg);
            html.push_str("</figure>\n");
        }
        html.push_str("</div>\n");
    }
    for table in &view.tables {
        write_table(html, table);
    }
    html.push_str("</section>\n");
}

fn write_table(html: &mut String, table: &Table) {
    html.push_str("<div class=\"table-wrap\">\n<table>\n");
    let _ = writeln!(html, "<caption>{}", escape(&table.title));
    if let Some(note) = &table.note {
        let _ = write!(html, "<div class=\"note\">{}</div>", escape(note));
    }
    html.push_str("</caption>\n<thead><tr>");
    for column in &table.columns {
        let class = if column.numeric { " class=\"num\"" } else { "" };
        let _ = write!(html, "<th{class}>{}</th>", escape(&column.header));
    }
    html.push_str("</tr></thead>\n<tbody>\n");
    if table.rows.is_empty() {
        let _ = writeln!(
            html,
            "<tr><td colspan=\"{}\">No cells.</td></tr>",
            table.columns.len().max(1)
        );
    }
    for row in &table.rows {
        match row {
            Row::Values(cells) => {
                html.push_str("<tr>");
                for (cell, column) in cells.iter().zip(&table.columns) {
                    write_cell(html, cell, column.numeric);
                }
                html.push_str("</tr>\n");
            }
            Row::Failed { key, error } => {
                html.push_str("<tr class=\"failed\">");
                for (cell, column) in key.iter().zip(&table.columns) {
                    write_cell(html, cell, column.numeric);
                }
                let span = table.columns.len().saturating_sub(key.len()).max(1);
                let _ = write!(
                    html,
                    "<td class=\"failed failed-error\" colspan=\"{span}\">{}</td>",
                    escape(&Row::failed_text(error))
                );
                html.push_str("</tr>\n");
            }
        }
    }
    html.push_str("</tbody>\n</table>\n</div>\n");
}

fn write_cell(html: &mut String, cell: &Cell, numeric: bool) {
    let class = match (cell, numeric) {
        (Cell::Failed(_), _) => " class=\"failed\"",
        (_, true) => " class=\"num\"",
        (_, false) => "",
    };
    let _ = write!(html, "<td{class}>{}</td>", escape(cell.text()));
}
