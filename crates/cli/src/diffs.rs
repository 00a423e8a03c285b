//! `basalt volume diff`, `export-diff` and `import-diff`: the changed ranges
//! between a snapshot and a later point (listed from the layers by the API,
//! never by reading data), written as a checksummed stream
//! (`basalt_image::diff_stream`) and applied to another volume, on this
//! cluster or another — incremental backup and asynchronous DR, as
//! `rbd export-diff`/`import-diff` give Ceph users.
//!
//! Invariants:
//! - `import-diff` changes nothing unless the target has the snapshot the
//!   diff starts from and lacks the one it leads to; a stream read from a
//!   file is checked whole (every record's CRC, order and end) before the
//!   first write, and ends with the `to` snapshot taken on the target, so
//!   the next diff in a chain applies on top.
//! - `export-diff` writes records in offset order (reads complete in any
//!   order; a reorder buffer holds the early ones) and removes its file if
//!   it fails.

use crate::client::{ApiClient, ClientArgs, Output};
use crate::commands::{decode, path_segment, print_json, volume_path};
use crate::output::{table, Align};
use crate::transfer::{chunks, create_output, data_and_zero_runs, NbdArgs, Progress, WINDOW};
use anyhow::{bail, Context, Result};
use basalt_api::types::{Volume, VolumeDiffBody};
use basalt_image::diff_stream::{
    encode_magic, encode_record, DiffParser, DiffRecord, DiffStreamError,
};
use basalt_nbd_client::WriteOp;
use basalt_volume::{format_size, split_snapshot_name};
use serde_json::json;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

/// Largest WRITE_ZEROES sent at once.
const ZERO_CHUNK: u64 = 1 << 28;

/// Asks the API for the diff of `to` (`VOL` or `VOL@SNAP`) from `from`
/// (`SNAP` of the same volume or `VOL@SNAP`; `None`: every data range).
fn fetch_diff(api: &ApiClient, from: Option<&str>, to: &str) -> Result<VolumeDiffBody> {
    let (volume, to_snap) = match split_snapshot_name(to) {
        Some((v, s)) => (v, Some(s)),
        None => (to, None),
    };
    let mut query = Vec::new();
    if let Some(f) = from {
        query.push(format!("from={}", path_segment(f)));
    }
    if let Some(s) = to_snap {
        query.push(format!("to={}", path_segment(s)));
    }
    let mut path = format!("{}/diff", volume_path(volume));
    if !query.is_empty() {
        path = format!("{path}?{}", query.join("&"));
    }
    decode(api.get(&path)?)
}

/// `volume diff FROM [TO]`: FROM is `VOL@SNAP` (or `VOL`: every data
/// range), TO `VOL@SNAP` or `VOL` (default: FROM's volume, now).
pub fn diff(from: &str, to: Option<&str>, client: &ClientArgs) -> Result<()> {
    let api = ApiClient::discover(client)?;
    let (base, newer) = match (split_snapshot_name(from), to) {
        (Some((volume, _)), None) => (Some(from), volume),
        (Some(_), Some(to)) => (Some(from), to),
        (None, None) => (None, from),
        (None, Some(_)) => bail!("{from} is not a snapshot: give FROM as VOLUME@SNAPSHOT"),
    };
    let value = fetch_diff(&api, base, newer)?;
    if client.output == Output::Json {
        return print_json(&serde_json::to_value(&value)?);
    }
    let rows: Vec<Vec<String>> = value
        .extents
        .iter()
        .map(|e| {
            vec![
                e.offset.to_string(),
                e.length.to_string(),
                if e.data { "data" } else { "zero" }.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                ("OFFSET", Align::Right),
                ("LENGTH", Align::Right),
                ("TYPE", Align::Left)
            ],
            &rows
        )
    );
    let changed: u64 = value.extents.iter().map(|e| e.length).sum();
    println!(
        "{} changed from {} to {} ({} of it data)",
        format_size(changed),
        value.from.as_deref().unwrap_or("nothing"),
        value.to,
        format_size(value.data_bytes)
    );
    Ok(())
}

