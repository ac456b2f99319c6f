"""CPU placement: `cpus:` in the topology -> --cpus on the embedded runtime -> sched_setaffinity."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from epdctl.errors import TopologyError
from epdctl.render import build_plan
from epdctl.runtime.placement import parse_cpus
from epdctl.topology import topology_from_text

ROOT = Path(__file__).resolve().parents[2]
LOCAL = (ROOT / "topologies" / "local.yaml").read_text()


def test_parse_cpu_lists():
    assert parse_cpus("0-3,6") == [0, 1, 2, 3, 6] and parse_cpus("1, 0") == [0, 1]
    for bad in ("a", "3-1", "", "1,,2"):
        with pytest.raises(ValueError, match="CPU ids"):
            parse_cpus(bad)


def test_cpus_key_per_role_and_worker_is_rendered_as_a_runtime_flag():
    text = LOCAL.replace("  encoder:\n    nodes: [local]\n    count: 2",
                         "  encoder:\n    nodes: [local]\n    count: 2\n    cpus: \"0\"")
    text = text.replace("  decode:\n    nodes: [local]\n    count: 1",
                        "  decode:\n    workers:\n      - {node: local, cpus: [1, 0]}")
    plan = build_plan(topology_from_text(text, ROOT / "topologies" / "t.yaml"))
    by = {w.name: w.argv for w in plan.workers}
    assert by["encoder-0"][by["encoder-0"].index("--cpus") + 1] == "0"
    assert by["decode-0"][by["decode-0"].index("--cpus") + 1] == "0,1"
    assert "--cpus" not in by["prefill-0"]


@pytest.mark.parametrize("value", ["'x-1'", "[0, -1]", "'2-1'", "true"])
def test_bad_cpus_is_an_error_with_its_path(value):
    text = LOCAL.replace("  prefill:\n    nodes: [local]\n    count: 1",
                         f"  prefill:\n    nodes: [local]\n    count: 1\n    cpus: {value}")
    with pytest.raises(TopologyError, match=r"roles\.prefill\.cpus: cpus: .* is not a CPU list"):
        topology_from_text(text, ROOT / "topologies" / "t.yaml")


def test_runtime_pins_itself_and_refuses_cpus_it_does_not_have(tmp_path):
    code = ("import os, sys; from epdctl.runtime.placement import apply; "
            "print(apply(sys.argv[1], None)); print(sorted(os.sched_getaffinity(0))); "
            "import torch; print(torch.get_num_threads())")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    first = sorted(os.sched_getaffinity(0))[0]
    out = subprocess.run([sys.executable, "-c", code, str(first)], capture_output=True, text=True, env=env)
    assert out.stdout.split("\n")[:3] == ["None", f"[{first}]", "1"], out.stderr
    out = subprocess.run([sys.executable, "-c", code, "4095"], capture_output=True, text=True, env=env)
    assert "not available to this process" in out.stdout and "fix cpus:" in out.stdout


def test_cpus_on_a_gpu_engine_is_refused():
    text = (ROOT / "topologies" / "qwen2vl-epd.yaml").read_text().replace(
        "  decode:\n    nodes: [d0]\n    count: 2\n", "  decode:\n    nodes: [d0]\n    count: 2\n    cpus: [0, 1]\n")
    with pytest.raises(TopologyError, match="cpus: pins embedded runtime workers"):
        topology_from_text(text, ROOT / "topologies" / "t.yaml")
