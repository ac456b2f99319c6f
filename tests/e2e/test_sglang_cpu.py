"""SGLang 0.5.23's real server, started, probed, routed to and stopped by epdctl on a CPU.

One session cluster: `epdctl up topologies/sglang-cpu-colocated.yaml` (one colocated worker, SGLang's
own `launch_server` from the engine venv that `scripts/setup_engines.sh sglang-cpu` makes, behind
smg), with its node preflight: `engine.device: cpu` claims no GPU, so `check` asks no nvidia-smi.
`up` waits for SGLang's /health and runs its canary (a 3-image request through the router,
answer judged); `status` reads the worker's real /health, /v1/loads and /metrics; `down` stops it.

The engine venv holds a stand-in `sgl_kernel` whose every function raises and records its call
(scripts/engines/sgl_kernel_standin): the server loads it, and a test asserts nothing called it, so
the answers came from SGLang's torch-native paths, not from a kernel. The worker serves the
topology's model, .engines/models/tiny-qwen2vl-sglang: the set-up links the tiny model's files and
adds `vision_config.in_chans` to its config.json (SGLang 0.5.23 reads that name; the checkpoint's
config names it `in_channels`).

Ports 31400-31499 (the topology's own), state in a tmp EPDCTL_STATE_DIR. Needs ~2 GiB; run under
the heavy lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "sglang-cpu-colocated.yaml"
VENV = ROOT / ".engines" / "sglang-cpu"
MODEL = ROOT / ".engines" / "models" / "tiny-qwen2vl-sglang"

pytestmark = pytest.mark.skipif(
    not (VENV / "bin" / "python").exists() or not (MODEL / "config.json").exists(),
    reason="SGLang's CPU engine venv or model is not set up: bash scripts/setup_engines.sh sglang-cpu")


def processes_with(marker: str) -> list[int]:
    """Live pids whose environment holds ``marker`` (survives SGLang's setproctitle renames)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if marker.encode() in (d / "environ").read_bytes():
                out.append(int(d.name))
        except OSError:
            continue
    return out


@dataclass
class SGLangCluster:
    name: str
    env: dict[str, str]
    up: subprocess.CompletedProcess
    worker_url: str
    router_url: str
    standin_log: Path

    def epdctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT, text=True,
                              capture_output=True, timeout=300)


@pytest.fixture(scope="session")
def sglang_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangCluster]:
    tmp = tmp_path_factory.mktemp("sglang-cpu")
    log = tmp / "standin-calls.log"
    doc: dict[str, Any] = yaml.safe_load(TOPOLOGY.read_text())
    assert doc["engine"]["device"] == "cpu" and "gpus" not in doc["nodes"][0], doc
    doc["model"]["path"] = str(MODEL)
    doc["engine"]["venv"] = str(VENV)
    doc["roles"]["colocated"].setdefault("env", {})["EPDCTL_KERNEL_STANDIN_LOG"] = str(log)
    topo = tmp / TOPOLOGY.name
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))
    base = doc["ports"]["base"]
    up = subprocess.run([sys.executable, "-m", "epdctl", "up", str(topo), "--timeout", "600"],
                        env=env, cwd=ROOT, text=True, capture_output=True, timeout=900)
    c = SGLangCluster(doc["name"], env, up, f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}", log)
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{up.stdout}\n{up.stderr}"
        yield c
    finally:
        down = c.epdctl("down", c.name)
        deadline = time.monotonic() + 30
        while processes_with(str(log)) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = processes_with(str(log))
        assert down.returncode == 0, down.stdout + down.stderr
        assert not left, f"`epdctl down` left SGLang processes: {left}"


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_up_canary_answers_right_through_sglang(sglang_cluster: SGLangCluster) -> None:
    out = sglang_cluster.up.stdout
    assert "node checks passed" in out and "skipped" not in out, out  # the preflight ran, on no GPU
    assert "canary: 3-image request through the router, model tiny-qwen2vl" in out, out
    assert "verdict:  correct" in out, out


def test_the_worker_is_sglangs_own_server(sglang_cluster: SGLangCluster) -> None:
    info = get(sglang_cluster.worker_url + "/server_info")
    assert info["version"] == "0.5.23"
    assert info["device"] == "cpu" and info["attention_backend"] == "torch_native"
    model = get(sglang_cluster.worker_url + "/get_model_info")
    assert model["model_path"].endswith("tiny-qwen2vl-sglang") and model["is_generation"] is True


def test_status_reads_sglangs_health_loads_and_metrics(sglang_cluster: SGLangCluster) -> None:
    proc = sglang_cluster.epdctl("status", sglang_cluster.name, "--json")
    assert proc.stdout, proc.stderr
    doc = json.loads(proc.stdout)
    [worker] = [w for w in doc["workers"] if w["role"] == "colocated"]
    assert worker["alive"] and worker["healthy"], worker
    assert worker["router"] in ("healthy", "ready"), worker  # smg lists it and routes to it
    assert worker["load"] is not None, worker  # SGLang's /v1/loads
    figures = worker["figures"]  # from SGLang's own /metrics (sglang: names), after up's canary
    assert figures is not None and figures.get("requests", 0) >= 1, figures
    text = sglang_cluster.epdctl("status", sglang_cluster.name)
    assert text.returncode == 0 and "colocated-0" in text.stdout, text.stdout + text.stderr


def test_the_stand_in_kernel_was_loaded_and_never_called(sglang_cluster: SGLangCluster) -> None:
    lines = sglang_cluster.standin_log.read_text().splitlines() if sglang_cluster.standin_log.exists() else []
    assert any(line.startswith("load ") for line in lines), "the server never imported the stand-in sgl_kernel"
    calls = [line for line in lines if line.startswith("call ")]
    assert not calls, f"SGLang called kernels of the stand-in sgl_kernel: {calls}"
