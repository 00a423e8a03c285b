#!/bin/bash
# QoS accuracy (issue 22): one volume of a single-node server on a
# preallocated data file, each QoS spec set online with `basalt volume
# set-qos`, then fio's nbd engine for 10 s (1 s ramp). Prints measured vs
# set for IOPS, a read/write split, bandwidth, and a burst second by
# second. Needs fio, jq and a release build.
set -eu
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
W=$(mktemp -d /var/tmp/qosbench.XXXX)
SP=""
cleanup() { [ -n "$SP" ] && kill $SP 2>/dev/null; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
$B server --data-dir $W/d --capacity 3G --preallocate --nbd-insecure --nbd-listen 127.0.0.1:10941 \
    --api-listen 127.0.0.1:8941 --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:4941 > $W/server.log 2>&1 &
SP=$!
sleep 2
$B volume create q --size 1G --data-dir $W/d >/dev/null
U=nbd://127.0.0.1:10941/q
fio --name=pre --ioengine=nbd --uri=$U --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null
f() { fio --name=m --ioengine=nbd --uri=$U --size=1G --runtime=10 --time_based --ramp_time=1 --output-format=json "$@" 2>/dev/null | sed -n '/^{/,$p'; }
qos() { $B volume set-qos q "$1" --data-dir $W/d >/dev/null; }
qos total_iops_sec=2000
echo "total_iops_sec=2000, 4k randread QD16: $(f --rw=randread --bs=4k --iodepth=16 | jq '.jobs[0].read.iops|floor') IOPS"
qos read_iops_sec=1500,write_iops_sec=500
echo "read_iops_sec=1500,write_iops_sec=500, 4k randrw 50/50 QD16: $(f --rw=randrw --bs=4k --iodepth=16 | jq -c '[.jobs[0].read.iops, .jobs[0].write.iops]|map(floor)') read/write IOPS"
qos read_iops_sec=1500
echo "read_iops_sec=1500, 4k randread QD16: $(f --rw=randread --bs=4k --iodepth=16 | jq '.jobs[0].read.iops|floor') IOPS"
qos total_bytes_sec=50M
echo "total_bytes_sec=50M, 64k randwrite QD8: $(f --rw=randwrite --bs=64k --iodepth=8 | jq '.jobs[0].write.bw_bytes/1048576') MiB/s"
qos write_bytes_sec=20M
echo "write_bytes_sec=20M, 1 MiB write QD4: $(f --rw=write --bs=1M --iodepth=4 | jq '.jobs[0].write.bw_bytes/1048576') MiB/s"
qos total_iops_sec=1000,total_iops_sec_max=5000,burst_length_sec=3
sleep 4   # quiet: the burst bucket fills
(cd $W && fio --name=burst --ioengine=nbd --uri=$U --size=1G --runtime=10 --time_based --rw=randread --bs=4k \
    --iodepth=16 --write_iops_log=burst --log_avg_msec=1000 >/dev/null 2>&1)
echo "total_iops_sec=1000,total_iops_sec_max=5000,burst_length_sec=3, 4k randread QD16, IOPS per second: $(awk -F, '{printf "%s ", $2}' $W/burst_iops*.log)"
qos none
echo "no limit, 4k randread QD16: $(f --rw=randread --bs=4k --iodepth=16 | jq '.jobs[0].read.iops|floor') IOPS"
