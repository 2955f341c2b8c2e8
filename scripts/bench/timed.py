"""Runs a command and writes its wall time (s) and peak resident memory (KiB, the largest of its
process tree's waited-for processes, as getrusage reports) to OUT: `/usr/bin/time -f "%e %M"`
for machines without GNU time (the lent GPU machine has none). Exits with the command's status.

usage: python3 scripts/bench/timed.py OUT CMD [ARG]...
"""
import resource
import subprocess
import sys
import time

out, cmd = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
rc = subprocess.call(cmd)
wall = time.perf_counter() - t0
peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
with open(out, "w") as f:
    f.write(f"{wall:.2f} {peak_kib}\n")
sys.exit(rc)
