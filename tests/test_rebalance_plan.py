"""Rebalance planning (pure): deltas -> moves, constraints, pinned ports, replay, diffs."""

from __future__ import annotations

from pathlib import Path

import pytest

from epdctl.rebalance import history
from epdctl.rebalance.plan import (Move, RebalanceError, commands_diff, parse_delta,
                                   plan_rebalance, replay, role_counts, topology_diff)
from epdctl.render import build_plan
from epdctl.topology import load_topology, topology_from_text

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "models" / "tiny-qwen2vl")


def local(enc: int = 1, pre: int = 1, dec: int = 2) -> object:
    return topology_from_text(f"""
name: rb
engine: embedded
model: {{path: {MODEL}, served_name: tiny, architecture: Qwen2VLForConditionalGeneration}}
ports: {{base: 38500, limit: 38599}}
transfer: {{backend: zmq}}
nodes: [{{name: local, host: 127.0.0.1, shared: true}}]
roles:
  encoder: {{nodes: [local], count: {enc}}}
  prefill: {{nodes: [local], count: {pre}}}
  decode: {{nodes: [local], count: {dec}}}
router: {{node: local, host: 127.0.0.1}}
""")


def gpu_topology(decode_nodes: str, decode_tp: int = 8) -> object:
    return topology_from_text(f"""
name: g
engine: sglang
model: {{path: /models/qwen, served_name: q, architecture: Qwen2VLForConditionalGeneration}}
transfer: {{backend: mooncake}}
nodes:
  - {{name: e0, host: 10.0.0.1, gpus: 8}}
  - {{name: p0, host: 10.0.0.2, gpus: 8}}
  - {{name: d0, host: 10.0.0.3, gpus: 8}}
  - {{name: d1, host: 10.0.0.4, gpus: 8}}
  - {{name: d2, host: 10.0.0.5, gpus: 8}}
  - {{name: d3, host: 10.0.0.6, gpus: 8}}
defaults: {{host: node}}
roles:
  encoder: {{nodes: [e0], count: 8, tp: 1}}
  prefill: {{nodes: [p0], count: 1, tp: 8}}
  decode:
    workers: {decode_nodes}
    tp: {decode_tp}
router: {{node: p0}}
""")


def test_encoder_from_decode_moves_the_last_decode_and_keeps_every_other_port() -> None:
    topo = local()
    rp = plan_rebalance(topo, {"encoder": 1}, "decode")
    assert [(m.worker, m.new_name) for m in rp.moves] == [("decode-1", "encoder-1")]
    assert role_counts(rp.after) == {"encoder": 2, "prefill": 1, "decode": 1}
    assert role_counts(topo) == {"encoder": 1, "prefill": 1, "decode": 2}  # never mutated
    before = {w.name: w for w in rp.plan_before.workers}
    after = {w.name: w for w in rp.plan_after.workers}
    for name in ("encoder-0", "prefill-0", "decode-0"):
        assert after[name].port == before[name].port
    assert after["encoder-1"].port == before["decode-1"].port
    assert after["encoder-1"].argv[3] == "encoder"
    pre = after["prefill-0"].argv
    assert after["encoder-1"].url in pre[pre.index("--encoder-urls") + 1:]
    assert rp.plan_after.router.port == rp.plan_before.router.port


def test_balanced_deltas_and_several_moves_in_order() -> None:
    rp = plan_rebalance(local(1, 1, 3), {"encoder": 2, "decode": -2})
    assert [m.worker for m in rp.moves] == ["decode-2", "decode-1"]
    assert [m.new_name for m in rp.moves] == ["encoder-1", "encoder-2"]
    assert role_counts(rp.after) == {"encoder": 3, "prefill": 1, "decode": 1}


def test_new_prefill_gets_fresh_bootstrap_ports_that_collide_with_nothing() -> None:
    rp = plan_rebalance(local(2, 1, 1), {"prefill": 1}, "encoder")
    (move,) = rp.moves
    assert move.new_name == "prefill-1" and move.bootstrap_port and move.encoder_bootstrap_port
    ports = [p for w in rp.plan_after.workers
             for p in (w.port, w.bootstrap_port, w.encoder_bootstrap_port) if p]
    ports += [rp.plan_after.router.port, rp.plan_after.router.prometheus_port]
    assert len(ports) == len(set(ports))


@pytest.mark.parametrize("deltas,source,msg", [
    ({"encoder": 1}, "prefill", "at least one"),
    ({"encoder": 2}, "decode", "at least one"),
    ({"encoder": 1}, None, "node pool is fixed"),
    ({}, None, "nothing to do"),
    ({"decode": 1}, "decode", "also asked to grow"),
    ({"gpu": 1}, None, "unknown role"),
])
def test_refused_before_anything_moves(deltas: dict, source: str | None, msg: str) -> None:
    with pytest.raises(RebalanceError, match=msg):
        plan_rebalance(local(), deltas, source)


