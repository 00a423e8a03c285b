#!/bin/bash
# The cost of encryption at rest (issue 23): one single-node server
# (--master-key-file, preallocated data file), a plain and an encrypted
# 1 GiB volume, both written in full first; fio's nbd engine, each cell
# run on the plain volume then on the encrypted one, RUNTIME s after 1 s
# of ramp, ROUNDS rounds. Server CPU per I/O from /proc/PID/stat (user +
# system time over the cell, divided by the I/Os fio completed).
# Needs fio, jq and a release build.
set -eu
BIN=${BIN:-$(dirname "$0")/../target/release/basalt}
ROUNDS=${ROUNDS:-2}
RUNTIME=${RUNTIME:-5}
W=$(mktemp -d /var/tmp/enccost.XXXX)
SP=""
cleanup() { [ -n "$SP" ] && kill $SP 2>/dev/null; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
$BIN server --data-dir $W/d --capacity 3G --preallocate --nbd-insecure --nbd-listen 127.0.0.1:10972 \
    --api-listen 127.0.0.1:8972 --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:4972 --master-key-file $W/master.key > $W/server.log 2>&1 &
SP=$!
for _ in $(seq 100); do [ -f $W/d/server.json ] && break; sleep 0.1; done
$BIN volume create plain --size 1G --data-dir $W/d >/dev/null
$BIN volume create enc --size 1G --encrypted --data-dir $W/d >/dev/null
for v in plain enc; do
    fio --name=pre --ioengine=nbd --uri=nbd://127.0.0.1:10972/$v --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null
done
ticks() { awk '{print $14 + $15}' /proc/$SP/stat; }
HZ=$(getconf CLK_TCK)
cell() { # volume label fio-args...
    local v=$1 label=$2; shift 2
    local t0 t1 out ios
    t0=$(ticks)
    out=$(fio --ioengine=nbd --uri=nbd://127.0.0.1:10972/$v --size=1G --runtime=$RUNTIME --time_based \
        --ramp_time=1 --group_reporting --output-format=json --name=c "$@" 2>/dev/null | sed -n '/^{/,$p')
    t1=$(ticks)
    ios=$(echo "$out" | jq '.jobs[0].read.total_ios + .jobs[0].write.total_ios')
    echo "$out" | jq -r --arg v "$v" --arg l "$label" --argjson cpu "$(( (t1 - t0) * 1000000 / HZ ))" --argjson ios "$ios" '
        .jobs[0] as $j | ($j.read.iops + $j.write.iops) as $iops |
        (($j.read.bw_bytes + $j.write.bw_bytes) / 1048576) as $mib |
        (if $j.read.iops > 0 then $j.read.clat_ns.mean else $j.write.clat_ns.mean end / 1000) as $lat |
        "\($l) \($v): \($iops|floor) IOPS, \($mib|floor) MiB/s, mean \($lat*10|floor/10) us, server CPU \(if $ios > 0 then ($cpu / $ios * 10 | floor / 10) else 0 end) us/IO"'
}
for round in $(seq $ROUNDS); do
    echo "== round $round"
    for v in plain enc; do cell $v "4k randread QD1" --rw=randread --bs=4k --iodepth=1; done
    for v in plain enc; do cell $v "4k randwrite QD1" --rw=randwrite --bs=4k --iodepth=1; done
    for v in plain enc; do cell $v "4k randread 2x16" --rw=randread --bs=4k --iodepth=16 --numjobs=2; done
    for v in plain enc; do cell $v "4k randwrite 2x16" --rw=randwrite --bs=4k --iodepth=16 --numjobs=2; done
    for v in plain enc; do cell $v "1M read QD8" --rw=read --bs=1M --iodepth=8; done
    for v in plain enc; do cell $v "1M write QD8" --rw=write --bs=1M --iodepth=8; done
done
