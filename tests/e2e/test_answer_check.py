"""The answer check and the lock on the real local embedded cluster (topologies/local.yaml, its
own copy on ports 31900-31999, one cluster for the module).

`up` with ``check: {answers: FILE, min_correct: 0.9}`` whose file has one wrong expected answer
reports the miss and exits 1 with the cluster left up (and says how to stop it); `epdctl check
--answers` then passes with right answers; the run folder holds epdctl.lock (copied out by
--lock); `up --locked` refuses a lock with another engine version and another flag, printing
the difference, and lets a matching lock through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from epdctl import shapes
from epdctl.canary import build_messages

from own_cluster import local_copy

ROOT = Path(__file__).resolve().parents[2]
NAME, BASE = "answers-e2e", 31900
RIGHT = [("circle", "red"), ("square", "blue"), ("triangle", "green"), ("circle", "yellow")]


def _question(shape: str, colour: str, expect: str | None = None) -> str:
    msgs = build_messages([shapes.plain_png(shape, colour)], shapes.QUESTION)
    return json.dumps({"id": f"{colour}-{shape}", "messages": msgs, "max_tokens": 16,
                       "expect": expect or f"{colour} {shape}"})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("answers")
    (tmp / "answers.jsonl").write_text("\n".join(
        [_question(*q) for q in RIGHT] + [_question("square", "yellow", expect="purple hexagon")]) + "\n")
    (tmp / "right.jsonl").write_text("\n".join(_question(*q) for q in RIGHT) + "\n")
    doc = local_copy(NAME, BASE)
    doc["check"] = {"answers": "answers.jsonl", "min_correct": 0.9}
    topo = tmp / f"{NAME}.yaml"
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))

    def epdctl(*args: str, state: Path | None = None) -> subprocess.CompletedProcess:
        run_env = dict(env, EPDCTL_STATE_DIR=str(state)) if state else env
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=run_env, cwd=ROOT,
                              text=True, capture_output=True, timeout=600)

    up = epdctl("up", str(topo), "--lock", str(tmp / "copy.lock"))
    try:
        yield {"up": up, "epdctl": epdctl, "tmp": tmp, "topo": topo,
               "run_dir": tmp / "state" / "clusters" / NAME}
    finally:
        down = epdctl("down", NAME)
        assert down.returncode == 0, down.stdout + down.stderr


def test_up_reports_the_miss_exits_1_and_leaves_the_cluster_up(cluster: dict[str, Any]) -> None:
    up = cluster["up"]
    out = up.stdout + up.stderr
    assert up.returncode == 1, out
    assert "start-up timeouts: encoder 3" in out  # 300 s + the tiny weights' share
    assert "canary:" in out  # the canary ran first
    assert "answer check" in out and "4/5 correct (80%; at least 90% needed): FAILED" in out, out
    assert "miss [yellow-square]: wrong answer; expected 'purple hexagon', got 'Picture 1: yellow square" in out
    assert f"stop it with `epdctl down {NAME}`" in out and "is ready" not in out
    status = cluster["epdctl"]("status", NAME, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["phase"] == "running"


def test_check_answers_any_time(cluster: dict[str, Any]) -> None:
    ok = cluster["epdctl"]("check", "--answers", str(cluster["tmp"] / "right.jsonl"), NAME)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "4/4 correct (100%" in ok.stdout and "passed" in ok.stdout
    bad = cluster["epdctl"]("check", "--answers", str(cluster["tmp"] / "answers.jsonl"), NAME)
    assert bad.returncode == 1 and "miss [yellow-square]" in bad.stdout
    loose = cluster["epdctl"]("check", "--answers", str(cluster["tmp"] / "answers.jsonl"), NAME,
                              "--min-correct", "0.8")
    assert loose.returncode == 0, loose.stdout + loose.stderr


def test_the_run_folder_holds_the_lock(cluster: dict[str, Any]) -> None:
    lock = cluster["run_dir"] / "epdctl.lock"
    doc = yaml.safe_load(lock.read_text())
    assert lock.read_bytes() == (cluster["tmp"] / "copy.lock").read_bytes()
    assert doc["engine"]["name"] == "embedded" and doc["nodes"]["local"]["versions"]["python"]
    assert doc["engine"]["versions"]["local"], doc["engine"]
    assert doc["model"]["listing_sha256"] and doc["model"]["bytes"] > 1e6
    assert set(doc["processes"]) == {"encoder-0", "encoder-1", "prefill-0", "decode-0", "router"}
    assert doc["processes"]["decode-0"]["argv"][2:4] == ["epdctl.runtime", "decode"]


def test_up_locked_refuses_what_differs_and_passes_what_matches(cluster: dict[str, Any]) -> None:
    run_lock = cluster["run_dir"] / "epdctl.lock"
    doc = yaml.safe_load(run_lock.read_text())
    key, was = next(iter(doc["engine"]["versions"]["local"].items()))
    doc["engine"]["versions"]["local"][key] = "9.9.9 (other)"
    argv = doc["processes"]["prefill-0"]["argv"]
    argv.append("--another-flag")
    other = cluster["tmp"] / "other.lock"
    other.write_text(yaml.safe_dump(doc, sort_keys=False))
    fresh = cluster["tmp"] / "fresh-state"  # the running cluster is not recorded here
    res = cluster["epdctl"]("up", str(cluster["topo"]), "--locked", str(other), state=fresh)
    out = res.stdout + res.stderr
    assert res.returncode == 1 and "nothing was started" in out, out
    assert f"~ engine.versions.local.{key}: 9.9.9 (other) -> {was}" in out
    assert f"- processes.prefill-0.argv[{len(argv) - 1}]: --another-flag" in out
    assert "2 field(s)" in out  # the version and the flag, nothing else
    same = cluster["epdctl"]("up", str(cluster["topo"]), "--locked", str(run_lock), state=fresh)
    out = same.stdout + same.stderr
    assert "lock: matches" in out and "ports already in use" in out, out  # past the lock check
