#!/bin/bash
# The cost of the unthrottled QoS check (issue 22): the build before QoS
# was wired into the data path (3f06a00) against this one, the same
# single-node setup on a preallocated data file, fio's nbd engine, 4k,
# 10 s after 1 s of ramp, two rounds alternating. Build the older one
# first:
#   git worktree add /tmp/wt-before 3f06a00
#   (cd /tmp/wt-before && CARGO_TARGET_DIR=/tmp/wt-before/target cargo build --release -p basalt)
# Needs fio, jq and a release build of this tree.
set -eu
BEFORE=${BEFORE:-/tmp/wt-before/target/release/basalt}
AFTER=${AFTER:-$(dirname "$0")/../target/release/basalt}
W=$(mktemp -d /var/tmp/qoscost.XXXX)
SP=""
cleanup() { [ -n "$SP" ] && kill $SP 2>/dev/null; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
run() { # label binary
    rm -rf $W/d
    $2 server --data-dir $W/d --capacity 2G --preallocate --nbd-insecure --nbd-listen 127.0.0.1:10971 \
        --api-listen 127.0.0.1:8971 --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:4971 > $W/server.log 2>&1 &
    SP=$!
    for _ in $(seq 50); do [ -f $W/d/server.json ] && break; sleep 0.1; done
    $2 volume create v --size 1G --data-dir $W/d >/dev/null
    U=nbd://127.0.0.1:10971/v
    fio --name=pre --ioengine=nbd --uri=$U --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null
    f() { fio --ioengine=nbd --uri=$U --size=1G --runtime=10 --time_based --ramp_time=1 --group_reporting --output-format=json "$@" 2>/dev/null | sed -n '/^{/,$p'; }
    local r1 w1 r32 w32
    r1=$(f --name=a --rw=randread --bs=4k --iodepth=1 | jq '[.jobs[0].read.iops, .jobs[0].read.clat_ns.mean/1000]|map(floor)|@csv' -r)
    w1=$(f --name=a --rw=randwrite --bs=4k --iodepth=1 | jq '[.jobs[0].write.iops, .jobs[0].write.clat_ns.mean/1000]|map(floor)|@csv' -r)
    r32=$(f --name=a --rw=randread --bs=4k --iodepth=16 --numjobs=2 | jq '.jobs[0].read.iops|floor')
    w32=$(f --name=a --rw=randwrite --bs=4k --iodepth=16 --numjobs=2 | jq '.jobs[0].write.iops|floor')
    echo "$1: 4k randread QD1 IOPS,us $r1 | 4k randwrite QD1 IOPS,us $w1 | 4k randread 2x16 $r32 IOPS | 4k randwrite 2x16 $w32 IOPS"
    kill $SP; wait $SP 2>/dev/null || true; SP=""
}
for round in 1 2; do
    run "before (3f06a00)" "$BEFORE"
    run "after (this tree)" "$AFTER"
done
