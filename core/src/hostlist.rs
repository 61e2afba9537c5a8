//! Slurm hostlist expressions. (Being written.)
