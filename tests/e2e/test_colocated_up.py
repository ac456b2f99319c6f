"""`epdctl up` of topologies/local-colocated.yaml: the one colocated worker behind a real smg.

smg 1.13 started with ``--enable-igw`` drops its ``--worker-urls`` (its log reads "mode: Regular
{ worker_urls: [] }"): `up` of this topology waited forever for a router without workers. The
regular-mode router is now rendered without ``--enable-igw`` (the command a user runs by hand
works too) and `up` registers the worker itself when a topology's router args add it back. The module's own
copy of the topology (ports 39400-39499, a tmp EPDCTL_STATE_DIR) is stopped with `epdctl down`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from epdctl import shapes
from epdctl.canary import build_messages

ROOT = Path(__file__).resolve().parents[2]
NAME, BASE = "colocated-e2e", 39400


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("colocated")
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies" / "local-colocated.yaml").read_text())
    doc["name"] = NAME
    doc["model"]["path"] = str((ROOT / "models" / "tiny-qwen2vl").resolve())
    doc["ports"] = {"base": BASE, "limit": BASE + 99}
    topo = tmp / f"{NAME}.yaml"
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))

    def epdctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, cwd=ROOT, text=True,
                              capture_output=True, timeout=300)

    up = epdctl("up", str(topo), "--no-canary", "--timeout", "240")
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{up.stdout}\n{up.stderr}"
        yield {"up": up.stdout, "epdctl": epdctl}
    finally:
        down = epdctl("down", NAME)
        assert down.returncode == 0, down.stdout + down.stderr


def test_up_registers_the_worker_and_the_router_serves_images(cluster: dict[str, Any]) -> None:
    url = f"http://127.0.0.1:{BASE + 1}/v1/chat/completions"  # the router: colocated-0 is BASE
    pngs, question, expected = shapes.make_request(random.Random(5), 2, plain=True)
    body = {"model": "tiny-qwen2vl", "messages": build_messages(pngs, question), "max_tokens": 24,
            "temperature": 0.0}
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        out = json.loads(resp.read())
    assert out["choices"][0]["message"]["content"].startswith("Picture 1:")
    t = out["timings"]  # the colocated worker's stage stamps, one clock: in order
    path = [t["t_decode_in"], t["t_enc_out"], t["t_emb_in"], t["t_prefill_end"]]
    assert path == sorted(path) and 0 < t["ttft_ms"] < 120_000


def test_a_model_no_worker_serves_is_a_404_through_the_router(cluster: dict[str, Any]) -> None:
    """Without --enable-igw the worker itself answers: 404 model_not_found, relayed by smg."""
    body = {"model": "not-served", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    req = urllib.request.Request(f"http://127.0.0.1:{BASE + 1}/v1/chat/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=60)
    assert info.value.code == 404
    assert "not-served" in info.value.read().decode()
