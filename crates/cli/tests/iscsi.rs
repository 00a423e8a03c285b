//! The iSCSI target of the real `basalt server` against initiators nobody
//! here wrote: libiscsi's conformance suite (`iscsi-test-cu`, every test,
//! data-loss ones included), libiscsi's `iscsi-ls` for discovery, and
//! QEMU's iSCSI block driver for CHAP logins and data, checked against
//! the same volume read over NBD.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

const SUITE_INITIATOR: &str = "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test";
const SUITE_INITIATOR_2: &str = "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test-2";
const INITIATOR: &str = "iqn.2026-11.io.test:host1";
const STRANGER: &str = "iqn.2026-11.io.test:stranger";

/// Tests of the suite that fail against this target, and why. Nothing else
/// may fail.
const KNOWN_FAILURES: &[(&str, &str)] = &[(
    "GetLBAStatus, Test UnmapSingle",
    "its second loop asks for the status at LBA i+1 and expects the first \
     descriptor to start at i+LBPPB, true only when a physical block holds \
     one logical block (Basalt's LUs are 512e: 8 per physical block)",
)];

fn target(volume: &str) -> String {
    basalt_volume::iscsi_target_name(volume)
}

/// `qemu-io` on an iSCSI LUN with these login settings.
fn qemu_io_iscsi(
    portal: &str,
    volume: &str,
    initiator: &str,
    chap: Option<(&str, &str)>,
    cmds: &[&str],
) -> CmdOutput {
    let mut opts = format!(
        "driver=iscsi,transport=tcp,portal={portal},target={},lun=0,initiator-name={initiator}",
        target(volume)
    );
    if let Some((user, password)) = chap {
        opts.push_str(&format!(",user={user},password={password}"));
    }
    let mut args = vec!["--image-opts".to_string(), opts];
    for c in cmds {
        args.push("-c".into());
        args.push(c.to_string());
    }
    tool("qemu-io", args)
}

#[test]
fn libiscsi_conformance_suite_passes() {
    let suite = require_tool("iscsi-test-cu");
    let s = Server::start_with(
        "2G",
        &[
            "--iscsi-allow-initiator",
            SUITE_INITIATOR,
            "--iscsi-allow-initiator",
            SUITE_INITIATOR_2,
        ],
    );
    s.create_volume("suite", "1G");
    let url = format!("iscsi://{}/{}/0", s.iscsi_addr(), target("suite"));
    // -d: the data-loss tests too (SANITIZE stays off: not offered). The
    // URL twice: the multipath tests (two sessions to one LU) run too.
    let out = run_cmd(
        Command::new(suite).args(["-n", "-d", &url, &url]),
        Duration::from_secs(900),
    );
    let SuiteRun {
        total,
        ran,
        passed,
        failed,
        summary,
        log,
    } = iscsi_suite_run(&out);
    let failures: BTreeSet<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("Suite "))
        .filter_map(|l| l.strip_suffix(" had failures:"))
        .collect();
    let skipped = log.matches("[SKIPPED]").count();
    assert!(!log.contains("Multipath unavailable"), "{log}");
    eprintln!(
        "iscsi-test-cu: {total} tests, {ran} ran, {passed} passed, {failed} failed \
         ({} distinct), {skipped} skip notices",
        failures.len()
    );
    assert!(ran >= 600 && ran == total, "{summary}\n{log}");
    let known: BTreeSet<&str> = KNOWN_FAILURES.iter().map(|(t, _)| *t).collect();
    let unexpected: Vec<&&str> = failures.difference(&known).collect();
    assert!(
        unexpected.is_empty(),
        "tests failed: {unexpected:?}\n{log}\n--- server log ---\n{}",
        s.log()
    );
    assert!(s.log().contains("iSCSI login"), "{}", s.log());
}

