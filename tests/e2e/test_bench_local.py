"""`epdctl bench`, `profile` and `plan` against a real local EPD cluster (runtime workers + smg).

The cluster is this module's own (`epdctl up` on a copy of topologies/local.yaml with ports
moved to 39100-39199 and a tmp EPDCTL_STATE_DIR), so it never collides with the session
cluster of test_local_cluster.py; it is stopped with `epdctl down` at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = 39100


def _topology(tmp: Path) -> Path:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies" / "local.yaml").read_text())
    doc["name"] = "bench-e2e"
    doc["model"]["path"] = str((ROOT / "models" / "tiny-qwen2vl").resolve())
    doc["ports"] = {"base": BASE, "limit": BASE + 99}
    out = tmp / "bench-e2e.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


class Env:
    def __init__(self, tmp: Path, topology: Path):
        self.tmp = tmp
        self.topology = topology
        self.env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))

    def epdctl(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT,
                              text=True, capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("bench")
    e = Env(tmp, _topology(tmp))
    up = e.epdctl("up", str(e.topology), "--timeout", "600", "--no-canary")
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{up.stdout}\n{up.stderr}"
        yield e
    finally:
        down = e.epdctl("down", "bench-e2e")
        assert down.returncode == 0, down.stdout + down.stderr


def test_bench_writes_json_and_png(cluster: Env) -> None:
    js, png = cluster.tmp / "bench.json", cluster.tmp / "bench.png"
    proc = cluster.epdctl("bench", "bench-e2e", "--images", "1-3", "--repeat", "0.3",
                          "--concurrency", "2", "--requests", "6", "--max-tokens", "12",
                          "--json", str(js), "--plot", str(png))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "TTFT ms  p50" in proc.stdout and "throughput" in proc.stdout
    run = json.loads(js.read_text())["runs"][0]
    assert run["requests"] == 6 and run["ok"] == 6 and run["errors"] == 0
    assert run["concurrency"] == 2 and run["target"].startswith("http://127.0.0.1:391")
    for key in ("ttft_ms", "tpot_ms", "latency_ms"):
        assert run[key]["n"] > 0 and 0 < run[key]["p50"] <= run[key]["p99"], key
    assert run["throughput"]["requests_per_s"] > 0 and run["throughput"]["output_tokens_per_s"] > 0
    # per-stage times from the decode's `timings`, bytes moved from the workers' metrics
    for stage in ("encode_ms", "prefill_ms", "kv_transfer_ms", "decode_ms"):
        assert run["stages_ms"][stage]["n"] == 6, stage
    m = run["metrics"]
    images = sum(s["n_images"] for s in run["samples"])
    enc = [v for k, v in m.items() if k.startswith("encoder-")]
    looked_up = sum(d.get("epd_encoder_cache_hits_total", 0) + d.get("epd_encoder_cache_misses_total", 0)
                    for d in enc)
    pre = m["prefill-0"]
    hit = pre.get('epd_prefill_embedding_cache_total{result="hit"}', 0)
    miss = pre.get('epd_prefill_embedding_cache_total{result="miss"}', 0)
    assert hit + miss == images  # every image looked up once, by the prefill
    assert 0 < looked_up <= images  # the encoders saw the images (deduplicated per batch)
    assert m["decode-0"]["epd_decode_generated_tokens_total"] == sum(
        s["completion_tokens"] for s in run["samples"])
    assert m["prefill-0"]["epd_prefill_transport_bytes_sent_total"] > 0
    assert any(k.startswith("smg_router_request_duration_seconds_count") for k in m["router"])
    assert len(run["samples"]) == 6 and all(s["ok"] for s in run["samples"])
    # each request's path, stamped by the prefill, the encoders and the decode (one host's clock)
    # (the first token travels ahead of the KV: t_first_in, then the KV lands beside the stream)
    path = ("t_prefill_in", "t_enc_out", "t_enc_in", "t_enc_send", "t_emb_in", "t_prefill_start",
            "t_prefill_end", "t_route", "t_first_in")
    for s in run["samples"]:
        t = s["timings"]
        assert all(k in t for k in path) and "t_kv_in" in t, sorted(t)
        assert all(t[a] <= t[b] + 0.002 for a, b in zip(path, path[1:])), {k: t[k] for k in path}
        assert abs(t["t_decode_in"] - t["t_prefill_in"]) < 1.0  # the router sent both legs at once
        first = t["t_decode_in"] + t["ttft_ms"] / 1000.0
        assert t["t_first_in"] <= first + 0.002 and t["t_route"] <= t["t_kv_in"] + 0.002
        assert first - t["t_prefill_in"] <= s["ttft"] + 0.05
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_bench_sweep_plots_throughput_vs_rate(cluster: Env) -> None:
    js, png = cluster.tmp / "sweep.json", cluster.tmp / "sweep.png"
    proc = cluster.epdctl("bench", "bench-e2e", "--images", "1", "--sweep", "1,2",
                          "--requests", "3", "--max-tokens", "8", "--json", str(js),
                          "--plot", str(png), "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = json.loads(js.read_text())["runs"]
    assert [r["offered_rate"] for r in runs] == [1.0, 2.0]
    assert all(r["ok"] == 3 for r in runs)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bench_ignore_eos_runs_every_answer_to_max_tokens(cluster: Env) -> None:
    js = cluster.tmp / "long.json"
    proc = cluster.epdctl("bench", "bench-e2e", "--images", "1", "--concurrency", "2",
                          "--requests", "4", "--max-tokens", "40", "--ignore-eos",
                          "--json", str(js), "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(ignore_eos)" in proc.stdout
    run = json.loads(js.read_text())["runs"][0]
    # the tiny model ends a 1-image answer after ~8 tokens; with ignore_eos it runs to 40
    assert [s["completion_tokens"] for s in run["samples"]] == [40] * 4


def test_bench_url_without_model_lookup_and_bad_input(cluster: Env) -> None:
    state = json.loads((cluster.tmp / "state" / "clusters" / "bench-e2e" / "state.json").read_text())
    router = next(p["url"] for p in state["processes"] if p["role"] == "router")
    proc = cluster.epdctl("bench", router, "--images", "1", "--concurrency", "1",
                          "--requests", "1", "--max-tokens", "4", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "model tiny-qwen2vl" in proc.stdout  # found through /v1/models
    proc = cluster.epdctl("bench", "bench-e2e", "--images", "1")
    assert proc.returncode == 1 and "--rate R" in proc.stderr and "Traceback" not in proc.stderr


def test_profile_then_plan(cluster: Env) -> None:
    prof = cluster.tmp / "profile.json"
    proc = cluster.epdctl("profile", "bench-e2e", "--batches", "1,2", "--requests", "2",
                          "--output-tokens", "8", "--out", str(prof))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(prof.read_text())
    assert doc["encoder"]["images_per_s"] > 0 and doc["prefill"]["tokens_per_s"] > 0
    assert doc["prefill"]["tokens_per_image"] > 0
    assert set(doc["decode"]["tokens_per_s"]) == {"1", "2"}
    # what each role costs the shared host, from the workers' process_cpu_seconds_total
    assert doc["cpu"]["encoder_s_per_image"] > 0 and doc["cpu"]["prefill_s_per_request"] > 0
    assert set(doc["cpu"]["decode_s_per_token"]) == {"1", "2"}
    out = cluster.tmp / "planned.yaml"
    proc = cluster.epdctl("plan", str(cluster.topology), "--workload",
                          str(ROOT / "benchmarks" / "workloads" / "daily.yaml"),
                          "--profile", str(prof), "--write", str(out), "--json")
    assert proc.returncode in (0, 2), proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["peak"]["bottleneck"] in ("encoder", "prefill", "decode")
    assert len(plan["hours"]) == 8
    # every worker on one shared loopback node: the planner charges this machine's cores
    assert plan["host_cores"] == float(os.cpu_count() or 1)
    assert "host" in plan["peak"]["utilisation"]
    if plan["peak"]["feasible"]:
        assert yaml.safe_load(out.read_text())["roles"]["encoder"]["count"] == \
            plan["peak"]["counts"]["encoder"]
