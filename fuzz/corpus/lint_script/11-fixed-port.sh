#!/bin/bash
#SBATCH --gpus-per-node=1
export MASTER_ADDR=$(hostname)
export MASTER_PORT=29500
srun python train.py
