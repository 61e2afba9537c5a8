#!/bin/bash
#SBATCH --gpus-per-node=1
#SBATCH --dependency=afterok:1234
srun python train.py --resume latest
