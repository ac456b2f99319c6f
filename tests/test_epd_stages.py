"""benchmarks/epd_stages.py: the workers' wall-clock stamps turned into consecutive stages."""

from __future__ import annotations
from types import SimpleNamespace

from epd_stages import breakdown, format_breakdown, stages_of

EPD = {"t_prefill_in": 100.000, "t_decode_in": 100.0005, "t_enc_out": 100.001, "t_enc_in": 100.003,
       "t_enc_send": 100.010, "t_emb_in": 100.011, "t_prefill_start": 100.0112, "t_prefill_end": 100.020,
       "t_route": 100.0203, "t_kv_in": 100.022, "ttft_ms": 23.5}


def test_epd_stages_add_up_to_the_worker_ttft_and_the_rest_is_the_router():
    st = stages_of(EPD, client_ttft_s=0.0255)
    assert st is not None
    assert round(st["encoder hop"], 3) == 2.0 and round(st["KV hand-off"], 3) == 1.7
    parts = [v for k, v in st.items() if k not in ("worker ttft", "router + client")]
    assert abs(sum(parts) - st["worker ttft"]) < 1e-6  # consecutive: nothing is counted twice
    assert round(st["worker ttft"], 3) == 24.0 and round(st["router + client"], 3) == 1.5


def test_colocated_stamps_use_the_colocated_path_and_incomplete_ones_are_skipped():
    colo = {"t_decode_in": 5.0, "t_enc_out": 5.001, "t_emb_in": 5.008, "t_prefill_end": 5.016, "ttft_ms": 17.0}
    st = stages_of(colo, None)
    assert st is not None and set(st) == {"fetch", "encode", "prefill", "first token", "worker ttft"}
    assert stages_of({"ttft_ms": 3.0}, None) is None  # an older worker: no stamps
    assert stages_of({k: v for k, v in EPD.items() if k != "t_route"}, None) is None


def test_breakdown_takes_medians_over_complete_ok_samples():
    ok = [SimpleNamespace(ok=True, ttft=0.0255, timings=EPD) for _ in range(3)]
    bad = [SimpleNamespace(ok=False, ttft=None, timings=EPD), SimpleNamespace(ok=True, ttft=0.01, timings={})]
    b = breakdown(ok + bad)
    assert b["n"] == 3 and b["encoder hop"] == 2.0
    lines = format_breakdown(b, {})
    assert lines[0].split() == ["stage", "(p50", "ms)", "EPD", "colocated"]
    assert any(line.startswith("encoder hop") and line.rstrip().endswith("-") for line in lines)


def test_by_images_splits_the_breakdown_by_request_size():
    from epd_stages import by_images

    four = [SimpleNamespace(ok=True, ttft=0.0255, timings=EPD, n_images=4) for _ in range(2)]
    eight = [SimpleNamespace(ok=True, ttft=0.03, timings=EPD, n_images=8)]
    out = by_images(four + eight)
    assert list(out) == ["4", "8"] and out["4"]["n"] == 2 and out["8"]["n"] == 1
    assert round(out["8"]["router + client"], 3) == 6.0


def test_a_first_token_ahead_of_the_kv_takes_the_token_path_and_the_kv_is_reported_beside_it():
    early = {**EPD, "t_first_in": 100.0208, "t_kv_in": 100.0231, "ttft_ms": 21.0}
    st = stages_of(early, client_ttft_s=0.023)
    assert st is not None and "KV hand-off" not in st
    assert round(st["token hand-off"], 3) == 0.5 and round(st["KV after token"], 3) == 2.8
    parts = [v for k, v in st.items() if k not in ("worker ttft", "router + client", "KV after token")]
    assert abs(sum(parts) - st["worker ttft"]) < 1e-6  # the KV's hand-off is not on the token's path
    b = breakdown([SimpleNamespace(ok=True, ttft=0.023, timings=early),
                   SimpleNamespace(ok=True, ttft=0.0255, timings=EPD)])  # one KV won the race: both kinds
    assert {"token hand-off", "KV hand-off", "KV after token"} <= set(b)
    assert any(line.startswith("token hand-off") for line in format_breakdown(b, {}))
