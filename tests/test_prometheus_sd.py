"""prometheus_sd: file_sd groups from a recorded state, and registered files follow the state each
command that changes the cluster leaves; saving the state alone writes nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epdctl.errors import EpdctlError
from epdctl.orchestrate.prometheus_sd import kept_current, register, targets, write
from epdctl.state.store import ClusterDir, ClusterState, ProcessRecord


def _proc(name: str, role: str, node: str, url: str, **kw: object) -> ProcessRecord:
    host, _, port = url.split("//")[1].rpartition(":")
    base = dict(name=name, role=role, node=node, host=host, port=int(port), url=url, log="", since=0.0,
                argv=[])
    return ProcessRecord(**{**base, **kw})  # type: ignore[arg-type]


def _state() -> ClusterState:
    return ClusterState(name="c1", topology="t.yaml", launcher="ssh", processes=[
        _proc("encoder-0", "encoder", "e0", "http://10.0.0.1:30001"),
        _proc("prefill-0", "prefill", "p0", "http://10.0.0.2:30002"),
        _proc("prefill-0.r1", "prefill", "p1", "http://10.0.0.3:30002", is_leader=False),
        _proc("decode-0", "decode", "d0", "http://[fd00::4]:30003"),
        _proc("router", "router", "p0", "http://10.0.0.2:30100",
              argv=["smg", "--host", "0.0.0.0", "--port", "30100", "--prometheus-host", "0.0.0.0",
                    "--prometheus-port", "30101"], prometheus_host="0.0.0.0", prometheus_port=30101),
    ])


def test_one_group_per_leader_and_router_with_labels() -> None:
    groups = targets(_state())
    assert [g["targets"] for g in groups] == [["10.0.0.1:30001"], ["10.0.0.2:30002"], ["[fd00::4]:30003"],
                                              ["127.0.0.1:30101"]]
    assert groups[0]["labels"] == {"cluster": "c1", "role": "encoder", "worker": "encoder-0", "node": "e0"}
    assert groups[-1]["labels"]["role"] == "router"
    assert targets(None) == []


def test_registered_file_follows_save_and_clear(tmp_path: Path) -> None:
    cdir = ClusterDir("c1", tmp_path / "state")
    sd = tmp_path / "sd" / "targets.json"
    state = _state()
    assert register(cdir, sd, state) == 4
    with kept_current(cdir):  # e.g. rebalance stopped workers
        state.processes = state.processes[:2]
        cdir.save(state)
        assert len(json.loads(sd.read_text())) == 4  # the state store has no side effects
    assert len(json.loads(sd.read_text())) == 2
    with pytest.raises(RuntimeError), kept_current(cdir):  # down, failing after it forgot the state
        cdir.clear()
        raise RuntimeError("boom")
    assert json.loads(sd.read_text()) == []
    register(cdir, sd, state)  # registering twice keeps one entry
    assert json.loads((cdir.root / "prometheus_sd.json").read_text()) == [str(sd.resolve())]


def test_unwritable_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(EpdctlError, match="cannot write Prometheus targets"):
        write(tmp_path / "f" / "x.json", _state())
