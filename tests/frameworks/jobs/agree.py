"""The check every framework job ends with: the ranks the framework gathered
from every process are exactly 0..world-1, the world is the one the case
expects ($EXPECT_WORLD), and rank 0 prints one `ok` line saying so."""

import os
import sys


def report(framework, rank, world, gathered):
    gathered = sorted(int(g) for g in gathered)
    expect = int(os.environ.get("EXPECT_WORLD", world))
    where = f"{os.uname().nodename} rank {rank}/{world}"
    if gathered != list(range(world)) or world != expect:
        print(f"FAIL {framework}: {where}: gathered ranks {gathered}, expected world {expect}", flush=True)
        sys.exit(3)
    if rank == 0:
        point = f"{os.environ.get('MASTER_ADDR', '-')}:{os.environ.get('MASTER_PORT', '-')}"
        print(f"ok {framework}: world {world}, ranks 0-{world - 1} agree (MASTER {point})", flush=True)