#[test]
fn chap_logins_discovery_and_data_through_qemu() {
    require_tool("iscsi-ls");
    let s = Server::start("256M");
    s.create_volume("disk", "64M");
    s.create_volume("other", "16M");
    let portal = s.iscsi_addr().to_string();

    // Not attached: nothing to discover, and refused at login (as if the
    // volume did not exist: 0x0202 either way).
    let ls = tool("iscsi-ls", ["-i", INITIATOR, &format!("iscsi://{portal}")]);
    assert!(!ls.stdout.contains("volume:disk"), "{}", ls.describe());
    let refused = qemu_io_iscsi(&portal, "disk", INITIATOR, None, &["read 0 4k"]);
    assert!(
        refused.stderr.contains("Authorization failure"),
        "{}",
        refused.describe()
    );

    // Attached with CHAP: the credentials are shown once.
    let attached = s.cli_json(&[
        "volume",
        "attach",
        "disk",
        "--initiator-iqn",
        INITIATOR,
        "--chap",
    ]);
    assert_eq!(attached["target_iqn"], target("disk"), "{attached}");
    assert_eq!(
        attached["iscsi_initiators_chap"][0], INITIATOR,
        "{attached}"
    );
    let user = attached["chap_username"].as_str().unwrap().to_string();
    let password = attached["chap_password"].as_str().unwrap().to_string();
    assert!(password.len() >= 12, "{attached}");

    // Discovery lists exactly the attached volume, at the portal.
    let ls = tool("iscsi-ls", ["-i", INITIATOR, &format!("iscsi://{portal}")]);
    assert!(
        ls.stdout
            .contains(&format!("Target:{} Portal:{portal},1", target("disk"))),
        "{}",
        ls.describe()
    );
    assert!(!ls.stdout.contains("volume:other"), "{}", ls.describe());

    // Without CHAP, or with a wrong secret: authentication failure.
    let none = qemu_io_iscsi(&portal, "disk", INITIATOR, None, &["read 0 4k"]);
    assert!(
        none.stderr.contains("Authentication failure"),
        "{}",
        none.describe()
    );
    let wrong = qemu_io_iscsi(
        &portal,
        "disk",
        INITIATOR,
        Some((&user, "wrong-secret-123")),
        &["read 0 4k"],
    );
    assert!(
        wrong.stderr.contains("Authentication failure"),
        "{}",
        wrong.describe()
    );
    // Another initiator with the right secret: refused too.
    let stranger = qemu_io_iscsi(
        &portal,
        "disk",
        STRANGER,
        Some((&user, &password)),
        &["read 0 4k"],
    );
    assert!(
        stranger.stderr.contains("Authorization failure"),
        "{}",
        stranger.describe()
    );

    // With it: 4 KiB-aligned and 512-byte writes, read back over iSCSI.
    let chap = Some((user.as_str(), password.as_str()));
    qemu_io_iscsi(
        &portal,
        "disk",
        INITIATOR,
        chap,
        &[
            "write -P 0x5c 1M 3M",
            "write -P 0x11 512 512",
            "write -P 0x22 4100k 1536",
            "read -P 0x5c 1M 3M",
            "read -P 0x11 512 512",
            "read -P 0x22 4100k 1536",
            "read -P 0 0 512",
        ],
    )
    .ok();
    // ... and over NBD: one volume, whatever the protocol.
    qemu_io(
        &s.uri("disk"),
        &[
            "read -P 0x5c 1M 3M",
            "read -P 0x11 512 512",
            "read -P 0 1024 3k",
            "read -P 0x22 4100k 1536",
        ],
    )
    .ok();
    // Resized: the initiator sees the new capacity on its next login.
    s.cli(&["volume", "resize", "disk", "--size", "96M"]).ok();
    let info = qemu_io_iscsi(&portal, "disk", INITIATOR, chap, &["length"]);
    assert!(info.ok().contains("96 MiB"), "{}", info.describe());

    // Detached: refused again.
    s.cli(&["volume", "detach", "disk", "--initiator-iqn", INITIATOR])
        .ok();
    let gone = qemu_io_iscsi(&portal, "disk", INITIATOR, chap, &["read 0 4k"]);
    assert!(
        gone.stderr.contains("Authorization failure"),
        "{}",
        gone.describe()
    );
}

#[test]
fn attach_mistakes_get_one_line() {
    let s = Server::start("64M");
    s.create_volume("v", "8M");
    let bad = s.cli(&["volume", "attach", "v", "--initiator-iqn", "host1"]);
    let line = bad.cli_error(1);
    assert!(line.contains("invalid iSCSI initiator name"), "{line}");
    let both = s.cli(&[
        "volume",
        "attach",
        "v",
        "--initiator-iqn",
        INITIATOR,
        "--host-nqn",
        "nqn.x",
    ]);
    assert_eq!(both.code(), Some(2), "{}", both.describe());
    let chap_without = s.cli(&["volume", "attach", "v", "--host-nqn", "nqn.x", "--chap"]);
    assert!(chap_without.cli_error(1).contains("--initiator-iqn"));
    let dhchap_with = s.cli(&[
        "volume",
        "attach",
        "v",
        "--initiator-iqn",
        INITIATOR,
        "--dhchap",
    ]);
    assert!(dhchap_with.cli_error(1).contains("--host-nqn"));
}
