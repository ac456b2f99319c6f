"""In place by default (``rebalance: {in_place: false}`` turns it off): which workers start
switchable, what is rendered, which path a planned move takes (and why), checked by the engines'
own parsers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from epdctl.errors import TopologyError
from epdctl.rebalance.plan import Move, plan_rebalance
from epdctl.render import build_plan
from epdctl.topology import topology_from_text
from epdctl.topology.engine_flags import flag_table

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "models" / "tiny-qwen2vl")


def embedded(in_place: str | None = None) -> object:
    """The 1 E / 1 P / 2 D embedded topology; ``in_place``: the rebalance key's value (None: no key)."""
    key = "" if in_place is None else f"rebalance: {{in_place: {in_place}}}"
    return topology_from_text(f"""
name: rb
engine: embedded
model: {{path: {MODEL}, served_name: tiny, architecture: Qwen2VLForConditionalGeneration}}
ports: {{base: 38500, limit: 38599}}
nodes: [{{name: local, host: 127.0.0.1, shared: true}}]
{key}
roles:
  encoder: {{nodes: [local], count: 1}}
  prefill: {{nodes: [local], count: 1}}
  decode: {{nodes: [local], count: 2}}
router: {{node: local, host: 127.0.0.1}}
""")


def sglang_pd(extra: str = ", tp: 8", encoders: bool = False, backend: str = "mooncake") -> object:
    enc = "  encoder: {nodes: [e0], count: 1, tp: 1}\n" if encoders else ""
    return topology_from_text(f"""
name: g
engine: sglang
model: {{path: /models/qwen, served_name: q, architecture: Qwen2VLForConditionalGeneration}}
transfer: {{backend: {backend}}}
nodes:
  - {{name: e0, host: 10.0.0.1, gpus: 8}}
  - {{name: p0, host: 10.0.0.2, gpus: 8}}
  - {{name: d0, host: 10.0.0.3, gpus: 8}}
  - {{name: d1, host: 10.0.0.4, gpus: 8}}
defaults: {{host: node}}
roles:
{enc}  prefill: {{nodes: [p0], count: 1, tp: 4}}
  decode: {{nodes: [d0, d1], count: 2{extra}}}
router: {{node: p0}}
""")


def _argv(plan, name: str) -> tuple[str, ...]:
    return next(w.argv for w in plan.workers if w.name == name)


def test_embedded_workers_start_switchable_and_the_runtime_parser_accepts_it() -> None:
    plan = build_plan(embedded())
    for w in plan.workers:
        assert "--switchable" in w.argv, w.name
        role = w.argv[w.argv.index("epdctl.runtime") + 1]
        assert flag_table("embedded", role).check(w.argv[w.argv.index(role) + 1:]) == []
    assert all("--switchable" not in w.argv for w in build_plan(embedded("false")).workers)


def test_embedded_moves_are_in_place_and_keep_the_ports() -> None:
    rp = plan_rebalance(embedded(), {"encoder": 1}, source="decode")
    (m,) = rp.moves
    assert (m.worker, m.new_name, m.path) == ("decode-1", "encoder-1", "in-place")
    assert "/admin/switch_role" in m.why
    old = next(w for w in rp.plan_before.workers if w.name == "decode-1")
    new = next(w for w in rp.plan_after.workers if w.name == "encoder-1")
    assert new.port == old.port and "--switchable" in new.argv
    tp = "--transfer-port"                           # the switched worker re-binds its transfer endpoint
    assert new.argv[new.argv.index(tp) + 1] == old.argv[old.argv.index(tp) + 1]
    assert Move.from_dict(m.to_dict()) == m          # recorded in history with its path


def test_embedded_without_in_place_restarts() -> None:
    (m,) = plan_rebalance(embedded("false"), {"encoder": 1}, source="decode").moves
    assert m.path == "restart" and m.why == "the topology says rebalance: {in_place: false}"
    assert plan_rebalance(embedded("true"), {"encoder": 1}, source="decode").moves[0].path == "in-place"


def test_the_default_local_topology_moves_encoder_to_decode_and_back_in_place() -> None:
    """topologies/local.yaml has no rebalance key: every worker starts switchable, both moves of
    a round trip keep the process (the plan names the path)."""
    from epdctl.topology import load_topology

    topo = load_topology(ROOT / "topologies" / "local.yaml")
    assert topo.in_place
    assert all("--switchable" in w.argv for w in build_plan(topo).workers if w.role != "router")
    there = plan_rebalance(topo, {"decode": 1}, source="encoder")
    (m,) = there.moves
    assert (m.worker, m.new_name, m.path) == ("encoder-1", "decode-1", "in-place"), m
    (back,) = plan_rebalance(there.after, {"encoder": 1}, source="decode").moves
    assert back.path == "in-place" and back.new_role == "encoder", back


def test_sglang_pd_renders_role_switch_with_a_bootstrap_port_on_decodes() -> None:
    plan = build_plan(sglang_pd())
    table = flag_table("sglang")
    ports = set()
    for w in plan.workers:
        assert "--enable-pd-role-switch" in w.argv, w.name
        assert table.check(w.argv[w.argv.index("sglang.launch_server") + 1:]) == [], w.name
        ports.add((w.host, int(w.argv[w.argv.index("--disaggregation-bootstrap-port") + 1])))
    assert len(ports) == 3                               # every instance its own bootstrap port


