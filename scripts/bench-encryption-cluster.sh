#!/bin/bash
# The cost of encryption on a replicated volume (issue 23): 3 node
# processes with a real etcd on loopback, all started with the same
# --master-key-file, a plain and an encrypted RF3 1 GiB volume written in
# full first; fio's nbd engine through each volume's primary node, each
# cell run on the plain volume then on the encrypted one, RUNTIME s after
# 1 s of ramp, ROUNDS rounds. Needs etcd, fio, jq and a release build.
set -eu
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
ROUNDS=${ROUNDS:-2}
RUNTIME=${RUNTIME:-5}
W=$(mktemp -d /var/tmp/encrf3.XXXX)
PIDS=""
EP=""
cleanup() { kill $PIDS $EP 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
etcd --data-dir $W/etcd --listen-client-urls http://127.0.0.1:23791 --advertise-client-urls http://127.0.0.1:23791 \
    --listen-peer-urls http://127.0.0.1:23801 >$W/etcd.log 2>&1 &
EP=$!
sleep 2
for i in 0 1 2; do
  $B server --data-dir $W/n$i --capacity 4G --etcd http://127.0.0.1:23791 --node-name n$i \
    --peer-listen 127.0.0.1:$((7200+i)) --cluster-secret-file $W/cluster-secret \
    --master-key-file $W/master.key --nbd-insecure --nbd-listen 127.0.0.1:$((10950+i)) \
    --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 --api-listen 127.0.0.1:$((8150+i)) >$W/n$i.log 2>&1 &
  PIDS="$PIDS $!"
  # The first node creates the key file; the others read the same one.
  [ $i = 0 ] && for _ in $(seq 50); do [ -s $W/master.key ] && break; sleep 0.1; done
done
sleep 3
$B volume create plain --size 1G --replicas 3 --data-dir $W/n0 >/dev/null
$B volume create enc --size 1G --replicas 3 --encrypted --data-dir $W/n0 >/dev/null
sleep 3
prim() { $B volume show $1 --data-dir $W/n0 --output json | jq -r '.replicas[] | select(.primary) | .node'; }
uri() { p=$(prim $1); echo nbd://127.0.0.1:$((10950+${p#n}))/$1; }
PLAIN=$(uri plain)
ENC=$(uri enc)
echo "plain: $PLAIN  encrypted: $ENC"
for u in $PLAIN $ENC; do
    fio --name=pre --ioengine=nbd --uri=$u --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null
done
cell() { # uri label fio-args...
    local u=$1 label=$2; shift 2
    fio --ioengine=nbd --uri=$u --size=1G --runtime=$RUNTIME --time_based --ramp_time=1 \
        --group_reporting --output-format=json --name=c "$@" 2>/dev/null | sed -n '/^{/,$p' |
    jq -r --arg v "${u##*/}" --arg l "$label" '
        .jobs[0] as $j | ($j.read.iops + $j.write.iops) as $iops |
        (($j.read.bw_bytes + $j.write.bw_bytes) / 1048576) as $mib |
        (if $j.read.iops > 0 then $j.read.clat_ns.mean else $j.write.clat_ns.mean end / 1000) as $lat |
        "\($l) \($v): \($iops|floor) IOPS, \($mib|floor) MiB/s, mean \($lat*10|floor/10) us"'
}
for round in $(seq $ROUNDS); do
    echo "== round $round"
    for u in $PLAIN $ENC; do cell $u "RF3 4k randwrite QD1" --rw=randwrite --bs=4k --iodepth=1; done
    for u in $PLAIN $ENC; do cell $u "RF3 4k randread QD1" --rw=randread --bs=4k --iodepth=1; done
    for u in $PLAIN $ENC; do cell $u "RF3 4k randwrite QD32" --rw=randwrite --bs=4k --iodepth=32; done
    for u in $PLAIN $ENC; do cell $u "RF3 1M write QD8" --rw=write --bs=1M --iodepth=8; done
done
