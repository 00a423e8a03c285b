//! What the results were measured on: the machine (CPU, memory, kernel, OS)
//! and the versions of the tools that ran.
//!
//! Invariant: never fails — what cannot be read is recorded as empty (or
//! 0), so a missing /proc file never stops a benchmark.

use crate::model::Machine;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `model name` from /proc/cpuinfo text.
fn cpu_model(cpuinfo: &str) -> String {
    cpuinfo
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == "model name").then(|| value.trim().to_string())
        })
        .unwrap_or_default()
}

/// `MemTotal` from /proc/meminfo text, in bytes.
fn mem_total(meminfo: &str) -> u64 {
    meminfo
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix("MemTotal:")?;
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

/// `PRETTY_NAME` from os-release text.
fn os_name(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_default()
}

/// The kernel release, e.g. `6.1.0-27-amd64`.
pub fn kernel() -> String {
    read_trimmed("/proc/sys/kernel/osrelease")
}

/// This machine.
pub fn machine() -> Machine {
    let cpus = std::thread::available_parallelism()
        .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        .unwrap_or(0);
    let os_release = std::fs::read_to_string("/etc/os-release")
        .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
        .unwrap_or_default();
    Machine {
        hostname: read_trimmed("/proc/sys/kernel/hostname"),
        cpus,
        cpu_model: cpu_model(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default()),
        memory_bytes: mem_total(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default()),
        kernel: kernel(),
        os: os_name(&os_release),
    }
}

/// The first line `program --version` prints, if it runs.
pub fn tool_version(program: &Path) -> Option<String> {
    let out = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    Some(strip_program_dir(line))
}

/// `/usr/bin/qemu-nbd 7.2.22 (…)` → `qemu-nbd 7.2.22 (…)` (some tools print
/// their argv[0]).
fn strip_program_dir(line: &str) -> String {
    match line.split_once(' ') {
        Some((program, rest)) if program.contains('/') => {
            let name = program.rsplit('/').next().unwrap_or(program);
            format!("{name} {rest}")
        }
        _ => line.to_string(),
    }
}

/// The versions map of the summary: fio, basalt and the kernel, plus
/// `extra` (the peers that ran, e.g. "qemu-nbd").
pub fn versions(fio: &str, basalt: &str, extra: &[(&str, String)]) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    map.insert("fio".to_string(), fio.to_string());
    map.insert("basalt".to_string(), basalt.to_string());
    map.insert("kernel".to_string(), kernel());
    for (name, version) in extra {
        map.insert(name.to_string(), version.clone());
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu\n";
        assert_eq!(cpu_model(cpuinfo), "AMD EPYC 7B13");
        assert_eq!(cpu_model(""), "");
        assert_eq!(
            mem_total("MemTotal:       24570012 kB\nMemFree: 1 kB\n"),
            24570012 * 1024
        );
        assert_eq!(mem_total("garbage"), 0);
        assert_eq!(
            os_name("NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
            "Debian GNU/Linux 12 (bookworm)"
        );
    }

    #[test]
    fn versions_without_paths() {
        assert_eq!(
            strip_program_dir("/usr/bin/qemu-nbd 7.2.22 (Debian 1:7.2)"),
            "qemu-nbd 7.2.22 (Debian 1:7.2)"
        );
        assert_eq!(strip_program_dir("nbdkit 1.32.5"), "nbdkit 1.32.5");
    }

    #[test]
    fn this_machine() {
        let m = machine();
        assert!(m.cpus >= 1);
        assert!(m.memory_bytes > 0);
        assert!(!m.kernel.is_empty());
        let v = versions("fio-3.33", "0.1.0", &[("nbdkit", "nbdkit 1.32.5".into())]);
        assert_eq!(v["nbdkit"], "nbdkit 1.32.5");
        assert_eq!(v["kernel"], m.kernel);
    }
}
