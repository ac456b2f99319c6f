"""Engines in containers: runtime records (docker, podman, apptainer, pyxis, SLURM OCI) and the wrapper."""
