#!/usr/bin/env python3
"""Small NBD client used by the Rust integration tests (pattern I/O, ENOSPC fill).

usage:
  nbdtool.py write  URI --seed S --offset O --length L [--gen G] [--chunk C] [--fua] [--flush]
  nbdtool.py verify URI --seed S --offset O --length L [--gen G] [--zero]
  nbdtool.py trim   URI --offset O --length L [--flush]
  nbdtool.py fill   URI --seed S --offset O [--chunk C] [--gen G]
  nbdtool.py hold   URI [--length L --offset O --seed S --gen G]
                  (connect, print READY, stay connected until stdin closes; with
                   --length, then write the pattern on that same connection, flush,
                   and print "SIZE <bytes>": the size the connection negotiated)

The pattern is nbdtest.block_pattern: every 512-byte sector names its seed,
block index and generation, so a mismatch report says what was found.
`fill` writes consecutive chunks from --offset until the server answers
ENOSPC (or the export ends), checks the connection is still usable, and
prints a JSON line {"filled": BYTES, "enospc": BOOL}.
Exit status: 0 ok, 1 check failed, 2 usage.
"""

import argparse
import errno
import json
import os
import sys

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nbdtest import BLOCK, connect, describe, range_pattern  # noqa: E402

MiB = 1 << 20


def fail(msg):
    print("nbdtool: FAIL: " + msg, flush=True)
    sys.exit(1)


def do_write(a):
    h = connect(a.uri)
    end = a.offset + a.length
    pos = a.offset
    while pos < end:
        n = min(a.chunk, end - pos)
        h.pwrite(range_pattern(a.seed, pos, n, a.gen), pos, nbd.CMD_FLAG_FUA if a.fua else 0)
        pos += n
    if a.flush:
        h.flush()
    h.shutdown()
    print("wrote %d bytes at %d" % (a.length, a.offset))


def do_verify(a):
    h = connect(a.uri)
    end = a.offset + a.length
    pos = a.offset
    bad = []
    while pos < end:
        n = min(a.chunk, end - pos)
        got = h.pread(n, pos)
        want = bytes(n) if a.zero else range_pattern(a.seed, pos, n, a.gen)
        if got != want:
            for i in range(0, n, BLOCK):
                if got[i:i + BLOCK] != want[i:i + BLOCK]:
                    bad.append("offset %d: got %s, want %s"
                               % (pos + i, describe(got[i:i + BLOCK]), describe(want[i:i + BLOCK])))
        pos += n
    h.shutdown()
    if bad:
        fail("%d mismatched 4 KiB blocks in [%d, %d):\n  %s" % (len(bad), a.offset, end, "\n  ".join(bad[:20])))
    print("verified %d bytes at %d" % (a.length, a.offset))


def do_trim(a):
    h = connect(a.uri)
    h.trim(a.length, a.offset)
    if a.flush:
        h.flush()
    h.shutdown()
    print("trimmed %d bytes at %d" % (a.length, a.offset))


def do_fill(a):
    h = connect(a.uri)
    size = h.get_size()
    pos = a.offset
    enospc = False
    while pos < size:
        n = min(a.chunk, size - pos)
        try:
            h.pwrite(range_pattern(a.seed, pos, n, a.gen), pos)
        except nbd.Error as e:
            if e.errnum == errno.ENOSPC:
                enospc = True
                break
            fail("write at %d failed with %s, expected success or ENOSPC" % (pos, e))
        pos += n
    # The connection and the store stay usable after ENOSPC: reads of written data, a flush,
    # and an overwrite of already-allocated space all work. (--bare: not checked here; a
    # replicated volume may hold writes back until its replicas are resynced.)
    if not a.bare:
        try:
            if pos > a.offset:
                last = max(a.offset, pos - a.chunk)
                got = h.pread(pos - last, last)
                if got != range_pattern(a.seed, last, pos - last, a.gen):
                    fail("data written before ENOSPC does not read back at %d" % last)
                h.pwrite(range_pattern(a.seed, last, BLOCK, a.gen), last)
            h.flush()
        except nbd.Error as e:
            fail("connection not usable after ENOSPC: %s" % e)
    h.shutdown()
    print(json.dumps({"filled": pos - a.offset, "end": pos, "enospc": enospc}), flush=True)


def do_hold(a):
    h = connect(a.uri)
    h.pread(BLOCK, 0)
    print("READY", flush=True)
    sys.stdin.read()
    if a.length:
        end = a.offset + a.length
        pos = a.offset
        while pos < end:
            n = min(a.chunk, end - pos)
            h.pwrite(range_pattern(a.seed, pos, n, a.gen), pos)
            pos += n
        h.flush()
        print("SIZE %d" % h.get_size(), flush=True)
    h.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["write", "verify", "trim", "fill", "hold"])
    p.add_argument("uri")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--gen", type=int, default=1)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--length", type=int, default=0)
    p.add_argument("--chunk", type=int, default=MiB)
    p.add_argument("--fua", action="store_true")
    p.add_argument("--flush", action="store_true")
    p.add_argument("--zero", action="store_true")
    p.add_argument("--bare", action="store_true", help="fill: stop at ENOSPC, nothing after")
    a = p.parse_args()
    if a.offset % BLOCK or a.length % BLOCK or a.chunk % BLOCK:
        p.error("offset, length and chunk must be multiples of 4096")
    {"write": do_write, "verify": do_verify, "trim": do_trim, "fill": do_fill, "hold": do_hold}[a.cmd](a)


if __name__ == "__main__":
    main()
