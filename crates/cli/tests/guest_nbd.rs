//! The Linux kernel's NBD client against Basalt, inside a QEMU guest (see
//! the basalt-guest crate): ext4 on /dev/nbd0 across a reconnect (after
//! which both connections idle past the server's handshake timeout before
//! they are used: a negotiated connection is never closed for idling), then
//! fio with verification on the raw device, then the host reads back what
//! the guest wrote.
//!
//! This test lives with the other end-to-end tests of the `basalt` binary
//! because it starts the real server through their `common` helpers; the
//! guest harness is a dev-dependency. It needs qemu-system-x86 and apt's
//! package lists (scripts/test.sh installs the former and refreshes the
//! latter when it installs anything); the guest's packages are downloaded
//! into the harness's cache on first use.

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use basalt_guest::{Forward, GuestConfig};
use common::guest::*;
use common::*;

const VOLUME: &str = "knbd";
const VOLUME_SIZE: u64 = 256 * MIB;
/// Port the guest connects to (forwarded to the server's real NBD port).
const GUEST_NBD_PORT: u16 = 10809;
/// fio: two jobs, each on its own 12 MiB region (so one job's writes never
/// break the other's verification); about 20 s of random 4 KiB I/O under TCG.
const FIO_REGION: u64 = 12 * MIB;
const FIO_STRIDE: u64 = 32 * MIB;
/// Where the guest writes a random blob for the host to read back.
const BLOB_OFFSET: u64 = 200 * MIB;
const BLOB_LEN: u64 = 4 * MIB;
/// The server's handshake timeout; the guest idles twice as long.
const HANDSHAKE_TIMEOUT_SECS: u64 = 2;

fn guest_script() -> String {
    let connect = format!(
        "nbd-client {ip} {GUEST_NBD_PORT} /dev/nbd0 -N {VOLUME} -b 4096 -C 2",
        ip = basalt_guest::FORWARD_IP
    );
    format!(
        r#"{SH_PRELUDE}
# Waits until the kernel has released /dev/nbd0 after `nbd-client -d`.
nbd0_released() {{ [ "$(cat /sys/block/nbd0/size)" = 0 ]; }}
wait_disconnected() {{ wait_until 100 nbd0_released; }}

# --- connect (two connections: netlink, multi-conn) and format
step connect and mkfs
{connect}
test "$(cat /sys/block/nbd0/size)" -eq {sectors}
mkfs.ext4 -q -F -b 4096 /dev/nbd0
mkdir -p /mnt/v
mount -t ext4 /dev/nbd0 /mnt/v

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

# --- disconnect, reconnect: what is read now comes from the server
step reconnect and verify files
nbd-client -d /dev/nbd0
wait_disconnected
echo 3 > /proc/sys/vm/drop_caches
{connect}
# Idle past the server's --handshake-timeout ({idle_past} s).
sleep {idle}
fsck.ext4 -fn /dev/nbd0
mount -t ext4 /dev/nbd0 /mnt/v
(cd /mnt/v && sha256sum -c /root/sums)
test "$(cd /mnt/v && find . -type f | wc -l)" -eq 14
umount /mnt/v
fsck.ext4 -fn /dev/nbd0

# --- fio on the raw device: two jobs, queue depth 4, O_DIRECT, verified
step fio random 4k, verified
cd /tmp
fio --name=kernel-nbd --filename=/dev/nbd0 --ioengine=libaio --direct=1 \
    --rw=randwrite --bs=4k --iodepth=4 --numjobs=2 \
    --size={fio_region} --offset_increment={fio_stride} \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    --group_reporting
step fio sequential 256k, verified
fio --name=kernel-nbd-seq --filename=/dev/nbd0 --ioengine=libaio --direct=1 \
    --rw=write --bs=256k --iodepth=4 --numjobs=2 \
    --size={fio_region} --offset_increment={fio_stride} \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    --group_reporting

# --- a blob for the host to read back
step blob for the host
dd if=/dev/urandom of=/tmp/blob bs=1M count={blob_mib}
echo "BLOB-SHA256 $(sha256sum /tmp/blob | cut -d' ' -f1)"
dd if=/tmp/blob of=/dev/nbd0 bs=1M seek={blob_seek} conv=fsync
nbd-client -d /dev/nbd0
wait_disconnected
step done
echo guest-nbd-done
"#,
        sectors = VOLUME_SIZE / 512,
        idle_past = HANDSHAKE_TIMEOUT_SECS,
        idle = HANDSHAKE_TIMEOUT_SECS * 2,
        fio_region = FIO_REGION,
        fio_stride = FIO_STRIDE,
        blob_mib = BLOB_LEN / MIB,
        blob_seek = BLOB_OFFSET / MIB,
    )
}

#[test]
fn kernel_nbd_client_ext4_and_fio_verify() {
    require_tool("qemu-system-x86_64");
    let s = Server::start_with(
        "1G",
        &["--handshake-timeout", &HANDSHAKE_TIMEOUT_SECS.to_string()],
    );
    s.create_volume(VOLUME, "256M");
    let nbd: SocketAddr = s.nbd_addr().parse().expect("server's NBD address");

    let config = GuestConfig {
        forwards: vec![Forward::new(GUEST_NBD_PORT, nbd)],
        memory_mib: 512,
        timeout: Duration::from_secs(600),
        ..GuestConfig::default()
    };
    let run = boot_ok(config, &guest_script(), "guest-nbd-done");

    // --- the host's view of what the kernel client wrote
    let vol = s.cli_json(&["volume", "show", VOLUME]);
    let vol = if vol.get("volume").is_some() {
        &vol["volume"]
    } else {
        &vol
    };
    let allocated = vol["allocated_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no allocated_bytes in {vol}"));
    let fio_bytes = 2 * FIO_REGION;
    assert!(
        allocated >= fio_bytes + BLOB_LEN && allocated <= VOLUME_SIZE,
        "allocated_bytes {allocated} after the guest wrote at least {} bytes: {vol}",
        fio_bytes + BLOB_LEN
    );
    let uri = s.uri(VOLUME);
    let map = nbd_map(&uri, VOLUME_SIZE);
    let is_data = |t: u64| t & 1 == 0;
    for (off, len) in [
        (0, FIO_REGION),
        (FIO_STRIDE, FIO_REGION),
        (BLOB_OFFSET, BLOB_LEN),
    ] {
        assert_eq!(
            map_bytes(&map, off, len, is_data),
            len,
            "[{off}, +{len}) written by the guest is not all data: {map:?}"
        );
    }

    let want = console_value(&run, "BLOB-SHA256 ");
    let dir = Scratch::new();
    let copy = dir.path("volume.raw");
    tool("nbdcopy", [uri.as_str(), copy.to_str().unwrap()]).ok();
    let f = std::fs::File::open(&copy).unwrap();
    let mut blob = vec![0u8; BLOB_LEN as usize];
    f.read_exact_at(&mut blob, BLOB_OFFSET).unwrap();
    assert_eq!(
        sha256_hex(&blob, &dir),
        want,
        "the blob the guest wrote through /dev/nbd0 reads back differently on the host"
    );
}