def test_sglang_prefill_decode_move_is_in_place_and_keeps_the_bootstrap_port() -> None:
    topo = sglang_pd()
    rp = plan_rebalance(topo, {"prefill": 1}, source="decode")
    (m,) = rp.moves
    assert m.path == "in-place" and "/pd_role_switch" in m.why
    old = next(w for w in rp.plan_before.workers if w.name == m.worker)
    new = next(w for w in rp.plan_after.workers if w.name == m.new_name)
    assert new.port == old.port
    bp = "--disaggregation-bootstrap-port"
    assert new.argv[new.argv.index(bp) + 1] == old.argv[old.argv.index(bp) + 1] == str(m.bootstrap_port)


@pytest.mark.parametrize("topo, reason", [
    (lambda: sglang_pd(", tp: 8, ep: 8"), "expert parallelism"),
    (lambda: sglang_pd(", tp: 4, pp: 2"), "pipeline parallelism"),
    (lambda: sglang_pd(", tp: 8, args: [--speculative-algorithm, EAGLE]"), "--speculative-algorithm"),
    (lambda: sglang_pd(backend="nixl"), "transfer backend nixl"),
    (lambda: sglang_pd(encoders=True), "--language-only"),
])
def test_sglang_falls_back_to_restart_and_says_why(topo, reason: str) -> None:
    t = topo()
    decodes = [w for w in build_plan(t).workers if w.role == "decode"]
    assert decodes and all("--enable-pd-role-switch" not in w.argv for w in decodes)
    (m,) = plan_rebalance(t, {"prefill": 1}, source="decode").moves
    assert m.path == "restart" and reason in m.why


def test_sglang_encoder_moves_restart() -> None:
    (m,) = plan_rebalance(sglang_pd(encoders=True), {"encoder": 1}, source="decode").moves
    assert m.path == "restart"


def test_unknown_rebalance_key_is_reported_with_its_path() -> None:
    with pytest.raises(TopologyError) as e:
        topology_from_text(f"""
name: rb
engine: embedded
model: {{path: {MODEL}, served_name: tiny}}
nodes: [{{name: local, host: 127.0.0.1}}]
rebalance: {{inplace: true}}
roles: {{colocated: {{nodes: [local], count: 1}}}}
""")
    assert "rebalance" in str(e.value) and "inplace" in str(e.value)


def test_validate_reports_what_a_switchable_worker_holds(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from epdctl.commands.validate import validate
    from epdctl.topology.weights import read_split

    split = read_split(MODEL)
    size = (Path(MODEL) / "model.safetensors").stat().st_size
    assert split is not None and split.vision > 0 and split.language > 0
    assert 0.95 * size < split.vision + split.language <= size      # every tensor, header aside
    f = tmp_path / "t.yaml"
    f.write_text(f"""
name: ip
engine: embedded
model: {{path: {MODEL}, served_name: tiny}}
ports: {{base: 38500, limit: 38599}}
nodes: [{{name: local, host: 127.0.0.1, shared: true}}]
roles:
  encoder: {{nodes: [local], count: 1}}
  prefill: {{nodes: [local], count: 1}}
  decode: {{nodes: [local], count: 2}}
""")
    out = CliRunner().invoke(validate, [str(f)]).output
    assert "2 switchable decode(s)" in out and "1 switchable encoder(s)" in out
    assert "over the role alone" in out
    from epdctl.topology.weights import switchable_memory
    (line,) = switchable_memory(sglang_pd())
    assert "3 prefill/decode worker(s) start --enable-pd-role-switch" in line
    assert switchable_memory(sglang_pd(encoders=True)) == []


def test_switchable_workers_of_every_role_get_the_cluster_key_and_limits() -> None:
    """POST /admin/switch_role needs the key like the encoder registry (i14 + i17), so a switchable
    decode is started with --api-key-env too; the topology's limits reach every switchable worker."""
    topo = embedded()
    router = dataclasses.replace(topo.router, api_key_env="EPD_CLUSTER_KEY")
    limits = dataclasses.replace(topo.limits, max_body_bytes=4096, given=frozenset({"max_body_bytes"}))
    plan = build_plan(dataclasses.replace(topo, router=router, limits=limits))
    for w in plan.workers:
        argv = list(w.argv)
        assert argv[argv.index("--api-key-env") + 1] == "EPD_CLUSTER_KEY", w.name
        assert argv[argv.index("--max-body-bytes") + 1] == "4096", w.name
        role = argv[argv.index("epdctl.runtime") + 1]
        assert flag_table("embedded", role).check(argv[argv.index(role) + 1:]) == []
    plain = build_plan(dataclasses.replace(embedded("false"), router=router))  # every worker: its /metrics
    assert all(list(w.argv)[list(w.argv).index("--api-key-env") + 1] == "EPD_CLUSTER_KEY" for w in plain.workers)
