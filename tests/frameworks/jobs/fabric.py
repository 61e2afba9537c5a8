"""Lightning Fabric (CPU, DDP over gloo): all_gather of every global rank."""

import datetime
import os

import torch
from lightning_fabric import Fabric
from lightning_fabric.strategies import DDPStrategy

from agree import report

fabric = Fabric(
    accelerator="cpu",
    strategy=DDPStrategy(process_group_backend="gloo", timeout=datetime.timedelta(seconds=60)),
    devices=int(os.environ["DEVICES"]),
    num_nodes=int(os.environ["NODES"]),
)
fabric.launch()
gathered = fabric.all_gather(torch.tensor([fabric.global_rank]))
env = type(fabric._connector.cluster_environment).__name__
report(f"lightning-fabric ({env})", fabric.global_rank, fabric.world_size, gathered.flatten().tolist())
fabric.barrier()
torch.distributed.destroy_process_group()
