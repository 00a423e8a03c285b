//! The Linux kernel's NVMe/TCP initiator (nvme-tcp with nvme-cli) against
//! Basalt's NVMe/TCP target, inside a QEMU guest (see the basalt-guest
//! crate), in one boot: discovery lists the volume for the allowed host
//! and nothing for another host, whose Connect is refused; ext4 on the
//! namespace across a disconnect and reconnect; fio with verification on
//! the raw namespace; NUSE counts allocated blocks; `nvme reset` (CC.EN
//! 1 -> 0, then a new controller) keeps the data; a resize while connected
//! that the guest notices (the target's Namespace Attribute Changed event
//! makes the kernel rescan), asked of the test through `host_call`; and the
//! host reads back over NBD what the guest wrote over NVMe/TCP. The guest
//! kernel must log no I/O error and the server no warning.
//!
//! `nvme_vs_nbd_fio_in_one_guest` (ignored: a measurement, not a check)
//! runs the same small fio jobs over the kernel's NVMe/TCP initiator and
//! over its NBD client in one boot and prints IOPS, mean latency and the
//! NVMe/NBD ratios (BENCHMARKS.md). The guest runs under TCG, so only the
//! ratios mean something.
//!
//! Needs qemu-system-x86 and apt's package lists, like `guest_nbd.rs`.

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use basalt_guest::{Forward, GuestConfig, GuestRun, HostCalls, FORWARD_IP};
use common::guest::*;
use common::*;

const VOLUME: &str = "knvme";
const VOLUME_SIZE: u64 = 256 * MIB;
/// The size `host_call resize` gives the volume while the guest is connected.
const RESIZED: u64 = 384 * MIB;
/// Port the guest reaches the target at (what the server advertises).
const GUEST_NVME_PORT: u16 = 4420;
/// Port the guest reaches the server's NBD listener at (benchmark).
const GUEST_NBD_PORT: u16 = 10809;
/// Port of the test's `host_call` listener in the guest.
const GUEST_CALL_PORT: u16 = 7000;
/// The guest's host NQN and host ID (allowed with --nvme-allow-host).
const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6b1e5a3c-0d4f-4e9a-9b7e-2f1c3d4e5f60";
const HOST_ID: &str = "6b1e5a3c-0d4f-4e9a-9b7e-2f1c3d4e5f60";
/// A host NQN that is neither allowed nor attached (its own host ID, so
/// the kernel does not refuse it for reusing the first host's).
const OTHER_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0c2a9d6e-5b1f-4f3e-8a7d-1e2f3a4b5c6d";
const OTHER_ID: &str = "0c2a9d6e-5b1f-4f3e-8a7d-1e2f3a4b5c6d";
/// fio: two jobs, each on its own 12 MiB region.
const FIO_REGION: u64 = 12 * MIB;
const FIO_STRIDE: u64 = 32 * MIB;
/// Where the guest writes a random blob for the host to read back.
const BLOB_OFFSET: u64 = 200 * MIB;
const BLOB_LEN: u64 = 4 * MIB;

