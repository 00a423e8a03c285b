"""Shared helpers for Basalt's python3-libnbd test scripts.

These scripts are run by the Rust integration tests in crates/cli/tests
(see crates/cli/tests/common/mod.rs), each against a freshly started
`basalt server`. They need Debian's python3-libnbd (`import nbd`), which
lives in /usr/bin/python3's dist-packages; scripts/test.sh installs it.
"""

import errno
import hashlib
import struct
import sys

import nbd

BLOCK = 4096
SECTOR = 512
MAGIC = b"BASALTPT"

# Strictness used by tests that must reach the server with requests libnbd
# would otherwise reject client-side (out of bounds, zero length, unaligned).
RELAXED = nbd.STRICT_COMMANDS | nbd.STRICT_FLAGS


def connect(uri, strict=None):
    h = nbd.NBD()
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    if strict is not None:
        h.set_strict_mode(strict)
    h.connect_uri(uri)
    return h


def block_pattern(seed, block, gen=1):
    """4 KiB of data identifying (seed, block index, generation).

    Every 512-byte sector starts with a header naming seed, block, gen and
    sector index, so a misplaced or torn block can be told apart. gen 0 is
    all zeros (never written / trimmed / zeroed).
    """
    if gen == 0:
        return bytes(BLOCK)
    digest = hashlib.blake2b(struct.pack("<QQQ", seed, block, gen), digest_size=64).digest()
    filler = digest * (SECTOR // len(digest))
    out = bytearray()
    for s in range(BLOCK // SECTOR):
        hdr = struct.pack("<8sQQQQ", MAGIC, seed, block, gen, s)
        out += hdr + filler[len(hdr):]
    return bytes(out)


def range_pattern(seed, offset, length, gen=1):
    assert offset % BLOCK == 0 and length % BLOCK == 0, (offset, length)
    first = offset // BLOCK
    return b"".join(block_pattern(seed, b, gen) for b in range(first, first + length // BLOCK))


def describe(data):
    """Human description of a 4 KiB block (or sector) read back."""
    if not any(data):
        return "zeros"
    if data[:8] == MAGIC:
        _, seed, block, gen, sector = struct.unpack_from("<8sQQQQ", data)
        return "pattern(seed=%d block=%d gen=%d sector=%d)" % (seed, block, gen, sector)
    return "unrecognised data %r..." % bytes(data[:16])


def errno_name(num):
    return errno.errorcode.get(num, str(num))


def expect_error(fn, allowed, what):
    """Run fn, which must fail with an nbd.Error whose errno is in allowed.

    Returns the errno name. Raises AssertionError otherwise.
    """
    try:
        fn()
    except nbd.Error as e:
        name = errno_name(e.errnum) if e.errnum else None
        if name not in allowed:
            raise AssertionError("%s: expected %s, got %s (%s)" % (what, "/".join(allowed), name, e.string))
        return name
    raise AssertionError("%s: expected %s, but the request succeeded" % (what, "/".join(allowed)))


def extents(h, offset, length, flags=0):
    """base:allocation extents for [offset, offset+length) as [(off, len, flags)].

    Loops over block_status until the range is covered (servers may
    return less than asked).
    """
    out = []
    pos = offset
    end = offset + length
    while pos < end:
        got = []

        def cb(metacontext, off, entries, err):
            if metacontext != nbd.CONTEXT_BASE_ALLOCATION:
                return 0
            for i in range(0, len(entries), 2):
                got.append((entries[i], entries[i + 1]))
            return 0

        h.block_status(min(end - pos, 1 << 30), pos, cb, flags)
        if not got:
            raise AssertionError("block_status at %d returned no base:allocation extents" % pos)
        for ln, fl in got:
            if ln == 0:
                raise AssertionError("block_status returned a zero-length extent at %d" % pos)
            take = min(ln, end - pos)
            out.append((pos, take, fl))
            pos += ln
            if pos >= end:
                break
    return out


def flags_over(h, offset, length):
    """Set of base:allocation flag values seen over a range."""
    return {fl for _, _, fl in extents(h, offset, length)}


class Checks:
    """Tiny runner: each check is reported; failures don't stop the run."""

    def __init__(self):
        self.passed = 0
        self.failed = []

    def run(self, name, fn, *args):
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - report everything
            self.failed.append(name)
            print("FAIL %s: %s: %s" % (name, type(e).__name__, e), flush=True)
        else:
            self.passed += 1
            print("ok   %s" % name, flush=True)

    def finish(self):
        print("%d passed, %d failed" % (self.passed, len(self.failed)), flush=True)
        if self.failed:
            print("failed checks: " + ", ".join(self.failed), flush=True)
            sys.exit(1)
        sys.exit(0)
