#!/usr/bin/env python3
"""NBD protocol conformance checks against one fresh (all-zero) export.

usage: protocol.py NBD-URI [EXPECTED-SIZE]

Prints one line per check and a closing 'N passed, N failed' line; exits
non-zero if any check failed. Regions of the export used by each check are
disjoint, so checks don't disturb each other; the export must be at least
16 MiB and must read as zeros at the start.
"""

import os
import sys

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nbdtest import (  # noqa: E402
    BLOCK, RELAXED, Checks, block_pattern, connect, describe, expect_error, extents, flags_over,
    range_pattern,
)

MiB = 1 << 20
HOLE = nbd.STATE_HOLE
ZERO = nbd.STATE_ZERO

uri = sys.argv[1]
expected_size = int(sys.argv[2]) if len(sys.argv) > 2 else None

h = connect(uri, strict=RELAXED)
size = h.get_size()
SEED = 0xB45A17


def alive():
    """The connection still serves a normal request after an error."""
    h.pwrite(b"\x5a" * BLOCK, 15 * MiB)
    assert h.pread(BLOCK, 15 * MiB) == b"\x5a" * BLOCK, "connection not usable after an error"


def check_handshake():
    assert size >= 16 * MiB, "export is %d bytes, need >= 16 MiB" % size
    if expected_size is not None:
        assert size == expected_size, "export size %d, expected %d" % (size, expected_size)
    assert h.get_protocol() == "newstyle-fixed", h.get_protocol()
    assert h.get_structured_replies_negotiated(), "structured replies not negotiated"
    assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION), "base:allocation not negotiated"
    assert not h.is_read_only(), "export is read-only"


def check_flags():
    missing = [name for name, fn in [
        ("can_flush", h.can_flush), ("can_fua", h.can_fua), ("can_trim", h.can_trim),
        ("can_zero", h.can_zero), ("can_cache", h.can_cache), ("can_multi_conn", h.can_multi_conn),
    ] if not fn()]
    assert not missing, "server does not advertise: " + ", ".join(missing)


def check_block_size():
    mn = h.get_block_size(nbd.SIZE_MINIMUM)
    pref = h.get_block_size(nbd.SIZE_PREFERRED)
    mx = h.get_block_size(nbd.SIZE_MAXIMUM)
    assert mn == 512, "minimum block size %d, expected 512" % mn
    assert pref == 4096, "preferred block size %d, expected 4096" % pref
    assert mx >= pref and mx % pref == 0, "maximum block size %d" % mx
    # A request of the full maximum payload (capped to libnbd's 64 MiB and the export) works.
    n = min(mx, size, 32 * MiB)
    assert len(h.pread(n, 0)) == n


def check_fresh_is_zero_hole():
    # The tail of a fresh export was never written: reads zeros, reported as hole+zero.
    off = size - MiB
    assert h.pread(MiB, off) == bytes(MiB), "fresh export tail does not read zeros"
    ext = extents(h, off, MiB)
    bad = [(o, ln, fl) for o, ln, fl in ext if fl != HOLE | ZERO]
    assert not bad, "fresh region not reported as hole,zero: %r" % bad


def check_read_out_of_range():
    expect_error(lambda: h.pread(BLOCK, size), ["EINVAL"], "read at end of export")
    expect_error(lambda: h.pread(2 * BLOCK, size - BLOCK), ["EINVAL"], "read straddling end")
    expect_error(lambda: h.pread(BLOCK, size + 1024 * MiB), ["EINVAL"], "read far beyond end")
    alive()


def check_write_out_of_range():
    # NBD: the server SHOULD return ENOSPC for writes beyond the end (Basalt's spec says ENOSPC).
    expect_error(lambda: h.pwrite(b"\x11" * BLOCK, size), ["ENOSPC"], "write at end of export")
    expect_error(lambda: h.pwrite(b"\x11" * 2 * BLOCK, size - BLOCK), ["ENOSPC"], "write straddling end")
    alive()
    # The write straddling the end must not have touched the last in-range block... NBD lets a
    # failed write be partial, so only check the connection, not the content.


