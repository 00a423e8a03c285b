//! End-to-end tests of rendering: summaries of every profile built in code,
//! rendered into a temporary directory, and the files checked for what they
//! must contain. No timing figure is asserted anywhere.

use super::*;
use crate::model::{
    CellOutcome, CellResult, DirectionMetrics, LatencyMetrics, Machine, Metrics, SampleEstimate,
    Workload,
};
use crate::stats::bootstrap_median;
use std::collections::BTreeMap;

const MATRIX_ERROR: &str = "fio exited with status 1: nbd: connection refused";

fn workload(rw: &str, bs: u64, numjobs: u32, iodepth: u32) -> Workload {
    Workload {
        rw: rw.into(),
        block_size_bytes: bs,
        numjobs,
        iodepth,
        rwmixread: (rw == "randrw").then_some(70),
        fsync: None,
    }
}

fn latency(mean_us: f64) -> LatencyMetrics {
    LatencyMetrics {
        mean_us,
        // Rounded: serde_json (without `float_roundtrip`) may read some floats back an ulp off.
        p50_us: (mean_us * 0.9).round(),
        p99_us: mean_us * 3.0,
        p99_9_us: mean_us * 6.0,
        max_us: mean_us * 20.0,
    }
}

fn direction(iops: f64, bs: u64, mean_us: f64) -> DirectionMetrics {
    DirectionMetrics {
        iops,
        bandwidth_bytes_per_sec: iops * bs as f64,
        ios: (iops * 10.0) as u64,
        latency: latency(mean_us),
    }
}

/// An ok cell with `iops` in total (split 70/30 for randrw).
fn ok(target: &str, workload: Workload, iops: f64, mean_us: f64) -> CellResult {
    let bs = workload.block_size_bytes;
    let (read, write) = match workload.rw.as_str() {
        "randread" | "read" => (Some(direction(iops, bs, mean_us)), None),
        "randrw" => (
            Some(direction(iops * 0.7, bs, mean_us)),
            Some(direction(iops * 0.3, bs, mean_us * 1.5)),
        ),
        _ => (None, Some(direction(iops, bs, mean_us))),
    };
    let sync = workload.fsync.map(|_| latency(mean_us * 2.0));
    CellResult {
        target: target.into(),
        raw_output: format!(
            "raw/{target}-{}-{bs}-{}.json",
            workload.rw, workload.numjobs
        ),
        workload,
        sample: None,
        outcome: CellOutcome::Ok {
            metrics: Metrics {
                read,
                write,
                sync,
                runtime_ms: 10_000,
            },
        },
        server_cpu_seconds: (target == "basalt").then_some(0.5),
        server_context_switches: None,
        server_cpu_migrations: None,
    }
}

fn failed(target: &str, workload: Workload, error: &str) -> CellResult {
    CellResult {
        target: target.into(),
        raw_output: format!("raw/{target}-failed.json"),
        workload,
        sample: None,
        outcome: CellOutcome::Failed {
            error: error.into(),
        },
        server_cpu_seconds: None,
        server_context_switches: None,
        server_cpu_migrations: None,
    }
}

fn summary(
    profile: &str,
    started_at: &str,
    targets: &[&str],
    cells: Vec<CellResult>,
) -> RunSummary {
    RunSummary {
        schema_version: SCHEMA_VERSION,
        profile: profile.into(),
        started_at: started_at.into(),
        finished_at: "2026-11-21T11:00:00Z".into(),
        machine: Machine {
            hostname: "devbox".into(),
            cpus: 2,
            cpu_model: "Test CPU @ 2.0GHz".into(),
            memory_bytes: 24 << 30,
            kernel: "6.1.0-test".into(),
            os: "Debian GNU/Linux 12".into(),
        },
        versions: BTreeMap::from([
            ("fio".to_string(), "fio-3.33".to_string()),
            ("basalt".to_string(), "0.1.0".to_string()),
        ]),
        parameters: BTreeMap::from([
            ("runtime_s".to_string(), serde_json::json!(5)),
            ("iodepth".to_string(), serde_json::json!(1)),
            ("quick".to_string(), serde_json::json!(true)),
        ]),
        targets: targets.iter().map(|t| t.to_string()).collect(),
        hosts: Vec::new(),
        cells,
        estimates: Vec::new(),
    }
}