/// The stream's destination: a new file (removed on failure) or stdout.
enum Sink {
    File {
        path: std::path::PathBuf,
        out: BufWriter<File>,
    },
    Stdout(BufWriter<std::io::Stdout>),
}

impl Sink {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Sink::File { out, .. } => out,
            Sink::Stdout(out) => out,
        }
    }
}

/// An item of the export, in offset order.
enum Item {
    Read(u64, u32),
    Zero(u64, u64),
}

/// `volume export-diff SOURCE FILE [--from-snap SNAP]`.
pub fn export_diff(
    source: &str,
    file: &Path,
    from_snap: Option<&str>,
    force: bool,
    nbd: &NbdArgs,
    client: &ClientArgs,
) -> Result<()> {
    let api = ApiClient::discover(client)?;
    let plan = fetch_diff(&api, from_snap, source)?;
    let mut sink = if file == Path::new("-") {
        Sink::Stdout(BufWriter::new(std::io::stdout()))
    } else {
        let out = create_output(file, force)?;
        Sink::File {
            path: file.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, out),
        }
    };
    let started = std::time::Instant::now();
    let result = write_stream(&api, &plan, source, sink.writer(), nbd, client);
    let result = result.and_then(|records| {
        match &mut sink {
            Sink::File { out, .. } => {
                out.flush()?;
                out.get_ref().sync_all()?;
            }
            Sink::Stdout(out) => out.flush()?,
        }
        Ok(records)
    });
    let records = match result {
        Ok(r) => r,
        Err(e) => {
            if let Sink::File { path, .. } = &sink {
                let _ = std::fs::remove_file(path);
            }
            return Err(e.context(format!("export-diff of {source} failed")));
        }
    };
    let changed: u64 = plan.extents.iter().map(|e| e.length).sum();
    let secs = started.elapsed().as_secs_f64();
    if client.output == Output::Json {
        // On stdout the stream is there already; the summary goes to stderr.
        let summary = json!({
            "from": plan.from, "to": plan.to, "size_bytes": plan.size_bytes,
            "changed_bytes": changed, "data_bytes": plan.data_bytes,
            "records": records, "seconds": secs,
        });
        if matches!(sink, Sink::Stdout(_)) {
            eprintln!("{}", serde_json::to_string_pretty(&summary)?);
            return Ok(());
        }
        return print_json(&summary);
    }
    eprintln!(
        "exported the diff from {} to {}: {} changed ({} data) in {records} records, {secs:.1} s",
        plan.from.as_deref().unwrap_or("nothing"),
        plan.to,
        format_size(changed),
        format_size(plan.data_bytes)
    );
    Ok(())
}