def check_other_out_of_range():
    # trim / write_zeroes / cache / block_status beyond the end: an error, never a disconnect.
    expect_error(lambda: h.trim(BLOCK, size), ["EINVAL", "ENOSPC"], "trim beyond end")
    expect_error(lambda: h.zero(BLOCK, size), ["EINVAL", "ENOSPC"], "write_zeroes beyond end")
    expect_error(lambda: h.cache(BLOCK, size), ["EINVAL"], "cache beyond end")
    expect_error(lambda: h.block_status(BLOCK, size, lambda *a: 0), ["EINVAL"], "block_status beyond end")
    alive()


def check_unaligned():
    # offset 1, length 3: read-modify-write inside one 512-byte sector.
    h.pwrite(b"abc", 1)
    assert h.pread(3, 1) == b"abc", "unaligned read-back differs"
    got = h.pread(BLOCK, 0)
    assert got[0:1] == b"\0" and got[1:4] == b"abc" and got[4:] == bytes(BLOCK - 4), \
        "neighbours of an unaligned write changed: %r" % got[:16]
    # Crossing a 4 KiB block boundary, unaligned at both ends.
    data = bytes(range(256)) * 40  # 10240 bytes
    off = 2 * BLOCK - 700
    h.pwrite(data, off)
    assert h.pread(len(data), off) == data, "unaligned cross-block read-back differs"
    assert h.pread(BLOCK - 700, BLOCK) == bytes(BLOCK - 700), "bytes before cross-block write changed"
    tail = off + len(data)
    assert h.pread(6 * BLOCK - tail, tail) == bytes(6 * BLOCK - tail), "bytes after cross-block write changed"
    # Unaligned reads of aligned data.
    assert h.pread(3, off + 5) == data[5:8]


def check_zero_length():
    # Unspecified by NBD except that the server SHOULD NOT disconnect: accept success or EINVAL.
    for what, fn in [("read", lambda: h.pread(0, 0)), ("write", lambda: h.pwrite(b"", 0)),
                     ("read at end", lambda: h.pread(0, size)), ("write at end", lambda: h.pwrite(b"", size))]:
        try:
            r = fn()
            if what.startswith("read"):
                assert r == b"", "zero-length %s returned %d bytes" % (what, len(r))
        except nbd.Error as e:
            # a write at offset == size may also be refused as beyond the end
            allowed = ["EINVAL"] if what.startswith("read") else ["EINVAL", "ENOSPC"]
            assert e.errno in allowed, "zero-length %s failed with %s" % (what, e)
    alive()


def check_fua():
    base = 1 * MiB
    data = range_pattern(SEED, base, 64 * 1024)
    h.pwrite(data, base, nbd.CMD_FLAG_FUA)
    assert h.pread(len(data), base) == data
    h.pwrite(b"\x77" * 512, base + 512, nbd.CMD_FLAG_FUA)  # unaligned-to-4K FUA write
    exp = data[:512] + b"\x77" * 512 + data[1024:]
    assert h.pread(len(data), base) == exp
    h.zero(BLOCK, base, nbd.CMD_FLAG_FUA)
    h.trim(BLOCK, base + BLOCK, nbd.CMD_FLAG_FUA)
    assert h.pread(2 * BLOCK, base) == bytes(2 * BLOCK)
    h.flush()


def check_flush():
    h.pwrite(b"\x42" * BLOCK, 1 * MiB + 512 * 1024)
    h.flush()
    h.flush()  # nothing dirty: still fine