/// `matrix --compare basalt,qemu-nbd`: randread and randrw at 4k, numjobs
/// 1/4/8; basalt does twice qemu-nbd's IOPS; qemu-nbd fails randread j8.
fn matrix_run() -> RunSummary {
    let mut cells = Vec::new();
    for rw in ["randread", "randrw"] {
        for numjobs in [1, 4, 8] {
            let scale = f64::from(numjobs);
            cells.push(ok(
                "basalt",
                workload(rw, 4096, numjobs, 1),
                2000.0 * scale,
                100.0,
            ));
            if rw == "randread" && numjobs == 8 {
                cells.push(failed(
                    "qemu-nbd",
                    workload(rw, 4096, numjobs, 1),
                    MATRIX_ERROR,
                ));
            } else {
                cells.push(ok(
                    "qemu-nbd",
                    workload(rw, 4096, numjobs, 1),
                    1000.0 * scale,
                    150.0,
                ));
            }
        }
    }
    summary(
        "matrix",
        "2026-11-21T10:00:00Z",
        &["basalt", "qemu-nbd"],
        cells,
    )
}

fn sweep_run() -> RunSummary {
    let mut cells = Vec::new();
    for rw in ["randread", "randwrite"] {
        for shift in 9..=19 {
            let bs = 1u64 << shift;
            cells.push(ok(
                "basalt",
                workload(rw, bs, 4, 32),
                40_000.0 / (shift as f64 - 8.0),
                300.0,
            ));
            cells.push(ok(
                "file",
                workload(rw, bs, 4, 32),
                60_000.0 / (shift as f64 - 8.0),
                200.0,
            ));
        }
    }
    summary("sweep", "2026-11-21T10:00:00Z", &["basalt", "file"], cells)
}

fn db_workload() -> Workload {
    Workload {
        rw: "randwrite".into(),
        block_size_bytes: 8192,
        numjobs: 1,
        iodepth: 1,
        rwmixread: None,
        fsync: Some(1),
    }
}

fn db_latency_run(started_at: &str, basalt_iops: f64) -> RunSummary {
    let cells = vec![
        ok("basalt", db_workload(), basalt_iops, 400.0),
        ok("qemu-nbd", db_workload(), 800.0, 500.0),
        ok("file", db_workload(), 2500.0, 150.0),
    ];
    summary(
        "db-latency",
        started_at,
        &["basalt", "qemu-nbd", "file"],
        cells,
    )
}

fn samples_workload() -> Workload {
    Workload {
        rw: "randwrite".into(),
        block_size_bytes: 4096,
        numjobs: 1,
        iodepth: 1,
        rwmixread: None,
        fsync: None,
    }
}

/// `fio-samples` on basalt and file, 10 samples each; file's sample 3
/// failed; estimates computed by the real bootstrap.
fn fio_samples_run() -> RunSummary {
    let mut cells = Vec::new();
    let mut estimates = Vec::new();
    for (target, base) in [("basalt", 9000.0), ("file", 12_000.0)] {
        let mut values = Vec::new();
        for sample in 0..10u32 {
            let mut cell = if target == "file" && sample == 3 {
                failed(target, samples_workload(), "fio: sample timed out")
            } else {
                let iops = base + f64::from((sample * 37) % 11) * 50.0;
                values.push(iops);
                ok(target, samples_workload(), iops, (1e6 / iops).round())
            };
            cell.sample = Some(sample);
            cells.push(cell);
        }
        estimates.push(SampleEstimate {
            target: target.into(),
            workload: samples_workload(),
            metric: "write_iops".into(),
            estimate: bootstrap_median(&values, 10_000, 0.95, 42),
        });
    }
    let mut run = summary(
        "fio-samples",
        "2026-11-21T10:00:00Z",
        &["basalt", "file"],
        cells,
    );
    run.estimates = estimates;
    run
}

fn parallel_run() -> RunSummary {
    let mut cells = Vec::new();
    for iodepth in [4, 20, 40] {
        for numjobs in [1, 10, 20] {
            let mut w = workload("randrw", 4096, numjobs, iodepth);
            w.rwmixread = Some(50);
            let iops = 1000.0 * f64::from(numjobs) * f64::from(iodepth).sqrt();
            cells.push(ok("basalt", w, iops, 200.0));
        }
    }
    summary("parallel", "2026-11-21T10:00:00Z", &["basalt"], cells)
}

