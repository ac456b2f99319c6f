"""Keys real clusters need, each rendered command checked by SGLang 0.5.23's own parser (when it is
installed; the committed flag dump otherwise): decode bootstrap port, Mooncake RDMA auto-detect,
encoder IB device, --mooncake-ib-device, explicit GPUs, launcher module, mini_lb, env precedence,
SGLang's defaults (served name, encoder transfer backend), explicit ports on every rank."""

from __future__ import annotations

import argparse

import pytest

from epdctl.errors import TopologyError
from epdctl.render import build_plan
from epdctl.topology import topology_from_text
from epdctl.topology.engine_flags import flag_table

BASE = """name: g
engine: sglang
model: {path: Qwen/Qwen3-VL-8B-Instruct}
transfer: {TRANSFER}
nodes:
  - {name: a, host: 10.0.0.1, gpus: 8, nics: [{name: mlx5_0, kind: ib}], env: {NCCL_DEBUG: INFO, X: node}}
  - {name: b, host: 10.0.0.2, gpus: 8, nics: [{name: mlx5_0, kind: ib}]}
  - {name: c, host: 10.0.0.3, gpus: 8, nics: [{name: mlx5_0, kind: ib}]}
roles:
  encoder:
    workers: [{node: c, host: node, base_gpu_id: 4}]
  prefill:
    env: {NCCL_DEBUG: WARN, X: role}
    workers: [{node: a, host: node, gpu_ids: [6, 7], tp: 2, module: dynamo.sglang}]
  decode:
    workers: [{node: b, host: node, bootstrap_port: 30001, moe_a2a_backend: mooncake, env: {X: worker}}]
router: {node: a, implementation: mini_lb}
"""


def _plan(transfer: str = "{backend: mooncake}"):
    topo = topology_from_text(BASE.replace("{TRANSFER}", transfer))
    plan = build_plan(topo)
    return topo, {s.name: s for s in plan.workers}, plan


def _parse(argv: tuple[str, ...]) -> argparse.Namespace | None:
    """Check with the flag dump always, and with SGLang's real parser when it is installed."""
    assert flag_table("sglang").check(list(argv[3:])) == [], argv
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError:
        return None
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    ns, extra = parser.parse_known_args(list(argv[3:]))
    assert not extra, extra
    return ns


