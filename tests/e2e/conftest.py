"""One real local cluster per test session: `epdctl up topologies/local.yaml`, ports moved.

The topology is copied with every port in 31000-31099 moved to 34000-34099 (the test range)
and the model path made absolute, the state goes to a tmp EPDCTL_STATE_DIR, and the cluster is
started once through the real CLI (a subprocess, as a user would) and stopped at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "local.yaml"
PORT_SHIFT = 3000  # 31000-31099 -> 34000-34099


def remap_ports(doc: Any, key: str = "") -> Any:
    """Shift every port-like integer in the local range into the test range."""
    if isinstance(doc, dict):
        return {k: remap_ports(v, str(k)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [remap_ports(v, key) for v in doc]
    portish = "port" in key or key in ("base", "limit")
    if portish and isinstance(doc, int) and 31000 <= doc <= 31099:
        return doc + PORT_SHIFT
    return doc


def absolute_paths(doc: dict, base: Path) -> dict:
    """Make the model path absolute so the copied topology still finds the checkpoint."""
    model = doc.get("model")
    if isinstance(model, dict) and isinstance(model.get("path"), str):
        p = Path(model["path"])
        if not p.is_absolute():
            for cand in (base / p, ROOT / p):
                if cand.exists():
                    model["path"] = str(cand.resolve())
                    break
    return doc


def test_topology(tmp_dir: Path, src: Path = TOPOLOGY) -> Path:
    """Write the remapped copy of ``src`` into ``tmp_dir``."""
    doc = yaml.safe_load(src.read_text())
    doc = absolute_paths(remap_ports(doc), src.parent)
    ports = dict(doc.get("ports") or {})
    ports["base"] = max(int(ports.get("base", 34000)), 34000)
    if "limit" in ports:
        ports["limit"] = max(int(ports["limit"]), ports["base"] + 99)
    doc["ports"] = ports
    out = tmp_dir / src.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def validate_status(doc: dict) -> None:
    """Every real `status --json` an e2e test reads must match the documented schema."""
    import jsonschema

    jsonschema.validate(doc, json.loads((ROOT / "docs" / "status.schema.json").read_text()))


test_topology.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


@dataclass
class Cluster:
    """The running session cluster, as tests need it."""

    name: str
    topology: Path
    env: dict[str, str]
    router_url: str
    model: str
    up_output: str

    def epdctl(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT,
                              text=True, capture_output=True, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"epdctl {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def status(self) -> dict:
        proc = self.epdctl("status", self.name, "--json")
        assert proc.stdout, proc.stderr
        doc = json.loads(proc.stdout)
        validate_status(doc)
        return doc

    def state(self) -> dict:
        path = Path(self.env["EPDCTL_STATE_DIR"]) / "clusters" / self.name / "state.json"
        return json.loads(path.read_text())


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from epdctl.render import build_plan
    from epdctl.topology import load_topology

    tmp = tmp_path_factory.mktemp("cluster")
    topo_path = test_topology(tmp)
    topo = load_topology(topo_path)
    plan = build_plan(topo)
    assert plan.router is not None and plan.router.port >= 34000, "ports were not remapped"
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))
    c = Cluster(topo.name, topo_path, env, plan.router.url, topo.model.served_name, "")
    up = c.epdctl("up", str(topo_path), "--timeout", "600")
    c.up_output = up.stdout + up.stderr
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{c.up_output}"
        yield c
    finally:
        down = c.epdctl("down", c.name)
        assert down.returncode == 0, down.stdout + down.stderr
