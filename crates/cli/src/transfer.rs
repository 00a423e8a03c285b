//! What the commands that move a volume's bytes share (`volume import`,
//! `export`, `export-diff`, `import-diff`): finding the node's NBD endpoint,
//! the window of requests kept in flight, zero detection (zeros are never
//! written, so holes stay holes), and progress (a bar on a terminal, a plain
//! line every few seconds otherwise).

use crate::client::{ApiClient, ClientArgs, Output};
use anyhow::{anyhow, bail, Context, Result};
use basalt_nbd_client::{Endpoint, NbdClient};
use clap::Args;
use std::fs::{File, OpenOptions};
use std::io::IsTerminal;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Bytes per NBD request.
pub const CHUNK: u64 = 1 << 20;
/// Requests kept in flight.
pub const WINDOW: usize = 8;
/// The granularity of zero detection: the store's block.
pub const BLOCK: usize = basalt_store::BLOCK_SIZE as usize;

/// Where the data moves: the NBD endpoint of the node.
#[derive(Args, Debug, Clone)]
pub struct NbdArgs {
    /// The node's NBD endpoint [default: its Unix socket, from
    /// DIR/server.json]: nbd+unix:///?socket=PATH, nbd://HOST:PORT (with
    /// --nbd-insecure servers) or
    /// nbds://IDENTITY@HOST:PORT/?tls-psk-file=keys.psk (a key from
    /// `basalt nbd-key create`).
    #[arg(long, value_name = "URI", env = "BASALT_NBD")]
    pub nbd: Option<String>,
}

impl NbdArgs {
    /// Connects to `export` (a volume or `VOLUME@SNAPSHOT`).
    pub fn connect(&self, api: &ApiClient, export: &str) -> Result<NbdClient> {
        let endpoint = match &self.nbd {
            Some(uri) => Endpoint::parse_uri(uri)?.0,
            None => match api.server.as_ref().and_then(|s| s.nbd_socket.as_ref()) {
                Some(socket) => Endpoint::Unix(socket.into()),
                None => bail!(
                    "no NBD endpoint known for this server: give --nbd nbds://IDENTITY@HOST:PORT/?tls-psk-file=keys.psk (or run on the server's machine with --data-dir)"
                ),
            },
        };
        NbdClient::connect(&endpoint, export)
            .with_context(|| format!("cannot open {export} over NBD"))
    }
}

/// Creates the file an export writes: mode 0600, refused if it exists
/// unless `force` (then truncated).
pub fn create_output(path: &Path, force: bool) -> Result<File> {
    let mut open = OpenOptions::new();
    open.read(true).write(true).mode(0o600);
    if force {
        open.create(true).truncate(true);
    } else {
        open.create_new(true);
    }
    open.open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => anyhow!(
            "{} exists; remove it or pass --force to overwrite it",
            path.display()
        ),
        _ => anyhow!("cannot create {}: {e}", path.display()),
    })
}

/// Nonzero runs of `data` (at block granularity) as (start, end) offsets.
pub fn nonzero_runs(data: &[u8]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, block) in data.chunks(BLOCK).enumerate() {
        if block.iter().all(|&b| b == 0) {
            continue;
        }
        let (start, end) = (i * BLOCK, i * BLOCK + block.len());
        match runs.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            _ => runs.push((start, end)),
        }
    }
    runs
}

/// `data` cut into consecutive runs of data and of zeros (at block
/// granularity), as (start, end, holds data).
pub fn data_and_zero_runs(data: &[u8]) -> Vec<(usize, usize, bool)> {
    let mut out = Vec::new();
    let mut at = 0;
    for (start, end) in nonzero_runs(data) {
        if start > at {
            out.push((at, start, false));
        }
        out.push((start, end, true));
        at = end;
    }
    if at < data.len() {
        out.push((at, data.len(), false));
    }
    out
}

/// Splits [offset, offset+len) into requests of at most [`CHUNK`] bytes,
/// aligned to [`CHUNK`] so clusters and blocks never straddle two.
pub fn chunks(offset: u64, len: u64) -> impl Iterator<Item = (u64, u32)> {
    let end = offset + len;
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let next = ((at / CHUNK + 1) * CHUNK).min(end);
        let piece = (at, (next - at) as u32);
        at = next;
        Some(piece)
    })
}

/// Progress of one transfer: an indicatif bar on a terminal; otherwise one
/// plain line on stderr every few seconds (for logs); nothing with
/// `--output json`.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    verb: String,
    total: u64,
    done: u64,
    started: Instant,
    last_line: Instant,
}

const PLAIN_EVERY: Duration = Duration::from_secs(5);

impl Progress {
    pub fn new(total: u64, verb: &str, name: &str, client: &ClientArgs) -> Progress {
        let quiet = client.output == Output::Json;
        let terminal = std::io::stderr().is_terminal();
        let bar = (terminal && !quiet).then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{verb} {{msg}} [{{bar:30}}] {{bytes}}/{{total_bytes}} ({{bytes_per_sec}}, {{eta}} left)"
                ))
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_message(name.to_string());
            bar
        });
        Progress {
            bar,
            plain: !terminal && !quiet,
            verb: format!("{verb} {name}"),
            total,
            done: 0,
            started: Instant::now(),
            last_line: Instant::now(),
        }
    }

    /// `n` more bytes handled.
    pub fn add(&mut self, n: u64) {
        self.done += n;
        if let Some(bar) = &self.bar {
            bar.inc(n);
        } else if self.plain && self.last_line.elapsed() >= PLAIN_EVERY {
            self.last_line = Instant::now();
            let secs = self.started.elapsed().as_secs_f64().max(0.001);
            let rate = self.done as f64 / secs;
            let left = self.total.saturating_sub(self.done) as f64 / rate.max(1.0);
            eprintln!(
                "{}: {} of {} ({}/s, {:.0} s left)",
                self.verb,
                basalt_volume::format_size(self.done),
                basalt_volume::format_size(self.total),
                basalt_volume::format_size(rate as u64),
                left
            );
        }
    }

    /// `pos` bytes handled in all.
    pub fn set_position(&mut self, pos: u64) {
        self.add(pos.saturating_sub(self.done));
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_blocks_are_left_out_and_runs_merge() {
        let mut data = vec![0u8; 5 * BLOCK + 100];
        data[BLOCK + 7] = 1;
        data[2 * BLOCK] = 1;
        data[5 * BLOCK + 99] = 3;
        assert_eq!(
            nonzero_runs(&data),
            vec![(BLOCK, 3 * BLOCK), (5 * BLOCK, 5 * BLOCK + 100)]
        );
        assert!(nonzero_runs(&[0u8; 3 * BLOCK]).is_empty());
        assert_eq!(
            data_and_zero_runs(&data),
            vec![
                (0, BLOCK, false),
                (BLOCK, 3 * BLOCK, true),
                (3 * BLOCK, 5 * BLOCK, false),
                (5 * BLOCK, 5 * BLOCK + 100, true)
            ]
        );
    }

    #[test]
    fn chunks_are_aligned_and_cover_the_range() {
        let pieces: Vec<_> = chunks(CHUNK - 4096, 2 * CHUNK).collect();
        assert_eq!(
            pieces,
            vec![
                (CHUNK - 4096, 4096),
                (CHUNK, CHUNK as u32),
                (2 * CHUNK, (CHUNK - 4096) as u32)
            ]
        );
        assert_eq!(chunks(5, 0).count(), 0);
    }
}
