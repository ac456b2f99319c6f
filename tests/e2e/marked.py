"""The processes that carry a cluster's marker: every launcher puts ``EPDCTL_CLUSTER=NAME@...`` in
each process's environment (children inherit it, containers' processes too), so a test finds what
a cluster left behind without trusting its state file."""

from __future__ import annotations

from pathlib import Path


def cluster_processes(name: str) -> list[int]:
    """Every live process whose environment carries the cluster's marker (EPDCTL_CLUSTER, which
    vLLM's engine-core children inherit too, on every launcher); zombies are not alive."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(f"EPDCTL_CLUSTER={name}@".encode()) for e in env):
            out.append(int(d.name))
    return out
