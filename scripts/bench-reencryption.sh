#!/bin/bash
# Re-encryption online (issue 23): a single-node server with a master key,
# a 1 GiB volume written in full, then a retype to an encrypted type and
# back to a plain one while fio writes 4k blocks at QD1 over NBD. Prints
# each retype's wall time (switch + flatten + the old layer's deletion),
# fio's IOPS and latency percentiles alone (20 s) and with the retype
# running (25 s, the retype starting 3 s in), and the client I/O pause of
# each key switch from the server's log. RATE (e.g. 200M) limits the
# resealing. Needs fio and a release build.
set -e
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
W=$(mktemp -d /var/tmp/rekeybench.XXXX)
PID=""
cleanup() { kill $PID 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
PORT=${PORT:-20819}
$B server --data-dir $W/data --capacity 4G --nbd-insecure --nbd-listen 127.0.0.1:$PORT \
  --nvme-listen 127.0.0.1:0 --iscsi-listen 127.0.0.1:0 --api-listen 127.0.0.1:0 \
  --master-key-file $W/master.key >$W/server.log 2>&1 &
PID=$!
sleep 2
export BASALT_DATA_DIR=$W/data
$B type create secure --encrypted >/dev/null
$B type create open >/dev/null
$B volume create db --size 1G >/dev/null
URI=nbd://127.0.0.1:$PORT/db
fio --name=fill --ioengine=nbd --uri=$URI --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
qd1() {
  fio --name=q1 --ioengine=nbd --uri=$URI --rw=randwrite --bs=4k --iodepth=1 --size=1G \
    --time_based --runtime=$1 --output-format=json 2>/dev/null | sed -n '/^{/,$p' > $2
}
report() {
  python3 -c "
import json; j = json.load(open('$2'))['jobs'][0]['write']; c = j['clat_ns']; p = c['percentile']
print('%-22s IOPS %6.0f  mean %6.1f us  p99 %7.1f us  p99.9 %8.1f us  max %6.1f ms' % ('$1', j['iops'], c['mean']/1e3, p['99.000000']/1e3, p['99.900000']/1e3, c['max']/1e6))"
}
for t in secure open; do
  qd1 20 $W/alone.json
  qd1 25 $W/during.json &
  FIO=$!
  sleep 3
  s=$(date +%s.%N)
  $B volume retype db $t ${RATE:+--rate $RATE} >/dev/null
  e=$(date +%s.%N)
  wait $FIO
  echo "retype to $t: $(echo "$e - $s" | bc) s for 1 GiB"
  report "  QD1 alone" $W/alone.json
  report "  QD1 during retype" $W/during.json
done
echo "client I/O paused by each key switch (ms):" $(grep -o 'io_paused_ms=[0-9.]*' $W/server.log | cut -d= -f2)
