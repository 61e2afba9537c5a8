#!/bin/bash
#SBATCH --gpus-per-node=1
#SBATCH --signal=B:USR1@120

trap 'touch SAVE_AND_EXIT' USR1

srun python train.py --ckpt-dir ckpt
