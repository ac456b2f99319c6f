"""Benchmarking and sizing: workloads, a streaming load generator, reports, plots, profiling
and the E:P:D planner. Control plane: no torch; aiohttp and matplotlib only where used."""
