//! The Linux kernel's iSCSI initiator (iscsi_tcp, driven by open-iscsi's
//! iscsid and iscsiadm) against Basalt's iSCSI target, inside a QEMU guest
//! (see the basalt-guest crate), in one boot: SendTargets discovery lists
//! the volume attached to the guest's initiator name, at the advertised
//! portal, and not a volume it is not attached to; a login with a wrong
//! CHAP secret is refused and makes no disk; a login with the secret
//! `basalt volume attach --chap` printed makes a SCSI disk of the volume's
//! size with 512-byte logical and 4096-byte physical blocks, which takes
//! ext4 and verified fio writes (4k and 64k); after a logout and a new
//! login, with CRC32C header and data digests this time, the file system
//! and fio's data read back unchanged; a resize on the host, asked of the
//! test through `host_call`, is seen after a rescan (the target's
//! CAPACITY DATA HAS CHANGED unit attention). A volume attached with
//! `--mutual-chap` takes a login in which the kernel checks the target's
//! answer too, and the kernel refuses a target that proves a wrong secret.
//! The guest kernel must log no I/O error and the server no warning.
//!
//! `iscsi_vs_nvme_fio_in_one_guest` (ignored: a measurement, not a check)
//! runs the same fio jobs over the kernel's iSCSI initiator and over its
//! NVMe/TCP initiator, on one volume, in one boot: QD1 mean and p99
//! latency, QD16 IOPS, and the iSCSI/NVMe ratios (BENCHMARKS.md). The
//! guest runs under TCG, so only the ratios mean something.
//!
//! Needs qemu-system-x86 and apt's package lists, like `guest_nbd.rs`.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use basalt_guest::{Forward, GuestConfig, HostCalls, FORWARD_IP};
use common::guest::*;
use common::*;

const VOLUME: &str = "kiscsi";
/// Attached with mutual CHAP.
const MUTUAL: &str = "kiscsi-mutual";
const MUTUAL_SIZE: u64 = 16 * MIB;
/// A volume the guest is not attached to: discovery must not list it.
const OTHER: &str = "kiscsi-other";
const VOLUME_SIZE: u64 = 256 * MIB;
/// The size `host_call resize` gives the volume while the guest is logged in.
const RESIZED: u64 = 384 * MIB;
/// Port the guest reaches the target at (what the server advertises).
const GUEST_ISCSI_PORT: u16 = 3260;
/// Port of the test's `host_call` listener in the guest.
const GUEST_CALL_PORT: u16 = 7000;
/// The guest's initiator name (/etc/iscsi/initiatorname.iscsi).
const INITIATOR: &str = "iqn.2026-11.io.test:guest-kernel";
/// ext4 takes the first 64 MiB; fio's regions lie after it, so both can be
/// checked again after the second login.
const FS_SIZE: u64 = 64 * MIB;
const FIO_REGION: u64 = 8 * MIB;
const FIO_4K_OFFSET: u64 = 64 * MIB;
const FIO_64K_OFFSET: u64 = 96 * MIB;

/// The CHAP credentials `basalt volume attach` printed.
struct Chap {
    user: String,
    secret: String,
    /// Mutual CHAP: what the target proves to the initiator.
    target_user: Option<String>,
    target_secret: Option<String>,
}

fn chap(attached: &serde_json::Value) -> Chap {
    let field = |k: &str| attached[k].as_str().map(str::to_string);
    Chap {
        user: field("chap_username").expect("chap_username"),
        secret: field("chap_password").expect("chap_password"),
        target_user: field("chap_username_in"),
        target_secret: field("chap_password_in"),
    }
}

