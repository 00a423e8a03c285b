#!/usr/bin/env bash
# Image import/export and diff-stream throughput against the tools a user
# would otherwise use on the same NBD export: qemu-img convert and nbdcopy.
#
#   scripts/bench-images.sh [BASALT_BIN] [WORKDIR] [DATA_MIB]
#
# Makes a 4 GiB sparse raw image with DATA_MIB (default 1024) MiB of random
# data in 64 MiB runs every 128 MiB, starts a server in WORKDIR, and times:
# import (basalt volume import vs qemu-img convert -n / nbdcopy into an
# empty volume), export (basalt volume export raw and qcow2 vs qemu-img
# convert / nbdcopy out of the volume), and export-diff/import-diff of the
# whole volume. Each copy is checked with cmp/qemu-img compare.
set -euo pipefail

bin=${1:-target/release/basalt}
work=${2:-/tmp/bench-images}
data_mib=${3:-1024}
bin=$(realpath "$bin")
rm -rf "$work"
mkdir -p "$work"
dd_dir="$work/data"

"$bin" server --data-dir "$dd_dir" --capacity 24G >"$work/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -f "$dd_dir/server.json" ] && break; sleep 0.1; done
sock=$(jq -r .nbd_socket "$dd_dir/server.json")
b() { "$bin" --data-dir "$dd_dir" "$@"; }
uri() { echo "nbd+unix:///$1?socket=$sock"; }
t() { local s; s=$(date +%s.%N); "$@" >/dev/null; echo "$(date +%s.%N) - $s" | bc; }

src="$work/src.raw"
truncate -s 4G "$src"
runs=$((data_mib / 64))
for i in $(seq 0 $((runs - 1))); do
    dd if=/dev/urandom of="$src" bs=1M count=64 seek=$((i * 128)) conv=notrunc status=none
done
sync

row() { printf '| %s | %s | %.2f | %.0f |\n' "$1" "$2" "$3" "$(echo "$data_mib / $3" | bc -l)"; }
echo "| direction | tool | seconds | MiB/s of data |"
echo "|---|---|---|---|"

s=$(t b volume import v-basalt "$src"); row import "basalt volume import" "$s"
b volume create v-qemu --size 4G >/dev/null
s=$(t qemu-img convert -n -f raw -O raw "$src" "$(uri v-qemu)"); row import "qemu-img convert -n" "$s"
b volume create v-nbdcopy --size 4G >/dev/null
s=$(t nbdcopy "$src" "$(uri v-nbdcopy)"); row import "nbdcopy" "$s"
for v in v-basalt v-qemu v-nbdcopy; do qemu-img compare -q -f raw -F raw "$src" "$(uri $v)"; done

# Every export reads the same volume: read it once first, so that none of
# them pays for the first, cold read of the store's blocks (the VM's host
# caches the virtual disk).
nbdcopy "$(uri v-basalt)" null:
sync
s=$(t b volume export v-basalt "$work/out.raw"); row export "basalt volume export (raw)" "$s"
cmp "$src" "$work/out.raw"; rm -f "$work/out.raw"; sync
s=$(t b volume export v-basalt "$work/out.qcow2"); row export "basalt volume export (qcow2)" "$s"
qemu-img compare -q -f raw -F qcow2 "$src" "$work/out.qcow2"; rm -f "$work/out.qcow2"; sync
# basalt volume export fsyncs its file before it reports success; qemu-img
# convert (default cache mode) and nbdcopy do not, so each is also timed
# with `sync FILE` after it (the comparable figure).
s=$(t qemu-img convert -f raw -O raw "$(uri v-basalt)" "$work/out.raw"); row export "qemu-img convert (raw), no fsync" "$s"
cmp "$src" "$work/out.raw"; rm -f "$work/out.raw"; sync
s=$(t sh -c "qemu-img convert -f raw -O raw '$(uri v-basalt)' '$work/out.raw' && sync '$work/out.raw'"); row export "qemu-img convert (raw) + sync" "$s"
rm -f "$work/out.raw"; sync
s=$(t sh -c "qemu-img convert -f raw -O qcow2 '$(uri v-basalt)' '$work/out.qcow2' && sync '$work/out.qcow2'"); row export "qemu-img convert (qcow2) + sync" "$s"
rm -f "$work/out.qcow2"; sync
s=$(t sh -c "nbdcopy '$(uri v-basalt)' '$work/out.raw' && sync '$work/out.raw'"); row export "nbdcopy + sync" "$s"
cmp "$src" "$work/out.raw"; rm -f "$work/out.raw"; sync

b snapshot create v-basalt s1 >/dev/null
s=$(t b volume export-diff v-basalt@s1 "$work/full.diff"); row export "basalt volume export-diff (full)" "$s"
b volume create v-dr --size 4G >/dev/null
s=$(t b volume import-diff "$work/full.diff" v-dr); row import "basalt volume import-diff (full)" "$s"
qemu-img compare -q -f raw -F raw "$src" "$(uri v-dr)"
