//! Tests of target parsing, command lines and processes.

use super::*;

#[test]
fn parses_targets() {
    assert_eq!(TargetSpec::parse("basalt").unwrap(), TargetSpec::Basalt);
    assert_eq!(TargetSpec::parse("qemu-nbd").unwrap(), TargetSpec::QemuNbd);
    assert_eq!(
        TargetSpec::parse("qemu-nbd-shared").unwrap(),
        TargetSpec::QemuNbdShared
    );
    assert_eq!(TargetSpec::parse("nbdkit").unwrap(), TargetSpec::Nbdkit);
    assert_eq!(
        TargetSpec::parse("basalt-iscsi").unwrap(),
        TargetSpec::BasaltIscsi
    );
    assert_eq!(TargetSpec::parse(" tgt ").unwrap(), TargetSpec::Tgt);
    assert_eq!(TargetSpec::parse("file").unwrap(), TargetSpec::File);
    assert_eq!(
        TargetSpec::parse("nbd://10.0.0.1:10809/db").unwrap(),
        TargetSpec::Nbd("nbd://10.0.0.1:10809/db".into())
    );
    assert_eq!(
        TargetSpec::parse("/dev/nvme0n1").unwrap(),
        TargetSpec::Path("/dev/nvme0n1".into())
    );
    let err = TargetSpec::parse("qemu").unwrap_err().to_string();
    assert!(
        err.contains("basalt, basalt-iscsi, qemu-nbd, qemu-nbd-shared, nbdkit, tgt, file, nbd://"),
        "{err}"
    );
    assert!(TargetSpec::parse("iscsi").is_err());
    assert!(TargetSpec::parse("tgtd").is_err());
}

#[test]
fn iscsi_targets_are_named_and_local() {
    let basalt = BasaltServer::Ephemeral {
        exe: "basalt".into(),
    };
    for (spec, name) in [
        (TargetSpec::BasaltIscsi, "basalt-iscsi"),
        (TargetSpec::Tgt, "tgt"),
    ] {
        assert_eq!(spec.name(), name);
        assert_eq!(spec.slug(), name);
        assert_eq!(TargetSpec::parse(&spec.name()).unwrap(), spec);
        assert!(spec.local_only(&basalt));
    }
}

#[test]
fn iscsi_command_lines() {
    // The ephemeral server of basalt-iscsi lets the bridge log in.
    assert_eq!(
        basalt_iscsi_args(),
        ["--iscsi-allow-initiator", BRIDGE_INITIATOR]
    );
    assert!(EPHEMERAL_LISTENERS.contains(&"--iscsi-listen"));
    assert_eq!(basalt_iqn(EXPORT), "iqn.2026-11.io.basalt:volume:bench");
    // The bridge: QEMU's iSCSI driver exported as NBD on a Unix socket.
    assert_eq!(
        bridge_args(
            "127.0.0.1:3260",
            &basalt_iqn(EXPORT),
            0,
            12,
            Path::new("/w/basalt-iscsi-bridge.sock")
        )
        .join(" "),
        "-t --cache=none --shared=12 -x bench -k /w/basalt-iscsi-bridge.sock --image-opts \
         driver=iscsi,transport=tcp,portal=127.0.0.1:3260,\
         target=iqn.2026-11.io.basalt:volume:bench,lun=0,\
         initiator-name=iqn.2026-11.io.basalt:bench-bridge"
    );
    // tgtd as its users start it, set up and stopped with tgtadm.
    assert_eq!(
        tgtd_args(12345, 3261).join(" "),
        "-f -C 12345 --iscsi portal=127.0.0.1:3261"
    );
    let tgtadm = Path::new("/usr/sbin/tgtadm");
    let setup: Vec<String> = tgtadm_setup_args(tgtadm, 7, Path::new("/w/tgt.img"))
        .iter()
        .map(|a| a.join(" "))
        .collect();
    assert_eq!(
        setup,
        [
            "/usr/sbin/tgtadm -C 7 --lld iscsi --op new --mode target --tid 1 \
             -T iqn.2026-11.io.basalt:bench-tgt",
            "/usr/sbin/tgtadm -C 7 --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 \
             --bstype rdwr -b /w/tgt.img",
            "/usr/sbin/tgtadm -C 7 --lld iscsi --op bind --mode target --tid 1 -I ALL",
        ]
    );
    let stop: Vec<String> = tgtadm_stop_args(tgtadm, 7)
        .iter()
        .map(|a| a.join(" "))
        .collect();
    assert_eq!(
        stop,
        [
            "/usr/sbin/tgtadm -C 7 --op update --mode sys --name State -v offline",
            "/usr/sbin/tgtadm -C 7 --lld iscsi --op delete --mode target --tid 1 --force",
            "/usr/sbin/tgtadm -C 7 --op delete --mode system",
        ]
    );
    let control = tgtd_control_number().unwrap();
    assert!((10_000..=32_767).contains(&control), "{control}");
}

