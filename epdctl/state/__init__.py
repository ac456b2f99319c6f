"""Cluster state: the record of what runs (store), its lock, its check and the v1 reader."""