/// Shell functions for the iSCSI side of a script, for `volume`'s target:
/// sets T (its IQN) and P (the guest-side portal); `node` runs iscsiadm on
/// the node record of $T at $P; `find_disk` finds the SCSI disk of the
/// (one) iSCSI session (sets DISK): there is no udev (so no
/// /dev/disk/by-path), but sysfs links the session to its block device and
/// devtmpfs makes /dev/$DISK; `login` / `logout` log in / out and wait for
/// the disk to appear / go.
fn iscsi_functions(volume: &str) -> String {
    format!(
        r#"T={target} P={FORWARD_IP}:{GUEST_ISCSI_PORT}
node() {{ iscsiadm -m node -T $T -p $P "$@"; }}
find_disk() {{
    local d
    DISK=
    for d in /sys/class/iscsi_session/session*/device/target*/*:*:*:*/block/sd*; do
        [ -e "$d" ] && DISK=${{d##*/}}
    done
    [ -n "$DISK" ] && [ -b /dev/$DISK ]
}}
no_disk() {{ ! find_disk; }}
login() {{ node --login; wait_until 100 find_disk; echo "disk: $DISK"; }}
logout() {{ node --logout; wait_until 100 no_disk; }}
"#,
        target = basalt_volume::iscsi_target_name(volume),
    )
}

fn guest_script(chap: &Chap, mutual: &Chap) -> String {
    format!(
        r#"{SH_PRELUDE}
{host_call}
{iscsi}
set_chap() {{
    node -o update -n node.session.auth.authmethod -v CHAP
    node -o update -n node.session.auth.username -v "$1"
    node -o update -n node.session.auth.password -v "$2"
}}
# Moves the kernel log so far to the console, each line after PREFIX (the
# console shows only warnings: loglevel=4), for the test to check.
kmsg() {{ dmesg -c | sed "s/^/$1 /"; }}
# One fio job of verified random writes on the raw disk: NAME BS OFFSET
# [more options]; with --verify_only it checks what the same job wrote.
fio_job() {{
    local name=$1 bs=$2 offset=$3
    shift 3
    fio --name=$name --filename=/dev/$DISK --ioengine=libaio --direct=1 \
        --rw=randwrite --bs=$bs --iodepth=8 --offset=$offset --size={fio_region} \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 "$@"
}}

# --- iscsid, with the guest's initiator name
step iscsid
{iscsid}

# --- discovery: the attached volumes, at the advertised portal, only
step discovery
iscsiadm -m discovery -t sendtargets -p $P | tee /tmp/disc
grep -q "^$P,1 $T\$" /tmp/disc
grep -q "^$P,1 {mutual_target}\$" /tmp/disc
test "$(wc -l < /tmp/disc)" -eq 2
if grep -q "{other_target}" /tmp/disc; then echo "discovered a volume not attached"; exit 1; fi

# --- a wrong CHAP secret: the target refuses the login (iscsiadm's exit
# status 24 is "authorization failure"), no disk appears
step wrong secret
kmsg KMSG
set_chap {user} wrong-secret-0123
rc=0
node --login || rc=$?
echo "WRONG-SECRET-RC $rc"
test $rc -eq 24
no_disk
kmsg KMSG-REFUSED
if iscsiadm -m session; then echo "a session exists after a refused login"; exit 1; fi

# --- the right secret: a disk of the volume's size, 512e
step login
set_chap {user} {secret}
login
iscsiadm -m session -P 3
echo "SIZE-SECTORS $(cat /sys/block/$DISK/size)"
echo "BLOCK-SIZES $(cat /sys/block/$DISK/queue/logical_block_size) $(cat /sys/block/$DISK/queue/physical_block_size)"
echo "MODEL $(cat /sys/block/$DISK/device/vendor) $(cat /sys/block/$DISK/device/model)"
test "$(cat /sys/block/$DISK/size)" -eq {sectors}
test "$(cat /sys/block/$DISK/queue/logical_block_size)" -eq 512
test "$(cat /sys/block/$DISK/queue/physical_block_size)" -eq 4096

# --- ext4 on the first {fs_mib} MiB, files with known content
step mkfs and files
mkfs.ext4 -q -F -b 4096 /dev/$DISK {fs_blocks}
mkdir -p /mnt/v
mount -t ext4 /dev/$DISK /mnt/v
dd if=/dev/urandom of=/mnt/v/big bs=1M count=8
dd if=/dev/urandom of=/mnt/v/odd bs=1000 count=77
(cd /mnt/v && find . -type f | sort | xargs sha256sum) > /root/sums
umount /mnt/v
fsck.ext4 -fn /dev/$DISK

# --- fio on the raw disk after the file system: verified random writes
step fio 4k
fio_job rand4k 4k {fio_4k}
step fio 64k
fio_job rand64k 64k {fio_64k}

# --- log out and in again, with CRC32C digests on every PDU: what is
# read now comes from the target
step logout and login with digests
logout
echo 3 > /proc/sys/vm/drop_caches
node -o update -n 'node.conn[0].iscsi.HeaderDigest' -v CRC32C
node -o update -n 'node.conn[0].iscsi.DataDigest' -v CRC32C
login
iscsiadm -m session -P 3 | grep -E '(Header|Data)Digest:' | sed 's/^[[:space:]]*/DIGEST /'
fsck.ext4 -fn /dev/$DISK
mount -t ext4 /dev/$DISK /mnt/v
(cd /mnt/v && sha256sum -c /root/sums)
umount /mnt/v
step fio verify only
fio_job rand4k 4k {fio_4k} --verify_only
fio_job rand64k 64k {fio_64k} --verify_only

# --- resize on the host; a rescan shows the new size
step resize
host_call resize {resized_mib}M
iscsiadm -m session --rescan
resized() {{ [ "$(cat /sys/block/$DISK/size)" -eq {resized_sectors} ]; }}
wait_until 100 resized
echo "RESIZED-SECTORS $(cat /sys/block/$DISK/size)"
dd if=/dev/urandom of=/tmp/tail bs=1M count=1
dd if=/tmp/tail of=/dev/$DISK bs=1M seek={tail_seek} oflag=direct conv=fsync
dd if=/dev/$DISK of=/tmp/tail.back bs=1M skip={tail_seek} count=1 iflag=direct
cmp /tmp/tail /tmp/tail.back

logout

# --- mutual CHAP: the kernel refuses a target that proves a wrong secret,
# and logs in when it proves the one it was given
step mutual chap
T={mutual_target}
set_chap {m_user} {m_secret}
node -o update -n node.session.auth.username_in -v {m_target_user}
node -o update -n node.session.auth.password_in -v wrong-target-secret
kmsg KMSG
rc=0
node --login || rc=$?
echo "WRONG-TARGET-SECRET-RC $rc"
test $rc -ne 0
no_disk
kmsg KMSG-REFUSED
node -o update -n node.session.auth.password_in -v {m_target_secret}
login
test "$(cat /sys/block/$DISK/size)" -eq {mutual_sectors}
dd if=/dev/urandom of=/tmp/m bs=64k count=16
dd if=/tmp/m of=/dev/$DISK bs=64k oflag=direct conv=fsync
dd if=/dev/$DISK of=/tmp/m.back bs=64k count=16 iflag=direct
cmp /tmp/m /tmp/m.back
logout
if iscsiadm -m session; then echo "a session is left"; exit 1; fi
kmsg KMSG
step done
echo guest-iscsi-done
"#,
        host_call = HostCalls::shell_function(GUEST_CALL_PORT),
        iscsi = iscsi_functions(VOLUME),
        iscsid = iscsid_start(INITIATOR),
        user = chap.user,
        secret = chap.secret,
        mutual_target = basalt_volume::iscsi_target_name(MUTUAL),
        other_target = basalt_volume::iscsi_target_name(OTHER),
        m_user = mutual.user,
        m_secret = mutual.secret,
        m_target_user = mutual.target_user.as_deref().expect("chap_username_in"),
        m_target_secret = mutual.target_secret.as_deref().expect("chap_password_in"),
        mutual_sectors = MUTUAL_SIZE / 512,
        sectors = VOLUME_SIZE / 512,
        fs_mib = FS_SIZE / MIB,
        fs_blocks = FS_SIZE / 4096,
        fio_region = FIO_REGION,
        fio_4k = FIO_4K_OFFSET,
        fio_64k = FIO_64K_OFFSET,
        resized_mib = RESIZED / MIB,
        resized_sectors = RESIZED / 512,
        tail_seek = RESIZED / MIB - 1,
    )
}

/// `host_call resize SIZE` resizes the volume with the CLI.
fn resize_calls(data_dir: PathBuf) -> HostCalls {
    HostCalls::start(move |req| {
        let Some(size) = req.strip_prefix("resize ") else {
            return Err(format!("unknown request {req:?}"));
        };
        let out = cli_in(&data_dir, &["volume", "resize", VOLUME, "--size", size]);
        if out.code() == Some(0) {
            Ok(out.stdout.trim().to_string())
        } else {
            Err(out.describe())
        }
    })
    .expect("host call listener")
}

#[test]
fn kernel_iscsi_initiator_chap_ext4_fio_resize() {
    require_tool("qemu-system-x86_64");
    // The target must advertise the guest-side portal: iscsiadm logs in to
    // the address SendTargets reports.
    let advertise = format!("{FORWARD_IP}:{GUEST_ISCSI_PORT}");
    let s = Server::start_with("1G", &["--iscsi-advertise", &advertise]);
    s.create_volume(VOLUME, "256M");
    s.create_volume(MUTUAL, "16M");
    s.create_volume(OTHER, "16M");
    let attached = s.cli_json(&[
        "volume",
        "attach",
        VOLUME,
        "--initiator-iqn",
        INITIATOR,
        "--chap",
    ]);
    assert_eq!(
        attached["target_iqn"],
        basalt_volume::iscsi_target_name(VOLUME),
        "{attached}"
    );
    let one_way = chap(&attached);
    assert!(one_way.target_secret.is_none(), "{attached}");
    let mutual = chap(&s.cli_json(&[
        "volume",
        "attach",
        MUTUAL,
        "--initiator-iqn",
        INITIATOR,
        "--mutual-chap",
    ]));

    let calls = resize_calls(s.data_dir().to_path_buf());
    let config = GuestConfig {
        forwards: vec![
            Forward::new(GUEST_ISCSI_PORT, s.iscsi_listen_addr()),
            calls.forward(GUEST_CALL_PORT),
        ],
        memory_mib: 512,
        timeout: Duration::from_secs(600),
        ..GuestConfig::default()
    };
    let run = boot_ok(config, &guest_script(&one_way, &mutual), "guest-iscsi-done");

    // No I/O errors, SCSI errors, error handling, connection errors or
    // oopses in the guest kernel's log. During a refused login the
    // connection may end with the kernel seeing the TCP connection close
    // (1020, ISCSI_ERR_TCP_CONN_CLOSE: whichever side closes first), and
    // with nothing else.
    let kmsg = console_values(&run, "KMSG ");
    let refused = console_values(&run, "KMSG-REFUSED ");
    assert!(kmsg.len() > 100, "no kernel log:\n{}", run.console_tail(40));
    let bad = [
        "I/O error",
        "Call Trace",
        "Sense Key",
        "timed out",
        "abort",
        "error handler",
        "conn error",
    ];
    let found: Vec<&String> = kmsg
        .iter()
        .filter(|l| bad.iter().any(|b| l.contains(b)))
        .chain(refused.iter().filter(|l| {
            bad.iter().any(|b| l.contains(b)) && !l.contains("detected conn error (1020)")
        }))
        .collect();
    assert!(found.is_empty(), "guest kernel reported: {found:#?}");
    // The target told the kernel about the resize with a unit attention.
    assert!(
        kmsg.iter().any(|l| l.contains("Capacity data has changed")),
        "no CAPACITY DATA HAS CHANGED in the guest's kernel log: {kmsg:#?}"
    );
    assert_eq!(console_value(&run, "WRONG-SECRET-RC "), "24");
    // 19: "non-retryable login failure", the kernel's verdict on a target
    // that answered the challenge with a wrong secret.
    assert_eq!(console_value(&run, "WRONG-TARGET-SECRET-RC "), "19");
    assert_eq!(
        console_values(&run, "DIGEST "),
        ["HeaderDigest: CRC32C", "DataDigest: CRC32C"]
    );
    assert_eq!(
        console_value(&run, "SIZE-SECTORS "),
        (VOLUME_SIZE / 512).to_string()
    );
    assert_eq!(console_value(&run, "BLOCK-SIZES "), "512 4096");
    // The resize was the host's, and the guest saw exactly it.
    let done = calls.calls();
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(done[0].answer.is_ok(), "{done:?}");
    assert_eq!(
        console_value(&run, "RESIZED-SECTORS "),
        (RESIZED / 512).to_string()
    );
    let vol = s.cli_json(&["volume", "show", VOLUME]);
    assert_eq!(volume_size(&vol), RESIZED, "{vol}");

    let log = s.log();
    // The refused login was the target's CHAP check: status 0x0201,
    // "authentication failure".
    assert!(
        log.lines()
            .any(|l| l.contains("iSCSI login failed") && l.contains("status 0x0201")),
        "the server did not log refusing the wrong CHAP secret:\n{log}"
    );
    // Two sessions with the volume, one with the mutual-CHAP one (the
    // refused logins made none), one discovery.
    let sessions = |volume: &str| {
        let target = format!(
            "target=Some(\"{}\")",
            basalt_volume::iscsi_target_name(volume)
        );
        log.lines()
            .filter(|l| l.contains(" iSCSI login peer=") && l.contains(&target))
            .count()
    };
    assert_eq!(sessions(VOLUME), 2, "two logins to {VOLUME}:\n{log}");
    assert_eq!(sessions(MUTUAL), 1, "one login to {MUTUAL}:\n{log}");
    assert_eq!(
        log.matches("session_type=Discovery").count(),
        1,
        "one discovery:\n{log}"
    );
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| {
            (l.contains(" WARN ") || l.contains(" ERROR "))
                // The harness serves NBD over TCP for its other clients.
                && !l.contains("--nbd-insecure")
        })
        .collect();
    assert!(
        warnings.is_empty(),
        "server warnings:\n{}",
        warnings.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Measurement: iSCSI vs NVMe/TCP through the kernel's initiators.

/// Port the guest reaches the NVMe/TCP target at (benchmark).
const GUEST_NVME_PORT: u16 = 4420;
/// The guest's host NQN and host ID (allowed with --nvme-allow-host).
const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:3d2c1b0a-9f8e-4d7c-8b6a-5f4e3d2c1b0a";
const HOST_ID: &str = "3d2c1b0a-9f8e-4d7c-8b6a-5f4e3d2c1b0a";
/// Seconds each fio job runs.
const BENCH_SECONDS: u32 = 10;
/// The region the benchmark reads and writes (written once first, so that
/// reads hit allocated extents on both protocols).
const BENCH_REGION: u64 = 64 * MIB;
/// The fio jobs, in the order each protocol runs them: (name, rw, iodepth).
const BENCH_JOBS: [(&str, &str, u32); 4] = [
    ("qd1-randwrite", "randwrite", 1),
    ("qd1-randread", "randread", 1),
    ("qd16-randread", "randread", 16),
    ("qd16-randwrite", "randwrite", 16),
];

fn bench_script() -> String {
    let jobs = |protocol: &str, dev: &str| -> String {
        BENCH_JOBS
            .iter()
            .map(|&(name, rw, iodepth)| {
                let label = format!("{protocol}-{name}");
                fio_json_job(&label, dev, rw, iodepth, BENCH_REGION, BENCH_SECONDS)
            })
            .collect()
    };
    format!(
        r#"{SH_PRELUDE}
{iscsi}
step iscsid
{iscsid}
step iSCSI login, no CHAP, no digests
iscsiadm -m discovery -t sendtargets -p $P
node -o update -n 'node.conn[0].iscsi.HeaderDigest' -v None
node -o update -n 'node.conn[0].iscsi.DataDigest' -v None
login
iscsiadm -m session -P 3 | grep -E '(Header|Data)Digest:' | sed 's/^[[:space:]]*/DIGEST /'
step prefill
dd if=/dev/urandom of=/dev/$DISK bs=1M count={region_mib} oflag=direct
{iscsi_jobs}logout
# The NVMe side's functions (its T replaces the iSCSI side's from here on).
{nvme}
step NVMe/TCP connect, one I/O queue, no digests
nvme connect $T -n $SUB --hostnqn {host} --hostid {host_id} --nr-io-queues=1
wait_ns
{nvme_jobs}nvme disconnect -n $SUB
wait_no_ns
step done
echo guest-bench-done
"#,
        iscsi = iscsi_functions(VOLUME),
        iscsid = iscsid_start(INITIATOR),
        region_mib = BENCH_REGION / MIB,
        iscsi_jobs = jobs("iscsi", "/dev/$DISK"),
        nvme = nvme_functions(VOLUME, GUEST_NVME_PORT),
        host = HOST_NQN,
        host_id = HOST_ID,
        nvme_jobs = jobs("nvme", "/dev/$NS"),
    )
}

#[test]
#[ignore = "measurement (about 2 minutes of guest time); run by hand for BENCHMARKS.md"]
fn iscsi_vs_nvme_fio_in_one_guest() {
    require_tool("qemu-system-x86_64");
    // Both targets advertise the guest-side addresses.
    let iscsi = format!("{FORWARD_IP}:{GUEST_ISCSI_PORT}");
    let nvme = format!("{FORWARD_IP}:{GUEST_NVME_PORT}");
    let s = Server::start_with(
        "1G",
        &[
            "--iscsi-advertise",
            &iscsi,
            "--nvme-advertise",
            &nvme,
            "--nvme-allow-host",
            HOST_NQN,
        ],
    );
    s.create_volume(VOLUME, "256M");
    s.cli_json(&["volume", "attach", VOLUME, "--initiator-iqn", INITIATOR]);
    let config = GuestConfig {
        forwards: vec![
            Forward::new(GUEST_ISCSI_PORT, s.iscsi_listen_addr()),
            Forward::new(GUEST_NVME_PORT, s.nvme_addr()),
        ],
        memory_mib: 512,
        timeout: Duration::from_secs(600),
        ..GuestConfig::default()
    };
    let run = boot_ok(config, &bench_script(), "guest-bench-done");
    assert_eq!(
        console_values(&run, "DIGEST "),
        ["HeaderDigest: None", "DataDigest: None"]
    );

    println!(
        "fio 4k, libaio, direct=1, {BENCH_SECONDS} s each, {} MiB region, one vCPU under TCG",
        BENCH_REGION / MIB
    );
    println!(
        "{:<26} {:>10} {:>10} {:>11}",
        "job", "iSCSI", "NVMe/TCP", "iSCSI/NVMe"
    );
    let row = |what: &str, iscsi: f64, nvme: f64| {
        println!(
            "{what:<26} {iscsi:>10.0} {nvme:>10.0} {:>11.2}",
            iscsi / nvme
        );
    };
    for (name, rw, iodepth) in BENCH_JOBS {
        let write = rw == "randwrite";
        let i = fio_result(&run, &format!("iscsi-{name}"), write);
        let n = fio_result(&run, &format!("nvme-{name}"), write);
        if iodepth == 1 {
            row(
                &format!("{rw} QD1 mean lat µs"),
                i.lat_mean_us,
                n.lat_mean_us,
            );
            row(&format!("{rw} QD1 p99 lat µs"), i.lat_p99_us, n.lat_p99_us);
        } else {
            row(&format!("{rw} QD{iodepth} IOPS"), i.iops, n.iops);
        }
    }
}

#[test]
fn fio_json_figures_are_read_from_the_right_places() {
    // The shape of fio 3.33's --output-format=json with --lat_percentiles=1.
    let side = |iops: f64, mean: f64, p99: u64| {
        serde_json::json!({
            "iops": iops,
            "clat_ns": { "mean": 1.0 },
            "lat_ns": { "mean": mean, "percentile": { "50.000000": 1, "99.000000": p99 } },
        })
    };
    let text = serde_json::json!({
        "fio version": "fio-3.33",
        "jobs": [{ "jobname": "x", "error": 0,
                   "read": side(812.5, 1_230_000.0, 2_900_000),
                   "write": side(97.0, 10_300_000.0, 21_000_000) }],
    })
    .to_string();
    let r = parse_fio_json(&text, false).unwrap();
    assert_eq!(
        (r.iops, r.lat_mean_us, r.lat_p99_us),
        (812.5, 1230.0, 2900.0)
    );
    let w = parse_fio_json(&text, true).unwrap();
    assert_eq!(
        (w.iops, w.lat_mean_us, w.lat_p99_us),
        (97.0, 10300.0, 21000.0)
    );
    let failed = text.replace("\"error\":0", "\"error\":5");
    assert!(parse_fio_json(&failed, false).is_err());
}
