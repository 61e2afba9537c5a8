"""A plain Accelerator() (CPU): gather of every process index."""

import torch
from accelerate import Accelerator

from agree import report

acc = Accelerator(cpu=True)
gathered = acc.gather(torch.tensor([acc.process_index]))
report(f"accelerate ({acc.distributed_type})", acc.process_index, acc.num_processes, gathered.tolist())
