"""A decode that returns 0 tokens (what a run missing nvidia_peermem looks like): `bench` and the
answer check fail, never count it as a fast success. Real processes: tests/e2e/dummy_worker.py
HTTP workers (the decode answers with an empty completion, streamed and not) behind the real smg
router, started by BringUp; `bench` and `check --answers` through the real CLI. Heavy lock;
ports 31910-31999."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from epdctl.answers.ask import ZERO_TOKENS, ask_all
from epdctl.answers.questions import load
from epdctl.launchers.local import LocalLauncher
from epdctl.orchestrate.lifecycle import BringUp
from epdctl.render.plan import ROUTER_TYPES, ProcessSpec
from epdctl.render.router import HEALTH_FLAGS, registers_workers
from epdctl.state.store import ClusterDir, ClusterState
from epdctl.topology.model import Role

ROOT = Path(__file__).resolve().parents[1]
DUMMY = str(ROOT / "tests" / "e2e" / "dummy_worker.py")
BASE = 31910


@dataclass
class Plan:
    workers: list[ProcessSpec]
    router: ProcessSpec | None


def _w(name: str, role: str, port: int, *extra: str) -> ProcessSpec:
    return ProcessSpec(name=name, role=Role(role), node="local", host="127.0.0.1",
                       url=f"http://127.0.0.1:{port}", ports={"http": port},
                       argv=(sys.executable, DUMMY, str(port), role, *extra), env={}, worker=name,
                       router_type=ROUTER_TYPES.get(Role(role)))


def _router(port: int) -> ProcessSpec:
    flags = [x for kv in HEALTH_FLAGS.items() for x in kv]
    argv = (sys.executable, "-m", "smg.launch_router", "--pd-disaggregation",
            "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(port + 80), *flags)
    return ProcessSpec(name="router", role=Role.ROUTER, node="local", host="127.0.0.1",
                       url=f"http://127.0.0.1:{port}", ports={"http": port, "prometheus": port + 80},
                       argv=argv, env={}, worker="router", registers_workers=registers_workers(argv),
                       prometheus_host="127.0.0.1")


@pytest.fixture(scope="module")
def empty_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("zero")
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))
    old = os.environ.get("EPDCTL_STATE_DIR")
    os.environ["EPDCTL_STATE_DIR"] = env["EPDCTL_STATE_DIR"]
    plan = Plan([_w("prefill-0", "prefill", BASE + 1), _w("decode-0", "decode", BASE + 2, "--zero-tokens")],
                _router(BASE))
    cdir = ClusterDir("zero")
    st = ClusterState(name="zero", topology="hand-built", launcher="local", model="dummy")
    cdir.save(st)
    try:
        BringUp(LocalLauncher(), cdir, st, timeout=90).run(plan)
        yield f"http://127.0.0.1:{BASE}", env
    finally:
        LocalLauncher().stop(st.processes, grace=10)
        if old is None:
            os.environ.pop("EPDCTL_STATE_DIR", None)
        else:
            os.environ["EPDCTL_STATE_DIR"] = old


def _epdctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=300)


def test_bench_fails_on_zero_tokens(empty_cluster: tuple[str, dict[str, str]]) -> None:
    url, env = empty_cluster
    res = _epdctl(env, "bench", url, "--requests", "4", "--concurrency", "2", "--images", "1",
                  "--max-tokens", "8", "-q")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "4 response(s) generated 0 tokens" in out and "nvidia_peermem" in out
    assert "ok 0" in out and "Traceback" not in out


def test_answer_check_fails_on_zero_tokens(empty_cluster: tuple[str, dict[str, str]],
                                           tmp_path: Path) -> None:
    url, env = empty_cluster
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"prompt": "What colour is the sky?", "expect_regex": ".*"}) + "\n"
                       + json.dumps({"id": "anything", "prompt": "Say anything.", "expect": " "})
                       + "\n")
    report = ask_all(url, load(answers), min_correct=0.5)
    assert not report.passed and len(report.zero_token) == 2  # an empty answer matches no rule
    assert all(o.tokens == 0 for o in report.outcomes)
    res = _epdctl(env, "check", "--answers", str(answers), "zero", "--min-correct", "0.5")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "0/2 correct" in out and f"miss [anything]: {ZERO_TOKENS}" in out
