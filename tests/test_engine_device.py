"""``engine.device``: one engine release in the forms it runs in, each its own record. SGLang
0.5.23 on the CPU (``device: cpu``) starts with ``--device cpu`` and SGLang's CPU platform, on
no GPU, and its node preflight expects none; a device an engine has no record for is one
problem at ``engine.device`` with its line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from epdctl.engines import engine_for, engine_of
from epdctl.errors import TopologyError
from epdctl.preflight.targets import expectations
from epdctl.render import build_plan
from epdctl.topology import load_topology, topology_from_text

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "topologies" / "sglang-cpu-colocated.yaml"


def _doc() -> dict:
    doc: dict = yaml.safe_load(SRC.read_text())
    return doc


def _load(doc: dict):  # type: ignore[no-untyped-def]
    return topology_from_text(yaml.safe_dump(doc, sort_keys=False), SRC)


def test_the_device_selects_the_releases_record() -> None:
    gpu, cpu = engine_for("sglang"), engine_for("sglang", "0.5.23", "cpu")
    assert gpu.device == "cuda" and gpu.uses_gpus and engine_for("sglang", "0.5.23", "cuda") is gpu
    assert cpu.device == "cpu" and not cpu.uses_gpus and cpu.version == gpu.version == "0.5.23"
    assert engine_for("sglang", None, "cpu") is cpu
    topo = load_topology(SRC)
    assert topo.engine_device == "cpu" and engine_of(topo) is cpu


def test_the_cpu_form_renders_sglangs_cpu_platform_on_no_gpu() -> None:
    [worker] = build_plan(load_topology(SRC)).workers
    argv = worker.argv
    assert argv[argv.index("--device") + 1] == "cpu" and argv.count("--device") == 1
    assert "--base-gpu-id" not in argv
    assert worker.env["SGLANG_USE_CPU_ENGINE"] == "1" and "CUDA_VISIBLE_DEVICES" not in worker.env
    assert worker.gpus == ()


def test_the_gpu_form_is_unchanged() -> None:
    doc = _doc()
    doc["engine"].pop("device")
    doc["nodes"][0]["gpus"] = 1
    [worker] = build_plan(_load(doc)).workers
    assert "--device" not in worker.argv and worker.argv[worker.argv.index("--base-gpu-id") + 1] == "0"
    assert "SGLANG_USE_CPU_ENGINE" not in worker.env and worker.gpus == (0,)


def test_the_preflight_expects_no_gpu_on_a_cpu_node() -> None:
    assert expectations(load_topology(SRC))["local"].gpus == 0
    doc = _doc()
    doc["engine"]["device"] = "cuda"
    doc["nodes"][0]["gpus"] = 1
    assert expectations(_load(doc))["local"].gpus == 1


@pytest.mark.parametrize("engine, device, says", [
    ({"name": "sglang", "version": "0.5.23"}, "tpu", "choose one of: cuda, cpu"),
    ({"name": "vllm", "version": "0.32"}, "cpu", "vllm 0.32.0 has no device 'cpu'; it names no device"),
    ({"name": "embedded"}, "cuda", "embedded runtime has no device 'cuda'"),
])
def test_a_device_the_engine_has_no_record_for_is_one_problem_with_its_line(
        engine: dict, device: str, says: str) -> None:
    doc = _doc()
    doc["engine"] = {**engine, "device": device}
    text = yaml.safe_dump(doc, sort_keys=False)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.strip().startswith("device:"))
    with pytest.raises(TopologyError) as e:
        topology_from_text(text, SRC)
    [problem] = [p for p in e.value.problems if p.path == "engine.device"]
    assert problem.line == line and says in problem.message, e.value.problems


def test_device_is_epdctls_to_render_and_cpus_are_refused() -> None:
    doc = _doc()
    doc["roles"]["colocated"]["args"] += ["--device", "cpu"]
    with pytest.raises(TopologyError, match="--device"):
        _load(doc)
    doc = _doc()
    doc["roles"]["colocated"]["cpus"] = [0, 1]
    with pytest.raises(TopologyError, match="SGLANG_CPU_OMP_THREADS_BIND"):
        _load(doc)