fn read(path: &Path) -> String {
    match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => panic!("cannot read {}: {e}", path.display()),
    }
}

fn render(runs: &[RunSummary]) -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("tempdir: {e}"),
    };
    let out = dir.path().join("out");
    match render_run(&out, runs) {
        Ok(written) => (dir, written),
        Err(e) => panic!("render_run failed: {e}"),
    }
}

fn parse_svg(text: &str) -> roxmltree::Document<'_> {
    match roxmltree::Document::parse(text) {
        Ok(doc) => doc,
        Err(e) => panic!("SVG is not well-formed XML: {e}"),
    }
}

/// The `data-series` names of the series groups holding a line path.
fn series_with_paths(doc: &roxmltree::Document<'_>) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.has_tag_name("g") && n.attribute("class") == Some("series"))
        .filter(|g| g.children().any(|c| c.has_tag_name("path")))
        .filter_map(|g| g.attribute("data-series").map(str::to_string))
        .collect()
}

fn chart_named<'a>(written: &'a [PathBuf], fragment: &str) -> &'a PathBuf {
    match written
        .iter()
        .find(|p| p.to_string_lossy().contains(fragment))
    {
        Some(path) => path,
        None => panic!("no chart containing {fragment:?} among {written:?}"),
    }
}

fn assert_self_contained(html: &str) {
    for forbidden in [
        "src=\"http",
        "href=\"http",
        "src='http",
        "href='http",
        "<script",
        "<link",
        "@import",
        "url(",
        "<img",
        "<iframe",
    ] {
        assert!(
            !html.contains(forbidden),
            "report.html contains {forbidden:?}"
        );
    }
    for (i, _) in html.match_indices("href=\"") {
        let target = &html[i + 6..];
        assert!(
            target.starts_with('#'),
            "non-local href: {}",
            &target[..target.len().min(60)]
        );
    }
}

/// Every inline `<svg>…</svg>` of the page parses as XML.
fn assert_inline_svgs_parse(html: &str) -> usize {
    let mut count = 0;
    let mut rest = html;
    while let Some(start) = rest.find("<svg ") {
        let Some(len) = rest[start..].find("</svg>") else {
            panic!("unterminated inline svg");
        };
        let end = start + len + "</svg>".len();
        parse_svg(&rest[start..end]);
        count += 1;
        rest = &rest[end..];
    }
    count
}

#[test]
fn every_profile_writes_every_file_and_every_svg_parses() {
    for run in [
        matrix_run(),
        sweep_run(),
        db_latency_run("2026-11-21T10:00:00Z", 1000.0),
        fio_samples_run(),
        parallel_run(),
    ] {
        let (dir, written) = render(std::slice::from_ref(&run));
        let out = dir.path().join("out");
        assert_eq!(
            written.first(),
            Some(&out.join(RESULTS_FILE)),
            "{}",
            run.profile
        );
        assert_eq!(
            written.last(),
            Some(&out.join(REPORT_FILE)),
            "{}",
            run.profile
        );
        let charts: Vec<&PathBuf> = written
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "svg"))
            .collect();
        assert!(!charts.is_empty(), "{}: no chart", run.profile);
        let mut unique = written.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            unique.len(),
            written.len(),
            "{}: a path written twice",
            run.profile
        );
        for path in &written {
            assert!(path.is_file(), "{} not written", path.display());
        }
        for chart in &charts {
            assert_eq!(chart.parent(), Some(out.join(CHARTS_DIR).as_path()));
            let text = read(chart);
            let doc = parse_svg(&text);
            assert_eq!(doc.root_element().tag_name().name(), "svg");
            assert!(
                !text.contains("href"),
                "{} has a reference",
                chart.display()
            );
        }
        let html = read(&out.join(REPORT_FILE));
        assert_self_contained(&html);
        assert_eq!(
            assert_inline_svgs_parse(&html),
            charts.len(),
            "{}: charts inlined",
            run.profile
        );
        assert!(read(&out.join(RESULTS_FILE)).contains("Test CPU @ 2.0GHz"));
    }
}

