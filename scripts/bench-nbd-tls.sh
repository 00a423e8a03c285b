#!/bin/bash
# NBD over TLS with a pre-shared key vs plain NBD (issue 22): the same
# single-node server twice on a preallocated data file, once serving plain
# TCP (--nbd-insecure) and once TLS (--nbd-listen), driven by qemu's own
# NBD client and TLS stack (qemu-io reading commands from a file; fio's nbd
# engine may not read a PSK file and `qemu-img bench` takes no TLS
# credentials): 4 KiB reads and writes one at a time (latency), in groups
# of 32 in flight (IOPS), and 1 MiB ones in groups of 4 (throughput), at
# sequential offsets. Each figure is the run's time less that of an empty
# run (process start and connect), per request. Two rounds, alternating.
# Needs qemu-utils and a release build.
set -eu
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
W=$(mktemp -d /var/tmp/tlsbench.XXXX)
SP=""
cleanup() { [ -n "$SP" ] && kill $SP 2>/dev/null; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT

start() { # $1: plain|tls
    rm -rf $W/d
    local mode=()
    [ "$1" = plain ] && mode=(--nbd-insecure)
    $B server --data-dir $W/d --capacity 2G --preallocate "${mode[@]}" --nbd-listen 127.0.0.1:10951 \
        --api-listen 127.0.0.1:8951 --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:4951 > $W/server.log 2>&1 &
    SP=$!
    for _ in $(seq 50); do [ -f $W/d/server.json ] && break; sleep 0.1; done
    $B volume create v --size 1G --data-dir $W/d >/dev/null
    OPTS=(--image-opts "driver=nbd,host=127.0.0.1,port=10951,export=v")
    if [ "$1" = tls ]; then
        mkdir -p $W/creds
        $B nbd-key create --data-dir $W/d > $W/creds/keys.psk 2>/dev/null
        chmod 600 $W/creds/keys.psk
        local id; id=$(cut -d: -f1 $W/creds/keys.psk)
        OPTS=(--object "tls-creds-psk,id=t0,endpoint=client,dir=$W/creds,username=$id"
              --image-opts "driver=nbd,host=127.0.0.1,port=10951,export=v,tls-creds=t0")
    fi
    # Write the first 512 MiB once so reads hit allocated blocks.
    gen write 512 1M 8 > $W/fill; qemu-io "${OPTS[@]}" < $W/fill > /dev/null
}
stop() { kill $SP; wait $SP 2>/dev/null || true; SP=""; }

# Commands for COUNT requests of SIZE (read|write), DEPTH in flight.
gen() {
    local op=$1 count=$2 size=$3 depth=$4 bytes
    bytes=$(numfmt --from=iec ${size})
    awk -v op=$op -v n=$count -v s=$size -v b=$bytes -v d=$depth 'BEGIN {
        for (i = 0; i < n; i++) {
            if (d == 1) printf "%s -q %d %s\n", op, i * b, s;
            else { printf "aio_%s -q %d %s\n", op, i * b, s; if ((i + 1) % d == 0) print "aio_flush" }
        }
        print "aio_flush" }'
}
seconds() { local t0 t1; t0=$(date +%s.%N); qemu-io "${OPTS[@]}" < $1 > /dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }

bench() { # label op count size depth
    gen $2 $3 $4 $5 > $W/cmds
    local base run; base=$(seconds /dev/null); run=$(seconds $W/cmds)
    awk -v l="$1" -v c=$3 -v b=$(numfmt --from=iec $4) -v s="$(echo "$run - $base" | bc)" 'BEGIN {
        printf "  %-16s %9.0f IOPS %8.1f MiB/s %9.1f us/request\n", l, c / s, c * b / s / 1048576, s / c * 1e6 }'
}

for round in 1 2; do
    for mode in plain tls; do
        start $mode
        echo "round $round, $mode:"
        bench "4k read QD1" read 10000 4K 1
        bench "4k write QD1" write 10000 4K 1
        bench "4k read QD32" read 50000 4K 32
        bench "4k write QD32" write 50000 4K 32
        bench "1M read QD4" read 400 1M 4
        bench "1M write QD4" write 400 1M 4
        stop
    done
done
