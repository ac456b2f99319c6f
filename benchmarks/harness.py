"""What the cluster benchmarks share: a private state dir, the `epdctl` CLI, topology copies,
and one cluster up -> bench -> down (down even when the bench fails).

Benchmarks drive epdctl through its CLI, as a user would, so what they measure includes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


class Harness:
    def __init__(self, prefix: str, env: dict[str, str] | None = None):
        self.tmp = Path(tempfile.mkdtemp(prefix=prefix))
        self.env = dict(os.environ, EPDCTL_STATE_DIR=str(self.tmp / "state"), **(env or {}))

    def epdctl(self, *args: str, check: bool = True, timeout: float = 1200) -> subprocess.CompletedProcess:
        p = subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT,
                           text=True, capture_output=True, timeout=timeout)
        if check and p.returncode != 0:
            sys.exit(f"epdctl {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        return p

    def topology(self, doc: dict[str, Any], name: str,
                 source_dir: Path = ROOT / "topologies") -> Path:
        """Write ``doc`` as cluster ``name`` (a relative model path resolved against the folder
        the topology came from) and return the file."""
        doc = {**doc, "name": name}
        path = doc["model"]["path"]
        if not Path(path).is_absolute():
            doc["model"] = {**doc["model"], "path": str((source_dir / path).resolve())}
        out = self.tmp / f"{name}.yaml"
        out.write_text(yaml.safe_dump(doc, sort_keys=False))
        return out

    def bench(self, topology: Path, name: str, *bench_args: str) -> dict[str, Any]:
        """Start the cluster, run `epdctl bench` with ``bench_args``, stop it; the run's report."""
        self.epdctl("up", str(topology), "--no-canary", "--skip-preflight")
        try:
            out = self.tmp / f"{name}-{len(list(self.tmp.glob(name + '-*.json')))}.json"
            self.epdctl("bench", name, *bench_args, "--json", str(out), "-q")
            return json.loads(out.read_text())["runs"][0]
        finally:
            self.epdctl("down", name, check=False)


def with_ports_and_env(doc: dict[str, Any], port_base: int,
                       node_env: dict[str, str] | None = None) -> dict[str, Any]:
    """A topology mapping moved to ports port_base..+99, with extra environment on every node."""
    doc = {**doc, "nodes": [dict(n) for n in doc["nodes"]]}
    doc["ports"] = {"base": port_base, "limit": port_base + 99}
    if node_env:
        for node in doc["nodes"]:
            node["env"] = {**(node.get("env") or {}), **node_env}
    return doc


def switchable_layout(base: int, decodes: int = 2) -> dict[str, Any]:
    """The rebalance benchmarks' cluster: 1 encoder, 1 prefill, ``decodes`` decodes, all switchable
    (in place is the default), the tiny model, ports base..base+99."""
    return {
        "engine": "embedded", "launcher": "local",
        "model": {"path": str(ROOT / "models" / "tiny-qwen2vl"), "served_name": "tiny-qwen2vl",
                  "architecture": "Qwen2VLForConditionalGeneration"},
        "ports": {"base": base, "limit": base + 99}, "transfer": {"backend": "zmq"},
        "nodes": [{"name": "local", "host": "127.0.0.1", "shared": True}],
        "roles": {"encoder": {"nodes": ["local"], "count": 1},
                  "prefill": {"nodes": ["local"], "count": 1},
                  "decode": {"nodes": ["local"], "count": decodes}},
        "router": {"node": "local", "host": "127.0.0.1"},
    }
