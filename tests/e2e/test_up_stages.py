"""`up` stages the weights itself, on the real local embedded cluster (a copy of
topologies/local-colocated.yaml with ``model.stage`` in a temporary folder, ports 31850-31899,
one cluster for the module).

`up` copies the tiny model from its origin to the stage folder, verified against the manifest in
the run folder; the worker is started with the staged path, not the origin; the cluster answers;
the run's epdctl.lock records the manifest's digest and the origin. `up --no-stage` with a stage
folder that holds no copy refuses before starting anything, saying how to stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from epdctl.stage.manifest import Manifest

ROOT = Path(__file__).resolve().parents[2]
ORIGIN = (ROOT / "models" / "tiny-qwen2vl").resolve()
NAME, BASE = "upstage-e2e", 31850


def _topology(tmp: Path, name: str, stage: Path) -> Path:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies" / "local-colocated.yaml").read_text())
    doc["name"] = name
    doc["model"]["path"] = str(ORIGIN)
    doc["model"]["stage"] = str(stage)
    doc["ports"] = {"base": BASE, "limit": BASE + 49}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("upstage")
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))

    def epdctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, cwd=ROOT,
                              text=True, capture_output=True, timeout=600)

    stage = tmp / "nvme" / "tiny"
    up = epdctl("up", str(_topology(tmp, NAME, stage)))
    try:
        yield {"up": up, "epdctl": epdctl, "tmp": tmp, "stage": stage,
               "run_dir": tmp / "state" / "clusters" / NAME}
    finally:
        down = epdctl("down", NAME)
        assert down.returncode == 0, down.stdout + down.stderr


def test_up_copies_the_weights_to_the_stage_folder_verified(cluster: dict[str, Any]) -> None:
    up = cluster["up"]
    out = up.stdout + up.stderr
    assert up.returncode == 0, out
    assert "weights: manifest written" in out and "staged and verified" in out, out
    assert f"weights: engines read {cluster['stage']} on every node" in out
    man = Manifest.from_json((cluster["run_dir"] / "weights-manifest.json").read_text())
    origin_files = sorted(p.name for p in ORIGIN.iterdir() if p.is_file())
    assert sorted(rel for rel, _, _ in man.files) == origin_files
    for rel, size, _ in man.files:
        staged = cluster["stage"] / rel
        assert staged.read_bytes() == (ORIGIN / rel).read_bytes() and staged.stat().st_size == size
    assert (cluster["stage"] / ".epdctl-manifest.json").is_file()


def test_workers_run_the_staged_copy_and_answer(cluster: dict[str, Any]) -> None:
    out = cluster["up"].stdout
    assert cluster["up"].returncode == 0, out + cluster["up"].stderr
    state = json.loads((cluster["run_dir"] / "state.json").read_text())
    workers = [p for p in state["processes"] if p["role"] != "router"]
    assert workers
    for p in workers:
        argv = p["argv"]
        assert argv[argv.index("--model-path") + 1] == str(cluster["stage"]), argv
        assert str(ORIGIN) not in " ".join(argv)
    assert "canary:" in out and "is up in" in out, out
    url = next(line.split()[2] for line in out.splitlines() if "OpenAI endpoint:" in line)
    body = json.dumps({"model": "tiny-qwen2vl", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "Say hello."}]}).encode()
    req = urllib.request.Request(f"{url}/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        answer = json.loads(r.read())
    assert answer["usage"]["completion_tokens"] > 0, answer


def test_lock_records_the_manifest_digest_and_the_origin(cluster: dict[str, Any]) -> None:
    assert cluster["up"].returncode == 0, cluster["up"].stdout + cluster["up"].stderr
    man = Manifest.from_json((cluster["run_dir"] / "weights-manifest.json").read_text())
    lock = yaml.safe_load((cluster["run_dir"] / "epdctl.lock").read_text())
    assert lock["model"]["manifest_sha256"] == man.digest
    assert lock["model"]["source"] == str(ORIGIN)


def test_up_no_stage_without_a_staged_copy_refuses(cluster: dict[str, Any]) -> None:
    tmp = cluster["tmp"]
    fresh = tmp / "nvme" / "empty"
    topo = _topology(tmp, "upstage-nostage", fresh)
    proc = cluster["epdctl"]("up", str(topo), "--no-stage")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert f"model.stage {fresh} holds no staged copy of {ORIGIN}" in out, out
    assert f"run `epdctl stage {topo}` first, or drop --no-stage" in out, out
    assert not fresh.exists()  # nothing was copied
    assert not (tmp / "state" / "clusters" / "upstage-nostage" / "state.json").exists()  # nothing started
