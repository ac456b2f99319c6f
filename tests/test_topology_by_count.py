"""SLURM topologies that size roles by node count (``roles.<role>.nodes: N``): synthesized nodes,
placement on them, rendering, the sbatch node count, and the errors for misuse."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from epdctl.cli import cli
from epdctl.errors import TopologyError
from epdctl.render import build_plan, to_shell
from epdctl.launchers.slurm.sbatch import render_sbatch
from epdctl.topology import Role, load_topology, topology_from_text

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "topologies" / "slurm-by-count.yaml"
GOLDEN_SBATCH = ROOT / "tests" / "golden" / "slurm" / "slurm-by-count.sbatch"
REGEN = os.environ.get("EPDCTL_REGEN_GOLDEN") == "1"

SGLANG = """\
name: by-count
engine: sglang
launcher: {launcher}
slurm: {{partition: gpu, time: "01:00:00", gpus_per_node: 8}}
model: {{path: /models/Qwen2-VL-7B-Instruct, architecture: Qwen2VLForConditionalGeneration}}
defaults: {{host: node}}
transfer: {{backend: mooncake}}
node_defaults:
  nics: [{{name: mlx5_0, kind: ib, speed_gbps: 400}}]
roles:
  encoder: {{nodes: 1, count: 8}}
  prefill:
    nodes: 2
    tp: 16
  decode: {{nodes: 1, tp: 8}}