/// Writes the whole stream; returns its record count.
fn write_stream(
    api: &ApiClient,
    plan: &VolumeDiffBody,
    source: &str,
    out: &mut dyn Write,
    nbd: &NbdArgs,
    client: &ClientArgs,
) -> Result<u64> {
    let mut conn = nbd.connect(api, source)?;
    let mut buf = Vec::with_capacity(1 << 20);
    let records = std::cell::Cell::new(0u64);
    encode_magic(&mut buf);
    let emit = |record: DiffRecord, buf: &mut Vec<u8>, out: &mut dyn Write| -> Result<()> {
        encode_record(&record, buf)?;
        records.set(records.get() + 1);
        out.write_all(buf)?;
        buf.clear();
        Ok(())
    };
    if let Some(from) = &plan.from {
        emit(DiffRecord::From(from.clone()), &mut buf, out)?;
    }
    emit(DiffRecord::To(plan.to.clone()), &mut buf, out)?;
    emit(DiffRecord::Size(plan.size_bytes), &mut buf, out)?;
    let mut items = Vec::new();
    for e in &plan.extents {
        if e.data {
            items.extend(chunks(e.offset, e.length).map(|(o, l)| Item::Read(o, l)));
        } else {
            items.push(Item::Zero(e.offset, e.length));
        }
    }
    let total: u64 = plan.extents.iter().map(|e| e.length).sum();
    let mut progress = Progress::new(total, "exporting changes of", source, client);
    let mut next = 0usize;
    let mut early: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    // Emits every item whose turn has come (zeros at once, reads once done).
    let mut drain = |early: &mut BTreeMap<u64, Vec<u8>>, out: &mut dyn Write| -> Result<()> {
        while let Some(item) = items.get(next) {
            match *item {
                Item::Zero(offset, len) => {
                    emit(DiffRecord::Zero { offset, len }, &mut buf, out)?;
                    progress.add(len);
                }
                Item::Read(offset, _) => {
                    let Some(data) = early.remove(&offset) else {
                        break;
                    };
                    for (s, e, holds_data) in data_and_zero_runs(&data) {
                        let at = offset + s as u64;
                        let record = if holds_data {
                            DiffRecord::Data {
                                offset: at,
                                data: data[s..e].to_vec(),
                            }
                        } else {
                            DiffRecord::Zero {
                                offset: at,
                                len: (e - s) as u64,
                            }
                        };
                        emit(record, &mut buf, out)?;
                    }
                    progress.add(data.len() as u64);
                }
            }
            next += 1;
        }
        Ok(())
    };
    let reads: Vec<(u64, u32)> = items
        .iter()
        .filter_map(|i| match *i {
            Item::Read(o, l) => Some((o, l)),
            Item::Zero(..) => None,
        })
        .collect();
    drain(&mut early, out)?;
    conn.read_pipelined::<anyhow::Error>(reads, WINDOW, |offset, data| {
        early.insert(offset, data);
        drain(&mut early, out)
    })?;
    drain(&mut early, out)?;
    if !early.is_empty() {
        bail!(
            "internal error: {} reads were never written out",
            early.len()
        );
    }
    progress.finish();
    conn.disconnect()?;
    emit(
        DiffRecord::End {
            records: records.get(),
        },
        &mut buf,
        out,
    )?;
    Ok(records.get())
}

/// Reads records from a stream one at a time.
struct StreamReader<R: Read> {
    input: R,
    buf: Vec<u8>,
    parser: DiffParser,
    what: String,
}

impl<R: Read> StreamReader<R> {
    fn new(input: R, what: String) -> Self {
        StreamReader {
            input,
            buf: Vec::new(),
            parser: DiffParser::new(),
            what,
        }
    }

    /// The next record; `None` after the end record (and nothing after it).
    fn next(&mut self) -> Result<Option<DiffRecord>> {
        loop {
            if self.parser.is_finished() {
                let mut probe = [0u8; 1];
                if !self.buf.is_empty() || self.input.read(&mut probe)? > 0 {
                    bail!("{}: data after the end record", self.what);
                }
                return Ok(None);
            }
            match self.parser.next(&self.buf) {
                Ok((record, used)) => {
                    self.buf.drain(..used);
                    if let Some(r) = record {
                        return Ok(Some(r));
                    }
                }
                Err(DiffStreamError::Incomplete(need)) => {
                    let have = self.buf.len();
                    self.buf.resize(need.max(have + 1), 0);
                    let n = self.input.read(&mut self.buf[have..])?;
                    self.buf.truncate(have + n);
                    if n == 0 {
                        bail!(
                            "{}: truncated diff stream (it ends before its end record)",
                            self.what
                        );
                    }
                }
                Err(e) => bail!("{}: {e}", self.what),
            }
        }
    }
}

/// The header of a stream: from, to, size (read up to the first range).
struct Header {
    from: Option<String>,
    to: String,
    size: u64,
}

fn open_stream(file: &Path) -> Result<StreamReader<Box<dyn Read>>> {
    let (input, what): (Box<dyn Read>, String) = if file == Path::new("-") {
        (Box::new(std::io::stdin().lock()), "standard input".into())
    } else {
        let f = File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
        (
            Box::new(BufReader::with_capacity(1 << 20, f)),
            file.display().to_string(),
        )
    };
    Ok(StreamReader::new(input, what))
}

