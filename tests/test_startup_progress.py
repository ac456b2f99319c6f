"""What `up` shows for a worker that is still starting: the last meaningful line of its log,
over real SGLang / vLLM start-up logs (tests/fixtures/startup_logs/, each with its source).
Also the start-up budgets: explicit `startup: {timeout}` layering and the size-scaled default."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from epdctl.errors import TopologyError
from epdctl.orchestrate.startup import (BASE_S, LOAD_RATE, ROUTER_EXTRA_S, UNKNOWN_S, budgets,
                                        meaningful_line, weight_bytes)
from epdctl.render import build_plan
from epdctl.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
LOGS = sorted((ROOT / "tests" / "fixtures" / "startup_logs").glob("*.log"))


def _fixture(path: Path) -> tuple[str, str, str]:
    lines = path.read_text(encoding="utf-8").split("\n")
    head = {ln[2:].split(":", 1)[0]: ln.split(":", 1)[1].strip() for ln in lines[:2]}
    return head["source"], head["expect"], "\n".join(lines[2:])


def test_fixtures_are_sourced() -> None:
    assert len(LOGS) >= 10
    for p in LOGS:
        source, expect, body = _fixture(p)
        assert source.startswith("https://github.com/") and expect and body.strip(), p.name


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.stem)
def test_last_meaningful_line(path: Path) -> None:
    _, expect, body = _fixture(path)
    assert meaningful_line(body) == expect
    # a progress bar writing to a file rewrites its line with carriage returns
    assert meaningful_line(body.replace("\n", "\r")) == expect


def test_health_probes_and_blank_lines_are_not_progress() -> None:
    _, expect, body = _fixture(LOGS[0])
    probes = '\nINFO:     127.0.0.1:50312 - "GET /health HTTP/1.1" 503 Service Unavailable\n\n'
    assert meaningful_line(body + probes * 3) == expect
    assert meaningful_line("") == meaningful_line("\n\n  \n") == ""


def _topo(tmp_path: Path, edit: dict | None = None, model: Path | None = None) -> Path:
    doc = yaml.safe_load((ROOT / "topologies" / "local.yaml").read_text())
    doc["model"]["path"] = str(model or (ROOT / "models" / "tiny-qwen2vl"))
    for key, value in (edit or {}).items():
        cur = doc
        *parents, last = key.split(".")
        for k in parents:
            cur = cur[int(k)] if isinstance(cur, list) else cur.setdefault(k, {})
        cur[last] = value
    out = tmp_path / "t.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def test_default_budget_scales_with_the_weights(tmp_path: Path) -> None:
    tiny = ROOT / "models" / "tiny-qwen2vl"
    nbytes = weight_bytes(str(tiny))
    assert nbytes and nbytes > 1e6
    topo = load_topology(_topo(tmp_path))
    got = budgets(topo, build_plan(topo))
    assert got["decode-0"] == pytest.approx(BASE_S + nbytes / LOAD_RATE)
    assert got["encoder-0"] < got["decode-0"]  # an encoder reads the vision tower alone
    assert got["router"] == pytest.approx(max(v for k, v in got.items() if k != "router") + ROUTER_EXTRA_S)
    # a bigger checkpoint: a longer budget, by its size
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text((tiny / "config.json").read_text())
    with open(big / "model-00001-of-00002.safetensors", "wb") as f:
        f.truncate(40 * 10**9)  # sparse: 40 GB of size, no disk
    (big / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 10)
    topo = load_topology(_topo(tmp_path, model=big))
    got = budgets(topo, build_plan(topo))
    assert got["prefill-0"] == pytest.approx(BASE_S + (40 * 10**9 + 10) / LOAD_RATE)
    # weights only the nodes can read: the long default
    topo = load_topology(_topo(tmp_path, {"model.architecture": "Qwen2VLForConditionalGeneration"},
                               model=tmp_path / "not-here"))
    assert set(budgets(topo, build_plan(topo)).values()) >= {UNKNOWN_S}


def test_explicit_timeouts_layer(tmp_path: Path) -> None:
    topo = load_topology(_topo(tmp_path, {"startup": {"timeout": 1800},
                                          "roles.decode.startup": {"timeout": 2400}}))
    got = budgets(topo, build_plan(topo))
    assert got["encoder-0"] == got["prefill-0"] == 1800 and got["decode-0"] == 2400
    assert got["router"] == 2400 + ROUTER_EXTRA_S
    topo = load_topology(_topo(tmp_path, {"defaults.startup": {"timeout": 900}}))
    assert budgets(topo, build_plan(topo))["prefill-0"] == 900


@pytest.mark.parametrize("edit, where", [
    ({"startup": {"timeout": "soon"}}, "startup.timeout"),
    ({"startup": {"timout": 10}}, "startup"),
    ({"startup": 600}, "startup"),
    ({"roles.decode.startup": {"timeout": 0}}, "roles.decode.startup.timeout"),
])
def test_bad_startup_blocks_are_named(tmp_path: Path, edit: dict, where: str) -> None:
    with pytest.raises(TopologyError) as e:
        load_topology(_topo(tmp_path, edit))
    assert where in str(e.value), str(e.value)
