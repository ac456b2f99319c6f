"""Good topologies: layering, placement, ports, the Plan API, multi-node wiring and quoting."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from epdctl.render import build_plan, shell_quote, to_shell
from epdctl.topology import load_topology, topology_from_text

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_examples_load_and_have_a_header(path: Path) -> None:
    assert path.read_text().startswith("# ")
    plan = build_plan(load_topology(path))
    assert plan.workers and plan.router is not None
    order = [w.role for w in plan.workers]
    assert order == sorted(order, key=["encoder", "prefill", "decode", "colocated"].index)
    ports = [(w.node, w.port) for w in plan.workers] + [(plan.router.node, plan.router.port)]
    assert len(set(ports)) == len(ports)


def test_local_plan_matches_the_architecture_contract() -> None:
    topo = load_topology(ROOT / "topologies" / "local.yaml")
    assert topo.model.path == str((ROOT / "models" / "tiny-qwen2vl").resolve())
    plan = build_plan(topo)
    assert [w.name for w in plan.workers] == ["encoder-0", "encoder-1", "prefill-0", "decode-0"]
    for w in plan.workers:
        assert w.host == "127.0.0.1" and 31000 <= w.port <= 31099 and w.is_leader and w.health_path == "/health"
        assert w.argv[1:4] == ("-m", "epdctl.runtime", w.role)
    pre = plan.workers[2]
    assert pre.bootstrap_port and pre.encoder_bootstrap_port
    i = pre.argv.index("--encoder-urls")
    assert pre.argv[i + 1:i + 3] == (plan.workers[0].url, plan.workers[1].url)
    r = plan.router
    assert r is not None and r.argv[1:3] == ("-m", "smg.launch_router") and 31000 <= r.prometheus_port <= 31099
    assert r.argv[r.argv.index("--prefill") + 1:r.argv.index("--prefill") + 3] == (pre.url, str(pre.bootstrap_port))


def test_multinode_workers_share_dist_init_and_register_rank0_only() -> None:
    plan = build_plan(load_topology(ROOT / "topologies" / "deepseek-v3-pp4-ep32.yaml"))
    prefill = [w for w in plan.workers if w.role == "prefill"]
    assert [w.name for w in prefill] == ["prefill-0", "prefill-0.r1", "prefill-0.r2", "prefill-0.r3"]
    inits = {w.argv[w.argv.index("--dist-init-addr") + 1] for w in prefill}
    assert len(inits) == 1 and inits.pop().startswith("10.1.0.10:")
    assert [w.argv[w.argv.index("--node-rank") + 1] for w in prefill] == ["0", "1", "2", "3"]
    for w in prefill:
        a = w.argv
        assert a[a.index("--pp-size") + 1] == "4" and a[a.index("--chunked-prefill-size") + 1] == "12288"
    decode = [w for w in plan.workers if w.role == "decode"]
    a = decode[0].argv
    assert a[a.index("--tp-size") + 1] == "32" and a[a.index("--attn-dp-size") + 1] == "32"
    assert a[a.index("--moe-a2a-backend") + 1] == "deepep"
    router = plan.router.argv
    assert router.count("--prefill") == 1 and router.count("--decode") == 1
    assert [w.is_leader for w in decode] == [True, False, False, False]


def test_layering_topology_role_node_worker() -> None:
    text = """
name: t
engine: sglang
model: {path: /m}
transfer: {backend: mooncake}
defaults: {host: node, env: {A: top, B: top}, mem_fraction_static: 0.5}
nodes:
  - {name: n0, host: 10.0.0.1, gpus: 8, shared: true, defaults: {env: {B: node}, mem_fraction_static: 0.7}}
  - {name: n1, host: 10.0.0.2, gpus: 8}
roles:
  prefill:
    env: {C: role}
    workers:
      - {node: n0, tp: 2, env: {D: worker}}
      - {node: n1, tp: 4, port: 31111}
  decode: {nodes: [n0], count: 1, tp: 4}
