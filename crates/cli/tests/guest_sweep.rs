//! Measurement (ignored; run by hand for BENCHMARKS.md): the Chelsio
//! seed's throughput-against-I/O-size sweep (512 B to 512 KiB, random
//! reads and writes, 4 jobs × QD32, libaio, O_DIRECT) through the Linux
//! kernel's initiators in one QEMU guest, against Basalt over iSCSI,
//! NVMe/TCP and NBD, and against tgt (Linux's user-space iSCSI target,
//! `--bstype rdwr` on a preallocated file on the same filesystem), all four
//! attached at once and measured cell by cell in turn, so every target
//! sees the same moment of this machine.
//!
//! What bounds the figures: the guest has one vCPU under TCG (no KVM
//! here), so every initiator's work is emulated and the guest, not the
//! targets, is the limit at small sizes; compare the columns with each
//! other, not with the host-side sweeps of BENCHMARKS.md. NVMe/TCP and
//! NBD carry 4 KiB logical blocks, so their cells below 4 KiB are not run
//! (an O_DIRECT I/O smaller than the logical block is refused); Basalt's
//! iSCSI LUs are 512e and tgt's LUN has 512-byte blocks.
//!
//! Needs qemu-system-x86 and apt's package lists (like `guest_iscsi.rs`),
//! and tgt on the host.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use basalt_bench::targets;
use basalt_guest::{Forward, GuestConfig, FORWARD_IP};
use common::guest::*;
use common::*;

const VOLUME: &str = "sweep";
const INITIATOR: &str = "iqn.2026-11.io.test:guest-sweep";
const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d";
const HOST_ID: &str = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d";
/// Guest-side ports of the four targets.
const GUEST_ISCSI_PORT: u16 = 3260;
const GUEST_TGT_PORT: u16 = 3261;
const GUEST_NVME_PORT: u16 = 4420;
const GUEST_NBD_PORT: u16 = 10809;
/// The region every cell reads and writes (written once first).
const REGION_MIB: u64 = 256;
/// Seconds each cell runs, after a second of ramp.
const CELL_SECONDS: u32 = 4;
/// I/O sizes of the seed's sweep, in bytes.
const SIZES: [u32; 11] = [
    512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131_072, 262_144, 524_288,
];
/// The targets, in the order each cell runs them, and the smallest I/O
/// each takes.
const TARGETS: [(&str, u32); 4] = [
    ("basalt-iscsi", 512),
    ("tgt", 512),
    ("basalt-nvme", 4096),
    ("basalt-nbd", 4096),
];

/// tgtd serving `image` on 127.0.0.1:`port`, started and set up with the
/// bench's command lines (`basalt_bench::targets`), stopped with tgtadm (it
/// ignores SIGTERM) when dropped.
struct Tgtd {
    child: Child,
    control: u16,
}

