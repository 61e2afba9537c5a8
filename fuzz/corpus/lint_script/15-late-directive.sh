#!/bin/bash
#SBATCH --gpus-per-node=1
set -euo pipefail
#SBATCH --time=01:00:00
srun python train.py