#[test]
fn stop_commands_stop_a_server_that_ignores_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("stop");
    // A shell that ignores SIGTERM and exits once the flag file exists.
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!(
        "trap '' TERM; while [ ! -e {} ]; do sleep 0.05; done",
        flag.display()
    ));
    let mut server = ServerProcess::spawn_stopped_by(
        "stubborn",
        cmd,
        dir.path().join("stubborn.log"),
        vec![vec!["touch".into(), flag.display().to_string()]],
        vec![flag.clone()],
    )
    .unwrap();
    assert!(server.exited().is_none());
    assert_eq!(server.terminate(), Ok(()));
    assert!(server.exited().is_some());
    assert!(!flag.exists(), "leftovers are removed");
    assert!(run_tool(&["false".to_string()]).is_err());
    assert_eq!(run_tool(&["echo".into(), "hi".into()]).unwrap(), "hi\n");
}

#[test]
fn preallocated_files_have_their_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tgt.img");
    preallocated_file(&path, 1 << 20).unwrap();
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 1 << 20);
    assert!(meta.blocks() * 512 >= 1 << 20, "{} blocks", meta.blocks());
}

#[test]
fn parses_compare_lists() {
    let list = TargetSpec::parse_list("basalt,qemu-nbd, nbdkit,file").unwrap();
    assert_eq!(
        list,
        [
            TargetSpec::Basalt,
            TargetSpec::QemuNbd,
            TargetSpec::Nbdkit,
            TargetSpec::File
        ]
    );
    assert!(matches!(
        TargetSpec::parse_list("file,file"),
        Err(TargetError::Duplicate(_))
    ));
    assert!(TargetSpec::parse_list(",").is_err());
    let iscsi = TargetSpec::parse_list("basalt-iscsi, tgt").unwrap();
    assert_eq!(iscsi, [TargetSpec::BasaltIscsi, TargetSpec::Tgt]);
    assert!(TargetSpec::parse_list("tgt,tgt").is_err());
}

#[test]
fn slugs_are_file_names() {
    assert_eq!(TargetSpec::Basalt.slug(), "basalt");
    assert_eq!(
        TargetSpec::Nbd("nbd://127.0.0.1:10809/db".into()).slug(),
        "nbd-127.0.0.1_10809_db"
    );
    assert_eq!(TargetSpec::Path("/dev/sdb".into()).slug(), "path-dev_sdb");
}

#[test]
fn cpu_from_proc_stat() {
    // Field 14 utime = 150, field 15 stime = 50; the name has a space
    // and a parenthesis.
    let stat =
        "1234 (basalt (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 9 0 100 0 0";
    assert_eq!(parse_stat_cpu(stat, 100.0), Some(2.0));
    assert_eq!(parse_stat_cpu("garbage", 100.0), None);
    let me = cpu_seconds(std::process::id());
    assert!(me.is_some_and(|s| s >= 0.0));
}

#[test]
fn loopback_hosts() {
    assert!(is_loopback_host("127.0.0.1"));
    assert!(is_loopback_host("127.0.0.1:8765"));
    assert!(is_loopback_host("localhost"));
    assert!(is_loopback_host("[::1]:8765"));
    assert!(!is_loopback_host("192.0.2.1"));
    assert!(!is_loopback_host("no-such-host.invalid"));
}

#[test]
fn capacity_has_room() {
    let gib = 1u64 << 30;
    assert!(basalt_capacity(gib) >= gib + gib / 4);
    assert_eq!(basalt_capacity(gib) % (1 << 20), 0);
}
