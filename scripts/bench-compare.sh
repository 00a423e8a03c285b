#!/bin/bash
# Replica compare (issue 18's cluster-wide scrub) on one machine: 4 node
# processes and a real etcd on loopback, a 1 GiB RF3 volume filled in full.
# Measures
#   1. `basalt volume scrub` through the node holding no replica (so only
#      the compare runs: the primary reads each 1 MiB region, both
#      secondaries checksum theirs), without a rate limit, and through a
#      replica's node (its local check, then the compare);
#   2. 4k random reads at QD32 and 4k random writes at QD1 on the volume
#      (fio's nbd engine, through the primary), alone and while a scrub at
#      the background scrubber's default rate (16 MiB/s) runs, in turn,
#      ROUNDS times (default 3).
# Needs etcd, fio and a release build.
set -e
[ -n "$TRACE" ] && set -x
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
W=$(mktemp -d /var/tmp/cmpbench.XXXX)
PIDS=""
EP=""
cleanup() { kill $PIDS $EP 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
etcd --data-dir $W/etcd --listen-client-urls http://127.0.0.1:23791 --advertise-client-urls http://127.0.0.1:23791 --listen-peer-urls http://127.0.0.1:23801 >$W/etcd.log 2>&1 &
EP=$!
sleep 2
for i in 0 1 2 3; do
  $B server --data-dir $W/n$i --capacity 2G --etcd http://127.0.0.1:23791 --node-name n$i --peer-listen 127.0.0.1:$((7200+i)) --cluster-secret-file $W/cluster-secret \
    --nbd-insecure --nbd-listen 127.0.0.1:$((11000+i)) --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 --api-listen 127.0.0.1:$((8200+i)) --scrub-interval 0 >$W/n$i.log 2>&1 &
  PIDS="$PIDS $!"
done
sleep 3
$B volume create cmp --size 1G --replicas 3 --data-dir $W/n0 >/dev/null
nodes() { $B volume show cmp --data-dir $W/n0 --output json | python3 -c 'import json,sys; v=json.load(sys.stdin); print(" ".join(("P" if r["primary"] else "")+r["node"] for r in v["replicas"]))'; }
# Placed within a second or two: wait for three replicas.
N=""
for _ in $(seq 30); do
  sleep 1
  N=$(nodes 2>/dev/null || true)
  [ $(echo $N | wc -w) -eq 3 ] && break
done
P=$(for n in $N; do case $n in P*) echo ${n#Pn};; esac; done)
HELD=$(for n in $N; do echo ${n#P}; done)
SPARE=$(for i in 0 1 2 3; do echo "$HELD" | grep -qx n$i || echo $i; done)
URI=nbd://127.0.0.1:$((11000+P))/cmp
echo "replicas: $N; primary n$P, no replica on n$SPARE"
fio --name=fill --ioengine=nbd --uri=$URI --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
t() { local s=$(date +%s.%N); "$@" >/dev/null; python3 -c "import sys; print('%.2f s' % ($(date +%s.%N) - $s))"; }
echo "compare only (through n$SPARE, no rate limit): $(t $B volume scrub cmp --rate 64G --data-dir $W/n$SPARE)"
echo "local check + compare (through n$P, no rate limit): $(t $B volume scrub cmp --rate 64G --data-dir $W/n$P)"
iops() {
  fio --name=c --ioengine=nbd --uri=$URI --rw=$1 --bs=4k --iodepth=$2 --size=1G --runtime=${RUNTIME:-10} \
    --time_based --output-format=json --output=$W/fio.json >/dev/null 2>&1
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; d=j["read"] if j["read"]["io_bytes"] else j["write"]; print("%.1fk" % (d["iops"]/1000))' $W/fio.json
}
for round in $(seq 1 ${ROUNDS:-3}); do
  for w in "randread 32" "randwrite 1"; do
    alone=$(iops $w)
    $B volume scrub cmp --rate 16M --data-dir $W/n$SPARE >/dev/null 2>&1 &
    S=$!
    sleep 1
    with=$(iops $w)
    kill $S 2>/dev/null || true; wait $S 2>/dev/null || true
    echo "round $round, 4k $w: alone $alone IOPS, with a 16 MiB/s scrub $with IOPS"
  done
done