#[test]
fn matrix_charts_have_a_line_per_target_and_mark_the_failed_point() {
    let (_dir, written) = render(&[matrix_run()]);
    let iops = read(chart_named(&written, "matrix-randread-bs-4k-iops"));
    let doc = parse_svg(&iops);
    assert_eq!(series_with_paths(&doc), ["basalt", "qemu-nbd"]);
    let failed_mark = doc
        .descendants()
        .find(|n| n.attribute("class") == Some("failed"))
        .and_then(|n| n.children().find(|c| c.has_tag_name("title")))
        .and_then(|t| t.text());
    assert_eq!(
        failed_mark,
        Some(format!("qemu-nbd, numjobs 8: FAILED: {MATRIX_ERROR}").as_str())
    );
    assert!(iops.contains(&format!("✕ qemu-nbd, numjobs 8: FAILED: {MATRIX_ERROR}")));

    let latency = read(chart_named(&written, "matrix-randread-bs-4k-latency-read"));
    let doc = parse_svg(&latency);
    assert_eq!(
        series_with_paths(&doc),
        ["basalt mean", "basalt p99", "qemu-nbd mean", "qemu-nbd p99"]
    );
    // randrw has a latency chart per direction.
    chart_named(&written, "matrix-randrw-bs-4k-latency-read");
    chart_named(&written, "matrix-randrw-bs-4k-latency-write");
}

#[test]
fn failed_cells_show_as_failed_in_markdown_and_html_never_as_zero() {
    let (dir, _) = render(&[matrix_run()]);
    let out = dir.path().join("out");
    let md = read(&out.join(RESULTS_FILE));
    let html = read(&out.join(REPORT_FILE));
    let row = format!("| randread | 4k | 8 | 1 | qemu-nbd | FAILED: {MATRIX_ERROR} |");
    assert!(md.contains(&row), "no failed row in results.md:\n{md}");
    assert!(html.contains(&format!(
        "<td class=\"failed failed-error\" colspan=\"8\">FAILED: {MATRIX_ERROR}</td>"
    )));
    assert!(html.contains("<tr class=\"failed\">"));
    // In the comparison the failed side reads FAILED, with no ratio.
    assert!(
        md.contains("| randread | 4k | 8 | 1 | read | IOPS | 16000 | FAILED | – |"),
        "{md}"
    );
    assert!(!md.contains("| 0.00 |"));
}

#[test]
fn ratios_compare_every_pair_of_targets() {
    let (dir, _) = render(&[matrix_run()]);
    let md = read(&dir.path().join("out").join(RESULTS_FILE));
    assert!(
        md.contains("| rw | bs | jobs | QD | dir | metric | basalt | qemu-nbd | basalt/qemu-nbd |")
    );
    assert!(
        md.contains("| randread | 4k | 1 | 1 | read | IOPS | 2000 | 1000 | 2.00× |"),
        "{md}"
    );
    assert!(md.contains("| randread | 4k | 1 | 1 | read | mean lat (µs) | 100.0 | 150.0 | 0.67× |"));

    let (dir, _) = render(&[db_latency_run("2026-11-21T10:00:00Z", 1000.0)]);
    let md = read(&dir.path().join("out").join(RESULTS_FILE));
    assert!(
        md.contains("| basalt | qemu-nbd | file | basalt/qemu-nbd | basalt/file | qemu-nbd/file |")
    );
    assert!(md.contains(
        "| randwrite | 8k | 1 | 1 | 1 | write | IOPS | 1000 | 800 | 2500 | 1.25× | 0.40× | 0.32× |"
    ), "{md}");
    // fsync latency is compared too, with no IOPS row for it.
    assert!(md.contains("| fsync | p99.9 lat (µs) |"));
    assert!(!md.contains("| fsync | IOPS |"));
}

#[test]
fn every_cell_appears_in_the_results_tables() {
    for run in [matrix_run(), sweep_run(), parallel_run(), fio_samples_run()] {
        let (dir, _) = render(std::slice::from_ref(&run));
        let md = read(&dir.path().join("out").join(RESULTS_FILE));
        for cell in &run.cells {
            let w = &cell.workload;
            let mut prefix = format!(
                "| {} | {} | {} | {} |",
                w.rw,
                format::block_size(w.block_size_bytes),
                w.numjobs,
                w.iodepth
            );
            if let Some(mix) = w.rwmixread {
                prefix.push_str(&format!(" {mix} |"));
            }
            if let Some(sample) = cell.sample {
                prefix.push_str(&format!(" {sample} |"));
            }
            let row = format!("{prefix} {} |", cell.target);
            assert!(md.contains(&row), "{}: no row {row}", run.profile);
        }
    }
}

