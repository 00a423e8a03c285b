//! The bench's iSCSI targets: `basalt-iscsi` (an ephemeral Basalt server's
//! volume over iSCSI) and `tgt` (Linux's user-space target on a preallocated
//! file), both reached through the bridge, qemu-nbd exporting QEMU's iSCSI
//! driver (libiscsi) as NBD, since fio's nbd engine is the bench's network
//! client.
//!
//! The tgtd and tgtadm command lines are public for other harnesses that
//! start tgt the same way (the kernel-initiator sweep in
//! `crates/cli/tests/guest_sweep.rs`).
//!
//! Invariants: tgtd listens on 127.0.0.1 only (its portal is checked before
//! any LUN is made: tgtd falls back to 0.0.0.0:3260 when it cannot bind),
//! and is stopped with tgtadm (it ignores SIGTERM).

use super::*;

/// The iSCSI initiator name the bridge logs in with (the ephemeral basalt
/// server of `basalt-iscsi` allows it with `--iscsi-allow-initiator`).
pub const BRIDGE_INITIATOR: &str = "iqn.2026-11.io.basalt:bench-bridge";
/// The target name under which the bench's tgtd serves its file.
pub const TGT_IQN: &str = "iqn.2026-11.io.basalt:bench-tgt";

/// `basalt-iscsi`'s ephemeral server arguments beyond the listeners.
pub(super) fn basalt_iscsi_args() -> Vec<String> {
    vec!["--iscsi-allow-initiator".into(), BRIDGE_INITIATOR.into()]
}

/// The bridge's qemu-nbd arguments: QEMU's iSCSI driver (libiscsi) on
/// `iqn` LUN `lun` at `portal`, exported as NBD export `bench` on the Unix
/// socket `socket` to up to `shared` clients, persistent (`-t`), without
/// the host page cache (`--cache=none`).
pub(crate) fn bridge_args(
    portal: &str,
    iqn: &str,
    lun: u32,
    shared: u32,
    socket: &Path,
) -> Vec<String> {
    vec![
        "-t".into(),
        "--cache=none".into(),
        format!("--shared={shared}"),
        "-x".into(),
        EXPORT.into(),
        "-k".into(),
        socket.display().to_string(),
        "--image-opts".into(),
        format!(
            "driver=iscsi,transport=tcp,portal={portal},target={iqn},lun={lun},\
             initiator-name={BRIDGE_INITIATOR}"
        ),
    ]
}

/// Starts the bridge in front of an iSCSI LUN (qemu-nbd, see
/// [`bridge_args`]) and records it in `target`; fio reaches it over NBD.
pub(super) fn start_bridge(
    ctx: &TargetContext<'_>,
    target: &mut Target,
    portal: &str,
    iqn: &str,
    lun: u32,
) -> Result<TargetIo, TargetError> {
    let qemu = require("qemu-nbd", "qemu-utils")?;
    let socket = ctx.work_dir.join(format!("{}-bridge.sock", target.slug));
    let args = bridge_args(portal, iqn, lun, ctx.max_connections, &socket);
    let mut cmd = Command::new(&qemu);
    cmd.args(&args);
    let log = ctx.work_dir.join(format!("{}-bridge.log", target.slug));
    let bridge = target
        .bridge
        .insert(ServerProcess::spawn("qemu-nbd (iSCSI bridge)", cmd, log)?);
    wait_ready(
        bridge,
        &format!("listening on {}", socket.display()),
        || UnixStream::connect(&socket).is_ok(),
    )?;
    target
        .versions
        .extend(crate::machine::tool_version(&qemu).map(|v| ("qemu-nbd", v)));
    target.details.insert(
        "bridge".into(),
        json!(format!(
            "qemu-nbd {} (QEMU's iSCSI driver, libiscsi, exported as NBD; fio's nbd engine drives it)",
            args.join(" ")
        )),
    );
    Ok(TargetIo::Nbd {
        uri: format!("nbd+unix:///{EXPORT}?socket={}", socket.display()),
    })
}

/// tgtd's arguments: in the foreground, control socket number `control`
/// (/var/run/tgtd/socket.N), one iSCSI portal on 127.0.0.1.
pub fn tgtd_args(control: u16, port: u16) -> Vec<String> {
    vec![
        "-f".into(),
        "-C".into(),
        control.to_string(),
        "--iscsi".into(),
        format!("portal=127.0.0.1:{port}"),
    ]
}