impl Tgtd {
    fn start(image: &Path, port: u16) -> Tgtd {
        let control = targets::tgtd_control_number().expect("a tgtd control socket number");
        let child = Command::new("tgtd")
            .args(targets::tgtd_args(control, port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tgtd");
        let tgtd = Tgtd { child, control };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tgtd
            .run(&tgtd.argv(&["--op", "show", "--mode", "sys"]))
            .is_err()
        {
            assert!(Instant::now() < deadline, "tgtd does not answer tgtadm");
            std::thread::sleep(Duration::from_millis(100));
        }
        for argv in targets::tgtadm_setup_args(Path::new("tgtadm"), control, image) {
            tgtd.run(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        }
        tgtd
    }

    fn argv(&self, args: &[&str]) -> Vec<String> {
        targets::tgtadm_argv(Path::new("tgtadm"), self.control, args)
    }

    fn run(&self, argv: &[String]) -> Result<String, String> {
        let out = Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .map_err(|e| e.to_string())?;
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    }
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        for argv in targets::tgtadm_stop_args(Path::new("tgtadm"), self.control) {
            let _ = self.run(&argv);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn guest_script() -> String {
    let sizes: Vec<String> = SIZES.iter().map(u32::to_string).collect();
    let targets: Vec<String> = TARGETS
        .iter()
        .map(|(t, min)| format!("{t}:{min}"))
        .collect();
    format!(
        r#"{SH_PRELUDE}
{nvme}
step iscsid
{iscsid}

# The SCSI disk of the session with target $1, in DISK.
disk_of() {{
    local s d
    DISK=
    for s in /sys/class/iscsi_session/session*; do
        [ "$(cat $s/targetname)" = "$1" ] || continue
        for d in $s/device/target*/*:*:*:*/block/sd*; do
            [ -e "$d" ] && DISK=${{d##*/}}
        done
    done
    [ -n "$DISK" ] && [ -b /dev/$DISK ]
}}
# Login on portal $1 to target $2; its disk in DEV_$3. (A node record
# made by hand: tgt's SendTargets names its own 127.0.0.1 portal.)
iscsi_attach() {{
    iscsiadm -m node -o new -T $2 -p $1
    iscsiadm -m node -T $2 -p $1 --login
    wait_until 100 disk_of $2
    eval "DEV_$3=/dev/$DISK"
    echo "$3: /dev/$DISK"
}}

step attach every target
iscsi_attach {ip}:{iscsi_port} {basalt_iqn} basalt_iscsi
iscsi_attach {ip}:{tgt_port} {tgt_iqn} tgt
nvme connect $T -n $SUB --hostnqn {host} --hostid {host_id}
wait_ns
DEV_basalt_nvme=/dev/$NS
nbd-client {ip} {nbd_port} /dev/nbd0 -N {volume} -b 4096 -C 4
DEV_basalt_nbd=/dev/nbd0

step prefill
dd if=/dev/urandom of=/tmp/fill bs=1M count=16
for dev in $DEV_basalt_iscsi $DEV_tgt; do
    for i in $(seq 0 $(({region_mib} / 16 - 1))); do
        dd if=/tmp/fill of=$dev bs=1M seek=$((i * 16)) count=16 oflag=direct 2>/dev/null
    done
done

for bs in {sizes}; do
    for rw in randread randwrite; do
        for t in {targets}; do
            name=${{t%%:*}} min=${{t##*:}}
            [ $bs -ge $min ] || continue
            label=$name-$rw-$bs
            dev=$(eval echo \$DEV_$(echo $name | tr - _))
            step $label
            fio --name=$label --filename=$dev --ioengine=libaio --direct=1 \
                --rw=$rw --bs=$bs --iodepth=32 --numjobs=4 --group_reporting \
                --size={region_mib}M --norandommap --time_based \
                --ramp_time=1 --runtime={seconds} \
                --lat_percentiles=1 --clat_percentiles=0 --percentile_list=50:99 \
                --output-format=json --output=/tmp/$label.json
            echo "FIO-JSON $label $(tr -d '\n' < /tmp/$label.json)"
        done
    done
done

step detach
nbd-client -d /dev/nbd0
nvme disconnect -n $SUB
iscsiadm -m node --logout
step done
echo guest-sweep-done
"#,
        nvme = nvme_functions(VOLUME, GUEST_NVME_PORT),
        iscsid = iscsid_start(INITIATOR),
        ip = FORWARD_IP,
        iscsi_port = GUEST_ISCSI_PORT,
        tgt_port = GUEST_TGT_PORT,
        nbd_port = GUEST_NBD_PORT,
        basalt_iqn = basalt_volume::iscsi_target_name(VOLUME),
        tgt_iqn = targets::TGT_IQN,
        host = HOST_NQN,
        host_id = HOST_ID,
        volume = VOLUME,
        region_mib = REGION_MIB,
        seconds = CELL_SECONDS,
        sizes = sizes.join(" "),
        targets = targets.join(" "),
    )
}

/// `bytes` as fio's size suffixes print it.
fn size_label(bytes: u32) -> String {
    match bytes {
        b if b >= 1024 => format!("{} KiB", b / 1024),
        b => format!("{b} B"),
    }
}

#[test]
#[ignore = "measurement (about 8 minutes of guest time); run by hand for BENCHMARKS.md"]
fn seed_sweep_over_iscsi_nvme_nbd_and_tgt_in_one_guest() {
    require_tool("qemu-system-x86_64");
    require_tool("tgtd");
    let iscsi = format!("{FORWARD_IP}:{GUEST_ISCSI_PORT}");
    let nvme = format!("{FORWARD_IP}:{GUEST_NVME_PORT}");
    let s = Server::start_with(
        "2G",
        &[
            "--iscsi-advertise",
            &iscsi,
            "--nvme-advertise",
            &nvme,
            "--nvme-allow-host",
            HOST_NQN,
            "--iscsi-allow-initiator",
            INITIATOR,
        ],
    );
    s.create_volume(VOLUME, &format!("{}M", REGION_MIB * 2));
    // tgt's backing: preallocated, in the test's scratch space (the same
    // filesystem as Basalt's data directory).
    let scratch = Scratch::new();
    let image: PathBuf = scratch.path("tgt.img");
    let status = Command::new("fallocate")
        .args(["-l", &format!("{}M", REGION_MIB * 2)])
        .arg(&image)
        .status()
        .expect("fallocate");
    assert!(status.success());
    let tgt_port =
        basalt_etcd_fixture::stable_free_ports([127, 0, 0, 1].into(), 1).expect("a free port")[0];
    let tgtd = Tgtd::start(&image, tgt_port);
    let nbd: std::net::SocketAddr = s.nbd_addr().parse().expect("NBD address");
    let config = GuestConfig {
        forwards: vec![
            Forward::new(GUEST_ISCSI_PORT, s.iscsi_listen_addr()),
            Forward::new(GUEST_TGT_PORT, ([127, 0, 0, 1], tgt_port).into()),
            Forward::new(GUEST_NVME_PORT, s.nvme_addr()),
            Forward::new(GUEST_NBD_PORT, nbd),
        ],
        memory_mib: 1024,
        timeout: Duration::from_secs(1800),
        ..GuestConfig::default()
    };
    let run = boot_ok(config, &guest_script(), "guest-sweep-done");
    drop(tgtd);

    println!(
        "fio {{randread,randwrite}}, libaio, direct=1, 4 jobs x QD32, {CELL_SECONDS} s after 1 s \
         of ramp, {REGION_MIB} MiB region; kernel initiators in one TCG guest (one vCPU); MiB/s"
    );
    for rw in ["randread", "randwrite"] {
        println!("\n{rw}");
        println!(
            "| size | {} | iSCSI / tgt | NVMe/TCP / iSCSI |",
            TARGETS.map(|(t, _)| t).join(" | ")
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for bs in SIZES {
            let mibs: Vec<Option<f64>> = TARGETS
                .iter()
                .map(|&(t, min)| {
                    (bs >= min).then(|| {
                        let r = fio_result(&run, &format!("{t}-{rw}-{bs}"), rw == "randwrite");
                        r.iops * f64::from(bs) / f64::from(1u32 << 20)
                    })
                })
                .collect();
            let cell = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.1}"));
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
                _ => "–".to_string(),
            };
            println!(
                "| {} | {} | {} | {} |",
                size_label(bs),
                mibs.iter()
                    .map(|&v| cell(v))
                    .collect::<Vec<_>>()
                    .join(" | "),
                ratio(mibs[0], mibs[1]),
                ratio(mibs[2], mibs[0]),
            );
        }
    }
}
