"""The warm spare (epdctl/node/supervise.py + epdctl/runtime/standby.py) with the real embedded
runtime: an encoder of topologies/local.yaml (ports 31750+) under its supervisor, the policy the
plan renders. Once the worker is healthy a spare starts, imports everything and waits without
listening; kill -9 of the worker hands over to that spare (same pid serves next), and a new
spare follows. Plans: spares only for engines whose workers can wait (embedded), never for the
router, and ``restart: {standby: false}`` turns them off."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import yaml

from test_supervise import Sup

from epdctl.render import build_plan
from epdctl.topology import load_topology, topology_from_text

ROOT = Path(__file__).resolve().parents[2]
BASE = 31750


def _local(tmp: Path, **extra: object) -> Path:
    doc = yaml.safe_load((ROOT / "topologies" / "local.yaml").read_text())
    doc["model"]["path"] = str((ROOT / "models" / "tiny-qwen2vl").resolve())
    doc["ports"] = {"base": BASE, "limit": BASE + 49}
    doc.update(extra)
    path = tmp / "local.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_plans_ask_for_a_spare_only_where_the_engine_can_wait(tmp_path: Path) -> None:
    plan = build_plan(load_topology(_local(tmp_path)))
    assert {r: p["standby"] for r, p in plan.restart.items()} == {
        "encoder": True, "prefill": True, "decode": True, "colocated": True, "router": False}
    off = build_plan(load_topology(_local(tmp_path, restart={"standby": False})))
    assert not any(p["standby"] for p in off.restart.values())
    sglang = build_plan(topology_from_text("""
name: g
engine: sglang
model: {path: /models/qwen, served_name: q, architecture: Qwen2VLForConditionalGeneration}
transfer: {backend: mooncake}
nodes: [{name: p0, host: 10.0.0.2, gpus: 8}, {name: d0, host: 10.0.0.3, gpus: 8}]
defaults: {host: node}
roles:
  prefill: {nodes: [p0], count: 1, tp: 8}
  decode: {nodes: [d0], count: 1, tp: 8}
"""))
    assert not any(p["standby"] for p in sglang.restart.values())  # SGLang would bind its ports


def _listens(pid: int, port: int) -> bool:
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                   for c in psutil.Process(pid).net_connections())
    except psutil.NoSuchProcess:
        return False


def test_kill_9_hands_over_to_the_warm_spare(tmp_path: Path) -> None:
    plan = build_plan(load_topology(_local(tmp_path)))
    enc = next(w for w in plan.workers if w.name == "encoder-0")
    policy = plan.restart["encoder"]
    assert policy["standby"] is True
    sup = Sup(tmp_path, [sys.executable if a == "python3" else a for a in enc.argv], policy,
              enc.url + enc.health_path)
    try:
        first = sup.until(lambda d: d.get("state") == "running", 300)
        spare = sup.until(lambda d: d.get("standby_ready"), 180)["standby_pid"]   # imports done
        assert spare != first["child_pid"] and psutil.Process(spare).ppid() == sup.proc.pid
        assert not _listens(spare, enc.port)              # it waits without taking the port
        os.kill(first["child_pid"], signal.SIGKILL)
        after = sup.until(lambda d: d.get("restarts") == 1 and d.get("state") == "running", 300)
        assert after["child_pid"] == spare and _listens(spare, enc.port)
        assert after["last_exit"] == "killed by signal 9 (SIGKILL)"
        assert f"continues in its standby process {spare}" in sup.log.read_text()
        nxt = sup.until(lambda d: d.get("standby_pid") not in (None, spare), 120)["standby_pid"]
        os.killpg(sup.proc.pid, signal.SIGTERM)          # `down`: the group, spare included
        sup.proc.wait(60)
        assert not psutil.pid_exists(spare) and not psutil.pid_exists(nxt)
    finally:
        sup.close()
