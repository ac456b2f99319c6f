"""SLURM: render sbatch scripts from a plan, submit and follow jobs, and the slurm launcher."""
