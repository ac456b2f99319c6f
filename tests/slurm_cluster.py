"""A real local SLURM cluster for tests: `scripts/slurm_local.sh up` (installs SLURM if missing).

Used as a session fixture: the cluster is started once (about 0.5 s when already installed) and
stopped at the end of the session, which also cancels any job a test left behind. Clients find
it through SLURM_CONF, which the fixture exports for the test process and its children.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm_local.sh"
SLURM_DIR = Path(os.environ.get("EPD_SLURM_DIR", "/tmp/epd-slurm"))
CONF = SLURM_DIR / "slurm.conf"
NODES = 4


@dataclass(frozen=True)
class SlurmCluster:
    """The running local cluster: its config path and node names."""

    conf: Path
    nodes: tuple[str, ...]
    partition: str = "debug"

    def run(self, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command against this cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, SLURM_CONF=str(self.conf)))

    def wait_state(self, job: str, states: tuple[str, ...], timeout: float = 120.0) -> str:
        """Poll squeue (0.2 s) until the job is in one of ``states``; returns the state."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            out = self.run("squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T").stdout
            state = out.strip()
            if state in states:
                return state
            time.sleep(0.2)
        raise AssertionError(f"job {job} still {state or 'unknown'} after {timeout:.0f}s, wanted {states}")


def script(action: str) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), action], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/slurm_local.sh {action} failed (rc {proc.returncode}):\n{proc.stderr}")


def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start the cluster, export SLURM_CONF, yield it, stop it (generator for a pytest fixture)."""
    script("up")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(CONF)
    try:
        yield SlurmCluster(conf=CONF, nodes=tuple(f"node{i}" for i in range(1, NODES + 1)))
    finally:
        script("down")
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