/// `volume import-diff FILE VOLUME`.
pub fn import_diff(file: &Path, volume: &str, nbd: &NbdArgs, client: &ClientArgs) -> Result<()> {
    if split_snapshot_name(volume).is_some() {
        bail!("{volume} is a snapshot; a diff is applied to a volume");
    }
    let from_file = file != Path::new("-");
    if from_file {
        // Check the whole file first: nothing is applied from a bad one.
        let mut check = open_stream(file)?;
        while check.next()?.is_some() {}
    }
    let mut stream = open_stream(file)?;
    let mut pending = None;
    while pending.is_none() {
        match stream.next()? {
            Some(DiffRecord::From(_) | DiffRecord::To(_) | DiffRecord::Size(_)) => {}
            other => pending = Some(other),
        }
    }
    let header = Header {
        from: stream.parser.from().map(str::to_string),
        to: stream.parser.to().unwrap_or_default().to_string(),
        size: stream.parser.size().unwrap_or_default(),
    };
    let api = ApiClient::discover(client)?;
    let target: Volume = decode(api.get(&volume_path(volume))?)?;
    if let Some(from) = &header.from {
        let snap = split_snapshot_name(from).map_or(from.as_str(), |(_, s)| s);
        if !target.snapshots.iter().any(|s| s == snap) {
            bail!(
                "volume {volume} has no snapshot {snap}, where this diff (from {from}) starts; apply the diffs before it first"
            );
        }
    }
    let to_snap = split_snapshot_name(&header.to).map(|(_, s)| s.to_string());
    if let Some(snap) = &to_snap {
        if target.snapshots.iter().any(|s| s == snap) {
            bail!(
                "volume {volume} already has snapshot {snap}, where this diff leads; nothing to do"
            );
        }
    }
    if target.size_bytes != header.size {
        api.post(
            &format!("{}/resize", volume_path(volume)),
            json!({"size": header.size, "allow_shrink": false}),
        )
        .with_context(|| format!("resizing {volume} to the diff's {} bytes", header.size))?;
    }
    let started = std::time::Instant::now();
    let mut conn = nbd.connect(&api, volume)?;
    let mut progress = Progress::new(header.size, "applying a diff to", volume, client);
    let mut applied = 0u64;
    let mut failure = None;
    let mut first = pending;
    let ops = std::iter::from_fn(|| loop {
        let record = match first.take() {
            Some(r) => r,
            None => match stream.next() {
                Ok(r) => r,
                Err(e) => {
                    failure = Some(e);
                    return None;
                }
            },
        };
        match record {
            Some(DiffRecord::Data { offset, data }) => {
                applied += data.len() as u64;
                progress.add(data.len() as u64);
                return Some(vec![Ok::<_, anyhow::Error>(WriteOp::Data { offset, data })]);
            }
            Some(DiffRecord::Zero { offset, len }) => {
                applied += len;
                progress.add(len);
                let end = offset + len;
                let mut ops = Vec::new();
                let mut at = offset;
                while at < end {
                    let n = (end - at).min(ZERO_CHUNK);
                    ops.push(Ok(WriteOp::Zeroes {
                        offset: at,
                        len: n as u32,
                        trim: true,
                    }));
                    at += n;
                }
                return Some(ops);
            }
            Some(_) => continue,
            None => return None,
        }
    })
    .flatten();
    conn.write_pipelined(ops, WINDOW)?;
    if let Some(e) = failure {
        return Err(e.context(format!(
            "volume {volume} is partly updated: roll it back to its snapshot and apply a good copy"
        )));
    }
    conn.flush()?;
    conn.disconnect()?;
    progress.finish();
    if let Some(snap) = &to_snap {
        api.post(
            &format!("{}/snapshots", volume_path(volume)),
            json!({ "name": snap }),
        )
        .with_context(|| format!("taking snapshot {snap} of {volume} after applying the diff"))?;
    }
    let secs = started.elapsed().as_secs_f64();
    if client.output == Output::Json {
        return print_json(&json!({
            "volume": volume, "from": header.from, "to": header.to,
            "size_bytes": header.size, "applied_bytes": applied,
            "snapshot": to_snap, "seconds": secs,
        }));
    }
    println!(
        "applied the diff from {} to {} to volume {volume}: {} in {secs:.1} s{}",
        header.from.as_deref().unwrap_or("nothing"),
        header.to,
        format_size(applied),
        to_snap
            .map(|s| format!("; took snapshot {volume}@{s}"))
            .unwrap_or_default()
    );
    Ok(())
}