/// A number for tgtd's control socket (`-C`, at most 32767) that no
/// socket in /var/run/tgtd has yet.
pub fn tgtd_control_number() -> Result<u16, TargetError> {
    loop {
        let control = 10_000 + free_port()? % 22_768;
        if !Path::new(&format!("/var/run/tgtd/socket.{control}")).exists() {
            return Ok(control);
        }
    }
}

/// A tgtadm command line on control socket `control`.
pub fn tgtadm_argv(tgtadm: &Path, control: u16, args: &[&str]) -> Vec<String> {
    let mut argv = vec![
        tgtadm.display().to_string(),
        "-C".into(),
        control.to_string(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv
}

/// The tgtadm commands that set up the `tgt` target: target 1 named
/// `TGT_IQN`, LUN 1 on `image` with the rdwr backing store (LUN 0 is tgt's
/// controller), open to every initiator.
pub fn tgtadm_setup_args(tgtadm: &Path, control: u16, image: &Path) -> Vec<Vec<String>> {
    let image = image.display().to_string();
    [
        vec![
            "--lld", "iscsi", "--op", "new", "--mode", "target", "--tid", "1", "-T", TGT_IQN,
        ],
        vec![
            "--lld",
            "iscsi",
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "--bstype",
            "rdwr",
            "-b",
            &image,
        ],
        vec![
            "--lld", "iscsi", "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
        ],
    ]
    .iter()
    .map(|args| tgtadm_argv(tgtadm, control, args))
    .collect()
}

/// The tgtadm commands that stop tgtd (it ignores SIGTERM): offline, delete
/// the target (forcing its sessions out), delete the system.
pub fn tgtadm_stop_args(tgtadm: &Path, control: u16) -> Vec<Vec<String>> {
    [
        &[
            "--op", "update", "--mode", "sys", "--name", "State", "-v", "offline",
        ][..],
        &[
            "--lld", "iscsi", "--op", "delete", "--mode", "target", "--tid", "1", "--force",
        ],
        &["--op", "delete", "--mode", "system"],
    ]
    .iter()
    .map(|args| tgtadm_argv(tgtadm, control, args))
    .collect()
}

/// Starts tgtd as its users start it and sets up its target with tgtadm;
/// returns it and its iSCSI port. tgtd that cannot bind its portal (the
/// port taken since it was picked) listens on every address at 3260
/// instead, so the portal it reports is checked, before any LUN exists,
/// and another port tried.
pub(super) fn start_tgtd(
    tgtd: &Path,
    tgtadm: &Path,
    image: &Path,
    work: &Path,
) -> Result<(ServerProcess, u16), TargetError> {
    let mut last_error = None;
    for attempt in 1..=3 {
        let port = free_port()?;
        let control = tgtd_control_number()?;
        let mut cmd = Command::new(tgtd);
        cmd.args(tgtd_args(control, port));
        let mut server = ServerProcess::spawn_stopped_by(
            "tgtd",
            cmd,
            work.join(format!("tgtd-{attempt}.log")),
            tgtadm_stop_args(tgtadm, control),
            ["", ".lock"]
                .iter()
                .map(|suffix| PathBuf::from(format!("/var/run/tgtd/socket.{control}{suffix}")))
                .collect(),
        )?;
        let failed = |detail: String| TargetError::StartFailed {
            name: "tgtd".into(),
            detail,
        };
        let show_sys = tgtadm_argv(tgtadm, control, &["--op", "show", "--mode", "sys"]);
        let show_portals = tgtadm_argv(
            tgtadm,
            control,
            &["--lld", "iscsi", "--op", "show", "--mode", "portal"],
        );
        let result = wait_ready(&mut server, "answering tgtadm", || {
            run_tool(&show_sys).is_ok()
        })
        .and_then(|()| {
            let portals = run_tool(&show_portals).map_err(failed)?;
            if !portals.contains(&format!("127.0.0.1:{port},")) {
                return Err(failed(format!(
                    "its portal 127.0.0.1:{port} did not open (port taken?); it has: {}",
                    portals.trim()
                )));
            }
            for argv in tgtadm_setup_args(tgtadm, control, image) {
                run_tool(&argv).map_err(failed)?;
            }
            Ok(())
        })
        .and_then(|()| wait_listening(&mut server, port));
        match result {
            Ok(()) => return Ok((server, port)),
            Err(e) => {
                let _ = server.terminate();
                last_error = Some(e);
            }
        }
    }
    Err(last_error.unwrap_or(TargetError::StartFailed {
        name: "tgtd".into(),
        detail: "no attempt made".into(),
    }))
}
