#!/bin/bash
# What compression saves and costs (issue 23): an operating-system image
# (an ext4 file system holding this machine's /usr/bin, /usr/lib/x86_64-
# linux-gnu and /usr/share: real binaries, libraries and documentation) is
# copied with nbdcopy into a plain volume and into an lz4 and a zstd volume
# of one single-node server (preallocated data file, background compaction
# off); `basalt volume compact` compresses the two (ratio, time), a read of
# each back is compared with the image, then fio's nbd engine reads and
# writes the three, cell by cell, RUNTIME s after 1 s of ramp, ROUNDS
# rounds (on the compressed volumes, the first write to each 1 MiB extent
# decompresses it: the 4k randwrite cells measure that). Needs fio,
# nbdcopy, mkfs.ext4, jq and a release build.
set -eu
BIN=${BIN:-$(dirname "$0")/../target/release/basalt}
ROUNDS=${ROUNDS:-2}
RUNTIME=${RUNTIME:-5}
W=$(mktemp -d /var/tmp/compress.XXXX)
SP=""
cleanup() { [ -n "$SP" ] && kill $SP 2>/dev/null; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
mkdir -p $W/root/usr/lib
cp -a /usr/bin /usr/share $W/root/usr/
cp -a /usr/lib/x86_64-linux-gnu $W/root/usr/lib/
MB=$(( $(du -sm $W/root | cut -f1) * 5 / 4 + 64 ))
truncate -s ${MB}M $W/os.raw
mkfs.ext4 -q -d $W/root $W/os.raw
rm -rf $W/root
echo "image: ext4, ${MB} MiB, $(du -m --apparent-size $W/os.raw | cut -f1) MiB apparent, $(du -m $W/os.raw | cut -f1) MiB allocated"
$BIN server --data-dir $W/d --capacity $(( MB * 4 + 512 ))M --preallocate --nbd-insecure \
    --nbd-listen 127.0.0.1:10973 --api-listen 127.0.0.1:8973 --nvme-listen 127.0.0.1:4973 \
    --compaction-rate 0 > $W/server.log 2>&1 &
SP=$!
for _ in $(seq 100); do [ -f $W/d/server.json ] && break; sleep 0.1; done
uri() { echo "nbd://127.0.0.1:10973/$1"; }
$BIN volume create plain --size ${MB}M --data-dir $W/d >/dev/null
$BIN volume create lz4 --size ${MB}M --compression lz4 --data-dir $W/d >/dev/null
$BIN volume create zstd --size ${MB}M --compression zstd --data-dir $W/d >/dev/null
for v in plain lz4 zstd; do nbdcopy $W/os.raw "$(uri $v)"; done
for v in lz4 zstd; do
    t0=$(date +%s.%N)
    r=$($BIN volume compact $v --output json --data-dir $W/d)
    t1=$(date +%s.%N)
    echo "$r" | jq -r --arg v $v --argjson s "$(awk "BEGIN{print $t1 - $t0}")" '
        "compact \($v): \(.packed_extents) extents (\(.packed_bytes / 1048576 | floor) MiB) into \(.stored_bytes / 1048576 | floor) MiB, ratio \(.packed_bytes / .stored_bytes * 100 | floor / 100), \(.incompressible_extents) incompressible, \($s * 10 | floor / 10) s (\(.packed_bytes / 1048576 / $s | floor) MiB/s)"'
    nbdcopy "$(uri $v)" $W/back.raw
    cmp $W/back.raw $W/os.raw && echo "read back $v: identical to the image"
    rm -f $W/back.raw
done
$BIN status --output json --data-dir $W/d | jq -r '"pool: \(.packed_bytes / 1048576 | floor) MiB packed into \(.packed_stored_bytes / 1048576 | floor) MiB (ratio \(.compression_ratio * 100 | floor / 100)), \(.pack_extent_bytes / 1048576 | floor) MiB of pack extents"'
cell() { # volume label fio-args...
    local v=$1 label=$2; shift 2
    fio --ioengine=nbd --uri="$(uri $v)" --size=${MB}M --runtime=$RUNTIME --time_based \
        --ramp_time=1 --group_reporting --output-format=json --name=c "$@" 2>/dev/null | sed -n '/^{/,$p' |
        jq -r --arg v "$v" --arg l "$label" '
        .jobs[0] as $j | ($j.read.iops + $j.write.iops) as $iops |
        (($j.read.bw_bytes + $j.write.bw_bytes) / 1048576) as $mib |
        (if $j.read.iops > 0 then $j.read.clat_ns else $j.write.clat_ns end) as $c |
        "\($l) \($v): \($iops|floor) IOPS, \($mib|floor) MiB/s, mean \($c.mean/100|floor/10) us, p99 \($c.percentile["99.000000"]/100|floor/10) us"'
}
for round in $(seq $ROUNDS); do
    echo "== round $round"
    for v in plain lz4 zstd; do cell $v "4k randread QD1" --rw=randread --bs=4k --iodepth=1; done
    for v in plain lz4 zstd; do cell $v "4k randread 2x16" --rw=randread --bs=4k --iodepth=16 --numjobs=2; done
    for v in plain lz4 zstd; do cell $v "1M read QD8" --rw=read --bs=1M --iodepth=8; done
done
# Last: writes decompress what they reach (once per extent).
for v in plain lz4 zstd; do cell $v "4k randwrite QD1" --rw=randwrite --bs=4k --iodepth=1; done
