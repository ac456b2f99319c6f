"""The executor's in-place path for SGLang, against SGLang-shaped servers on loopback: a decode
becomes a prefill through drain (loads, pause) -> /pd_role_switch -> /continue_generation, its
record is renamed in place (same port), and a refusal falls back to the restart path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from epdctl.errors import LaunchError
from epdctl.rebalance import history
from epdctl.rebalance.execute import Executor, Options
from epdctl.rebalance.plan import plan_rebalance
from epdctl.state.store import ClusterDir, ClusterState, ProcessRecord
from epdctl.topology import topology_from_text
from sglang_switch_fake import FakeSGLang

TOPO = """
name: sx
engine: sglang
model: {path: /models/qwen, served_name: q, architecture: Qwen2VLForConditionalGeneration}
transfer: {backend: mooncake}
rebalance: {in_place: true}
ports: {base: 38650, limit: 38699}
nodes:
  - {name: p0, host: 127.0.0.1, gpus: 1}
  - {name: d0, host: 127.0.0.2, gpus: 1}
  - {name: d1, host: 127.0.0.3, gpus: 1}
defaults: {host: node}
roles:
  prefill: {nodes: [p0], count: 1, tp: 1}
  decode: {nodes: [d0, d1], count: 2, tp: 1}
"""


class NoRestart:
    """A launcher the in-place path must not need; a restart attempt shows up as an error."""

    name, runs_here = "stub", False

    def place(self, text: str) -> str:
        return text

    def stop(self, recs: Any, grace: float = 10.0) -> Any:
        raise LaunchError(f"restart path taken: stop {[r.name for r in recs]}")


@pytest.fixture
def cluster(tmp_path: Path):
    rp = plan_rebalance(topology_from_text(TOPO), {"prefill": 1}, source="decode")
    fakes = {w.name: FakeSGLang(w.role, host=w.host, port=w.port) for w in rp.plan_before.workers}
    state = ClusterState(name="sx", topology=str(tmp_path / "t.yaml"), launcher="stub", engine="sglang",
                         processes=[ProcessRecord.of(w, "sglang") for w in rp.plan_before.workers])
    yield rp, fakes, state, ClusterDir("sx", root=tmp_path)
    for f in fakes.values():
        f.close()


def test_decode_becomes_prefill_in_place(cluster) -> None:
    rp, fakes, state, cdir = cluster
    (m,) = rp.moves
    assert (m.worker, m.new_name, m.path) == ("decode-1", "prefill-1", "in-place")
    rec = Executor(rp, cdir, state, NoRestart(), Options(verify=False)).run({})
    assert rec["outcome"] == "done", rec
    move = rec["moves"][0]
    assert move["taken"] == "in-place" and set(move["steps"]) == {"drain", "switch", "register"}
    node = fakes["decode-1"]
    posts = [(p, b) for meth, p, b in node.calls if meth == "POST"]
    assert posts == [("/pause_generation", {"mode": "abort"}), ("/pd_role_switch", {"new_role": "prefill"}),
                     ("/continue_generation", {})]
    assert node.role == "prefill" and not node.paused
    saved = cdir.load()
    assert saved is not None and saved.find("decode-1") is None
    new = saved.find("prefill-1")
    assert new is not None and new.role == "prefill" and new.url == node.url
    assert "--enable-pd-role-switch" in new.argv and new.argv[new.argv.index("--disaggregation-mode") + 1] == "prefill"


def test_a_refused_switch_falls_back_to_restart(cluster) -> None:
    rp, fakes, state, cdir = cluster
    fakes["decode-1"].enabled = False
    with pytest.raises(LaunchError, match="restart path taken"):
        Executor(rp, cdir, state, NoRestart(), Options(verify=False)).run({})
    (rec,) = history.read(cdir.root)
    move = rec["moves"][0]
    assert rec["outcome"] == "failed" and move["taken"] == "restart"
    assert "in-place switch failed, restarting instead" in move["note"]
    assert "--enable-pd-role-switch is not set" in move["note"]