"""
    topo = topology_from_text(text)
    p0, p1, d0 = topo.workers
    assert p0.settings.env == {"A": "top", "B": "node", "C": "role", "D": "worker"}
    assert p0.settings.mem_fraction_static == 0.7 and p1.settings.mem_fraction_static == 0.5
    assert p1.settings.env == {"A": "top", "B": "top", "C": "role"}
    plan = build_plan(topo)
    by = {w.name: w for w in plan.workers}
    assert by["prefill-1"].port == 31111 and by["prefill-1"].host == "10.0.0.2"
    assert by["decode-0"].argv[by["decode-0"].argv.index("--base-gpu-id") + 1] == "2"  # after prefill-0's 2 GPUs
    assert by["decode-0"].gpus == (2, 3, 4, 5)


def test_secrets_stay_references_and_shell_output_parses(tmp_path: Path) -> None:
    plan = build_plan(load_topology(ROOT / "topologies" / "qwen2vl-epd.yaml"))
    assert plan.router is not None
    # the router reads its key from the variable the topology names: only the name is rendered
    assert plan.router.argv[2:5] == ("epdctl.node.router_exec", "EPD_ROUTER_API_KEY", "smg.launch_router")
    script = to_shell(plan)
    assert "epdctl.node.router_exec EPD_ROUTER_API_KEY smg.launch_router" in script
    assert "--api-key" not in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert shell_quote("a b'c") == shlex.quote("a b'c")
    assert shell_quote("Bearer ${TOK} $x `y`") == '"Bearer ${TOK} \\$x \\`y\\`"'
    out = subprocess.run(["bash", "-c", "TOK=s3; printf %s " + shell_quote("k=${TOK};$(id)")],
                         capture_output=True, text=True)
    assert out.stdout == "k=s3;$(id)"


def test_architecture_is_read_from_local_config(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"architectures": ["LlavaForConditionalGeneration"]}')
    text = (ROOT / "topologies" / "local.yaml").read_text().replace("../models/tiny-qwen2vl", "./m")
    text = text.replace("  architecture: Qwen2VLForConditionalGeneration\n", "")
    topo = topology_from_text(text, tmp_path / "t.yaml")
    assert topo.model.architecture == "LlavaForConditionalGeneration"
    assert topo.model.path == str(tmp_path / "m")


def test_vllm_multinode_worker_is_headless_beyond_rank0() -> None:
    from epdctl.topology.engine_flags import flag_table

    text = """
name: v
engine: vllm
model: {path: /m}
transfer: {backend: nixl}
defaults: {host: node}
nodes:
  - {name: a, host: 10.0.0.1, gpus: 8, nics: [{name: mlx5_0, kind: ib}]}
  - {name: b, host: 10.0.0.2, gpus: 8, nics: [{name: mlx5_0, kind: ib}]}
  - {name: c, host: 10.0.0.3, gpus: 8, nics: [{name: mlx5_0, kind: ib}]}
roles:
  prefill: {nodes: [a], count: 1, tp: 8}
  decode:
    workers:
      - {nodes: [b, c], tp: 8, pp: 2}
router: {node: a, host: node}
"""
    plan = build_plan(topology_from_text(text))
    d0, d1 = [w for w in plan.workers if w.role == "decode"]
    assert "--headless" not in d0.argv and "--headless" in d1.argv
    for w in (d0, d1):
        a = w.argv
        assert a[a.index("--master-addr") + 1] == "10.0.0.2" and a[a.index("--nnodes") + 1] == "2"
        assert flag_table("vllm").check(list(a[3:])) == []
        assert w.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == ("10.0.0.2" if w is d0 else "10.0.0.3")
        assert w.env["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert d0.argv[d0.argv.index("--master-port") + 1] == d1.argv[d1.argv.index("--master-port") + 1]
    assert plan.router is not None and plan.router.argv.count("--decode") == 1
