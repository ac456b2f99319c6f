"""Orchestration: bring-up and tear-down (lifecycle), what runs now (observe), Prometheus targets."""
