#!/usr/bin/env bash
# Basalt's whole test suite, the one command for developers and CI.
#
#   scripts/test.sh [--no-clippy] [--no-fuzz] [--no-install] [-- CARGO-TEST-ARGS...]
#
# On a fresh Debian 12 machine it first installs what the end-to-end tests
# drive (as root, with apt-get, only when something is missing):
#   fio                 fio with the nbd engine
#   qemu-utils          qemu-img, qemu-io
#   libnbd-bin          nbdinfo, nbdcopy
#   python3-libnbd      nbdsh and the python3 `nbd` module (tests/nbdsh/*.py)
#   nbdkit              reference NBD server, for comparing behaviour by hand
#   libiscsi-bin        iscsi-test-cu (libiscsi's conformance suite), iscsi-ls
#   etcd-server         etcd 3.4, started by the etcd catalog's tests
#   protobuf-compiler   protoc and the well-known .proto files (with
#   libprotobuf-dev)    libprotobuf-dev), to build the etcd-client crate
#   qemu-system-x86     boots the Linux guest of the kernel-initiator tests
#                       (crates/guest; with gcc for its placeholder libraries)
#   iproute2            `ip netns`, for the network-partition cluster tests
#   libssl-dev          OpenSSL and pkg-config, to build the openssl crate
#   pkg-config          (NBD over TLS with pre-shared keys)
#   python3-venv        the virtual environment of the Cinder driver's tests
# and makes sure apt's package lists are there: the guest harness downloads
# the guest's kernel and tools with `apt-get download` (cached in
# ~/.cache/basalt-guest, about 170 MB).
# then runs, in order, and reports each:
#   cargo fmt --all -- --check
#   cargo clippy --workspace --all-targets -- -D warnings   (skip: --no-clippy)
#   cargo test --workspace --release --no-fail-fast [CARGO-TEST-ARGS]
#   loom: the event loops' mailbox protocol under every interleaving
#         (RUSTFLAGS="--cfg loom" cargo test -p basalt-reactor --lib, in its
#         own target directory so the main build stays cached)
#   integrations/openstack/run-tests.sh: the Cinder driver with Cinder's own
#         code (pinned, from PyPI, into a cached virtual environment) against
#         a live server
#   fuzz/run.sh 30                                          (skip: --no-fuzz)
# Every step runs even if an earlier one failed; the exit status is non-zero
# if any failed. Safe to run repeatedly.

set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)

run_clippy=1
run_fuzz=1
do_install=1
test_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-clippy) run_clippy=0 ;;
        --no-fuzz) run_fuzz=0 ;;
        --no-install) do_install=0 ;;
        --) shift; test_args=("$@"); break ;;
        -h|--help) sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "test.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
    shift
done

say() { printf '\n==> %s\n' "$*"; }

# ---------------------------------------------------------------------------
# External tools for the end-to-end tests.

python_has_nbd() {
    # Debian's python3-libnbd is in /usr/bin/python3's dist-packages; a pyenv
    # or venv python3 earlier in PATH cannot import it (the tests know this).
    local py
    for py in /usr/bin/python3 "$(command -v python3 2>/dev/null)"; do
        [ -n "$py" ] && [ -x "$py" ] && "$py" -c 'import nbd' >/dev/null 2>&1 && return 0
    done
    return 1
}

