//! `basalt volume import` and `basalt volume export`: disk images (raw or
//! qcow2) into a new volume and a volume or snapshot out to an image file,
//! streamed over NBD. Holes stay holes both ways: only ranges the source
//! says hold data are read, and blocks of zeros in them are not written.
//!
//! Invariants:
//! - A failed import deletes the volume it created; a failed export removes
//!   the file it created. Nothing half-done is left behind.
//! - An export is durable (fsync) before it reports success.

use crate::client::{ApiClient, ClientArgs, Output};
use crate::commands::{decode, print_json, volume_path};
use crate::transfer::{chunks, create_output, nonzero_runs, NbdArgs, Progress, WINDOW};
use anyhow::{anyhow, bail, Context, Result};
use basalt_api::types::Volume;
use basalt_image::{ExtentKind, ImageFormat, Qcow2Reader, Qcow2Writer, ReadAt};
use basalt_nbd_client::{Allocation, WriteOp};
use basalt_volume::{format_size, parse_size};
use serde_json::json;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Cluster size of exported qcow2 images (qemu-img's default).
const QCOW2_CLUSTER_BITS: u32 = 16;

/// What `volume import` needs besides the file.
pub struct ImportOptions {
    pub format: String,
    pub size: Option<String>,
    pub volume_type: Option<String>,
    pub project: Option<String>,
    pub replicas: Option<u32>,
    pub encrypted: bool,
    pub compression: Option<String>,
}

/// How long an import waits for a new replicated volume's primary.
const PLACEMENT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits until volume `name` has a primary to write to (a new replicated
/// volume is placed by the cluster's coordinator shortly after its record).
fn wait_for_primary(api: &ApiClient, name: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + PLACEMENT_WAIT;
    loop {
        let volume: Volume = decode(api.get(&volume_path(name))?)?;
        if volume.replicas_wanted.is_none() || volume.replicas.iter().any(|r| r.primary) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "volume {name} was not placed on the cluster's nodes within {} s",
                PLACEMENT_WAIT.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// An opened image to import.
enum Source {
    Raw(File),
    Qcow2(Qcow2Reader<File>),
}

impl Source {
    fn open(path: &Path, format: &str) -> Result<(Source, ImageFormat)> {
        let mut file =
            File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let format = match ImageFormat::parse_choice(format)? {
            Some(f) => f,
            None => {
                let mut magic = [0u8; 64];
                let n = file.read(&mut magic)?;
                basalt_image::probe_auto(&magic[..n])
                    .with_context(|| format!("{}", path.display()))?
            }
        };
        let source = match format {
            ImageFormat::Raw => Source::Raw(file),
            ImageFormat::Qcow2 => Source::Qcow2(
                Qcow2Reader::open(file).with_context(|| format!("{}", path.display()))?,
            ),
        };
        Ok((source, format))
    }

    fn size(&self) -> Result<u64> {
        Ok(match self {
            Source::Raw(f) => f.metadata()?.len(),
            Source::Qcow2(r) => r.virtual_size(),
        })
    }

    /// Ranges that may hold data, in order.
    fn data_ranges(&self) -> Result<Vec<(u64, u64)>> {
        match self {
            Source::Raw(f) => raw_data_ranges(f),
            Source::Qcow2(r) => Ok(r
                .extents()?
                .into_iter()
                .filter(|e| e.kind == ExtentKind::Data)
                .map(|e| (e.offset, e.len))
                .collect()),
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        match self {
            Source::Raw(f) => ReadAt::read_at(f, buf, offset).map_err(|e| {
                anyhow!("reading the image at byte {offset}: {e} (was it truncated meanwhile?)")
            }),
            Source::Qcow2(r) => Ok(r.read(offset, buf)?),
        }
    }
}

/// The data ranges of a raw file, from the file system's holes
/// (SEEK_DATA/SEEK_HOLE); the whole file where holes are not reported.
fn raw_data_ranges(file: &File) -> Result<Vec<(u64, u64)>> {
    let len = file.metadata()?.len();
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < len {
        // SAFETY: lseek on a file descriptor this function borrows; it only
        // moves the file offset, which nothing else here uses (reads are
        // positioned).
        let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENXIO) => Ok(out),
                Some(libc::EINVAL) if out.is_empty() => Ok(vec![(0, len)]),
                _ => Err(e).context("looking for data in the image"),
            };
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(std::io::Error::last_os_error()).context("looking for holes in the image");
        }
        let (data, hole) = (data as u64, (hole as u64).min(len));
        if hole > data {
            out.push((data, hole - data));
        }
        at = hole.max(data + 1);
    }
    Ok(out)
}

pub fn import(
    name: &str,
    path: &Path,
    options: &ImportOptions,
    nbd: &NbdArgs,
    client: &ClientArgs,
) -> Result<()> {
    let (source, format) = Source::open(path, &options.format)?;
    let image_size = source.size()?;
    let data = source.data_ranges()?;
    let size = match options.size.as_deref().map(parse_size).transpose()? {
        Some(s) if s < image_size => bail!(
            "--size {} is smaller than the image ({})",
            format_size(s),
            format_size(image_size)
        ),
        Some(s) => s,
        None => image_size.div_ceil(4096).max(1) * 4096,
    };
    let api = ApiClient::discover(client)?;
    let mut body = json!({"name": name, "size": size});
    if let Some(t) = &options.volume_type {
        body["type"] = json!(t);
    }
    if let Some(p) = &options.project {
        body["project"] = json!(p);
    }
    if let Some(n) = options.replicas {
        body["replicas"] = json!(n);
    }
    if options.encrypted {
        body["encrypted"] = json!(true);
    }
    if let Some(c) = &options.compression {
        body["compression"] = json!(c);
    }
    api.post("/api/v1/volumes", body)?;
    let started = std::time::Instant::now();
    let copied = match wait_for_primary(&api, name)
        .and_then(|()| copy_into_volume(&api, name, &source, &data, nbd, client))
    {
        Ok(copied) => copied,
        Err(e) => {
            if let Err(undo) = api.delete(&format!("{}?force=true", volume_path(name))) {
                eprintln!("warning: could not delete the half-imported volume {name}: {undo:#}");
            }
            return Err(e.context(format!(
                "import of {} failed; volume {name} was removed",
                path.display()
            )));
        }
    };
    let secs = started.elapsed().as_secs_f64();
    if client.output == Output::Json {
        return print_json(&json!({
            "volume": name, "file": path, "format": format.name(),
            "size_bytes": size, "written_bytes": copied, "seconds": secs,
        }));
    }
    println!(
        "imported {} ({format}, {}) into volume {name}: {} of data written in {secs:.1} s",
        path.display(),
        format_size(image_size),
        format_size(copied),
    );
    Ok(())
}

/// Writes the nonzero blocks of `data` ranges; returns the bytes written.
fn copy_into_volume(
    api: &ApiClient,
    name: &str,
    source: &Source,
    data: &[(u64, u64)],
    nbd: &NbdArgs,
    client: &ClientArgs,
) -> Result<u64> {
    let mut nbd = nbd.connect(api, name)?;
    let total: u64 = data.iter().map(|r| r.1).sum();
    let mut progress = Progress::new(total, "importing", name, client);
    let mut written = 0u64;
    let ops = data
        .iter()
        .flat_map(|&(offset, len)| chunks(offset, len))
        .flat_map(|(offset, len)| {
            let mut buf = vec![0u8; len as usize];
            let ops: Vec<Result<WriteOp>> = match source.read(offset, &mut buf) {
                Err(e) => vec![Err(e)],
                Ok(()) => nonzero_runs(&buf)
                    .into_iter()
                    .map(|(s, e)| {
                        written += (e - s) as u64;
                        Ok(WriteOp::Data {
                            offset: offset + s as u64,
                            data: buf[s..e].to_vec(),
                        })
                    })
                    .collect(),
            };
            progress.add(u64::from(len));
            ops
        });
    nbd.write_pipelined(ops, WINDOW)?;
    nbd.flush()?;
    nbd.disconnect()?;
    progress.finish();
    Ok(written)
}

/// The format of an export: as given, else from the file's extension.
fn export_format(path: &Path, format: Option<&str>) -> Result<ImageFormat> {
    match format {
        Some(f) => ImageFormat::parse_choice(f)?
            .ok_or_else(|| anyhow!("--format auto is for imports; give raw or qcow2")),
        None => Ok(match path.extension().and_then(|e| e.to_str()) {
            Some("qcow2") => ImageFormat::Qcow2,
            _ => ImageFormat::Raw,
        }),
    }
}

pub fn export(
    source: &str,
    path: &Path,
    format: Option<&str>,
    force: bool,
    nbd: &NbdArgs,
    client: &ClientArgs,
) -> Result<()> {
    let format = export_format(path, format)?;
    let api = ApiClient::discover(client)?;
    let mut conn = nbd.connect(&api, source)?;
    let size = conn.size();
    let file = create_output(path, force)?;
    let started = std::time::Instant::now();
    let result = (|| -> Result<u64> {
        let runs: Vec<(u64, u64)> = conn
            .allocation(0, size)?
            .into_iter()
            .filter(|r| r.2 == Allocation::Data)
            .map(|r| (r.0, r.1))
            .collect();
        let total: u64 = runs.iter().map(|r| r.1).sum();
        let mut progress = Progress::new(total, "exporting", source, client);
        let written = match format {
            ImageFormat::Raw => export_raw(&mut conn, &file, size, &runs, &mut progress)?,
            ImageFormat::Qcow2 => export_qcow2(&mut conn, &file, size, &runs, &mut progress)?,
        };
        file.sync_all()
            .with_context(|| format!("cannot make {} durable", path.display()))?;
        conn.disconnect()?;
        progress.finish();
        Ok(written)
    })();
    let written = match result {
        Ok(n) => n,
        Err(e) => {
            drop(file);
            let _ = std::fs::remove_file(path);
            return Err(e.context(format!(
                "export of {source} failed; {} was removed",
                path.display()
            )));
        }
    };
    let secs = started.elapsed().as_secs_f64();
    if client.output == Output::Json {
        return print_json(&json!({
            "source": source, "file": path, "format": format.name(),
            "size_bytes": size, "data_bytes": written, "seconds": secs,
        }));
    }
    println!(
        "exported {source} ({}) to {} ({format}): {} of data in {secs:.1} s",
        format_size(size),
        path.display(),
        format_size(written)
    );
    Ok(())
}

fn export_raw(
    conn: &mut basalt_nbd_client::NbdClient,
    file: &File,
    size: u64,
    runs: &[(u64, u64)],
    progress: &mut Progress,
) -> Result<u64> {
    file.set_len(size)?;
    // The file is written on a thread of its own, so the window of NBD
    // reads stays full while the page cache takes the data.
    let (tx, rx) = std::sync::mpsc::sync_channel::<(u64, Vec<u8>)>(WINDOW);
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> Result<u64> {
            let mut written = 0u64;
            for (offset, data) in rx {
                for (s, e) in nonzero_runs(&data) {
                    file.write_all_at(&data[s..e], offset + s as u64)?;
                    written += (e - s) as u64;
                }
            }
            Ok(written)
        });
        let read = conn.read_pipelined::<anyhow::Error>(
            runs.iter().flat_map(|&(o, l)| chunks(o, l)),
            WINDOW,
            |offset, data| {
                let len = data.len() as u64;
                tx.send((offset, data))
                    .map_err(|_| anyhow!("the file writer stopped"))?;
                progress.add(len);
                Ok(())
            },
        );
        drop(tx);
        let written = writer
            .join()
            .map_err(|_| anyhow!("the file writer panicked"))?;
        // The writer's own error says more than "stopped".
        let written = written?;
        read?;
        Ok(written)
    })
}

