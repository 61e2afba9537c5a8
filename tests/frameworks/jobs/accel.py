"""A plain Accelerator() (CPU): gather of every process index."""

import torch
from accelerate import Accelerator

from agree import report

acc = Accelerator(cpu=True)
gathered = acc.gather(torch.tensor([acc.process_index]))
report(f"accelerate ({acc.distributed_type})", acc.process_index, acc.num_processes, gathered.tolist())
# Leave together and tear the process group down before exit: a gloo process
# that exits while its peers still talk to it can abort at teardown
# ("terminate called without an active exception", seen in the 22.05 suite), and
# torchrun then keeps the other node waiting.
acc.wait_for_everyone()
acc.end_training()
