"""jax.distributed.initialize() with no arguments: allgather of every process index (CPU, gloo)."""

import os

import numpy as np
import jax

# Cross-process collectives on CPU are off unless an implementation is named
# (a CPU-only setting, not launch glue: a GPU job uses NCCL).
jax.config.update("jax_cpu_collectives_implementation", "gloo")
# JAX_ID_FROM_RANK=1: the one argument docs/users.md gives for layouts where Slurm
# numbers tasks in another order than the nodes (JAX's own id is SLURM_PROCID).
process_id = int(os.environ["RANK"]) if os.environ.get("JAX_ID_FROM_RANK") else None
timeout = int(os.environ.get("JAX_INIT_TIMEOUT", "60"))
jax.distributed.initialize(process_id=process_id, initialization_timeout=timeout)
from jax.experimental import multihost_utils  # noqa: E402

from agree import report  # noqa: E402

gathered = multihost_utils.process_allgather(np.array([jax.process_index()]))
report(f"jax {jax.__version__}", jax.process_index(), jax.process_count(), np.ravel(gathered).tolist())
jax.distributed.shutdown()
