#!/bin/bash
# Replicated volumes on event loops vs on lanes (issue 20), in one run:
# two 3-node clusters on loopback with a real etcd each, one started with
# the default event loops, one with `--event-loops 0` (every connection on
# lanes: two threads per connection taking turns at its socket, the way
# replicated volumes were served before they moved to the loops). An RF3
# and an RF1 volume on each, filled, then fio's nbd engine through each
# volume's primary node, cells interleaved between the two clusters,
# ROUNDS times (default 2), RUNTIME seconds each (default 10):
#   4k randwrite and randread at 1 job x QD1 and 2 jobs x QD16,
#   1 MiB sequential write at QD8.
# For each cell: IOPS (or MiB/s), mean latency, and the context switches
# of the whole machine per I/O (/proc/stat: fio's included). Needs etcd,
# fio and a release build.
set -e
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
W=$(mktemp -d /var/tmp/rfloops.XXXX)
PIDS=""
cleanup() { kill $PIDS 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
ROUNDS=${ROUNDS:-2}
RUNTIME=${RUNTIME:-10}
start_cluster() { # name base-port extra-args...
  local c=$1 base=$2; shift 2
  etcd --data-dir $W/$c-etcd --listen-client-urls http://127.0.0.1:$((base+90)) --advertise-client-urls http://127.0.0.1:$((base+90)) \
    --listen-peer-urls http://127.0.0.1:$((base+91)) >$W/$c-etcd.log 2>&1 &
  PIDS="$PIDS $!"
  sleep 2
  for i in 0 1 2; do
    $B server --data-dir $W/$c-n$i --capacity 4G --etcd http://127.0.0.1:$((base+90)) --node-name n$i \
      --peer-listen 127.0.0.1:$((base+10+i)) --cluster-secret-file $W/$c-secret \
      --nbd-insecure --nbd-listen 127.0.0.1:$((base+20+i)) --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 --api-listen 127.0.0.1:$((base+30+i)) "$@" >$W/$c-n$i.log 2>&1 &
    PIDS="$PIDS $!"
  done
}
start_cluster loops 17000
start_cluster lanes 17100 --event-loops 0
sleep 4
prim() { $B volume show $2 --data-dir $W/$1-n0 --output json | python3 -c 'import json,sys; v=json.load(sys.stdin); print([r["node"] for r in v["replicas"] if r["primary"]][0])'; }
declare -A URI
for c in loops lanes; do
  $B volume create rf1 --size 1G --replicas 1 --data-dir $W/$c-n0 >/dev/null
  $B volume create rf3 --size 1G --replicas 3 --data-dir $W/$c-n0 >/dev/null
done
sleep 3
for c in loops lanes; do
  base=$([ $c = loops ] && echo 17000 || echo 17100)
  for v in rf1 rf3; do
    p=$(prim $c $v)
    URI[$c-$v]=nbd://127.0.0.1:$((base+20+${p#n}))/$v
    fio --name=pre --ioengine=nbd --uri=${URI[$c-$v]} --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
  done
done
ctxsw() { # context switches of the whole machine so far
  # (/proc/stat: per-thread counters vanish with the threads, and lanes are
  # threads per connection; this also counts fio's and the idle cluster's.)
  awk '/^ctxt/ {print $2}' /proc/stat
}
cell() { # cluster vol label fio-args...
  local c=$1 v=$2 label=$3; shift 3
  local before=$(ctxsw $c)
  local out=$(fio --output=$W/fio.json --name=c --ioengine=nbd --uri=${URI[$c-$v]} --size=1G --time_based --runtime=$RUNTIME \
    --group_reporting --output-format=json "$@" >/dev/null; cat $W/fio.json)
  local after=$(ctxsw $c)
  echo "$out" | python3 -c '
import json,sys
c,v,label,cs=sys.argv[1],sys.argv[2],sys.argv[3],int(sys.argv[4])
j=json.load(sys.stdin)["jobs"][0]
op="write" if j["write"]["io_bytes"]>0 else "read"
d=j[op]; ios=d["total_ios"]
iops,mib,lat=d["iops"],d["bw"]/1024,d["lat_ns"]["mean"]/1000
print(f"{label:<22} {v} {c:<6} {iops:>9.0f} IOPS {mib:>8.1f} MiB/s  mean {lat:>8.1f} us  ctxsw/IO {cs/max(ios,1):>5.2f}")
' $c $v "$label" $((after - before))
}
for round in $(seq 1 $ROUNDS); do
  echo "== round $round"
  for v in ${VOLS:-rf3 rf1}; do
    for c in loops lanes; do cell $c $v "4k randwrite 1x1" --rw=randwrite --bs=4k --iodepth=1; done
    for c in loops lanes; do cell $c $v "4k randwrite 2x16" --rw=randwrite --bs=4k --iodepth=16 --numjobs=2; done
    for c in loops lanes; do cell $c $v "4k randread 1x1" --rw=randread --bs=4k --iodepth=1; done
    for c in loops lanes; do cell $c $v "4k randread 2x16" --rw=randread --bs=4k --iodepth=16 --numjobs=2; done
    for c in loops lanes; do cell $c $v "1M write QD8" --rw=write --bs=1M --iodepth=8; done
  done
done
