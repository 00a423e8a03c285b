#!/usr/bin/env python3
"""Crash-consistency pattern writer for Basalt's kill -9 test.

usage: crash_writer.py URI STATE-FILE SEED [--verify-only] [--max-seconds N]
                       [--stop-on-stdin] [--progress]

1. Loads STATE-FILE (absent on the first round): for every 4 KiB block of
   the export, the content that is *durable* (acknowledged with FUA, or
   written before a FLUSH that completed) and the set of contents written
   since that are *not yet durable*. Content 0 is zeros (never written,
   trimmed or zeroed); content g > 0 is nbdtest.block_pattern(seed, block, g).
2. Reads the whole export and checks every 512-byte sector equals the same
   sector of the durable content or of one of the pending contents. Anything
   else (lost flushed data, stale data, misplaced blocks, garbage in blocks
   never written) fails. Pending contents are kept as candidates: only
   durable data is promised.
3. Prints READY, then writes until the connection dies (the test kills the
   server with SIGKILL): batches of distinct-block aio writes (some FUA,
   see --fua-rate), trims and write_zeroes with and without NO_HOLE, trims
   of whole 1 MiB-aligned ranges (so store extents are freed and allocated
   again), and a FLUSH every few batches. Completed FUA writes and flushes move blocks to durable.
   With --stop-on-stdin it also stops, between batches, once stdin has
   data or is closed (the test ends a writer it does not kill that way).
   With --progress it prints `PROGRESS flushes=N writes=M` after a
   completed FLUSH (at most every 0.2 s), so the test sees I/O advance.
4. On connection loss (or stop), saves STATE-FILE and prints a JSON summary
   line.

Exit status: 0 ok, 1 verification or unexpected I/O failure.
"""

import argparse
import json
import os
import random
import select
import sys
import time

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nbdtest import BLOCK, SECTOR, block_pattern, connect, describe  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("uri")
p.add_argument("state")
p.add_argument("seed", type=int)
p.add_argument("--verify-only", action="store_true")
p.add_argument("--max-seconds", type=float, default=60.0)
p.add_argument("--fua-rate", type=float, default=0.2,
               help="fraction of writes/trims/zeroes sent with FUA (0: durability only through FLUSH)")
p.add_argument("--stop-on-stdin", action="store_true",
               help="stop writing once stdin is readable (data or EOF)")
p.add_argument("--progress", action="store_true",
               help="print PROGRESS lines after completed flushes")
a = p.parse_args()

h = connect(a.uri)
size = h.get_size()
nblocks = size // BLOCK
# The last eighth of the export is never touched: it must always read zeros.
active = nblocks - nblocks // 8

if os.path.exists(a.state):
    with open(a.state) as f:
        st = json.load(f)
    assert st["size"] == size, "export size changed: %d -> %d" % (st["size"], size)
    durable = st["durable"]
    pending = [set(x) for x in st["pending"]]
    how = st["how"]
    next_gen = st["next_gen"]
    rounds = st["rounds"]
else:
    durable = [0] * nblocks
    pending = [set() for _ in range(nblocks)]
    how = ["never written"] * nblocks  # the op that made the durable content (for reports)
    next_gen = 1
    rounds = 0

rng = random.Random(a.seed * 1000003 + rounds)


def save():
    tmp = a.state + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"size": size, "durable": durable, "pending": [sorted(x) for x in pending], "how": how,
                   "next_gen": next_gen, "rounds": rounds + 1}, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, a.state)


def verify():
    bad = []
    chunk = 1 << 20
    stats = {"durable": 0, "pending": 0, "mixed": 0}
    for base in range(0, size, chunk):
        n = min(chunk, size - base)
        data = h.pread(n, base)
        for i in range(0, n, BLOCK):
            b = (base + i) // BLOCK
            got = data[i:i + BLOCK]
            want = block_pattern(a.seed, b, durable[b])
            if got == want:
                stats["durable"] += 1
                continue
            cands = [want] + [block_pattern(a.seed, b, g) for g in sorted(pending[b])]
            if any(got == c for c in cands[1:]):
                stats["pending"] += 1
                continue
            # torn: each sector must still come from some candidate
            ok = all(any(got[s:s + SECTOR] == c[s:s + SECTOR] for c in cands) for s in range(0, BLOCK, SECTOR))
            if ok:
                stats["mixed"] += 1
                continue
            bad.append("block %d (offset %d): read %s; durable is %s (by %s), not-yet-durable %s"
                       % (b, b * BLOCK, describe(got), "zeros" if durable[b] == 0 else "gen %d" % durable[b],
                          how[b], sorted(pending[b]) or "none"))
    if bad:
        print("VERIFY FAILED: %d bad blocks (round %d, seed %d):\n  %s"
              % (len(bad), rounds, a.seed, "\n  ".join(bad[:25])), flush=True)
        sys.exit(1)
    print("verified %d blocks: %r" % (nblocks, stats), flush=True)


