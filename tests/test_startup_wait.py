"""`up`'s wait on workers that take long to start: real processes (tests/e2e/dummy_worker.py
printing an engine's loading lines, tqdm carriage returns included) under the local launcher's
real supervisor. A 90 s load is shown as it goes and waited for; a worker that dies during its
load fails the start within seconds, with its log tail, and its 30-minute budget never fires.
Ports 32600-32609, which no other test uses: scripts/test.sh runs it beside the main run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from epdctl.errors import LaunchError
from epdctl.launchers.local import LocalLauncher
from epdctl.orchestrate.lifecycle import BringUp, Event
from epdctl.render.plan import ROUTER_TYPES, ProcessSpec
from epdctl.state.store import ClusterDir, ClusterState
from epdctl.topology.model import Role

DUMMY = str(Path(__file__).parent / "e2e" / "dummy_worker.py")
BASE = 32600


@dataclass
class Plan:
    workers: list[ProcessSpec]
    router: ProcessSpec | None = None


def _spec(name: str, role: str, port: int, *extra: str) -> ProcessSpec:
    return ProcessSpec(name=name, role=Role(role), node="local", host="127.0.0.1",
                       url=f"http://127.0.0.1:{port}", ports={"http": port},
                       argv=("python", DUMMY, str(port), role, *extra), env={}, worker=name,
                       router_type=ROUTER_TYPES.get(Role(role)))


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ClusterDir, ClusterState]:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    cdir = ClusterDir("slow")
    st = ClusterState(name="slow", topology="hand-built", launcher="local", model="dummy")
    cdir.save(st)
    return cdir, st


def test_a_90s_load_is_shown_and_waited_for(cluster: tuple[ClusterDir, ClusterState]) -> None:
    cdir, st = cluster
    events: list[Event] = []
    plan = Plan([_spec("encoder-0", "encoder", BASE + 1),
                 _spec("decode-0", "decode", BASE + 2, "--load-seconds", "90")])
    bring = BringUp(LocalLauncher(), cdir, st, timeout=5, on_event=events.append,
                    timeouts={"encoder-0": 60, "decode-0": 150})
    t0 = time.monotonic()
    try:
        bring.run(plan)
        took = time.monotonic() - t0
    finally:
        LocalLauncher().stop(st.processes, grace=5)
    assert took >= 90  # waited past the 5 s default: the budget of its own counts
    lines = [e for e in events if e.kind == "worker" and e.stage == "decode-0"]
    shards = [e.detail for e in lines if "checkpoint shards" in e.detail]
    assert shards and shards[0].startswith("[local/decode-0] Loading safetensors checkpoint shards: ")
    counts = [int(d.rsplit(": ", 1)[1].split("/")[0]) for d in shards]
    assert counts == sorted(counts) and counts[-1] > counts[0] and len(set(counts)) >= 5
    assert any("Capture cuda graph begin" in e.detail for e in lines)
    waited = [e.elapsed for e in lines]
    assert waited == sorted(waited) and waited[-1] >= 80
    assert max(b - a for a, b in zip(waited, waited[1:])) <= 16  # shown at least every 15 s
    assert [e.stage for e in events if e.kind == "ready"][-1] == "decode"


def test_a_worker_that_dies_while_loading_fails_at_once(
        cluster: tuple[ClusterDir, ClusterState]) -> None:
    cdir, st = cluster
    events: list[Event] = []
    plan = Plan([_spec("prefill-0", "prefill", BASE + 3, "--load-seconds", "600"),
                 _spec("decode-0", "decode", BASE + 4, "--load-seconds", "600",
                       "--exit-during-load", "6")])
    bring = BringUp(LocalLauncher(), cdir, st, timeout=1800, on_event=events.append)
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as e:
        bring.run(plan)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert took < 6 + 5, f"took {took:.1f}s"
    assert "[local/decode-0] exited with status 1 during startup" in msg
    assert "CUDA out of memory" in msg and "Loading safetensors checkpoint shards" in msg
    assert "budget" not in msg and "not healthy after" not in msg  # not the timeout
    assert "stopped the 2 process(es)" in msg
    assert any(ev.kind == "worker" and ev.stage == "decode-0" for ev in events)
    assert not any(s.alive for s in LocalLauncher().poll(st.processes).ok.values())