missing_packages() {
    local missing=()
    command -v fio >/dev/null 2>&1 || missing+=(fio)
    { command -v qemu-img && command -v qemu-io; } >/dev/null 2>&1 || missing+=(qemu-utils)
    { command -v nbdinfo && command -v nbdcopy; } >/dev/null 2>&1 || missing+=(libnbd-bin)
    { command -v nbdsh >/dev/null 2>&1 && python_has_nbd; } || missing+=(python3-libnbd)
    command -v nbdkit >/dev/null 2>&1 || missing+=(nbdkit)
    { command -v iscsi-test-cu && command -v iscsi-ls; } >/dev/null 2>&1 || missing+=(libiscsi-bin)
    command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
    command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
    [ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
    command -v qemu-system-x86_64 >/dev/null 2>&1 || missing+=(qemu-system-x86)
    command -v cc >/dev/null 2>&1 || missing+=(gcc)
    command -v ip >/dev/null 2>&1 || missing+=(iproute2)
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
    pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
    echo "${missing[@]}"
}

# The guest harness resolves its packages from apt's lists (no lists, e.g.
# on a fresh container, means no candidate for the kernel).
apt_lists_ready() {
    apt-cache show --no-all-versions linux-image-amd64 busybox-static >/dev/null 2>&1
}

say "checking test tools"
missing=$(missing_packages)
if [ -n "$missing" ]; then
    if [ "$do_install" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing: $missing"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q || echo "warning: apt-get update failed; trying the install anyway" >&2
        # shellcheck disable=SC2086
        apt-get install -y -q --no-install-recommends $missing
        missing=$(missing_packages)
    fi
fi
if ! apt_lists_ready && [ "$do_install" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "refreshing apt's package lists (the guest harness downloads from them)"
    apt-get update -q || echo "warning: apt-get update failed" >&2
fi
if ! apt_lists_ready; then
    echo "error: apt cannot resolve linux-image-amd64 and busybox-static, which the guest" >&2
    echo "harness downloads; run: sudo apt-get update" >&2
    exit 1
fi
if [ -n "$missing" ]; then
    echo "error: missing test tools; install them with:" >&2
    echo "    sudo apt-get install $missing" >&2
    echo "(the end-to-end tests fail, rather than skip, without them)" >&2
    exit 1
fi
echo "fio: $(fio --version)  qemu-img: $(qemu-img --version | head -1)  $(nbdinfo --version | head -1)  $(etcd --version | head -1)"
echo "$(qemu-system-x86_64 --version | head -1)"

# ---------------------------------------------------------------------------
# Rust toolchain.

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
    cat >&2 <<'EOF'
error: cargo not found. Install Rust with rustup (https://rustup.rs):
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y
    . "$HOME/.cargo/env"
then run scripts/test.sh again.
EOF
    exit 1
fi
if command -v rustup >/dev/null 2>&1; then
    for comp in rustfmt clippy; do
        rustup component list --installed 2>/dev/null | grep -q "^$comp" || rustup component add "$comp"
    done
fi
cargo --version

# ---------------------------------------------------------------------------
# Steps.

LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/basalt-test.XXXXXX")
declare -a names results times
failed=0

step() {
    local name=$1; shift
    say "$name: $*"
    local t0=$SECONDS
    "$@"
    local rc=$?
    names+=("$name")
    times+=("$((SECONDS - t0))s")
    if [ $rc = 0 ]; then
        results+=("ok")
    else
        results+=("FAILED (exit $rc)")
        failed=1
    fi
}

cargo_test() {
    # Keep the output (for the totals below) and show it live.
    # --no-fail-fast: one failing test binary must not hide the others.
    cargo test --workspace --release --no-fail-fast "$@" 2>&1 | tee "$LOGDIR/cargo-test.log"
    return "${PIPESTATUS[0]}"
}

step fmt cargo fmt --all -- --check
if [ "$run_clippy" = 1 ]; then
    step clippy cargo clippy --workspace --all-targets -- -D warnings
fi
step test cargo_test "${test_args[@]}"
step loom env RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$ROOT/target/loom" \
    cargo test -p basalt-reactor --lib --release
step openstack bash integrations/openstack/run-tests.sh
if [ "$run_fuzz" = 1 ]; then
    if [ -f fuzz/run.sh ]; then
        step fuzz bash fuzz/run.sh 30
    else
        echo "error: fuzz/run.sh is missing" >&2
        names+=(fuzz); results+=("FAILED (fuzz/run.sh missing)"); times+=("0s"); failed=1
    fi
fi

# ---------------------------------------------------------------------------
# Summary.

passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' "$LOGDIR/cargo-test.log" 2>/dev/null \
    | awk '{p += $4; f += $6} END {print p + 0, f + 0}')
read -r tests_passed tests_failed <<<"${passed:-0 0}"
failing=$(grep -E '^test .* \.\.\. FAILED$' "$LOGDIR/cargo-test.log" 2>/dev/null | sed 's/^test /  /; s/ \.\.\. FAILED$//')

say "summary"
for i in "${!names[@]}"; do
    printf '  %-8s %-28s %s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
done
if [ -n "$failing" ]; then
    echo "failing tests:"
    echo "$failing"
    # CI keeps only the end of this output: repeat where each of the first
    # failures panicked, and the first lines of its message, down here.
    echo "where they failed (first lines of each panic):"
    awk 'BEGIN { lines = -1 }
         /^---- .* stdout ----$/ { name = $2; lines = -1; if (++shown > 3) exit }
         /panicked at/ && lines < 0 && name != "" { lines = 0; print "  " name ":" }
         lines >= 0 && lines < 24 { print "    " substr($0, 1, 200); lines++ }' \
        "$LOGDIR/cargo-test.log" 2>/dev/null
fi
rm -rf "$LOGDIR"
if [ "$failed" != 0 ]; then
    echo "RESULT: FAILED"
else
    echo "RESULT: all steps passed"
fi
echo "tests: $tests_passed passed, $tests_failed failed"
exit "$failed"
