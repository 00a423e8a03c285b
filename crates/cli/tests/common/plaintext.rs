//! Recognisable plaintext for the encryption tests: 4 MiB texts no 16-byte
//! window of which is likely anywhere else, a search of a data file for
//! them, and a comparison of an export's first 4 MiB with a file.

use super::{require_tool, tool, CmdOutput, Server};
use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

const MIB: usize = 1 << 20;

/// 4 MiB of text from `seed` (hex digits of a splitmix64 stream).
pub fn text(seed: u64) -> Vec<u8> {
    let mut x = seed;
    let mut out = Vec::with_capacity(4 * MIB + 32);
    while out.len() < 4 * MIB {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        out.extend_from_slice(format!("{z:016x}").as_bytes());
    }
    out.truncate(4 * MIB);
    out
}

/// How many 16-byte windows of `file` are windows of `plain`.
pub fn windows_in_file(file: &Path, plain: &[u8]) -> usize {
    let wanted: HashSet<&[u8]> = plain.windows(16).collect();
    let raw = std::fs::read(file).unwrap();
    raw.windows(16).filter(|w| wanted.contains(w)).count()
}

/// fio writing 16 MiB of `volume` from `offset` in random 4k blocks at
/// QD16 over NBD, then verifying every block it wrote (`verify=crc32c`),
/// run in `dir`: the check that an encrypted volume's data path holds.
pub fn fio_verify_region(s: &Server, dir: &Path, volume: &str, offset: &str) -> Command {
    let mut fio = Command::new(require_tool("fio"));
    fio.current_dir(dir).args([
        "--name=v".to_string(),
        "--ioengine=nbd".into(),
        format!("--uri={}", s.uri(volume)),
        "--rw=randwrite".into(),
        "--bs=4k".into(),
        "--iodepth=16".into(),
        format!("--offset={offset}"),
        "--size=16M".into(),
        "--verify=crc32c".into(),
        "--do_verify=1".into(),
        "--verify_state_save=0".into(),
    ]);
    fio
}

/// qemu-img's comparison of the first 4 MiB of `export` (over NBD) with
/// `file`.
pub fn same_as(s: &Server, export: &str, file: &Path) -> CmdOutput {
    let addr = s.nbd_addr();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let image = format!(
        "json:{{\"driver\":\"raw\",\"size\":{},\"file\":{{\"driver\":\"nbd\",\"server\":{{\"type\":\"inet\",\"host\":\"{host}\",\"port\":\"{port}\"}},\"export\":\"{export}\"}}}}",
        4 * MIB
    );
    tool(
        "qemu-img",
        [
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            &image,
            file.to_str().unwrap(),
        ],
    )
}
