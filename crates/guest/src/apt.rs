//! Debian packages for the guest, through the host's own apt: resolves names
//! to the candidate version apt would install (`apt-cache show
//! --no-all-versions`, from the local package lists, no network; or from the
//! lists of another suite kept in the cache, [`Lists::suite`]), downloads
//! each `.deb` once with `apt-get download` into the cache (file names carry
//! the version, so a new version is a new file), and unpacks them with
//! `dpkg-deb -x`. Nothing is installed on the host.
//!
//! Invariants:
//! - A `.deb` only appears under its final name once completely downloaded
//!   (downloads land in a temporary directory first, then are renamed).
//! - Failures name the package and carry apt's own message; a package apt
//!   does not know points at `apt-get update`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::error::{Error, Result};

/// The metapackage whose dependency names the current kernel image package.
pub const KERNEL_METAPACKAGE: &str = "linux-image-amd64";

/// Which package lists apt reads: the host's own, or those of a suite the
/// host's sources do not name (e.g. bookworm-backports), kept in the
/// guest cache with their own `sources.list` so the host's apt
/// configuration is never touched.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lists {
    /// `-o` options pointing apt at the suite's lists (empty: the host's).
    options: Vec<String>,
}

/// Lists older than this are refreshed (`apt-get update` of the one suite).
const LISTS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Lists {
    /// The host's package lists.
    pub fn host() -> Lists {
        Lists::default()
    }

    /// The lists of the suite `deb_line` names (a `sources.list` line),
    /// in `dir`, fetched now when missing or older than a day.
    pub fn suite(dir: &Path, deb_line: &str) -> Result<Lists> {
        let lists = dir.join("lists");
        fs::create_dir_all(lists.join("partial"))
            .map_err(|e| Error::io(format!("create {}", lists.display()), e))?;
        let sources = dir.join("sources.list");
        let line = format!("{deb_line}\n");
        if fs::read_to_string(&sources).ok().as_deref() != Some(line.as_str()) {
            fs::write(&sources, &line)
                .map_err(|e| Error::io(format!("write {}", sources.display()), e))?;
        }
        let suite = Lists {
            options: [
                format!("Dir::Etc::sourcelist={}", sources.display()),
                "Dir::Etc::sourceparts=-".to_string(),
                format!("Dir::State::Lists={}", lists.display()),
                "APT::Get::List-Cleanup=0".to_string(),
            ]
            .into_iter()
            .flat_map(|o| ["-o".to_string(), o])
            .collect(),
        };
        let stamp = dir.join("updated");
        let fresh = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < LISTS_MAX_AGE);
        if !fresh {
            tracing::info!(
                suite = deb_line,
                "fetching the package lists of a suite for the guest"
            );
            let out = run(
                Command::new("apt-get")
                    .args(&suite.options)
                    .args(["update", "-q"]),
                "apt-get",
            )?;
            if !out.status.success() {
                return Err(Error::Apt(format!(
                    "apt-get update of {deb_line:?} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            fs::write(&stamp, b"")
                .map_err(|e| Error::io(format!("write {}", stamp.display()), e))?;
        }
        Ok(suite)
    }
}

/// A package as apt resolved it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Package {
    pub name: String,
    pub version: String,
    pub arch: String,
    /// The raw `Depends:` field (used to find the kernel package).
    pub depends: String,
    /// The lists it was found in (and is downloaded through).
    pub lists: Lists,
}

impl Package {
    /// The file name `apt-get download` gives this package (an epoch's `:`
    /// is written `%3a`).
    pub fn deb_file_name(&self) -> String {
        format!(
            "{}_{}_{}.deb",
            self.name,
            self.version.replace(':', "%3a"),
            self.arch
        )
    }
}

fn run(cmd: &mut Command, tool: &str) -> Result<Output> {
    cmd.env("LC_ALL", "C")
        .output()
        .map_err(|e| Error::MissingTool {
            tool: tool.to_string(),
            detail: e.to_string(),
            hint: "the guest harness needs a Debian host with apt and dpkg",
        })
}

/// Parses `apt-cache show` paragraphs: the first paragraph per package.
fn parse_show(text: &str) -> BTreeMap<String, Package> {
    let mut out = BTreeMap::new();
    for para in text.split("\n\n") {
        let mut fields: BTreeMap<&str, String> = BTreeMap::new();
        let mut last: Option<&str> = None;
        for line in para.lines() {
            if line.starts_with(' ') || line.starts_with('\t') {
                if let Some(k) = last {
                    if let Some(v) = fields.get_mut(k) {
                        v.push(' ');
                        v.push_str(line.trim());
                    }
                }
            } else if let Some((k, v)) = line.split_once(':') {
                fields.insert(k, v.trim().to_string());
                last = Some(k);
            }
        }
        if let (Some(name), Some(version), Some(arch)) = (
            fields.get("Package"),
            fields.get("Version"),
            fields.get("Architecture"),
        ) {
            out.entry(name.clone()).or_insert_with(|| Package {
                name: name.clone(),
                version: version.clone(),
                arch: arch.clone(),
                depends: fields.get("Depends").cloned().unwrap_or_default(),
                lists: Lists::host(),
            });
        }
    }
    out
}

/// The candidate version of each named package in `lists`, in the order
/// given.
pub fn resolve(names: &[&str], lists: &Lists) -> Result<Vec<Package>> {
    let out = run(
        Command::new("apt-cache")
            .args(&lists.options)
            .args(["show", "--no-all-versions"])
            .args(names),
        "apt-cache",
    )?;
    let mut found = parse_show(&String::from_utf8_lossy(&out.stdout));
    for p in found.values_mut() {
        p.lists = lists.clone();
    }
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !found.contains_key(*n))
        .collect();
    if !missing.is_empty() {
        return Err(Error::Apt(format!(
            "no candidate version of {} (run `apt-get update`?): {}",
            missing.join(", "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(names
        .iter()
        .filter_map(|n| found.get(*n).cloned())
        .collect())
}

/// The kernel image package a metapackage's `Depends:` names, e.g.
/// `linux-image-6.1.0-56-amd64 (= 6.1.192-2)`: name and, if pinned, version.
fn kernel_dependency(depends: &str) -> Option<(String, Option<String>)> {
    depends.split(',').find_map(|d| {
        let d = d.split('|').next().unwrap_or("").trim();
        let name = d.split_whitespace().next()?;
        if !name.starts_with("linux-image-") || name == KERNEL_METAPACKAGE {
            return None;
        }
        let version = d
            .split_once("(=")
            .and_then(|(_, v)| v.split_once(')'))
            .map(|(v, _)| v.trim().to_string());
        Some((name.to_string(), version))
    })
}

/// The current kernel image package of `kernel_lists` (what
/// [`KERNEL_METAPACKAGE`] depends on there) followed by `names` from the
/// host's lists, all at their candidate versions: one `apt-cache` call per
/// set of lists when the metapackage pins the kernel's version, as
/// Debian's does.
pub fn resolve_with_kernel(names: &[&str], kernel_lists: &Lists) -> Result<Vec<Package>> {
    let mut found = if *kernel_lists == Lists::host() {
        let mut all: Vec<&str> = vec![KERNEL_METAPACKAGE];
        all.extend_from_slice(names);
        resolve(&all, &Lists::host())?
    } else {
        let mut found = resolve(&[KERNEL_METAPACKAGE], kernel_lists)?;
        found.extend(resolve(names, &Lists::host())?);
        found
    };
    let meta = found.remove(0);
    let (kernel, version) = kernel_dependency(&meta.depends).ok_or_else(|| {
        Error::Apt(format!(
            "{KERNEL_METAPACKAGE} depends on no linux-image package: {:?}",
            meta.depends
        ))
    })?;
    let kernel = match version {
        Some(version) => Package {
            name: kernel,
            version,
            arch: meta.arch.clone(),
            depends: String::new(),
            lists: meta.lists.clone(),
        },
        None => resolve(&[kernel.as_str()], &meta.lists)?.remove(0),
    };
    found.insert(0, kernel);
    Ok(found)
}

/// Makes sure every package's `.deb` is in `debs_dir`; returns their paths
/// in the order given. Missing ones are fetched with one `apt-get download`.
pub fn download(packages: &[Package], debs_dir: &Path) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(debs_dir)
        .map_err(|e| Error::io(format!("create {}", debs_dir.display()), e))?;
    let missing: Vec<&Package> = packages
        .iter()
        .filter(|p| !debs_dir.join(p.deb_file_name()).is_file())
        .collect();
    if !missing.is_empty() {
        let tmp = tempfile::Builder::new()
            .prefix(".download-")
            .tempdir_in(debs_dir)
            .map_err(|e| {
                Error::io(
                    format!("create a download directory in {}", debs_dir.display()),
                    e,
                )
            })?;
        // apt drops privileges to `_apt` for downloads when it can write the
        // target directory as that user; otherwise it warns and downloads as
        // the caller. Both work.
        // One download per set of lists the packages came from.
        let mut by_lists: BTreeMap<&Lists, Vec<String>> = BTreeMap::new();
        for p in &missing {
            by_lists
                .entry(&p.lists)
                .or_default()
                .push(format!("{}={}", p.name, p.version));
        }
        for (lists, specs) in by_lists {
            tracing::info!(packages = %specs.join(" "), "downloading guest packages");
            let out = run(
                Command::new("apt-get")
                    .args(&lists.options)
                    .args(["download", "-q"])
                    .args(&specs)
                    .current_dir(tmp.path()),
                "apt-get",
            )?;
            if !out.status.success() {
                return Err(Error::Apt(format!(
                    "apt-get download {} failed ({}; stale package lists name versions the \
                     mirror no longer has: `apt-get update` refreshes them): {}",
                    specs.join(" "),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        for p in &missing {
            let name = p.deb_file_name();
            let from = tmp.path().join(&name);
            let to = debs_dir.join(&name);
            fs::rename(&from, &to).map_err(|e| {
                Error::io(
                    format!(
                        "apt-get download did not leave {} ({})",
                        from.display(),
                        p.name
                    ),
                    e,
                )
            })?;
        }
    }
    Ok(packages
        .iter()
        .map(|p| debs_dir.join(p.deb_file_name()))
        .collect())
}

/// Removes `.deb`s of the given packages whose version is not the current
/// one (superseded by an update); other files are left alone.
pub fn prune_superseded(packages: &[Package], debs_dir: &Path) {
    let Ok(entries) = fs::read_dir(debs_dir) else {
        return;
    };
    let current: Vec<String> = packages.iter().map(Package::deb_file_name).collect();
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let superseded = file.ends_with(".deb")
            && !current.contains(&file)
            && packages
                .iter()
                .any(|p| file.starts_with(&format!("{}_", p.name)));
        if superseded {
            tracing::info!(file, "removing superseded guest package");
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Unpacks a `.deb`'s files into `dest` (created if needed).
pub fn extract(deb: &Path, dest: &Path) -> Result<()> {
    fs::create_dir_all(dest).map_err(|e| Error::io(format!("create {}", dest.display()), e))?;
    let out = run(
        Command::new("dpkg-deb").arg("-x").arg(deb).arg(dest),
        "dpkg-deb",
    )?;
    if !out.status.success() {
        return Err(Error::Apt(format!(
            "dpkg-deb -x {} failed ({}): {}",
            deb.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOW: &str = "Package: busybox-static\nVersion: 1:1.35.0-4+deb12u1+b1\nArchitecture: amd64\nDepends: libc6\nDescription: x\n more\n\n\
Package: linux-image-amd64\nSource: linux-signed-amd64 (6.1.192+2)\nVersion: 6.1.192-2\nArchitecture: amd64\nDepends: linux-image-6.1.0-56-amd64 (= 6.1.192-2)\n\n\
Package: busybox-static\nVersion: 1:1.30.1-6\nArchitecture: amd64\n\n";

    #[test]
    fn parses_the_first_paragraph_per_package() {
        let m = parse_show(SHOW);
        assert_eq!(m.len(), 2);
        let bb = &m["busybox-static"];
        assert_eq!(bb.version, "1:1.35.0-4+deb12u1+b1");
        assert_eq!(
            bb.deb_file_name(),
            "busybox-static_1%3a1.35.0-4+deb12u1+b1_amd64.deb"
        );
        assert_eq!(
            m["linux-image-amd64"].depends,
            "linux-image-6.1.0-56-amd64 (= 6.1.192-2)"
        );
    }

    #[test]
    fn kernel_dependency_takes_name_and_pinned_version() {
        assert_eq!(
            kernel_dependency("linux-image-6.1.0-56-amd64 (= 6.1.192-2)"),
            Some((
                "linux-image-6.1.0-56-amd64".into(),
                Some("6.1.192-2".into())
            ))
        );
        assert_eq!(
            kernel_dependency("initramfs-tools, linux-image-6.1.0-9-amd64"),
            Some(("linux-image-6.1.0-9-amd64".into(), None))
        );
        assert_eq!(kernel_dependency("libc6 (>= 2.36)"), None);
    }

    #[test]
    fn prune_keeps_current_and_unrelated_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = Package {
            name: "fio".into(),
            version: "3.33-3".into(),
            arch: "amd64".into(),
            depends: String::new(),
            lists: Lists::host(),
        };
        for f in [
            "fio_3.33-3_amd64.deb",
            "fio_3.30-1_amd64.deb",
            "fio-examples_1_all.deb",
            "notes.txt",
        ] {
            fs::write(dir.path().join(f), b"x").unwrap();
        }
        prune_superseded(&[p], dir.path());
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "fio-examples_1_all.deb",
                "fio_3.33-3_amd64.deb",
                "notes.txt"
            ]
        );
    }
}