def _val(argv: tuple[str, ...], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_decode_bootstrap_port_and_mooncake_ep_device() -> None:
    _, specs, _ = _plan()
    dec = specs["decode-0"].argv
    assert _val(dec, "--disaggregation-bootstrap-port") == "30001"
    assert _val(dec, "--mooncake-ib-device") == "mlx5_0"
    ns = _parse(dec)
    if ns is not None:
        assert ns.disaggregation_bootstrap_port == 30001 and ns.mooncake_ib_device == "mlx5_0"


def test_rdma_auto_leaves_device_discovery_to_sglang_and_off_forces_tcp() -> None:
    _, specs, _ = _plan("{backend: mooncake, rdma: auto}")
    pre = specs["prefill-0"].argv
    assert _val(pre, "--disaggregation-transfer-backend") == "mooncake"
    assert "--disaggregation-ib-device" not in pre and "--mooncake-ib-device" not in specs["decode-0"].argv
    _parse(pre)
    _, specs, _ = _plan("{backend: mooncake, rdma: off}")
    assert _val(specs["prefill-0"].argv, "--disaggregation-transfer-backend") == "mooncake_tcp"


def test_encoder_over_mooncake_gets_its_ib_device() -> None:
    _, specs, _ = _plan("{backend: mooncake, embeddings: mooncake}")
    enc = specs["encoder-0"].argv
    assert _val(enc, "--encoder-transfer-backend") == "mooncake"
    assert _val(enc, "--disaggregation-ib-device") == "mlx5_0"
    ns = _parse(enc)
    if ns is not None:
        assert ns.encoder_only and ns.disaggregation_ib_device == "mlx5_0"


def test_encoder_transfer_backend_left_to_sglang_auto_unless_set() -> None:
    _, specs, _ = _plan()
    for name in ("encoder-0", "prefill-0"):
        assert "--encoder-transfer-backend" not in specs[name].argv
        ns = _parse(specs[name].argv)
        if ns is not None:
            assert ns.encoder_transfer_backend == "auto"


def test_explicit_gpus_module_and_served_name_default() -> None:
    topo, specs, _ = _plan()
    enc, pre = specs["encoder-0"], specs["prefill-0"]
    assert _val(enc.argv, "--base-gpu-id") == "4" and enc.gpus == (4,)
    assert pre.env["CUDA_VISIBLE_DEVICES"] == "6,7" and _val(pre.argv, "--base-gpu-id") == "0"
    assert pre.argv[2] == "dynamo.sglang" and specs["decode-0"].argv[2] == "sglang.launch_server"
    assert topo.model.served_name == "Qwen/Qwen3-VL-8B-Instruct"  # SGLang's default: the full path
    _parse(pre.argv)


def test_env_most_specific_wins() -> None:
    _, specs, _ = _plan()
    assert specs["prefill-0"].env["NCCL_DEBUG"] == "INFO"  # node beats role
    assert specs["prefill-0"].env["X"] == "node"
    assert specs["decode-0"].env["X"] == "worker"  # the worker's own env beats its node's


def test_mini_lb_router() -> None:
    _, _, plan = _plan()
    assert plan.router is not None
    argv = plan.router.argv
    assert argv[1:4] == ("-m", "sglang_router.launch_router", "--mini-lb") and "--pd-disaggregation" in argv


def test_explicit_port_on_every_rank() -> None:
    text = BASE.replace("{TRANSFER}", "{backend: mooncake}").replace(
        "workers: [{node: b, host: node, bootstrap_port: 30001, moe_a2a_backend: mooncake, env: {X: worker}}]",
        "workers: [{nodes: [b, c], host: node, port: 30001, tp: 16, dist_init_port: 5000}]").replace(
        "workers: [{node: c, host: node, base_gpu_id: 4}]", "workers: [{node: a, host: node, base_gpu_id: 4}]").replace(
        "{name: a, host: 10.0.0.1, gpus: 8,", "{name: a, host: 10.0.0.1, gpus: 8, shared: true,")
    specs = {s.name: s for s in build_plan(topology_from_text(text)).workers}
    assert specs["decode-0"].port == specs["decode-0.r1"].port == 30001
    assert _val(specs["decode-0.r1"].argv, "--dist-init-addr") == "10.0.0.2:5000"
    _parse(specs["decode-0.r1"].argv)


def test_embedded_engine_rejects_a_separate_embeddings_transport() -> None:
    text = """name: e
engine: embedded
model: {path: /m}
transfer: {backend: zmq, embeddings: mooncake}
nodes: [{name: a, host: 127.0.0.1}]
roles:
  encoder: {nodes: [a], count: 1}
  prefill: {nodes: [a], count: 1}
  decode: {nodes: [a], count: 1}
"""
    with pytest.raises(TopologyError) as e:
        topology_from_text(text)
    assert "transfer.embeddings" in str(e.value) and "one transport" in str(e.value)


def test_explicit_gpus_are_claimed_first_and_overlaps_reported() -> None:
    text = """name: o
engine: sglang
model: {path: /m}
transfer: {backend: mooncake}
nodes: [{name: a, host: 10.0.0.1, gpus: 4, shared: true}, {name: b, host: 10.0.0.2, gpus: 4}]
roles:
  prefill:
    workers: [{node: a, host: node, tp: 2}, {node: a, host: node, tp: 2, base_gpu_id: 0}]
  decode:
    workers: [{node: b, host: node, gpu_ids: [2, 3], tp: 2}]
"""
    topo = topology_from_text(text)
    assert [w.base_gpu_ids for w in topo.workers] == [(2,), (0,), (0,)]
    bad = text.replace("[{node: a, host: node, tp: 2}, {node: a, host: node, tp: 2, base_gpu_id: 0}]",
                       "[{node: a, host: node, tp: 2, base_gpu_id: 1}, {node: a, host: node, tp: 2, base_gpu_id: 0}]")
    with pytest.raises(TopologyError) as e:
        topology_from_text(bad)
    assert "GPU 1 on node 'a' is given to both" in str(e.value)
