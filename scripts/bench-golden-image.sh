#!/usr/bin/env bash
# Golden image, seed-style (issue 21; the OpenShift Container Storage
# paper in ../shared/seeds/ times "clone and start 10 VMs" and "start 10
# pre-existing VMs": 207 s / 35 s on Ceph-backed OCS, 150 s / 23 s on NFS).
#
#   scripts/bench-golden-image.sh [BASALT_BINARY]   (default target/release/basalt)
#
# What it does, end to end:
#   1. Builds a bootable disk image (ext4, `mke2fs -d`, no mount): busybox
#      (static), Debian 12's kernel module tree (~390 MB, so the image is
#      the size of a small distro's, like the seed's 289 MB Fedora image),
#      a random id in /etc/golden-id and /sbin/init, which loads virtio_net
#      from the disk, reads BOOT_READ_MIB (64) MiB of the disk's files (a
#      stand-in for the user space a distro's boot reads), prints
#      `GOLDEN-BOOTED <id> <vm> <guest uptime> <sectors read from vda>` on
#      the console, remounts / read-only and powers off. The kernel (the
#      .deb's, uncompressed, booted by QEMU's -kernel) starts with a tiny
#      initramfs whose only job is to load virtio_blk and ext4, mount
#      /dev/vda and switch_root into the disk's /sbin/init: everything that
#      counts as "the VM booted" is read from the disk over NBD, and the id
#      printed proves it (the initramfs does not have it).
#   2. Starts its own server (temporary data dir, sparse 8 GiB store, API
#      and NVMe/TCP on free ports, NBD on the data dir's Unix socket),
#      imports the image (`basalt volume import golden disk.img`) and takes
#      `golden@base`.
#   3. Clones: 10 `basalt volume create vmN --from golden@base` at once
#      (wall time for all 10), then boots 10 QEMU guests at once, each from
#      its clone through QEMU's own NBD client (virtio-blk, cache=none),
#      and times launch -> marker for each guest. Then boots the same 10
#      again ("start 10 pre-existing VMs").
#   4. Full copies, the baseline without clones: 10 at once of
#      `basalt volume create fullN --size S` + `qemu-img convert -n` from
#      the NBD export golden@base into fullN (what a copying clone does:
#      read the source volume, write the whole image), then the same two
#      boots.
#   5. Prints a table (and the per-guest times) and removes everything it
#      made; it kills only the processes it started, by PID.
#
# Environment: VMS (10), MEM_MIB (256 per guest), ACCEL (auto: kvm if a
# guest really boots under it, else tcg), SIZE (512M, the image and volume
# size), BOOT_READ_MIB (64; 0: the init reads only itself, busybox and
# virtio_net's modules), TIMEOUT (600 s per boot round), TMPDIR (where
# its work directory goes, default /var/tmp; about 1.5 GB), KEEP (set:
# leave the work directory, with the consoles and logs),
# GOLDEN_CACHE (where the downloaded kernel and busybox .debs are kept;
# default ~/.cache/basalt-guest/golden-image; the guest harness's own
# cache/debs are reused when they hold the same packages).
#
# Needs (Debian 12): qemu-system-x86, qemu-utils, e2fsprogs, cpio, jq,
# apt-get/apt-cache/dpkg-deb (the .debs are fetched with `apt-get download`,
# no root needed for that). Runs guests with one vCPU each.
set -euo pipefail

BIN=${1:-$(dirname "$0")/../target/release/basalt}
VMS=${VMS:-10}
MEM_MIB=${MEM_MIB:-256}
ACCEL=${ACCEL:-auto}
SIZE=${SIZE:-512M}
BOOT_READ_MIB=${BOOT_READ_MIB:-64}
TIMEOUT=${TIMEOUT:-600}
HARNESS_CACHE=${BASALT_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/basalt-guest}
GOLDEN_CACHE=${GOLDEN_CACHE:-$HARNESS_CACHE/golden-image}
MARK=GOLDEN-BOOTED