fn export_qcow2(
    conn: &mut basalt_nbd_client::NbdClient,
    file: &File,
    size: u64,
    runs: &[(u64, u64)],
    progress: &mut Progress,
) -> Result<u64> {
    let cluster = 1u64 << QCOW2_CLUSTER_BITS;
    // Whole clusters, each in one read (chunks are cluster-aligned).
    let mut aligned: Vec<(u64, u64)> = Vec::new();
    for &(o, l) in runs {
        let start = o / cluster * cluster;
        let end = ((o + l).div_ceil(cluster) * cluster).min(size);
        match aligned.last_mut() {
            Some(last) if last.0 + last.1 >= start => last.1 = end.max(last.0 + last.1) - last.0,
            _ => aligned.push((start, end - start)),
        }
    }
    let mut writer = Qcow2Writer::create(file.try_clone()?, size, QCOW2_CLUSTER_BITS)?;
    let mut written = 0u64;
    conn.read_pipelined::<anyhow::Error>(
        aligned.iter().flat_map(|&(o, l)| chunks(o, l)),
        WINDOW,
        |offset, data| {
            for (i, piece) in data.chunks(cluster as usize).enumerate() {
                if piece.iter().all(|&b| b == 0) {
                    continue;
                }
                let index = offset / cluster + i as u64;
                if piece.len() == cluster as usize {
                    writer.write_cluster(index, piece)?;
                } else {
                    let mut padded = piece.to_vec();
                    padded.resize(cluster as usize, 0);
                    writer.write_cluster(index, &padded)?;
                }
                written += piece.len() as u64;
            }
            progress.add(data.len() as u64);
            Ok(())
        },
    )?;
    writer.finish()?;
    Ok(written)
}
