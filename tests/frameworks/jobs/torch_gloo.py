"""torch.distributed with a bare init_process_group("gloo") (env://): all_gather of every rank."""

import datetime

import torch
import torch.distributed as dist

from agree import report

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
out = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
dist.all_gather(out, torch.tensor([rank]))
report("torch", rank, world, [t.item() for t in out])
dist.destroy_process_group()