fn guest_script() -> String {
    format!(
        r#"{SH_PRELUDE}
{nvme}
{host_call}
H={host} HID={host_id} H2={other} H2ID={other_id}
connect() {{ nvme connect $T -n $SUB --hostnqn $H --hostid $HID; wait_ns; }}
disconnect() {{ nvme disconnect -n $SUB; wait_no_ns; }}

# --- discovery: the allowed host sees the volume, another host nothing
step discovery
nvme discover $T --hostnqn $H --hostid $HID | tee /tmp/disc
grep -q "subnqn: *$SUB\$" /tmp/disc
grep -q "traddr: *{ip}\$" /tmp/disc
grep -q "trsvcid: *{port}\$" /tmp/disc
nvme discover $T --hostnqn $H2 --hostid $H2ID | tee /tmp/disc2
grep -q "Number of Records 0" /tmp/disc2
if grep -q "$SUB" /tmp/disc2; then echo "$H2 discovered $SUB"; exit 1; fi

# --- the other host's Connect is refused
step refused connect
if nvme connect $T -n $SUB --hostnqn $H2 --hostid $H2ID; then
    echo "connect as $H2 succeeded"; exit 1
fi
if nvme_ns; then echo "a namespace appeared for $H2: $NS"; exit 1; fi
echo REFUSED-OK

# --- connect, check the size, format
step connect and mkfs
connect
nvme list | tee /tmp/list
grep -q "Basalt volume" /tmp/list
test "$(cat /sys/block/$NS/size)" -eq {sectors}
mkfs.ext4 -q -F -b 4096 /dev/$NS
mkdir -p /mnt/v
mount -t ext4 /dev/$NS /mnt/v

# --- files with known content
step write files
dd if=/dev/urandom of=/mnt/v/big bs=1M count=16
dd if=/dev/urandom of=/mnt/v/odd bs=1000 count=77
mkdir /mnt/v/dir
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
    dd if=/dev/urandom of=/mnt/v/dir/f$i bs=4096 count=$i 2>/dev/null
done
(cd /mnt/v && find . -type f | sort | xargs sha256sum) > /root/sums
cat /root/sums
sync
umount /mnt/v
fsck.ext4 -fn /dev/$NS

# --- disconnect, reconnect: what is read now comes from the target
step disconnect, reconnect and verify files
disconnect
echo 3 > /proc/sys/vm/drop_caches
connect
fsck.ext4 -fn /dev/$NS
mount -t ext4 /dev/$NS /mnt/v
(cd /mnt/v && sha256sum -c /root/sums)
test "$(cd /mnt/v && find . -type f | wc -l)" -eq 14
umount /mnt/v

# --- fio on the raw namespace: two jobs, queue depth 8, O_DIRECT, verified
step fio random 4k, verified
cd /tmp
fio --name=kernel-nvme --filename=/dev/$NS --ioengine=libaio --direct=1 \
    --rw=randwrite --bs=4k --iodepth=8 --numjobs=2 \
    --size={fio_region} --offset_increment={fio_stride} \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    --group_reporting
step fio sequential 64k, verified
fio --name=kernel-nvme-seq --filename=/dev/$NS --ioengine=libaio --direct=1 \
    --rw=write --bs=64k --iodepth=8 --numjobs=2 \
    --size={fio_region} --offset_increment={fio_stride} \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    --group_reporting

# Identify Namespace's NUSE counts allocated blocks (thin provisioning).
echo "NUSE $(nvme id-ns /dev/$NS | awk '$1 == "nuse" {{print $3}}')"

# --- a blob for the host to read back (over NBD)
step blob for the host
dd if=/dev/urandom of=/tmp/blob bs=1M count={blob_mib}
echo "BLOB-SHA256 $(sha256sum /tmp/blob | cut -d' ' -f1)"
dd if=/tmp/blob of=/dev/$NS bs=1M seek={blob_seek} oflag=direct conv=fsync

# --- a controller reset (the kernel clears CC.EN, then connects anew):
# the namespace stays and reads what was written before
step controller reset
for c in /sys/class/nvme/nvme*; do
    [ "$(cat $c/subsysnqn)" = "$SUB" ] && CTRL=${{c##*/}}
done
nvme reset /dev/$CTRL
live() {{ [ "$(cat /sys/class/nvme/$CTRL/state)" = live ]; }}
wait_until 100 live
dd if=/dev/$NS of=/tmp/blob.back bs=1M skip={blob_seek} count={blob_mib} iflag=direct
cmp /tmp/blob /tmp/blob.back
echo RESET-OK

# --- resize while connected: the kernel rescans on the target's event
step resize
host_call resize {resized_mib}M
resized() {{ [ "$(cat /sys/block/$NS/size)" -eq {resized_sectors} ]; }}
wait_until 100 resized
echo "RESIZED-SECTORS $(cat /sys/block/$NS/size)"
dd if=/dev/urandom of=/tmp/tail bs=1M count=1
dd if=/tmp/tail of=/dev/$NS bs=1M seek={tail_seek} oflag=direct conv=fsync
dd if=/dev/$NS of=/tmp/tail.back bs=1M skip={tail_seek} count=1 iflag=direct
cmp /tmp/tail /tmp/tail.back

# --- after a disconnect and reconnect the blob and the new size are there
step final reconnect
disconnect
connect
test "$(cat /sys/block/$NS/size)" -eq {resized_sectors}
dd if=/dev/$NS of=/tmp/blob.back bs=1M skip={blob_seek} count={blob_mib} iflag=direct
cmp /tmp/blob /tmp/blob.back
disconnect
step done
echo guest-nvme-done
"#,
        nvme = nvme_functions(VOLUME, GUEST_NVME_PORT),
        host_call = HostCalls::shell_function(GUEST_CALL_PORT),
        host = HOST_NQN,
        host_id = HOST_ID,
        other = OTHER_NQN,
        other_id = OTHER_ID,
        ip = FORWARD_IP,
        port = GUEST_NVME_PORT,
        sectors = VOLUME_SIZE / 512,
        resized_mib = RESIZED / MIB,
        resized_sectors = RESIZED / 512,
        tail_seek = RESIZED / MIB - 1,
        fio_region = FIO_REGION,
        fio_stride = FIO_STRIDE,
        blob_mib = BLOB_LEN / MIB,
        blob_seek = BLOB_OFFSET / MIB,
    )
}

/// A server whose NVMe/TCP target advertises the guest-side address and
/// allows the guest's host NQN, with the test volume.
fn start_server() -> Server {
    let advertise = format!("{FORWARD_IP}:{GUEST_NVME_PORT}");
    let s = Server::start_with(
        "1G",
        &[
            "--nvme-advertise",
            &advertise,
            "--nvme-allow-host",
            HOST_NQN,
        ],
    );
    s.create_volume(VOLUME, "256M");
    s
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
fn kernel_nvme_tcp_initiator_ext4_fio_resize() {
    require_tool("qemu-system-x86_64");
    let s = start_server();
    let calls = resize_calls(s.data_dir().to_path_buf());
    let config = GuestConfig {
        forwards: vec![
            Forward::new(GUEST_NVME_PORT, s.nvme_addr()),
            calls.forward(GUEST_CALL_PORT),
        ],
        memory_mib: 512,
        timeout: Duration::from_secs(600),
        ..GuestConfig::default()
    };
    let run = boot_ok(config, &guest_script(), "guest-nvme-done");

    // No I/O errors, timeouts or oopses in the guest kernel's log.
    for bad in ["I/O error", "timeout", "Call Trace"] {
        assert!(
            !run.console_log
                .lines()
                .any(|l| l.starts_with('[') && l.contains(bad)),
            "guest kernel reported {bad:?}:\n{}",
            run.console_log
        );
    }
    assert!(run.console_log.contains("RESET-OK"));
    // The refusal came from the target, for the right reason.
    assert!(run.console_log.contains("REFUSED-OK"));
    let log = s.log();
    assert!(
        log.lines()
            .any(|l| l.contains("host not allowed") && l.contains(OTHER_NQN)),
        "the server did not log refusing {OTHER_NQN}:\n{log}"
    );
    // The resize was the host's, and the guest saw exactly it.
    let done = calls.calls();
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(done[0].answer.is_ok(), "{done:?}");
    assert_eq!(
        console_value(&run, "RESIZED-SECTORS "),
        (RESIZED / 512).to_string()
    );
    let nuse = console_value(&run, "NUSE ");
    let nuse = u64::from_str_radix(nuse.trim_start_matches("0x"), 16)
        .unwrap_or_else(|e| panic!("NUSE {nuse:?}: {e}"));
    assert!(
        (2 * FIO_REGION / 4096..VOLUME_SIZE / 4096).contains(&nuse),
        "NUSE {nuse} blocks after fio wrote {} blocks of {}",
        2 * FIO_REGION / 4096,
        VOLUME_SIZE / 4096
    );
    let vol = s.cli_json(&["volume", "show", VOLUME]);
    assert_eq!(volume_size(&vol), RESIZED, "{vol}");
    // Nothing else went wrong on the target's side.
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| {
            (l.contains(" WARN ") || l.contains(" ERROR "))
                && !l.contains("host not allowed")
                // The harness serves NBD over TCP for its other clients.
                && !l.contains("--nbd-insecure")
        })
        .collect();
    assert!(
        warnings.is_empty(),
        "server warnings:\n{}",
        warnings.join("\n")
    );
    // `nvme reset` reached the target as a CC.EN 1 -> 0 write.
    assert!(
        log.contains("NVMe controller reset (CC.EN cleared)"),
        "no controller reset in the server log:\n{log}"
    );
    // Every controller the guest made is gone after its disconnects.
    let removed = log.matches("NVMe controller removed").count();
    let created = log.matches("NVMe controller created").count();
    assert!(
        created >= 5,
        "discovery x2, 3 connects and a reset, got {created}"
    );
    assert_eq!(created, removed, "controllers left behind:\n{log}");

    // --- the host's view (over NBD) of what the guest wrote over NVMe/TCP
    let want = console_value(&run, "BLOB-SHA256 ");
    let dir = Scratch::new();
    let copy = dir.path("volume.raw");
    tool("nbdcopy", [s.uri(VOLUME).as_str(), copy.to_str().unwrap()]).ok();
    let f = std::fs::File::open(&copy).unwrap();
    assert_eq!(f.metadata().unwrap().len(), RESIZED);
    let mut blob = vec![0u8; BLOB_LEN as usize];
    f.read_exact_at(&mut blob, BLOB_OFFSET).unwrap();
    assert_eq!(
        sha256_hex(&blob, &dir),
        want,
        "the blob the guest wrote through NVMe/TCP reads back differently on the host"
    );
}

// ---------------------------------------------------------------------------
// Measurement: NVMe/TCP vs NBD through the kernel's initiators.

/// Seconds each fio job runs.
const BENCH_SECONDS: u32 = 10;
/// The region the benchmark reads and writes (written once first, so that
/// reads hit allocated extents on both protocols).
const BENCH_REGION: u64 = 64 * MIB;

fn bench_script() -> String {
    let fio = |label: &str, dev: &str, rw: &str| {
        format!(
            "step {label}\n\
             fio --name={label} --filename={dev} --ioengine=libaio --direct=1 \
             --rw={rw} --bs=4k --iodepth=16 --numjobs=1 --size={region} \
             --time_based --runtime={BENCH_SECONDS} --norandommap --minimal > /tmp/{label}.terse\n\
             echo \"FIO-TERSE {label} $(cat /tmp/{label}.terse)\"\n",
            region = BENCH_REGION
        )
    };
    format!(
        r#"{SH_PRELUDE}
{nvme}
H={host} HID={host_id}
nvme connect $T -n $SUB --hostnqn $H --hostid $HID
wait_ns
step prefill
dd if=/dev/urandom of=/dev/$NS bs=1M count={region_mib} oflag=direct
{nvme_read}{nvme_write}nvme disconnect -n $SUB
wait_no_ns
nbd-client {ip} {nbd_port} /dev/nbd0 -N {volume} -b 4096
{nbd_read}{nbd_write}nbd-client -d /dev/nbd0
step done
echo guest-bench-done
"#,
        nvme = nvme_functions(VOLUME, GUEST_NVME_PORT),
        host = HOST_NQN,
        host_id = HOST_ID,
        region_mib = BENCH_REGION / MIB,
        nvme_read = fio("nvme-randread", "/dev/$NS", "randread"),
        nvme_write = fio("nvme-randwrite", "/dev/$NS", "randwrite"),
        nbd_read = fio("nbd-randread", "/dev/nbd0", "randread"),
        nbd_write = fio("nbd-randwrite", "/dev/nbd0", "randwrite"),
        ip = FORWARD_IP,
        nbd_port = GUEST_NBD_PORT,
        volume = VOLUME,
    )
}

/// IOPS and mean total latency (µs) of the read or write side of a fio
/// `--minimal` (terse v3) line.
fn terse_figures(line: &str, write: bool) -> (f64, f64) {
    let f: Vec<&str> = line.split(';').collect();
    assert!(
        f.len() > 90 && f[0] == "3",
        "not a fio terse v3 line: {line}"
    );
    // 1-based fields: read IOPS 8, read lat mean 40; write 41 fields later.
    let base = if write { 41 } else { 0 };
    let num = |i: usize| -> f64 {
        f[base + i - 1]
            .parse()
            .unwrap_or_else(|e| panic!("field {}: {e}: {line}", base + i))
    };
    (num(8), num(40))
}

fn bench_figures(run: &GuestRun, label: &str, write: bool) -> (f64, f64) {
    let line = console_value(run, &format!("FIO-TERSE {label} "));
    let (iops, lat) = terse_figures(&line, write);
    assert!(iops > 0.0 && lat > 0.0, "{label}: {line}");
    (iops, lat)
}

#[test]
#[ignore = "measurement (about 1 minute of guest time); run by hand for BENCHMARKS.md"]
fn nvme_vs_nbd_fio_in_one_guest() {
    require_tool("qemu-system-x86_64");
    let s = start_server();
    let nbd: SocketAddr = s.nbd_addr().parse().expect("server's NBD address");
    let config = GuestConfig {
        forwards: vec![
            Forward::new(GUEST_NVME_PORT, s.nvme_addr()),
            Forward::new(GUEST_NBD_PORT, nbd),
        ],
        memory_mib: 512,
        timeout: Duration::from_secs(600),
        ..GuestConfig::default()
    };
    let run = boot_ok(config, &bench_script(), "guest-bench-done");
    println!(
        "fio 4k, iodepth 16, {BENCH_SECONDS} s, direct, libaio, {} MiB region, one vCPU under TCG",
        BENCH_REGION / MIB
    );
    println!(
        "{:<10} {:>12} {:>14} {:>12} {:>14} {:>10} {:>10}",
        "job", "NVMe IOPS", "NVMe lat µs", "NBD IOPS", "NBD lat µs", "IOPS ×", "lat ×"
    );
    for (rw, write) in [("randread", false), ("randwrite", true)] {
        let (n_iops, n_lat) = bench_figures(&run, &format!("nvme-{rw}"), write);
        let (b_iops, b_lat) = bench_figures(&run, &format!("nbd-{rw}"), write);
        println!(
            "{rw:<10} {n_iops:>12.0} {n_lat:>14.0} {b_iops:>12.0} {b_lat:>14.0} {:>10.2} {:>10.2}",
            n_iops / b_iops,
            n_lat / b_lat
        );
    }
}

#[test]
fn terse_fields_are_read_from_the_right_places() {
    // A fio 3.33 --minimal line of a randrw job (read IOPS 9627, read lat
    // mean 91.01 µs, write IOPS 8150, write lat mean 4.77 µs).
    let mut f = vec!["0"; 130];
    f[0] = "3";
    f[7] = "9627";
    f[39] = "91.012963";
    f[48] = "8150";
    f[80] = "4.767704";
    let line = f.join(";");
    assert_eq!(terse_figures(&line, false), (9627.0, 91.012963));
    assert_eq!(terse_figures(&line, true), (8150.0, 4.767704));
}
