#!/bin/bash
#SBATCH --gpus-per-node=1
srun python train.py > train.log 2>&1 &
echo started
