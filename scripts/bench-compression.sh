#!/bin/bash
# What compression saves and costs (issue 23), next to encryption: an
# operating-system image (an ext4 file system holding this machine's
# /usr/bin and /usr/lib/x86_64-linux-gnu: real binaries and libraries) is
# copied with nbdcopy into five volumes of
# one single-node server (preallocated data file, background compaction
# off, a master key): plain, encrypted, lz4, zstd and encrypted+lz4; two
# more get random data instead (incompressible): "rand" (plain) and
# "noise" (lz4), to compare with each other.
# `basalt volume compact` compresses the compressed ones (ratio, time);
# each is read back and compared with what was written; then fio's nbd
# engine reads all six, cell by cell, RUNTIME s after 1 s of ramp, ROUNDS
# rounds, then writes them once (the first write to each 1 MiB packed
# extent decompresses it). Server CPU per I/O from /proc/PID/stat. Needs
# fio, nbdcopy, mkfs.ext4, jq and a release build.
set -eu
BIN=${BIN:-$(dirname "$0")/../target/release/basalt}
ROUNDS=${ROUNDS:-2}
RUNTIME=${RUNTIME:-5}
W=$(mktemp -d /var/tmp/compress.XXXX)
SP=""
cleanup() { [ -n "$SP" ] && kill $SP 2>/dev/null; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
mkdir -p $W/root/usr/lib
cp -a /usr/bin $W/root/usr/
cp -a /usr/lib/x86_64-linux-gnu $W/root/usr/lib/
MB=$(( $(du -sm $W/root | cut -f1) * 5 / 4 + 64 ))
truncate -s ${MB}M $W/os.raw
mkfs.ext4 -q -d $W/root $W/os.raw
rm -rf $W/root
head -c ${MB}M /dev/urandom > $W/noise.raw
echo "image: ext4 of ${MB} MiB, $(du -m $W/os.raw | cut -f1) MiB of it allocated"
$BIN server --data-dir $W/d --capacity $(( MB * 8 + 512 ))M --preallocate --nbd-insecure \
    --nbd-listen 127.0.0.1:10973 --api-listen 127.0.0.1:8973 --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:4973 \
    --compaction-rate 0 --master-key-file $W/master.key > $W/server.log 2>&1 &
SP=$!
for _ in $(seq 100); do [ -f $W/d/server.json ] && break; sleep 0.1; done
uri() { echo "nbd://127.0.0.1:10973/$1"; }
src() { case $1 in noise|rand) echo $W/noise.raw ;; *) echo $W/os.raw ;; esac; }
VOLS="plain enc lz4 zstd enc-lz4 rand noise"
create() { $BIN volume create $1 --size ${MB}M "${@:2}" --data-dir $W/d >/dev/null; }
create plain
create enc --encrypted
create lz4 --compression lz4
create zstd --compression zstd
create enc-lz4 --compression lz4 --encrypted
create rand
create noise --compression lz4
for v in $VOLS; do nbdcopy $(src $v) "$(uri $v)"; done
for v in lz4 zstd enc-lz4 noise; do
    t0=$(date +%s.%N)
    r=$($BIN volume compact $v --output json --data-dir $W/d)
    t1=$(date +%s.%N)
    echo "$r" | jq -r --arg v $v --argjson s "$(awk "BEGIN{print $t1 - $t0}")" '
        "compact \($v): \(.packed_extents) extents (\(.packed_bytes / 1048576 | floor) MiB) into \(.stored_bytes / 1048576 | floor) MiB, ratio \(if .stored_bytes > 0 then .packed_bytes / .stored_bytes * 100 | floor / 100 else "-" end), \(.incompressible_extents) incompressible, \($s * 10 | floor / 10) s"'
done
for v in $VOLS; do
    nbdcopy "$(uri $v)" $W/back.raw
    cmp $W/back.raw $(src $v) && echo "read back $v: identical to what was written"
    rm -f $W/back.raw
done
$BIN status --output json --data-dir $W/d | jq -r '"pool: \(.packed_bytes / 1048576 | floor) MiB packed into \(.packed_stored_bytes / 1048576 | floor) MiB (ratio \(.compression_ratio * 100 | floor / 100)), \(.pack_extent_bytes / 1048576 | floor) MiB of pack extents"'
ticks() { awk '{print $14 + $15}' /proc/$SP/stat; }
HZ=$(getconf CLK_TCK)
cell() { # volume label fio-args...
    local v=$1 label=$2; shift 2
    local t0 t1 out ios
    t0=$(ticks)
    out=$(fio --ioengine=nbd --uri="$(uri $v)" --size=${MB}M --runtime=$RUNTIME --time_based \
        --ramp_time=1 --group_reporting --output-format=json --name=c "$@" 2>/dev/null | sed -n '/^{/,$p')
    t1=$(ticks)
    ios=$(echo "$out" | jq '.jobs[0].read.total_ios + .jobs[0].write.total_ios')
    echo "$out" | jq -r --arg v "$v" --arg l "$label" --argjson cpu "$(( (t1 - t0) * 1000000 / HZ ))" --argjson ios "$ios" '
        .jobs[0] as $j | ($j.read.iops + $j.write.iops) as $iops |
        (($j.read.bw_bytes + $j.write.bw_bytes) / 1048576) as $mib |
        (if $j.read.iops > 0 then $j.read.clat_ns else $j.write.clat_ns end) as $c |
        "\($l) \($v): \($iops|floor) IOPS, \($mib|floor) MiB/s, mean \($c.mean/100|floor/10) us, p99 \($c.percentile["99.000000"]/100|floor/10) us, server CPU \(if $ios > 0 then ($cpu / $ios * 10 | floor / 10) else 0 end) us/IO"'
}
for round in $(seq $ROUNDS); do
    echo "== round $round"
    for v in $VOLS; do cell $v "4k randread QD1" --rw=randread --bs=4k --iodepth=1; done
    for v in $VOLS; do cell $v "4k randread 2x16" --rw=randread --bs=4k --iodepth=16 --numjobs=2; done
    for v in $VOLS; do cell $v "1M read QD8" --rw=read --bs=1M --iodepth=8; done
done
# Last, once: writes decompress the packed extents they reach (once each).
echo "== writes"
for v in $VOLS; do cell $v "4k randwrite QD1" --rw=randwrite --bs=4k --iodepth=1; done
for v in $VOLS; do cell $v "4k randwrite 2x16" --rw=randwrite --bs=4k --iodepth=16 --numjobs=2; done
for v in $VOLS; do cell $v "1M write QD8" --rw=write --bs=1M --iodepth=8; done
