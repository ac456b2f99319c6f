"""sbatch rendering: golden files, the committed slurm/*.sbatch examples, quoting and host mapping,
and `sbatch --test-only` on the real local cluster for every script whose request fits.

Regenerate tests/golden/slurm/ and slurm/*.sbatch after an intended change with:

    EPDCTL_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_sbatch_render.py -q
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from slurm_cluster import SlurmCluster, slurm_cluster

from epdctl.errors import RenderError
from epdctl.render import build_plan
from epdctl.launchers.slurm import jobs
from epdctl.launchers.slurm.sbatch import host_map, render_sbatch, substitute
from epdctl.topology import load_topology, topology_from_text

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "slurm"
EXAMPLES = ROOT / "slurm"
REGEN = os.environ.get("EPDCTL_REGEN_GOLDEN") == "1"
# Rendered for SLURM: every topology whose launcher is slurm, plus the SGLang EPD example.
RENDERED = ("deepseek-v3-pp4-ep32", "qwen2vl-epd", "slurm-local", "slurm-by-count")
# Committed as ready-to-run examples (slurm-local's model path is the checkout's, so it is rendered
# at `epdctl up` time instead).
COMMITTED = ("deepseek-v3-pp4-ep32", "qwen2vl-epd")
# What the 4-node, GPU-less local cluster cannot run, and why (sbatch --test-only must say so).
DOES_NOT_FIT = {
    "deepseek-v3-pp4-ep32": "gres",        # 8 GPUs per node on partition gpu, account llm-serving
    "qwen2vl-epd": "gres",                 # 8 GPUs per node on 3 nodes
}


def _render(name: str) -> str:
    topo = load_topology(ROOT / "topologies" / f"{name}.yaml")
    return render_sbatch(topo, build_plan(topo)).replace(str(ROOT), "<REPO>")


def _check(path: Path, text: str) -> None:
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"missing {path}; run EPDCTL_REGEN_GOLDEN=1 pytest {__file__}"
    assert path.read_text(encoding="utf-8") == text, (
        f"{path} differs from what render produces; if intended, regenerate with EPDCTL_REGEN_GOLDEN=1")


@pytest.mark.parametrize("name", RENDERED)
def test_render_matches_golden(name: str) -> None:
    _check(GOLDEN / f"{name}.sbatch", _render(name))


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_examples_do_not_drift(name: str) -> None:
    _check(EXAMPLES / f"{name}.sbatch", _render(name))


@pytest.mark.parametrize("name", RENDERED)
def test_rendered_script_is_valid_bash(name: str) -> None:
    proc = subprocess.run(["bash", "-n"], input=_render(name), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_multinode_ranks_share_the_leaders_runtime_address() -> None:
    text = _render("deepseek-v3-pp4-ep32")
    assert text.count('--dist-init-addr "${EPD_ADDR_0}:30002"') == 4  # prefill ranks on pf0..pf3
    assert text.count('--dist-init-addr "${EPD_ADDR_4}:30001"') == 4  # decode ranks on dc0..dc3
    for rank in range(4):
        assert text.count(f"--node-rank {rank} ") == 2
    assert "10.1.0." not in text.split("set -uo pipefail", 1)[1]  # no hard-coded topology address
    assert "#SBATCH --nodes=8" in text and "#SBATCH --gpus-per-node=8" in text
    assert "#SBATCH --exclusive\n" in text and "#SBATCH --account=llm-serving" in text
    # only rank-0 URLs are probed for readiness; other ranks are watched for liveness
    assert 'wait_ready prefill 1800 "prefill-0=http://${EPD_ADDR_0}:30000/health"\n' in text


def test_substitute_replaces_whole_addresses_only() -> None:
    hosts = {"10.1.0.1": "${EPD_ADDR_0}", "10.1.0.10": "${EPD_ADDR_1}"}
    assert substitute("http://10.1.0.10:80", hosts) == "http://${EPD_ADDR_1}:80"
    assert substitute("10.1.0.1:5000", hosts) == "${EPD_ADDR_0}:5000"
    assert substitute("10.1.0.100", hosts) == "10.1.0.100"
    assert substitute("x10.1.0.1", hosts) == "x10.1.0.1"


BASE = """
name: t
engine: embedded
launcher: slurm
slurm: {partition: "debug", time: "00:10:00", extra: {comment: "a queue'; echo pwned"}}
model: {path: /models/m, served_name: m}
defaults: {host: node}
nodes:
  - {name: a, host: HOST_A, port_base: 37500}
  - {name: b, host: HOST_B, port_base: 37600}
roles:
  prefill: {nodes: [a], count: 1}
  decode: {nodes: [b], count: 1}
