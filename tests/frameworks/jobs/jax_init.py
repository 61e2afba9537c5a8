"""jax.distributed.initialize() with no arguments: allgather of every process index (CPU, gloo)."""

import numpy as np
import jax

# Cross-process collectives on CPU are off unless an implementation is named
# (a CPU-only setting, not launch glue: a GPU job uses NCCL).
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(initialization_timeout=60)
from jax.experimental import multihost_utils  # noqa: E402

from agree import report  # noqa: E402

gathered = multihost_utils.process_allgather(np.array([jax.process_index()]))
report(f"jax {jax.__version__}", jax.process_index(), jax.process_count(), np.ravel(gathered).tolist())
jax.distributed.shutdown()
