"""deepspeed.init_distributed() (gloo on CPU): all_gather of every rank."""

import torch
import deepspeed
import deepspeed.comm as comm

from agree import report

deepspeed.init_distributed(dist_backend="gloo")
rank, world = comm.get_rank(), comm.get_world_size()
out = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
comm.all_gather(out, torch.tensor([rank]))
report("deepspeed", rank, world, [t.item() for t in out])
comm.barrier()
torch.distributed.destroy_process_group()