"""


def test_nodes_sharing_an_address_cannot_be_mapped() -> None:
    topo = topology_from_text(BASE.replace("HOST_A", "h1").replace("HOST_B", "h1"))
    with pytest.raises(RenderError, match="share the address 'h1'"):
        host_map(topo, ["a", "b"])


def test_directive_values_are_quoted() -> None:
    topo = topology_from_text(BASE.replace("HOST_A", "a.x").replace("HOST_B", "b.x"))
    text = render_sbatch(topo, build_plan(topo))
    assert "#SBATCH --partition=debug\n" in text
    assert "#SBATCH --comment='a queue'\"'\"'; echo pwned'\n" in text


def test_user_template_overrides_the_default(tmp_path: Path) -> None:
    topo = topology_from_text(BASE.replace("HOST_A", "a.x").replace("HOST_B", "b.x"))
    tpl = tmp_path / "mine.j2"
    tpl.write_text("#!/bin/bash\n{% for k, v in directives %}#SBATCH --{{ k }}={{ v }}\n{% endfor %}"
                   "{% for s in stages %}# {{ s.name }}: {{ s.workers | map(attribute='name') | join(',') }}\n"
                   "{% endfor %}")
    text = render_sbatch(topo, build_plan(topo), tpl)
    assert text.startswith("#!/bin/bash\n#SBATCH --job-name=epd-t\n")
    assert "# prefill: prefill-0\n# decode: decode-0\n" in text
    with pytest.raises(RenderError, match="cannot read sbatch template"):
        render_sbatch(topo, build_plan(topo), tmp_path / "missing.j2")


def test_each_stage_waits_its_processes_start_up_budget() -> None:
    """The script's wait per stage is the largest budget of that stage's processes (what `up`
    allows them): explicit `startup: {timeout}` per role here, the router its workers' + 60 s."""
    text = BASE.replace("HOST_A", "a.x").replace("HOST_B", "b.x").replace(
        "prefill: {nodes: [a], count: 1}", "prefill: {nodes: [a], count: 1, startup: {timeout: 90}}").replace(
        "decode: {nodes: [b], count: 1}", "decode: {nodes: [b], count: 1, startup: {timeout: 2400.5}}")
    topo = topology_from_text(text + "router: {node: a}\n")
    script = render_sbatch(topo, build_plan(topo))
    assert 'wait_ready prefill 90 "prefill-0=' in script
    assert 'wait_ready decode 2401 "decode-0=' in script  # rounded up, never below the budget
    assert "wait_ready router 2461 router=http" in script
    limits = {"prefill-0": 5.0, "decode-0": 7.0, "router": 9.0}
    assert 'wait_ready decode 7 "decode-0=' in render_sbatch(topo, build_plan(topo), limits=limits)


def _wait_ready(script: str, tmp_path: Path, call: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The rendered script's own functions (phase, fail, check_alive, probe, wait_ready), run in bash."""
    body = script.split("set -uo pipefail", 1)[1]
    start = body.index("check_alive() {")
    funcs = body[body.index("phase() {"):body.index("declare -A")] + body[start:body.index("\n# --- ", start)]
    prog = f"set -uo pipefail\nEPD_RUN_DIR={tmp_path}\nEPD_ORDER=()\n{funcs}\n{call}\n"
    return subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], **env})


def test_wait_ready_fails_at_the_stage_limit_or_the_environments(tmp_path: Path) -> None:
    topo = topology_from_text(BASE.replace("HOST_A", "a.x").replace("HOST_B", "b.x"))
    script = render_sbatch(topo, build_plan(topo))
    call = 'wait_ready prefill 1 "prefill-0=http://127.0.0.1:9/health"'  # port 9: nothing answers
    stage = _wait_ready(script, tmp_path, call, {})
    assert stage.returncode == 1 and "prefill-0 not healthy after 1s" in stage.stderr, stage.stderr
    override = _wait_ready(script, tmp_path, call, {"EPD_READY_TIMEOUT": "2"})
    assert override.returncode == 1 and "prefill-0 not healthy after 2s" in override.stderr, override.stderr
    assert (tmp_path / "phase").read_text().startswith("failed prefill-0 not healthy after 2s")


# ----------------------------------------------------------------------------- real cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from slurm_cluster()


@pytest.mark.parametrize("name", RENDERED)
def test_sbatch_test_only_on_the_local_cluster(cluster: SlurmCluster, tmp_path: Path, name: str) -> None:
    script = tmp_path / f"{name}.sbatch"
    script.write_text(_render(name))
    ok, msg = jobs.check_fits(str(script))
    if name in DOES_NOT_FIT:
        assert not ok
        assert DOES_NOT_FIT[name] in msg and "slurm.gpus_per_node" in msg
        # without the GPU request the node count alone fits or is named as the problem
        topo = load_topology(ROOT / "topologies" / f"{name}.yaml")
        topo = dataclasses.replace(topo, slurm=None, nodes=tuple(dataclasses.replace(n, gpus=0) for n in topo.nodes))
        script.write_text(render_sbatch(topo, build_plan(topo)))
        ok, msg = jobs.check_fits(str(script))
        nodes = len(build_plan(topo).nodes)
        assert ok == (nodes <= len(cluster.nodes)), msg
        if not ok:
            assert "too many nodes" in msg
    else:
        assert ok, msg
        assert "to start at" in msg and "partition debug" in msg
