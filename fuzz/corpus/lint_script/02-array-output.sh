#!/bin/bash
#SBATCH --array=0-3
#SBATCH --gpus-per-node=1
#SBATCH --output=logs/%x.out
srun python sweep.py --index "$SLURM_ARRAY_TASK_ID"
