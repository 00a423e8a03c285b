#!/bin/bash
# The I/O pause of `basalt snapshot create` on a replicated volume (issue
# 21): 3 node processes with a real etcd on loopback, an RF3 volume of
# 1 GiB filled in full, fio's nbd engine writing 4k blocks at QD1 through
# the primary's node (in its first 256 MiB: every snapshot's new layer
# takes an extent per MiB its writes touch, and the stores hold 4 GiB) for
# RUNTIME seconds (default 20), ROUNDS times
# (default 3) without a snapshot and with SNAPS snapshots (default 5) taken
# during the run, one every RUNTIME/(SNAPS+1) seconds, and while they are
# deleted again the same way. Prints fio's max and
# p99.99 completion latency and mean latency per run, and how long each
# `snapshot create` took. Then the cost of first writes after a snapshot:
# QD1 mean latency of overwrites, of first writes to blocks after a
# snapshot, and of overwrites after. Needs etcd, fio and a release build.
#
#   scripts/bench-replicated-snapshots.sh
set -e
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
RUNTIME=${RUNTIME:-20}
ROUNDS=${ROUNDS:-3}
SNAPS=${SNAPS:-5}
W=$(mktemp -d /var/tmp/rfsnap.XXXX)
PIDS=""
EP=""
cleanup() { kill $PIDS $EP 2>/dev/null || true; wait 2>/dev/null || true; if [ -n "$KEEP_LOGS" ]; then mkdir -p "$KEEP_LOGS"; cp $W/*.log "$KEEP_LOGS/"; fi; rm -rf $W; }
trap cleanup EXIT
etcd --data-dir $W/etcd --listen-client-urls http://127.0.0.1:23791 --advertise-client-urls http://127.0.0.1:23791 --listen-peer-urls http://127.0.0.1:23801 >$W/etcd.log 2>&1 &
EP=$!
sleep 2
for i in 0 1 2; do
  $B server --data-dir $W/n$i --capacity 4G --preallocate --etcd http://127.0.0.1:23791 --node-name n$i --peer-listen 127.0.0.1:$((7200+i)) --cluster-secret-file $W/cluster-secret \
    --nbd-insecure --nbd-listen 127.0.0.1:$((11000+i)) --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 --api-listen 127.0.0.1:$((8200+i)) >$W/n$i.log 2>&1 &
  PIDS="$PIDS $!"
done
cli() { $B --data-dir $W/n0 "$@"; }
until cli node list >/dev/null 2>&1; do sleep 0.5; done
sleep 2
cli volume create rs --size 1G --replicas 3 >/dev/null
until cli volume show rs --output json | python3 -c 'import json,sys; v=json.load(sys.stdin); sys.exit(0 if v.get("replicas") and all(r["state"]=="in-sync" for r in v.get("replicas", [])) and len(v.get("replicas", []))==3 else 1)'; do sleep 0.5; done
p=$(cli volume show rs --output json | python3 -c 'import json,sys; v=json.load(sys.stdin); print([r["node"] for r in v["replicas"] if r["primary"]][0])')
URI=nbd://127.0.0.1:$((11000+${p#n}))/rs
echo "RF3 volume rs, primary $p: $URI"
fio --name=fill --ioengine=nbd --uri=$URI --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
run() { fio --name=b --ioengine=nbd --uri=$URI --output-format=json --output=$W/fio.json "$@" >/dev/null 2>&1; }
tail_ms() { python3 -c 'import json,sys; w=json.load(open(sys.argv[1]))["jobs"][0]["write"]; c=w["clat_ns"]; print("max %.1f ms, p99.99 %.2f ms, mean %.0f us, %d IOPS" % (c["max"]/1e6, c["percentile"]["99.990000"]/1e6, c["mean"]/1e3, w["iops"]))' $W/fio.json; }
mean_us() { python3 -c 'import json,sys; print("%.1f" % (json.load(open(sys.argv[1]))["jobs"][0]["write"]["clat_ns"]["mean"]/1e3))' $W/fio.json; }
QD1=(--rw=randwrite --bs=4k --iodepth=1 --size=256M --runtime=$RUNTIME --time_based --norandommap)
n=0
for round in $(seq 1 $ROUNDS); do
  run "${QD1[@]}"
  echo "round $round, no snapshot:   $(tail_ms)"
  run "${QD1[@]}" &
  fiopid=$!
  gap=$(python3 -c "print($RUNTIME/($SNAPS+1))")
  took=""
  for s in $(seq 1 $SNAPS); do
    sleep $gap
    n=$((n+1))
    t0=$(date +%s%N)
    cli snapshot create rs s$n >/dev/null
    took="$took $(( ($(date +%s%N) - t0) / 1000000 ))"
  done
  wait $fiopid
  echo "round $round, $SNAPS snapshots: $(tail_ms); snapshot create took$took ms"
  # The same run while they are deleted (each merges into the next layer).
  run "${QD1[@]}" &
  fiopid=$!
  took=""
  for s in $(seq $((n-SNAPS+1)) $n); do
    sleep $gap
    t0=$(date +%s%N)
    cli snapshot delete rs@s$s >/dev/null
    took="$took $(( ($(date +%s%N) - t0) / 1000000 ))"
  done
  wait $fiopid
  echo "round $round, $SNAPS deletions: $(tail_ms); snapshot delete took$took ms"
done
echo "== first writes after a snapshot (QD1, 4k, 256 MiB each)"
ONE=(--rw=randwrite --bs=4k --iodepth=1 --size=256M)
run "${ONE[@]}" --offset=512M --runtime=$RUNTIME --time_based --norandommap
echo "overwrites, no snapshot: $(mean_us) us"
cli snapshot create rs first >/dev/null
# fio's random map: each block of the 256 MiB written once, all first
# writes in the new layer.
run "${ONE[@]}" --offset=0
echo "first writes after it:   $(mean_us) us"
run "${ONE[@]}" --offset=0 --runtime=$RUNTIME --time_based --norandommap
echo "overwrites after it:     $(mean_us) us"