#[test]
fn sweep_uses_a_log2_block_size_axis() {
    let (_dir, written) = render(&[sweep_run()]);
    let svg = read(chart_named(&written, "sweep-randwrite-throughput"));
    let doc = parse_svg(&svg);
    assert_eq!(series_with_paths(&doc), ["basalt", "file"]);
    let labels: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .collect();
    for tick in ["512", "1k", "4k", "64k", "512k"] {
        assert!(labels.contains(&tick), "no x tick {tick}");
    }
    assert!(labels.contains(&"MiB/s") && labels.contains(&"block size"));
}

#[test]
fn db_latency_has_bars_per_target() {
    let (_dir, written) = render(&[db_latency_run("2026-11-21T10:00:00Z", 1000.0)]);
    for chart in [
        "db-latency-iops",
        "db-latency-latency-write",
        "db-latency-latency-fsync",
    ] {
        let text = read(chart_named(&written, chart));
        let doc = parse_svg(&text);
        let bars: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("g") && n.attribute("class") == Some("series"))
            .filter(|g| g.children().any(|c| c.has_tag_name("rect")))
            .filter_map(|g| g.attribute("data-series"))
            .collect();
        assert_eq!(bars, ["basalt", "qemu-nbd", "file"], "{chart}");
    }
}

#[test]
fn fio_samples_show_medians_with_intervals_per_target() {
    let run = fio_samples_run();
    let (dir, written) = render(std::slice::from_ref(&run));
    let md = read(&dir.path().join("out").join(RESULTS_FILE));
    for estimate in &run.estimates {
        let e = &estimate.estimate;
        let row = format!(
            "| {} | randwrite | 4k | 1 | 1 | write_iops | {} | {} | {} | 95% |",
            estimate.target,
            format::value(e.median),
            format::value(e.ci_low),
            format::value(e.ci_high)
        );
        assert!(md.contains(&row), "no estimate row {row}\n{md}");
    }
    // file: 9 samples used, 1 failed.
    assert!(md.contains("| 9 | 1 | 10000 | 42 |"));
    assert!(md.contains("FAILED: fio: sample timed out"));
    assert!(md.contains("basalt median [CI]"));

    let svg = read(chart_named(&written, "fio-samples-write-iops"));
    let doc = parse_svg(&svg);
    let whiskers = series_with_paths(&doc);
    assert_eq!(whiskers, ["basalt", "file"]);
    assert!(svg.contains("file: 1 of 10 samples FAILED (estimate from the rest)"));
}

#[test]
fn a_target_whose_samples_all_failed_is_reported_not_dropped() {
    let mut run = fio_samples_run();
    for cell in run.cells.iter_mut().filter(|c| c.target == "file") {
        cell.outcome = CellOutcome::Failed {
            error: "target unreachable".into(),
        };
    }
    run.estimates.retain(|e| e.target != "file");
    let (dir, written) = render(std::slice::from_ref(&run));
    let md = read(&dir.path().join("out").join(RESULTS_FILE));
    assert!(md.contains("FAILED: no estimate: 10 of 10 samples failed"));
    let svg = read(chart_named(&written, "fio-samples-write-iops"));
    assert!(svg.contains("file: 10 of 10 samples FAILED (no estimate)"));
}

#[test]
fn parallel_has_a_chart_per_iodepth() {
    let (_dir, written) = render(&[parallel_run()]);
    for depth in [4, 20, 40] {
        let doc_text = read(chart_named(&written, &format!("parallel-iops-qd{depth}")));
        assert_eq!(series_with_paths(&parse_svg(&doc_text)), ["basalt"]);
    }
}