def test_parse_delta_reports_the_flag() -> None:
    assert parse_delta("+2", "--encoder") == 2 and parse_delta("-1", "--decode") == -1
    with pytest.raises(RebalanceError, match="--encoder 'two'"):
        parse_delta("two", "--encoder")


def test_multi_node_worker_moves_as_a_unit_only_into_a_matching_shape() -> None:
    topo = gpu_topology("[{nodes: [d0, d1]}, {nodes: [d2], tp: 8}]", decode_tp=16)
    rp = plan_rebalance(topo, {"prefill": 1}, "decode")  # the 1-node decode-1 fits a prefill
    assert rp.moves[0].worker == "decode-1" and rp.moves[0].nodes == ("d2",)
    # the 2-node decode-0 cannot become a 1-node prefill; with decode-1 gone it is the last one
    with pytest.raises(RebalanceError):
        plan_rebalance(topo, {"prefill": 2}, "decode")


def test_multi_node_source_is_refused_when_the_target_is_single_node() -> None:
    topo = gpu_topology("[{nodes: [d0, d1]}, {nodes: [d2, d3]}]", decode_tp=16)
    with pytest.raises(RebalanceError, match="multi-node workers move as a unit"):
        plan_rebalance(topo, {"prefill": 1}, "decode")


def test_gpus_must_fit_and_node_ownership_is_checked() -> None:
    topo = gpu_topology("[{nodes: [d0]}, {nodes: [d1]}]")
    rp = plan_rebalance(topo, {"prefill": 1}, "decode")  # tp 8 decode -> tp 8 prefill fits
    spec = next(w for w in rp.plan_after.workers if w.name == rp.moves[0].new_name)
    assert spec.node == "d1" and "--disaggregation-mode" in spec.argv
    # decode (8 GPUs) -> encoders need 1 GPU each: fits, but d1 then hosts an encoder while e0
    # is the encoder node: allowed (d1 is wholly the encoder's now)
    rp2 = plan_rebalance(topo, {"encoder": 1}, "decode")
    assert role_counts(rp2.after)["encoder"] == 9


def test_replay_reproduces_the_planned_layout_and_commands() -> None:
    topo = local()
    rp = plan_rebalance(topo, {"encoder": 1}, "decode")
    again = replay(topo, list(rp.moves))
    assert [(w.name, w.argv) for w in build_plan(again).workers] == \
        [(w.name, w.argv) for w in rp.plan_after.workers]
    back = plan_rebalance(again, {"decode": 1}, "encoder")
    assert back.moves[0].worker == "encoder-1" and back.moves[0].new_name == "decode-1"
    assert role_counts(back.after) == role_counts(topo)


def test_history_round_trip_only_applies_done_moves(tmp_path: Path) -> None:
    topo = local()
    rp = plan_rebalance(topo, {"encoder": 1}, "decode")
    m = rp.moves[0]
    history.append(tmp_path, {"started": 10.0, "moves": [{"move": m.to_dict(), "outcome": "rolled_back"}]})
    history.append(tmp_path, {"started": 20.0, "moves": [{"move": m.to_dict(), "outcome": "done"}]})
    recs = history.read(tmp_path)
    assert len(recs) == 2
    assert history.applied_moves(recs) == [m]
    assert history.applied_moves(recs, since=30.0) == []
    assert Move.from_dict(m.to_dict()) == m


def test_diffs_show_the_moved_worker_and_the_prefill_encoder_list() -> None:
    rp = plan_rebalance(local(), {"encoder": 1}, "decode")
    topo_lines = "\n".join(topology_diff(rp))
    assert "-decode-1" in topo_lines and "+encoder-1" in topo_lines and "decode=1" in topo_lines
    cmd = "\n".join(commands_diff(rp))
    assert "+[local/encoder-1]" in cmd and "-[local/decode-1]" in cmd and "prefill-0" in cmd
    assert "[local/decode-0]" not in cmd  # unchanged workers do not appear


def test_example_topology_refusals_name_the_reason() -> None:
    topo = load_topology(ROOT / "topologies" / "qwen2vl-epd.yaml")
    with pytest.raises(RebalanceError, match="1 GPU\\(s\\) per node but a prefill worker needs 4"):
        plan_rebalance(topo, {"prefill": 1}, "encoder")
    # d0 holds both decodes and is not shared: an encoder there would mix roles on one node
    with pytest.raises(RebalanceError, match="would not validate"):
        plan_rebalance(topo, {"encoder": 1}, "decode")


# -- the command, on a recorded cluster (no processes needed for planning and history) ----------