def check_trim():
    base = 2 * MiB
    data = range_pattern(SEED, base, MiB)
    h.pwrite(data, base)
    assert h.pread(MiB, base) == data
    h.trim(256 * 1024, base + 256 * 1024)
    got = h.pread(MiB, base)
    assert got[256 * 1024:512 * 1024] == bytes(256 * 1024), "trimmed range does not read zeros"
    assert got[:256 * 1024] == data[:256 * 1024] and got[512 * 1024:] == data[512 * 1024:], \
        "trim changed data outside its range"
    # Trim of a whole aligned range then flush: reads zeros.
    h.trim(MiB, base)
    h.flush()
    assert h.pread(MiB, base) == bytes(MiB)


def check_zero():
    base = 3 * MiB
    data = range_pattern(SEED, base, MiB)
    h.pwrite(data, base)
    h.zero(128 * 1024, base)                      # may punch a hole
    h.zero(100, base + 200 * 1024 + 7)            # unaligned
    got = h.pread(MiB, base)
    assert got[:128 * 1024] == bytes(128 * 1024), "write_zeroes range does not read zeros"
    assert got[200 * 1024 + 7:200 * 1024 + 107] == bytes(100), "unaligned write_zeroes not zero"
    exp = bytearray(data)
    exp[:128 * 1024] = bytes(128 * 1024)
    exp[200 * 1024 + 7:200 * 1024 + 107] = bytes(100)
    assert got == bytes(exp), "write_zeroes changed data outside its range"
    # Zeroing a never-written range keeps it reading zeros.
    h.zero(MiB, 12 * MiB)
    assert h.pread(MiB, 12 * MiB) == bytes(MiB)


def check_zero_no_hole():
    base = 4 * MiB
    data = range_pattern(SEED, base, MiB)
    h.pwrite(data, base)
    h.zero(256 * 1024, base, nbd.CMD_FLAG_NO_HOLE)
    got = h.pread(MiB, base)
    assert got[:256 * 1024] == bytes(256 * 1024), "NO_HOLE write_zeroes range does not read zeros"
    assert got[256 * 1024:] == data[256 * 1024:], "NO_HOLE write_zeroes changed data outside its range"
    # NO_HOLE: the server must not punch a hole, so the range stays allocated.
    fl = flags_over(h, base, 256 * 1024)
    assert all(f & HOLE == 0 for f in fl), "NO_HOLE zeroed range reported as hole: flags %r" % fl
    # NO_HOLE on an unallocated range also reads zeros.
    h.zero(64 * 1024, 13 * MiB, nbd.CMD_FLAG_NO_HOLE)
    assert h.pread(64 * 1024, 13 * MiB) == bytes(64 * 1024)


def check_block_status():
    base = 5 * MiB
    before = extents(h, base, MiB)
    assert all(fl == HOLE | ZERO for _, _, fl in before), "fresh range not hole,zero: %r" % before
    data = range_pattern(SEED, base + 256 * 1024, 64 * 1024)
    h.pwrite(data, base + 256 * 1024)
    ext = extents(h, base, MiB)
    # extents tile the range exactly
    pos = base
    for o, ln, _ in ext:
        assert o == pos, "extents not contiguous: %r" % ext
        pos += ln
    assert pos == base + MiB
    # the written range is data: neither hole nor zero
    w0, w1 = base + 256 * 1024, base + 320 * 1024
    for o, ln, fl in ext:
        if o < w1 and o + ln > w0:
            assert fl & (HOLE | ZERO) == 0, "written range reported with flags %d: %r" % (fl, ext)
    # something in this MiB is still reported as a hole (allocation is not the whole MiB)...
    # unless the allocation unit is >= 1 MiB, so check a far region instead
    far = extents(h, 10 * MiB, MiB)
    assert all(fl == HOLE | ZERO for _, _, fl in far), "untouched range not hole,zero: %r" % far
    # REQ_ONE: exactly one extent, not longer than asked
    one = []
    h.block_status(MiB, base, lambda m, o, e, err: one.append(list(e)) or 0, nbd.CMD_FLAG_REQ_ONE)
    assert len(one) == 1 and len(one[0]) == 2, "REQ_ONE returned %r" % one
    assert 0 < one[0][0] <= MiB
    # after trimming the data it reads zeros again
    h.trim(MiB, base)
    assert h.pread(MiB, base) == bytes(MiB)
    for o, ln, fl in extents(h, base, MiB):
        if fl & ZERO == 0:
            assert h.pread(ln, o) == bytes(ln)