#[test]
fn merged_runs_are_ordered_labelled_and_compared_before_after() {
    let before = db_latency_run("2026-11-20T09:00:00Z", 1000.0);
    let after = db_latency_run("2026-11-21T09:00:00+01:00", 1500.0);
    // Given newest first: the report still calls the earlier run "before".
    let (dir, written) = render(&[after, before]);
    let out = dir.path().join("out");
    let md = read(&out.join(RESULTS_FILE));
    let html = read(&out.join(REPORT_FILE));
    assert!(md.contains("## Run 1: db-latency @ 2026-11-20T09:00:00Z"));
    assert!(md.contains("## Run 2: db-latency @ 2026-11-21T09:00:00+01:00"));
    assert!(md.contains("### Run 1 (db-latency @ 2026-11-20T09:00:00Z) → run 2 (db-latency @ 2026-11-21T09:00:00+01:00)"));
    assert!(md.contains("| basalt before | basalt after | basalt after/before |"));
    assert!(
        md.contains(
            "| write | IOPS | 1000 | 1500 | 1.50× | 800 | 800 | 1.00× | 2500 | 2500 | 1.00× |"
        ),
        "{md}"
    );
    assert!(html.contains("Before/after"));
    assert_self_contained(&html);
    // Each run's charts, under distinct names.
    chart_named(&written, "run1-db-latency-iops");
    chart_named(&written, "run2-db-latency-iops");
}

#[test]
fn merged_fio_samples_compare_medians() {
    let before = fio_samples_run();
    let mut after = fio_samples_run();
    after.started_at = "2026-11-22T10:00:00Z".into();
    let (dir, _) = render(&[before, after]);
    let md = read(&dir.path().join("out").join(RESULTS_FILE));
    assert!(md.contains("#### Medians: run 2 vs run 1"));
    assert!(md.contains("| 1.00× | yes |"));
}

#[test]
fn unrelated_runs_are_merged_without_a_comparison() {
    let (dir, _) = render(&[matrix_run(), sweep_run()]);
    let md = read(&dir.path().join("out").join(RESULTS_FILE));
    assert!(md.contains("Merged from 2 runs"));
    // Both start at the same time: kept in the order given.
    assert!(md.contains("## Run 1: matrix @"));
    assert!(md.contains("## Run 2: sweep @"));
    assert!(!md.contains("## Before/after"));
}

#[test]
fn rendering_is_deterministic() {
    let runs = [matrix_run(), db_latency_run("2026-11-22T10:00:00Z", 900.0)];
    let (first, written) = render(&runs);
    let (second, _) = render(&runs);
    for path in &written {
        let Ok(relative) = path.strip_prefix(first.path()) else {
            panic!("{} outside the output directory", path.display());
        };
        assert_eq!(
            read(path),
            read(&second.path().join(relative)),
            "{}",
            relative.display()
        );
    }
}

#[test]
fn hostile_text_is_escaped_everywhere() {
    let mut run = matrix_run();
    run.targets[1] = "nbd://h:1/x?a=<b>&c=\"d\"|e".into();
    for cell in run.cells.iter_mut().filter(|c| c.target == "qemu-nbd") {
        cell.target = run.targets[1].clone();
    }
    run.machine.hostname = "<script>alert(1)</script>".into();
    if let Some(cell) = run
        .cells
        .iter_mut()
        .find(|c| matches!(c.outcome, CellOutcome::Failed { .. }))
    {
        cell.outcome = CellOutcome::Failed {
            error: "line one\nline | two <b>".into(),
        };
    }
    let (dir, written) = render(&[run]);
    let out = dir.path().join("out");
    let html = read(&out.join(REPORT_FILE));
    assert_self_contained(&html);
    assert_inline_svgs_parse(&html);
    for chart in written
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "svg"))
    {
        parse_svg(&read(chart));
    }
    let md = read(&out.join(RESULTS_FILE));
    assert!(md.contains("FAILED: line one line \\| two &lt;b&gt;"));
    assert!(!md.contains("<script>"));
}