router: {{node: encoder-n0, host: node}}
"""


def _sbatch_nodes(text: str) -> int:
    line = next(x for x in text.splitlines() if x.startswith("#SBATCH --nodes="))
    return int(line.split("=", 1)[1])


def test_example_synthesizes_nodes_and_renders() -> None:
    topo = load_topology(EXAMPLE)
    assert [n.name for n in topo.nodes] == ["encoder-n0", "prefill-n0", "prefill-n1", "decode-n0"]
    assert [n.host for n in topo.nodes] == [f"{n.name}.slurm" for n in topo.nodes]
    assert [n.port_base for n in topo.nodes] == [37100, 37200, 37300, 37400]
    # without count, one worker per node
    assert [(w.name, w.nodes) for w in topo.workers] == [
        ("encoder-0", ("encoder-n0",)), ("prefill-0", ("prefill-n0",)), ("prefill-1", ("prefill-n1",)),
        ("decode-0", ("decode-n0",))]
    plan = build_plan(topo)
    assert list(plan.nodes) == ["encoder-n0", "prefill-n0", "prefill-n1", "decode-n0"]
    proc = subprocess.run(["bash", "-n"], input=to_shell(plan), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_example_sbatch_asks_for_the_sum_and_rewrites_every_placeholder() -> None:
    topo = load_topology(EXAMPLE)
    text = render_sbatch(topo, build_plan(topo))
    assert _sbatch_nodes(text) == 1 + 2 + 1
    body = [x for x in text.splitlines() if not x.startswith("#")]
    assert not [x for x in body if ".slurm" in x]  # every placeholder host became ${EPD_ADDR_i}
    assert 'wait_ready decode 301 "decode-0=http://${EPD_ADDR_3}:37400/health"' in text
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_example_sbatch_matches_golden() -> None:
    """Regenerate after an intended change: EPDCTL_REGEN_GOLDEN=1 pytest tests/test_topology_by_count.py"""
    topo = load_topology(EXAMPLE)
    text = render_sbatch(topo, build_plan(topo)).replace(str(ROOT), "<REPO>")
    if REGEN:
        GOLDEN_SBATCH.write_text(text, encoding="utf-8")
    assert GOLDEN_SBATCH.read_text(encoding="utf-8") == text, f"{GOLDEN_SBATCH} differs; regenerate if intended"


def test_gpus_from_slurm_multinode_workers_and_node_defaults() -> None:
    topo = topology_from_text(SGLANG.format(launcher="slurm"))
    assert all(n.gpus == 8 and n.nics[0].name == "mlx5_0" for n in topo.nodes)  # gpus from slurm.gpus_per_node
    prefill = topo.role_workers(Role.PREFILL)
    assert [w.nodes for w in prefill] == [("prefill-n0", "prefill-n1")]  # tp 16 fills both 8-GPU nodes
    assert len(topo.role_workers(Role.ENCODER)) == 8
    assert [w.base_gpu_ids for w in topo.role_workers(Role.ENCODER)] == [(i,) for i in range(8)]
    text = render_sbatch(topo, build_plan(topo))
    assert _sbatch_nodes(text) == 4
    assert "#SBATCH --gpus-per-node=8" in text
    assert '--dist-init-addr "${EPD_ADDR_1}:' in text  # the prefill leader is allocation node 1


@pytest.mark.parametrize("launcher", ["local", "ssh"])
def test_count_without_slurm_is_rejected_with_path_and_line(launcher: str) -> None:
    with pytest.raises(TopologyError) as info:
        topology_from_text(SGLANG.format(launcher=launcher))
    problems = {p.path: p for p in info.value.problems}
    for role, line in (("encoder", 11), ("prefill", 13), ("decode", 15)):
        p = problems[f"roles.{role}.nodes"]
        assert p.line == line
        assert "needs launcher: slurm" in p.message and "nodes: [n0, n1]" in p.message


def test_validate_cli_reports_count_without_slurm(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(SGLANG.format(launcher="local"), encoding="utf-8")
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "t.yaml:13" in result.output and "needs launcher: slurm" in result.output


def test_mixing_explicit_nodes_and_counts() -> None:
    """Explicit nodes come first in the allocation, counted nodes follow in role order."""
    text = SGLANG.format(launcher="slurm").replace(
        "roles:\n", "nodes:\n  - {name: e0, host: e0.slurm, gpus: 8}\nroles:\n").replace(
        "encoder: {nodes: 1, count: 8}", "encoder: {nodes: [e0], count: 8}").replace("node: encoder-n0", "node: e0")
    topo = topology_from_text(text)
    assert [n.name for n in topo.nodes] == ["e0", "prefill-n0", "prefill-n1", "decode-n0"]
    sbatch = render_sbatch(topo, build_plan(topo))
    assert _sbatch_nodes(sbatch) == 4
    assert '"encoder-0=http://${EPD_ADDR_0}:' in sbatch


def test_explicit_node_may_not_take_a_counted_name() -> None:
    text = SGLANG.format(launcher="slurm").replace(
        "roles:\n", "nodes:\n  - {name: prefill-n1, host: x.slurm, gpus: 8}\nroles:\n")
    with pytest.raises(TopologyError) as info:
        topology_from_text(text)
    assert any(p.path == "roles.prefill.nodes" and "already defines it" in p.message for p in info.value.problems)


@pytest.mark.parametrize("replace, path, fragment", [
    (("nodes: 2", "nodes: 0"), "roles.prefill.nodes", "between 1 and"),
    (("node_defaults:", "node_defaults:\n  gpu: 8"), "node_defaults.gpu", "did you mean 'gpus'"),
    (("node_defaults:", "node_defaults:\n  port_stride: 10"), "node_defaults.port_stride", "set port_base too"),
])
def test_bad_counts_and_node_defaults(replace: tuple[str, str], path: str, fragment: str) -> None:
    with pytest.raises(TopologyError) as info:
        topology_from_text(SGLANG.format(launcher="slurm").replace(*replace, 1))
    assert any(p.path == path and fragment in p.message and p.line is not None for p in info.value.problems), \
        [p.format() for p in info.value.problems]


def test_node_defaults_without_counts_is_rejected() -> None:
    text = (ROOT / "topologies" / "slurm-local.yaml").read_text(encoding="utf-8").replace(
        "roles:\n", "node_defaults: {gpus: 0}\nroles:\n")
    with pytest.raises(TopologyError) as info:
        topology_from_text(text, ROOT / "topologies" / "slurm-local.yaml")
    assert any(p.path == "node_defaults" and "no role gives a count" in p.message for p in info.value.problems)


def test_explicit_node_lists_still_need_nodes() -> None:
    text = (ROOT / "topologies" / "slurm-local.yaml").read_text(encoding="utf-8")
    head, _, tail = text.partition("nodes:\n  - {name: n0")
    tail = tail.split("roles:", 1)[1]
    with pytest.raises(TopologyError) as info:
        topology_from_text(head + "roles:" + tail, ROOT / "topologies" / "slurm-local.yaml")
    assert any("missing required key 'nodes'" in p.message for p in info.value.problems)