verify()
if a.verify_only:
    h.shutdown()
    sys.exit(0)

# Write phase. Blocks whose latest write completed but is not durable yet.
dirty = {}
ops = {"writes": 0, "fua": 0, "trims": 0, "zeroes": 0, "flushes": 0, "batches": 0, "fua_rate": a.fua_rate}
print("READY", flush=True)
deadline = time.time() + a.max_seconds
lost = None


def run_batch():
    """Issue one batch of aio commands on distinct blocks and wait for all of them."""
    global next_gen
    used = set()
    cmds = []  # (cookie, blocks, content, fua, buf, what)
    for _ in range(rng.randint(1, 12)):
        if rng.random() < 0.03:
            # a whole 1 MiB-aligned range: frees the extent(s) behind it
            n = (1 << 20) // BLOCK
            start = rng.randrange(0, active // n) * n
            kind = "bigtrim"
        else:
            n = rng.choice([1, 1, 1, 2, 4, 8])
            start = rng.randrange(0, active - n + 1)
            kind = None
        blocks = range(start, start + n)
        if used.intersection(blocks):
            continue
        used.update(blocks)
        r = 0.85 if kind == "bigtrim" else rng.random()
        fua = rng.random() < a.fua_rate
        flags = nbd.CMD_FLAG_FUA if fua else 0
        if r < 0.8:
            gen = next_gen
            next_gen += 1
            buf = nbd.Buffer.from_bytearray(bytearray(b"".join(block_pattern(a.seed, b, gen) for b in blocks)))
            content = gen
            for b in blocks:
                pending[b].add(content)
            cookie = h.aio_pwrite(buf, start * BLOCK, flags=flags)
            what = "write"
            ops["writes"] += 1
            ops["fua"] += fua
        elif r < 0.9:
            buf = None
            content = 0
            for b in blocks:
                pending[b].add(0)
            cookie = h.aio_trim(n * BLOCK, start * BLOCK, flags=flags)
            what = "trim of 1 MiB" if kind == "bigtrim" else "trim"
            ops["trims"] += 1
        else:
            buf = None
            content = 0
            for b in blocks:
                pending[b].add(0)
            if rng.random() < 0.5:
                flags |= nbd.CMD_FLAG_NO_HOLE
            cookie = h.aio_zero(n * BLOCK, start * BLOCK, flags=flags)
            what = "write_zeroes" + (" NO_HOLE" if flags & nbd.CMD_FLAG_NO_HOLE else "")
            ops["zeroes"] += 1
        if fua:
            what += " FUA"
        cmds.append((cookie, blocks, content, fua, buf, "round %d: %s" % (rounds, what)))
    waiting = list(cmds)
    while waiting:
        rest = []
        for cmd in waiting:
            cookie, blocks, content, fua, _, what = cmd
            if h.aio_command_completed(cookie):  # raises if the command failed
                for b in blocks:
                    if fua:
                        durable[b] = content
                        how[b] = what
                        pending[b].clear()
                        dirty.pop(b, None)
                    else:
                        dirty[b] = (content, what + " + FLUSH")
            else:
                rest.append(cmd)
        waiting = rest
        if waiting:
            h.poll(-1)
    ops["batches"] += 1


def stop_requested():
    if not a.stop_on_stdin:
        return False
    readable, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(readable)


try:
    since_flush = 0
    flush_every = rng.randint(1, 6)
    last_progress = 0.0
    while time.time() < deadline and not stop_requested():
        run_batch()
        since_flush += 1
        if since_flush >= flush_every:
            snapshot = dict(dirty)
            h.flush()
            ops["flushes"] += 1
            for b, (content, what) in snapshot.items():
                durable[b] = content
                how[b] = what
                pending[b].clear()
                dirty.pop(b, None)
            since_flush = 0
            flush_every = rng.randint(1, 6)
            if a.progress and time.monotonic() - last_progress >= 0.2:
                last_progress = time.monotonic()
                print("PROGRESS flushes=%d writes=%d" % (ops["flushes"], ops["writes"]), flush=True)
except nbd.Error as e:
    # Expected when the server is killed; anything else is a real failure.
    if not (h.aio_is_dead() or h.aio_is_closed() or e.errno == "ESHUTDOWN"):
        save()
        print("UNEXPECTED I/O ERROR on a live connection: %s" % e, flush=True)
        sys.exit(1)
    lost = str(e)

save()
print(json.dumps({"round": rounds, "lost": lost, "ops": ops}), flush=True)
sys.exit(0)