def _record_cluster(tmp_path: Path, launcher: str = "local") -> tuple[dict[str, str], Path]:
    import os

    from epdctl.state.store import ClusterDir, ClusterState

    topo_path = tmp_path / "rb.yaml"
    topo_path.write_text(f"""
name: rb
engine: embedded
model: {{path: {MODEL}, served_name: tiny, architecture: Qwen2VLForConditionalGeneration}}
ports: {{base: 38500, limit: 38599}}
transfer: {{backend: zmq}}
nodes: [{{name: local, host: 127.0.0.1, shared: true}}]
roles:
  encoder: {{nodes: [local], count: 1}}
  prefill: {{nodes: [local], count: 1}}
  decode: {{nodes: [local], count: 2}}
router: {{node: local, host: 127.0.0.1}}
""")
    root = tmp_path / "state"
    cdir = ClusterDir("rb", root)
    cdir.save(ClusterState(name="rb", topology=str(topo_path), launcher=launcher,
                           phase="running", created=1.0))
    return dict(os.environ, EPDCTL_STATE_DIR=str(root)), cdir.root


def _epdctl(env: dict[str, str], *args: str) -> "subprocess.CompletedProcess[str]":
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, text=True,
                          capture_output=True, timeout=120)


def test_dry_run_shows_both_diffs_and_changes_nothing(tmp_path: Path) -> None:
    env, root = _record_cluster(tmp_path)
    r = _epdctl(env, "rebalance", "rb", "--prefill", "+1", "--decode", "-1", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "decode-1 (decode) -> prefill-1 (prefill)" in r.stdout
    assert "+prefill-1" in r.stdout and "+[local/prefill-1]" in r.stdout and "dry run" in r.stdout
    assert not (root / "history.jsonl").exists()


def test_bad_input_is_one_clear_line_without_traceback(tmp_path: Path) -> None:
    env, _ = _record_cluster(tmp_path)
    for args, msg in ((("--encoder", "two"), "--encoder 'two' is not a count"),
                      (("--encoder", "+2", "--from", "decode"), "a role must keep at least one"),
                      (("--encoder", "+1"), "name a source with --from")):
        r = _epdctl(env, "rebalance", "rb", *args, "--yes")
        assert r.returncode == 1 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_one_job_slurm_cluster_of_an_older_epdctl_is_refused_before_anything_moves(
        tmp_path: Path) -> None:
    import json

    env, root = _record_cluster(tmp_path, launcher="slurm")
    doc = json.loads((root / "state.json").read_text())
    doc["processes"] = [{"name": "decode-0", "role": "decode", "node": "local",
                         "handle": {"job": "12", "step": None}}]
    (root / "state.json").write_text(json.dumps(doc))
    r = _epdctl(env, "rebalance", "rb", "--encoder", "+1", "--from", "decode", "--yes")
    assert r.returncode == 1 and "one SLURM batch job" in r.stderr and "Traceback" not in r.stderr

def test_history_lists_records_and_the_layout_replays_them(tmp_path: Path) -> None:
    env, root = _record_cluster(tmp_path)
    assert "no rebalance recorded" in _epdctl(env, "history", "rb").stdout
    rp = plan_rebalance(local(), {"encoder": 1}, "decode")
    history.append(root, {"id": "abc", "who": "me@host", "started": 5.0, "finished": 40.0,
                          "request": {"deltas": {"encoder": 1}, "from": "decode"},
                          "outcome": "done",
                          "moves": [{"move": rp.moves[0].to_dict(), "outcome": "done",
                                     "steps": {"drain": 1.0, "ready": 20.0}, "error": ""}]})
    text = _epdctl(env, "history", "rb").stdout
    assert "abc  me@host  --encoder +1 --from decode  -> done (35.0s)" in text
    assert "decode-1 (decode) -> encoder-1 (encoder): done  drain=1.00s ready=20.00s" in text
    # the next plan starts from the replayed layout: encoder-1 exists, decode-1 does not
    r = _epdctl(env, "rebalance", "rb", "--decode", "+1", "--from", "encoder", "--dry-run")
    assert "encoder-1 (encoder) -> decode-1 (decode)" in r.stdout, r.stdout + r.stderr


def test_ports_a_move_adds_must_be_free_before_anything_moves() -> None:
    import socket

    from epdctl.errors import LaunchError
    from epdctl.rebalance.targets import extra_ports_free

    rp = plan_rebalance(local(2, 1, 1), {"prefill": 1}, "encoder")
    extra_ports_free(rp)  # nothing listens there
    with socket.socket() as s:
        s.bind(("127.0.0.1", rp.moves[0].bootstrap_port))
        s.listen()
        with pytest.raises(LaunchError, match=f"prefill-1 port {rp.moves[0].bootstrap_port}"):
            extra_ports_free(rp)