#[test]
fn summaries_round_trip_through_load_summaries() {
    let runs = [matrix_run(), fio_samples_run()];
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("tempdir: {e}"),
    };
    let mut dirs = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let run_dir = dir.path().join(format!("run{i}"));
        let json = match serde_json::to_string_pretty(run) {
            Ok(json) => json,
            Err(e) => panic!("serialize: {e}"),
        };
        if let Err(e) =
            fs::create_dir_all(&run_dir).and_then(|_| fs::write(run_dir.join(SUMMARY_FILE), json))
        {
            panic!("write summary: {e}");
        }
        dirs.push(run_dir);
    }
    // A path to the summary file itself works too.
    dirs.push(dir.path().join("run0").join(SUMMARY_FILE));
    let loaded = match load_summaries(&dirs) {
        Ok(loaded) => loaded,
        Err(e) => panic!("load_summaries: {e}"),
    };
    assert_eq!(
        loaded,
        vec![runs[0].clone(), runs[1].clone(), runs[0].clone()]
    );
    assert!(render_run(&dir.path().join("report"), &loaded).is_ok());
}

#[test]
fn unknown_or_missing_schema_versions_are_refused() {
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("tempdir: {e}"),
    };
    let mut future = match serde_json::to_value(matrix_run()) {
        Ok(value) => value,
        Err(e) => panic!("serialize: {e}"),
    };
    future["schema_version"] = serde_json::json!(99);
    future["cells"] = serde_json::json!("changed meaning");
    let future_path = dir.path().join("future.json");
    let no_version = dir.path().join("other.json");
    let not_json = dir.path().join("garbage.json");
    let written = fs::write(&future_path, future.to_string())
        .and_then(|_| fs::write(&no_version, "{\"profile\": \"matrix\"}"))
        .and_then(|_| fs::write(&not_json, "not json"));
    if let Err(e) = written {
        panic!("write fixtures: {e}");
    }

    match load_summaries(std::slice::from_ref(&future_path)) {
        Err(
            e @ RenderError::UnsupportedSchema {
                found: _,
                supported: 1,
                ..
            },
        ) => {
            let message = e.to_string();
            assert!(message.contains("schema_version 99"), "{message}");
            assert!(message.contains("only schema_version 1"), "{message}");
            assert!(
                message.contains(&future_path.display().to_string()),
                "{message}"
            );
        }
        other => panic!("expected UnsupportedSchema, got {other:?}"),
    }
    assert!(matches!(
        load_summaries(&[no_version]),
        Err(RenderError::MissingSchemaVersion { .. })
    ));
    assert!(matches!(
        load_summaries(&[not_json]),
        Err(RenderError::Parse { .. })
    ));
    match load_summaries(&[dir.path().join("no-such-run")]) {
        Err(e @ RenderError::Read { .. }) => {
            assert!(e.to_string().contains("no-such-run/summary.json"))
        }
        other => panic!("expected Read, got {other:?}"),
    }
}

#[test]
fn rendering_nothing_is_an_error_and_an_empty_run_still_renders() {
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("tempdir: {e}"),
    };
    assert!(matches!(
        render_run(dir.path(), &[]),
        Err(RenderError::NoRuns)
    ));
    let empty = summary(
        "precondition",
        "2026-11-21T10:00:00Z",
        &["basalt"],
        Vec::new(),
    );
    let (out, written) = render(&[empty]);
    assert_eq!(written.len(), 2);
    assert!(read(&out.path().join("out").join(RESULTS_FILE)).contains("_No cells._"));
}

/// Renders every fixture into `$BASALT_RENDER_DEMO/<name>/` for a look in a
/// browser: `BASALT_RENDER_DEMO=/tmp/demo cargo test -p basalt-bench
/// render_demo -- --ignored`.
#[test]
#[ignore = "writes a demo report for people to look at"]
fn render_demo() {
    let Some(root) = std::env::var_os("BASALT_RENDER_DEMO").map(PathBuf::from) else {
        return;
    };
    let demos = [
        ("matrix", vec![matrix_run()]),
        ("sweep", vec![sweep_run()]),
        (
            "db-latency",
            vec![db_latency_run("2026-11-21T10:00:00Z", 1000.0)],
        ),
        ("fio-samples", vec![fio_samples_run()]),
        ("parallel", vec![parallel_run()]),
        (
            "merged",
            vec![
                db_latency_run("2026-11-20T09:00:00Z", 1000.0),
                db_latency_run("2026-11-21T09:00:00Z", 1500.0),
            ],
        ),
    ];
    for (name, runs) in demos {
        if let Err(e) = render_run(&root.join(name), &runs) {
            panic!("{name}: {e}");
        }
    }
}
