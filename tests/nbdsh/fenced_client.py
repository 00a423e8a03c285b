#!/usr/bin/env python3
"""A client of a node that is about to be partitioned from its cluster, for
Basalt's network-partition test (crates/cli/tests/cluster_partition.rs).

usage: fenced_client.py URI --seed S --gen G --write-offset O --write-blocks N
                        --read-offset O --read-blocks N
                        [--interval SECS] [--drain-seconds SECS]

1. Opens two connections to URI (before the partition: the handshake needs
   the node's view of the catalog), one for writes and one for reads, so a
   stuck write never holds back a read on the server, and prints READY.
2. Waits for a line GO on stdin (the test has cut the node off). Then every
   --interval seconds it issues, without waiting for earlier commands:
   - a FUA write of pattern generation G to the next block of the write
     range (each block is written at most once), and
   - a read of the next block of the read range (cycling through it),
   and records for every command when it was issued and when it completed
   (time.monotonic(), which is the test's CLOCK_MONOTONIC), whether it
   succeeded, and for reads which pattern generation came back.
3. On a line STOP (or EOF) on stdin it stops issuing, waits up to
   --drain-seconds for the commands still in flight, reads the write range
   back and prints one JSON line:
     {"ops": [{"kind", "block", "issued", "done", "ok", "error", "gen"}],
      "final": [gen of each block of the write range]}
   where gen is 0 for zeros, -1 for anything that is not a block of the
   pattern, and done is null for a command still unanswered.

The test judges the record. Exit status: 0 ok, 1 a connection died,
2 usage.
"""

import argparse
import json
import os
import select
import struct
import sys
import time

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nbdtest import BLOCK, MAGIC, block_pattern, connect  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("uri")
p.add_argument("--seed", type=int, required=True)
p.add_argument("--gen", type=int, required=True)
p.add_argument("--write-offset", type=int, required=True)
p.add_argument("--write-blocks", type=int, required=True)
p.add_argument("--read-offset", type=int, required=True)
p.add_argument("--read-blocks", type=int, required=True)
p.add_argument("--interval", type=float, default=0.05)
p.add_argument("--drain-seconds", type=float, default=80.0)
a = p.parse_args()
if a.write_offset % BLOCK or a.read_offset % BLOCK:
    p.error("offsets must be multiples of 4096")


def gen_of(data, block):
    """The pattern generation `data` holds for `block` (0: zeros, -1: other)."""
    if not any(data):
        return 0
    if data[:8] != MAGIC:
        return -1
    _, seed, blk, gen, _ = struct.unpack_from("<8sQQQQ", data)
    if seed == a.seed and blk == block and data == block_pattern(seed, blk, gen):
        return gen
    return -1


class Stream:
    """One connection and the commands in flight on it."""

    def __init__(self):
        self.h = connect(a.uri)
        self.inflight = {}  # cookie -> (op, buffer)

    def collect(self, ops):
        for cookie, (op, buf) in list(self.inflight.items()):
            try:
                done = self.h.aio_command_completed(cookie)
            except nbd.Error as e:
                op["done"] = time.monotonic()
                op["ok"] = False
                op["error"] = str(e)
                del self.inflight[cookie]
                continue
            if done:
                op["done"] = time.monotonic()
                op["ok"] = True
                if op["kind"] == "read":
                    op["gen"] = gen_of(bytes(buf.to_bytearray()), op["block"])
                del self.inflight[cookie]

    def dead(self):
        return self.h.aio_is_dead() or self.h.aio_is_closed()


writes = Stream()
reads = Stream()
reads.h.pread(BLOCK, a.read_offset)
print("READY", flush=True)
if sys.stdin.readline().strip() != "GO":
    print("expected GO on stdin", flush=True)
    sys.exit(2)

ops = []
next_write = 0
next_read = 0
next_issue = time.monotonic()
stop_at = None
while True:
    now = time.monotonic()
    if stop_at is None and select.select([sys.stdin], [], [], 0)[0]:
        line = sys.stdin.readline()
        if line == "" or line.strip() == "STOP":
            stop_at = now
    if stop_at is None and now >= next_issue:
        next_issue += a.interval
        if next_write < a.write_blocks:
            block = a.write_offset // BLOCK + next_write
            next_write += 1
            buf = nbd.Buffer.from_bytearray(bytearray(block_pattern(a.seed, block, a.gen)))
            op = {"kind": "write", "block": block, "issued": now, "done": None, "ok": None}
            cookie = writes.h.aio_pwrite(buf, block * BLOCK, flags=nbd.CMD_FLAG_FUA)
            writes.inflight[cookie] = (op, buf)
            ops.append(op)
        block = a.read_offset // BLOCK + next_read % a.read_blocks
        next_read += 1
        buf = nbd.Buffer(BLOCK)
        op = {"kind": "read", "block": block, "issued": now, "done": None, "ok": None, "gen": None}
        cookie = reads.h.aio_pread(buf, block * BLOCK)
        reads.inflight[cookie] = (op, buf)
        ops.append(op)
    for s in (writes, reads):
        s.collect(ops)
    if writes.dead() or reads.dead():
        print(json.dumps({"ops": ops, "final": None, "dead": True}), flush=True)
        sys.exit(1)
    if stop_at is not None and (
        not (writes.inflight or reads.inflight) or now > stop_at + a.drain_seconds
    ):
        break
    for s in (writes, reads):
        s.h.poll(10)

data = reads.h.pread(a.write_blocks * BLOCK, a.write_offset)
first = a.write_offset // BLOCK
final = [gen_of(data[i * BLOCK:(i + 1) * BLOCK], first + i) for i in range(a.write_blocks)]
print(json.dumps({"ops": ops, "final": final, "dead": False}), flush=True)