def check_cache():
    h.cache(MiB, 0)
    h.cache(BLOCK, size - BLOCK)
    h.cache(100, 3)  # unaligned


def check_multi_conn():
    # can_multi_conn: a write completed on one connection is visible on another, and a flush on
    # the second covers it.
    h2 = connect(uri)
    try:
        assert h2.can_multi_conn()
        base = 7 * MiB
        data = range_pattern(SEED, base, 128 * 1024, gen=2)
        h.pwrite(data, base)
        assert h2.pread(len(data), base) == data, "write on connection 1 not visible on connection 2"
        h2.flush()
        h2.pwrite(b"\x99" * BLOCK, base)
        assert h.pread(BLOCK, base) == b"\x99" * BLOCK, "write on connection 2 not visible on connection 1"
        h.flush()
    finally:
        h2.shutdown()


def check_large_io():
    base = 8 * MiB
    data = range_pattern(SEED, base, 4 * MiB, gen=3)
    h.pwrite(data, base)
    got = h.pread(4 * MiB, base)
    if got != data:
        for i in range(0, len(data), BLOCK):
            if got[i:i + BLOCK] != data[i:i + BLOCK]:
                raise AssertionError("4 MiB write/read differs at +%d: got %s, want %s"
                                     % (i, describe(got[i:i + BLOCK]), describe(data[i:i + BLOCK])))


def check_aio_pipeline():
    # Many requests in flight on one connection, completing in any order.
    base = 14 * MiB
    cookies = []
    bufs = []
    for i in range(64):
        buf = nbd.Buffer.from_bytearray(bytearray(block_pattern(SEED, 14 * 256 + i, 4)))
        bufs.append(buf)
        cookies.append(h.aio_pwrite(buf, base + i * BLOCK))
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for c in cookies:
        assert h.aio_command_completed(c)
    rbufs = []
    cookies = []
    for i in range(64):
        rb = nbd.Buffer(BLOCK)
        rbufs.append(rb)
        cookies.append(h.aio_pread(rb, base + i * BLOCK))
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for i, c in enumerate(cookies):
        assert h.aio_command_completed(c)
        got = rbufs[i].to_bytearray()
        assert got == block_pattern(SEED, 14 * 256 + i, 4), "pipelined read %d: %s" % (i, describe(got))


c = Checks()
c.run("handshake", check_handshake)
c.run("advertised flags", check_flags)
c.run("block sizes", check_block_size)
c.run("fresh export is hole,zero", check_fresh_is_zero_hole)
c.run("read out of range -> EINVAL", check_read_out_of_range)
c.run("write out of range -> ENOSPC", check_write_out_of_range)
c.run("trim/zero/cache/block_status out of range", check_other_out_of_range)
c.run("unaligned read/write", check_unaligned)
c.run("zero-length read/write", check_zero_length)
c.run("FUA", check_fua)
c.run("flush", check_flush)
c.run("trim", check_trim)
c.run("write_zeroes", check_zero)
c.run("write_zeroes NO_HOLE", check_zero_no_hole)
c.run("block_status", check_block_status)
c.run("cache", check_cache)
c.run("multi-conn", check_multi_conn)
c.run("large I/O", check_large_io)
c.run("pipelined aio", check_aio_pipeline)
try:
    h.shutdown()
except nbd.Error as e:
    c.failed.append("clean disconnect")
    print("FAIL clean disconnect: %s" % e)
c.finish()