for t in qemu-system-x86_64 qemu-img mke2fs cpio jq xz apt-get apt-cache dpkg-deb; do
    command -v "$t" >/dev/null || {
        echo "missing $t (apt-get install qemu-system-x86 qemu-utils e2fsprogs cpio jq)" >&2
        exit 1
    }
done
[ -x "$BIN" ] || { echo "no basalt binary at $BIN (cargo build --release -p basalt)" >&2; exit 1; }

W=$(mktemp -d "${TMPDIR:-/var/tmp}/golden-bench.XXXXXX")
# PIDs of everything started here and not yet reaped (server, QEMUs,
# create/copy workers); a reaped PID leaves the list, so cleanup never
# signals a PID the kernel may have given to someone else.
declare -A PIDS=()
reap() { wait "$1"; local rc=$?; unset "PIDS[$1]"; return $rc; }
cleanup() {
    local p
    for p in "${!PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${!PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# A copy: the shared target dir may be rebuilt while this runs.
cp "$BIN" "$W/basalt"
BIN=$W/basalt
now() { echo "$EPOCHREALTIME"; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# ---------------------------------------------------------------- packages
# The kernel linux-image-amd64 points at, and busybox-static: from the
# harness's cache if it has them, else downloaded into GOLDEN_CACHE.
deb() { # PACKAGE -> path of its .deb at the candidate version
    local pkg=$1 ver f
    ver=$(apt-cache policy "$pkg" | awk '/Candidate:/ { print $2 }')
    [ -n "$ver" ] && [ "$ver" != "(none)" ] || { echo "apt knows no $pkg (apt-get update?)" >&2; return 1; }
    ver=${ver#*:}
    for f in "$HARNESS_CACHE/debs/${pkg}_"*"${ver}_amd64.deb" "$GOLDEN_CACHE/${pkg}_"*"${ver}_amd64.deb"; do
        [ -f "$f" ] && { echo "$f"; return; }
    done
    mkdir -p "$GOLDEN_CACHE"
    (cd "$GOLDEN_CACHE" && apt-get download -q "$pkg" >/dev/null 2>"$W/apt.log") || {
        cat "$W/apt.log" >&2
        return 1
    }
    for f in "$GOLDEN_CACHE/${pkg}_"*"${ver}_amd64.deb"; do
        [ -f "$f" ] && { echo "$f"; return; }
    done
    echo "apt-get download $pkg left no .deb in $GOLDEN_CACHE" >&2
    return 1
}
KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ && !k { k = $2 } END { print k }')
[ -n "$KPKG" ] || { echo "cannot resolve linux-image-amd64's kernel package" >&2; exit 1; }
echo "== packages: $KPKG, busybox-static"
KDEB=$(deb "$KPKG")
BDEB=$(deb busybox-static)
dpkg-deb -x "$KDEB" "$W/kernel"
dpkg-deb -x "$BDEB" "$W/busybox"
VMLINUZ=$(ls "$W"/kernel/boot/vmlinuz-*)
RELEASE=${VMLINUZ##*/vmlinuz-}
# The uncompressed kernel (an ELF that QEMU boots through its PVH entry),
# as the guest harness does: decompressing the bzImage under TCG costs each
# guest seconds of CPU that say nothing about storage. The payload is the
# xz stream at its magic; xz stops at the trailing data with an error,
# hence the check of the result instead of its status.
VMLINUX=$W/vmlinux
pos=$(LC_ALL=C grep -abo $'\xfd7zXZ' "$VMLINUZ" | awk -F: 'NR == 1 { print $1 }')
[ -n "$pos" ] || { echo "no xz payload in $VMLINUZ" >&2; exit 1; }
tail -c +$((pos + 1)) "$VMLINUZ" | xz -dc >"$VMLINUX" 2>/dev/null || true
[ "$(head -c 4 "$VMLINUX" | od -An -c | tr -d ' ')" = '177ELF' ] || {
    echo "could not extract vmlinux from $VMLINUZ" >&2
    exit 1
}
MODDIR=$W/kernel/lib/modules/$RELEASE
BUSYBOX=$W/busybox/bin/busybox

# modules_for MODULE... -> module names, dependencies first, each once.
# (The .deb has no modules.dep: depmod runs at install. Each module's
# `depends=` modinfo field lists its direct dependencies.)
declare -A MODPATH=()
while read -r rel; do
    m=${rel##*/}; m=${m%.ko}; MODPATH[${m//-/_}]=$MODDIR/$rel
done < <(cd "$MODDIR" && find kernel -name '*.ko')
declare -A SEEN=()
ORDER=()
modules_for() {
    local m d deps
    for m in "$@"; do
        [ -n "${SEEN[$m]:-}" ] && continue
        SEEN[$m]=1
        [ -n "${MODPATH[$m]:-}" ] || { echo "no module $m in $KPKG" >&2; exit 1; }
        deps=$(grep -a -o 'depends=[a-z0-9_,-]*' "${MODPATH[$m]}" | awk -F= 'NR == 1 { print $2 }')
        for d in ${deps//,/ }; do modules_for "${d//-/_}"; done
        ORDER+=("$m")
    done
}

# ---------------------------------------------------------------- initramfs
# Loads the disk driver and ext4 (crc32c_generic: ext4's metadata
# checksums), mounts /dev/vda and hands over to the disk's /sbin/init.
echo "== building the initramfs and the disk image"
I=$W/initramfs
mkdir -p "$I"/{bin,dev,proc,sys,newroot,lib/modules}
cp "$BUSYBOX" "$I/bin/busybox"
ln -s busybox "$I/bin/sh"
SEEN=(); ORDER=()
modules_for virtio_pci virtio_blk crc32c_generic ext4
for m in "${ORDER[@]}"; do cp "${MODPATH[$m]}" "$I/lib/modules/$m.ko"; done
INITRAMFS_MODULES=("${ORDER[@]}")
{
    cat <<'EOF'
#!/bin/busybox sh
# Initramfs of scripts/bench-golden-image.sh: load the disk driver and
# ext4, mount the disk, switch_root to its /sbin/init.
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
fail() { echo "GOLDEN-INITRAMFS-FAILED $*"; /bin/busybox poweroff -f; }
EOF
    for m in "${ORDER[@]}"; do echo "/bin/busybox insmod /lib/modules/$m.ko || fail insmod $m"; done
    cat <<'EOF'
i=0
while [ ! -b /dev/vda ]; do
    i=$((i + 1)); [ $i -le 200 ] || fail "no /dev/vda"; /bin/busybox usleep 20000
done
/bin/busybox mount -t ext4 /dev/vda /newroot || fail "mount /dev/vda"
/bin/busybox umount /proc /sys
/bin/busybox mount --move /dev /newroot/dev
exec /bin/busybox switch_root -c /dev/console /newroot /sbin/init
EOF
} > "$I/init"
chmod 755 "$I/init"
(cd "$I" && find . | cpio -o -H newc --quiet) > "$W/initramfs.cpio"

# ---------------------------------------------------------------- disk
R=$W/rootfs
mkdir -p "$R"/{bin,sbin,dev,proc,sys,tmp,etc,lib/modules}
cp "$BUSYBOX" "$R/bin/busybox"
for a in $("$BUSYBOX" --list); do [ "$a" = busybox ] || ln -s busybox "$R/bin/$a"; done
mv "$MODDIR" "$R/lib/modules/$RELEASE"
for m in "${!MODPATH[@]}"; do MODPATH[$m]=${MODPATH[$m]/#$MODDIR/$R/lib/modules/$RELEASE}; done
# The files the init reads at boot: the first BOOT_READ_MIB MiB of the
# module tree (sorted by path), a stand-in for the user space a distro's
# boot reads (the init, libraries, services).
(cd "$R" && find lib/modules -type f -name '*.ko' | LC_ALL=C sort | xargs -d '\n' stat -c '%s %n' |
    awk -v max=$((BOOT_READ_MIB * 1048576)) 'max > 0 && sum < max { sum += $1; print "/" $2 }') >"$R/etc/boot-read"
GOLDEN_ID=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
echo "$GOLDEN_ID" > "$R/etc/golden-id"
SEEN=(); for m in "${INITRAMFS_MODULES[@]}"; do SEEN[$m]=1; done; ORDER=()
modules_for virtio_net
{
    cat <<'EOF'
#!/bin/sh
# The golden image's init (scripts/bench-golden-image.sh): what a distro's
# early boot does, in miniature — kernel file systems, the NIC's driver
# from the disk, loopback — then the marker line and power-off.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
EOF
    for m in "${ORDER[@]}"; do
        echo "insmod ${MODPATH[$m]#"$R"} || echo \"insmod $m failed\""
    done
    cat <<EOF
ip link set lo up
xargs cat </etc/boot-read >/dev/null
vm=\$(cat /proc/cmdline); vm=\${vm##*golden_vm=}; vm=\${vm%% *}
read -r _ _ sectors _ </sys/block/vda/stat
echo "$MARK \$(cat /etc/golden-id) \$vm \$(cut -d' ' -f1 /proc/uptime) \$sectors"
mount -o remount,ro /
sync
poweroff -f
EOF
} > "$R/sbin/init"
chmod 755 "$R/sbin/init"
mke2fs -q -t ext4 -L golden -d "$R" "$W/disk.img" "$SIZE"
IMG_USED=$(du -sm "$R" | cut -f1)
rm -rf "$R" "$W/kernel/lib"

# ---------------------------------------------------------------- accel
# KVM only if a guest really runs under it (a /dev/kvm node can exist
# where the CPU has no virtualisation extensions): boot the kernel with no
# disk and wait for its first console line.
if [ "$ACCEL" = auto ]; then
    ACCEL=tcg
    if [ -w /dev/kvm ] && timeout 10 qemu-system-x86_64 -accel kvm -cpu host -m 128 -nodefaults \
        -no-user-config -display none -serial stdio -no-reboot -kernel "$VMLINUX" \
        -append "console=ttyS0 panic=-1 loglevel=4 rdinit=/nonexistent" </dev/null 2>/dev/null |
        grep -q -m1 'Linux version'; then
        ACCEL=kvm
    fi
fi
CPU=()
[ "$ACCEL" = kvm ] && CPU=(-cpu host)

# ---------------------------------------------------------------- server
echo "== server ($W/data)"
"$BIN" server --data-dir "$W/data" --capacity 8G --api-listen 127.0.0.1:0 --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 \
    >"$W/server.log" 2>&1 &
SERVER=$!
PIDS[$SERVER]=1
for _ in $(seq 300); do
    [ -f "$W/data/server.json" ] && "$BIN" --data-dir "$W/data" status >/dev/null 2>&1 && break
    kill -0 "$SERVER" 2>/dev/null || { cat "$W/server.log" >&2; exit 1; }
    sleep 0.1
done
cli() { "$BIN" --data-dir "$W/data" "$@"; }
SOCK=$(jq -r .nbd_socket "$W/data/server.json")
[ -S "$SOCK" ] || { echo "no NBD socket at $SOCK" >&2; exit 1; }
allocated_mib() { cli status --output json | jq '.allocated_bytes / 1048576 | floor'; }

t=$(now)
cli volume import golden "$W/disk.img" >"$W/import.log" 2>&1 || { cat "$W/import.log" >&2; exit 1; }
T_IMPORT=$(secs "$t" "$(now)")
cli snapshot create golden base >/dev/null
ALLOC_GOLDEN=$(allocated_mib)
echo "   work directory $W"
echo "   imported $SIZE image (${IMG_USED} MiB of files) in ${T_IMPORT} s; accel $ACCEL"

# ---------------------------------------------------------------- stages
# parallel LABEL COMMAND... : runs COMMAND N times at once ("{}" in it
# replaced by N = 1..VMS); sets PAR_WALL, the wall time for all; fails if
# any failed.
parallel() {
    local label=$1 i pids=() rc=0 t0; shift
    t0=$(now)
    for i in $(seq "$VMS"); do
        "${@//\{\}/$i}" >"$W/$label-$i.log" 2>&1 &
        pids+=($!); PIDS[$!]=1
    done
    for i in "${!pids[@]}"; do
        reap "${pids[$i]}" || { rc=1; cat "$W/$label-$((i + 1)).log" >&2; }
    done
    PAR_WALL=$(secs "$t0" "$(now)")
    [ $rc = 0 ] || { echo "$label failed" >&2; exit 1; }
}

# stamp OUT: copies a console to OUT and writes the time the marker line
# arrived (epoch seconds) to OUT.t.
stamp() {
    local out=$1 line
    while IFS= read -r line; do
        printf '%s\n' "$line" >>"$out"
        case $line in
        *"$MARK"*) echo "$EPOCHREALTIME" >"$out.t" ;;
        esac
    done
}

# boot_timeout LABEL PREFIX PID...: what each guest still running shows.
boot_timeout() {
    local label=$1 prefix=$2 i=0 pid out seen; shift 2
    echo "boot $label: timeout after $TIMEOUT s; still running:" >&2
    for pid in "$@"; do
        i=$((i + 1)); out=$W/console-$label-$i
        [ -n "${PIDS[$pid]:-}" ] || continue # exited and reaped
        seen="not seen"; [ -s "$out.t" ] && seen=seen
        echo "--- $prefix$i (QEMU $pid), marker $seen; console tail:" >&2
        tail -n 8 "$out" "$out.err" >&2 2>/dev/null || true
    done
    echo "--- server log tail:" >&2
    tail -n 20 "$W/server.log" >&2 || true
    exit 1
}

# boot LABEL PREFIX: boots guests PREFIX1..PREFIXn at once, each from its
# volume over NBD; sets BOOT_LIST (per guest: its launch -> its marker),
# BOOT_MAX (the slowest), BOOT_END (epoch time of the last marker) and
# BOOT_GUEST (guest 1's uptime at the marker and what it read from vda).
boot() {
    local label=$1 prefix=$2 i pid pids=() starts=() deadline out v
    for i in $(seq "$VMS"); do
        out=$W/console-$label-$i
        rm -f "$out" "$out.t"
        starts+=("$(now)")
        qemu-system-x86_64 -accel "$ACCEL" "${CPU[@]}" -smp 1 -m "$MEM_MIB" -nodefaults -no-user-config \
            -display none -serial stdio -no-reboot \
            -kernel "$VMLINUX" -initrd "$W/initramfs.cpio" \
            -append "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init golden_vm=$prefix$i" \
            -drive "file=nbd+unix:///$prefix$i?socket=$SOCK,format=raw,if=virtio,cache=none" \
            </dev/null 2>"$out.err" > >(stamp "$out") &
        pid=$!
        pids+=("$pid"); PIDS[$pid]=1
    done
    deadline=$((SECONDS + TIMEOUT))
    for i in "${!pids[@]}"; do
        while kill -0 "${pids[$i]}" 2>/dev/null; do
            [ $SECONDS -ge $deadline ] && boot_timeout "$label" "$prefix" "${pids[@]}"
            sleep 0.2
        done
        reap "${pids[$i]}" || true
    done
    sleep 0.3 # the console readers write their last lines
    BOOT_LIST=(); BOOT_MAX=0; BOOT_END=0
    for i in $(seq "$VMS"); do
        out=$W/console-$label-$i
        if [ ! -s "$out.t" ] || ! grep -q "$MARK $GOLDEN_ID $prefix$i " "$out"; then
            echo "boot $label: $prefix$i never printed '$MARK $GOLDEN_ID $prefix$i'; its console:" >&2
            tail -n 30 "$out" "$out.err" >&2 || true
            exit 1
        fi
        v=$(cat "$out.t")
        BOOT_LIST+=("$(secs "${starts[$((i - 1))]}" "$v")")
        BOOT_END=$(awk -v a="$BOOT_END" -v b="$v" 'BEGIN { printf "%.6f", (b > a) ? b : a }')
    done
    BOOT_MAX=$(printf '%s\n' "${BOOT_LIST[@]}" | sort -g | tail -1)
    BOOT_GUEST=$(grep -m1 "$MARK" "$W/console-$label-1" | tr -d '\r' |
        awk '{ printf "%s s guest uptime at the marker, %d KiB read from vda", $4, $5 / 2 }')
}
stats() { printf '%s\n' "$@" | awk '{ s += $1; if (NR == 1 || $1 < mn) mn = $1; if ($1 > mx) mx = $1 } END { printf "min %.2f / mean %.2f / max %.2f", mn, s / NR, mx }'; }

declare -A RES=()
run_set() { # KIND PREFIX CREATE-COMMAND...
    local kind=$1 prefix=$2 t0; shift 2
    echo "== $kind: $VMS at once"
    t0=$(now)
    parallel "create-$kind" "$@"
    RES[$kind.create]=$PAR_WALL
    RES[$kind.alloc]=$(($(allocated_mib) - ALLOC_GOLDEN))
    echo "   created in ${RES[$kind.create]} s (+${RES[$kind.alloc]} MiB allocated)"
    boot "$kind-first" "$prefix"
    RES[$kind.boot1]=$BOOT_MAX
    RES[$kind.boot1.list]=$(stats "${BOOT_LIST[@]}")
    RES[$kind.e2e]=$(secs "$t0" "$BOOT_END")
    echo "   first boot: ${RES[$kind.boot1.list]} s (vm1: $BOOT_GUEST); created + booted in ${RES[$kind.e2e]} s"
    boot "$kind-again" "$prefix"
    RES[$kind.boot2]=$BOOT_MAX
    RES[$kind.boot2.list]=$(stats "${BOOT_LIST[@]}")
    echo "   second boot: ${RES[$kind.boot2.list]} s"
}
BYTES=$(cli volume show golden --output json | jq .size_bytes)
run_set clones vm "$BIN" --data-dir "$W/data" volume create "vm{}" --from golden@base
run_set copies full sh -c "'$BIN' --data-dir '$W/data' volume create full{} --size $BYTES >/dev/null &&
    qemu-img convert -n -f raw -O raw 'nbd+unix:///golden@base?socket=$SOCK' 'nbd+unix:///full{}?socket=$SOCK'"

# ---------------------------------------------------------------- report
echo
echo "Golden image: $SIZE ext4 (${IMG_USED} MiB of files), $VMS guests x 1 vCPU x $MEM_MIB MiB, $ACCEL, kernel $RELEASE"
echo
echo "| $VMS VMs at once | Basalt clones (\`volume create --from golden@base\`) | full copies (\`qemu-img convert\` from golden@base) |"
echo "|---|---|---|"
echo "| create $VMS volumes (wall) | ${RES[clones.create]} s | ${RES[copies.create]} s |"
echo "| space they allocate | ${RES[clones.alloc]} MiB | ${RES[copies.alloc]} MiB |"
echo "| boot $VMS (launch -> disk's init ran; slowest) | ${RES[clones.boot1]} s | ${RES[copies.boot1]} s |"
echo "| **create and start $VMS VMs** (seed: 207 s Ceph, 150 s NFS) | **${RES[clones.e2e]} s** | **${RES[copies.e2e]} s** |"
echo "| **start $VMS pre-existing VMs** (seed: 34.8 s Ceph, 23.2 s NFS) | **${RES[clones.boot2]} s** | **${RES[copies.boot2]} s** |"
echo
echo "Per guest, launch -> marker (s):"
echo "  clones, first boot:  ${RES[clones.boot1.list]}"
echo "  clones, second boot: ${RES[clones.boot2.list]}"
echo "  copies, first boot:  ${RES[copies.boot1.list]}"
echo "  copies, second boot: ${RES[copies.boot2.list]}"
echo "  (import of the golden image: $T_IMPORT s)"
