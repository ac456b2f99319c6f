"""The E:P:D planner on synthetic profiles: who gets the workers, infeasibility, per-hour plans,
and `epdctl plan` end to end on a real topology file (subprocess, as a user runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from epdctl.bench import plan_io, planner
from epdctl.bench.planner import SLO, Demand, PlanError, Profile

ROOT = Path(__file__).resolve().parents[1]


def prof(enc: float = 100.0, pre: float = 10000.0, dec1: float = 50.0, dec4: float = 180.0,
         dec16: float = 500.0, per_image: float = 16.0, kv_ms: float = 2.0) -> Profile:
    return Profile.from_dict({"encoder": {"images_per_s": enc},
                              "prefill": {"tokens_per_s": pre, "tokens_per_image": per_image},
                              "decode": {"tokens_per_s": {"1": dec1, "4": dec4, "16": dec16}},
                              "kv_transfer_ms": kv_ms})


def test_slow_encoder_gets_the_workers() -> None:
    # 8 images/request at 4 req/s = 32 images/s; one encoder does 10/s -> about 4-5 encoders.
    rec = planner.recommend(prof(enc=10.0), Demand(4.0, 8, 0.0, 12, 16), SLO(ttft_ms=3000))
    s = rec.split
    assert rec.feasible
    assert s.encoder > s.prefill and s.encoder > s.decode
    assert s.encoder >= 4  # 32 images/s over 10 images/s per worker at <= 85 % utilisation
    assert s.bottleneck == "encoder"
    assert all(u <= 0.85 for u in s.utilisation.values())


def test_repeat_share_shrinks_the_encoder_pool() -> None:
    base = planner.recommend(prof(enc=10.0), Demand(4.0, 8, 0.0), SLO(ttft_ms=3000)).split
    cached = planner.recommend(prof(enc=10.0), Demand(4.0, 8, 0.75), SLO(ttft_ms=3000)).split
    assert cached.encoder < base.encoder


def test_decode_bound_workload_gets_decode_workers() -> None:
    # Long answers: 2 req/s x 512 tokens = 1024 tok/s; a decode worker peaks at 500 tok/s.
    rec = planner.recommend(prof(), Demand(2.0, 1, 0.0, 12, 512), SLO(tpot_ms=100))
    s = rec.split
    assert rec.feasible and s.bottleneck == "decode"
    assert s.decode >= 3 and s.decode > s.encoder and s.decode > s.prefill
    assert s.tpot_ms <= 100


def test_tight_tpot_forces_small_batches_hence_more_decodes() -> None:
    loose = planner.recommend(prof(), Demand(2.0, 1, 0.0, 12, 128), SLO(tpot_ms=100)).split
    tight = planner.recommend(prof(), Demand(2.0, 1, 0.0, 12, 128), SLO(tpot_ms=25)).split
    assert tight.decode > loose.decode and tight.tpot_ms <= 25


def test_infeasible_tpot_is_reported_with_the_reason() -> None:
    rec = planner.recommend(prof(dec1=50.0), Demand(1.0, 2), SLO(tpot_ms=10))
    assert not rec.feasible
    text = "\n".join(rec.explain())
    assert "TPOT SLO 10 ms is below one decode worker's TPOT at batch 1 (20.0 ms)" in text
    assert "infeasible:" in text


def test_infeasible_ttft_is_reported_with_the_reason() -> None:
    # one image at 10 images/s = 100 ms of encoding before any queueing (8 images could be
    # spread over 8 encoders, so the floor is one image's time)
    rec = planner.recommend(prof(enc=10.0), Demand(1.0, 1), SLO(ttft_ms=90))
    assert not rec.feasible
    assert any("below the unloaded TTFT" in r for r in rec.reasons), rec.reasons


def test_gpu_budget_too_small_is_infeasible_and_says_how_many() -> None:
    rec = planner.recommend(prof(enc=10.0), Demand(4.0, 8), SLO(ttft_ms=3000), gpus=3)
    assert not rec.feasible
    assert any("needs" in r and "only 3 are available" in r for r in rec.reasons), rec.reasons
    roomy = planner.recommend(prof(enc=10.0), Demand(4.0, 8), SLO(ttft_ms=3000), gpus=64)
    assert roomy.feasible and any("not needed" in r for r in roomy.reasons)


def test_gpus_per_worker_changes_the_cost_not_the_counts() -> None:
    d, slo = Demand(4.0, 8), SLO(ttft_ms=3000)
    one = planner.recommend(prof(enc=10.0), d, slo).split
    eight = planner.recommend(prof(enc=10.0), d, slo,
                              cost_per={"encoder": 1, "prefill": 8, "decode": 8}).split
    assert eight.counts == one.counts
    assert eight.cost == one.encoder + 8 * (one.prefill + one.decode)


def test_hour_of_day_gives_per_hour_splits() -> None:
    hours = {3: 0.2, 9: 2.0, 14: 6.0}
    recs = planner.recommend_hours(prof(enc=10.0), Demand(0.0, 8), hours, SLO(ttft_ms=3000))
    assert list(recs) == [3, 9, 14]
    e = [recs[h].split.encoder for h in (3, 9, 14)]
    assert e[0] <= e[1] < e[2]
    assert recs[3].split.counts == {"encoder": 1, "prefill": 1, "decode": 1}
    assert all(r.feasible for r in recs.values())


def test_decode_curve_interpolates_and_saturates() -> None:
    p = prof(dec1=50.0, dec4=180.0, dec16=500.0)
    assert p.decode_tps(1) == 50.0 and p.decode_tps(4) == 180.0
    assert 50.0 < p.decode_tps(2) < 180.0
    assert p.decode_tps(64) == 500.0


@pytest.mark.parametrize("text,want", [("ttft=500ms,tpot=50ms", SLO(500.0, 50.0)),
                                       ("ttft=0.5s", SLO(500.0, None)), ("tpot=40", SLO(None, 40.0))])
def test_parse_slo(text: str, want: SLO) -> None:
    assert plan_io.parse_slo(text) == want


@pytest.mark.parametrize("text", ["ttft", "latency=5ms", "ttft=fast", "tpot=-1ms"])
def test_parse_slo_rejects_nonsense(text: str) -> None:
    with pytest.raises(PlanError, match="--slo"):
        plan_io.parse_slo(text)


def test_bad_profile_says_how_to_make_one() -> None:
    with pytest.raises(PlanError, match="epdctl profile"):
        Profile.from_dict({"encoder": {}}, "p.json")
    with pytest.raises(PlanError, match="rates must be > 0"):
        Profile.from_dict({"encoder": {"images_per_s": 0}, "prefill": {"tokens_per_s": 1},
                           "decode": {"tokens_per_s": {"1": 1}}})


def test_retopology_changes_only_counts() -> None:
    doc = yaml.safe_load((ROOT / "topologies" / "local.yaml").read_text())
    new = plan_io.retopology(doc, {"encoder": 3, "prefill": 2, "decode": 1})
    assert [new["roles"][r]["count"] for r in planner.ROLES] == [3, 2, 1]
    assert doc["roles"]["encoder"]["count"] == 2  # the input is not modified
    assert {k: v for k, v in new.items() if k != "roles"} == {k: v for k, v in doc.items()
                                                              if k != "roles"}
    colocated = yaml.safe_load((ROOT / "topologies" / "local-colocated.yaml").read_text())
    with pytest.raises(PlanError, match="colocated"):
        plan_io.retopology(colocated, {"encoder": 1, "prefill": 1, "decode": 1})


def _epdctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "epdctl", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=120)


def test_plan_cli_writes_a_valid_topology(tmp_path: Path) -> None:
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"encoder": {"images_per_s": 10.0},
                             "prefill": {"tokens_per_s": 5000.0, "tokens_per_image": 16},
                             "decode": {"tokens_per_s": {"1": 40, "4": 120, "16": 300}},
                             "kv_transfer_ms": 3}))
    w = tmp_path / "w.yaml"
    w.write_text("name: t\nimages: 4-8\nrepeat: 0.25\nmax_tokens: 32\nrate: 2\n"
                 "hours: {2: 0.1, 12: 2.0}\n")
    out = tmp_path / "planned.yaml"
    proc = _epdctl("plan", "topologies/local.yaml", "--workload", str(w), "--profile", str(p),
                   "--slo", "ttft=3s,tpot=100ms", "--write", str(out), "--json",
                   "--host-cores", "0")  # as on GPUs: each worker its own accelerator
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    peak = doc["peak"]
    assert peak["feasible"] and peak["bottleneck"] == "encoder"
    assert set(doc["hours"]) == {"2", "12"}
    assert doc["hours"]["2"]["split"] == "1:1:1"
    written = yaml.safe_load(out.read_text())
    assert written["roles"]["encoder"]["count"] == peak["counts"]["encoder"]
    assert _epdctl("validate", str(out)).returncode == 0


def test_plan_cli_infeasible_exits_1_with_the_reason(tmp_path: Path) -> None:
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"encoder": {"images_per_s": 10.0}, "prefill": {"tokens_per_s": 5000},
                             "decode": {"tokens_per_s": {"1": 40}}}))
    w = tmp_path / "w.yaml"
    w.write_text("images: 2\nrate: 1\n")
    proc = _epdctl("plan", "topologies/local.yaml", "--workload", str(w), "--profile", str(p),
                   "--slo", "tpot=5ms", "--write", str(tmp_path / "x.yaml"))
    assert proc.returncode == 1  # 2 is click's usage error
    assert "infeasible: TPOT SLO 5 ms is below" in proc.stdout
    assert "not written" in proc.stdout and not (tmp_path / "x.yaml").exists()


def test_plan_cli_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    w = tmp_path / "w.yaml"
    w.write_text("images: 2\nrate: 1\nbogus: 3\n")
    p = tmp_path / "p.json"
    p.write_text("{}")
    proc = _epdctl("plan", "topologies/local.yaml", "--workload", str(w), "--profile", str(p))
    assert proc.returncode == 1 and "unknown key(s) bogus" in proc.stderr
    assert "Traceback" not in proc.stderr
    w.write_text("images: 2\nrate: 1\n")
    proc = _epdctl("plan", "topologies/local-colocated.yaml", "--workload", str(w),
                   "--profile", str(p))
    assert proc.returncode == 1 and "colocated" in proc.stderr and "Traceback" not in proc.stderr


def test_each_extra_worker_is_explained_by_the_constraint_that_needs_it() -> None:
    rec = planner.recommend(prof(enc=10.0), Demand(4.0, 8, 0.0, 12, 16), SLO(ttft_ms=3000))
    assert rec.split.encoder > 1 and "encoder" in rec.limits
    assert "utilisation" in rec.limits["encoder"] or "TTFT" in rec.limits["encoder"]
    assert "prefill" not in rec.limits or rec.split.prefill > 1
    text = "\n".join(rec.explain())
    assert f"why {rec.split.encoder} encoder: with {rec.split.encoder - 1}" in text


def test_host_share_slowdown_grows_with_work_on_few_cores() -> None:
    from epdctl.bench.host_share import slowdown

    assert slowdown(0.0, 2) == 1.0
    assert slowdown(0.5, 64) == pytest.approx(1.0)           # plenty of cores: no contention
    vals = [slowdown(b, 2) for b in (0.25, 0.5, 1.0, 1.5, 2.0)]
    assert vals == sorted(vals) and vals[0] > 1.0
    # closed form for one core: E[1 + X] = 1 + busy
    assert slowdown(0.7, 1) == pytest.approx(1.7, rel=1e-6)


def _cpu_profile() -> planner.Profile:
    return planner.Profile.from_dict({
        "encoder": {"images_per_s": 100.0}, "prefill": {"tokens_per_s": 4000.0},
        "decode": {"tokens_per_s": {"1": 250, "4": 600, "16": 1300}},
        "cpu": {"encoder_s_per_image": 0.01, "prefill_s_per_request": 0.02,
                "decode_s_per_token": {"1": 0.005, "4": 0.003, "16": 0.002}}})


def test_shared_host_stretches_service_and_caps_the_load() -> None:
    p = _cpu_profile()
    d = Demand(4.0, 6, 0.0, 14, 32)
    n = {"encoder": 2, "prefill": 1, "decode": 1}
    alone = planner.evaluate(p, d, n, {})
    shared = planner.evaluate(p, d, n, {}, host_cores=2)
    assert "host" not in alone.utilisation
    # CPU per request: 6 x 10 ms + 20 ms + 32 tokens x 5 ms (decode at batch 1) = 240 ms;
    # 4 req/s on 2 cores = 48 %
    assert shared.utilisation["host"] == pytest.approx(0.48)
    assert shared.ttft_ms > alone.ttft_ms and shared.tpot_ms > alone.tpot_ms
    assert shared.bottleneck in planner.ROLES
    # a load the 2 cores cannot carry is infeasible whatever the split, and says so
    rec = planner.recommend(p, Demand(20.0, 6, 0.0, 14, 32), SLO(ttft_ms=2000), host_cores=2)
    assert not rec.feasible
    assert any("share 2 cores" in r and "whatever the split" in r for r in rec.reasons)
    # the same load with a core per worker is fine
    assert planner.recommend(p, Demand(20.0, 6, 0.0, 14, 32), SLO(ttft_ms=2000)).feasible


def test_plan_cli_compare_all_lists_every_split_of_the_same_total(tmp_path: Path) -> None:
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"encoder": {"images_per_s": 10.0},
                             "prefill": {"tokens_per_s": 5000.0, "tokens_per_image": 16},
                             "decode": {"tokens_per_s": {"1": 40, "4": 120, "16": 300}}}))
    w = tmp_path / "w.yaml"
    w.write_text("images: 8\nrepeat: 0\nmax_tokens: 32\nrate: 2\n")
    proc = _epdctl("plan", "topologies/local.yaml", "--workload", str(w), "--profile", str(p),
                   "--slo", "ttft=2s", "--compare-all", "--host-cores", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    total = doc["peak"]["cost"]
    got = {c["split"] for c in doc["compare"]}
    want = {f"{e}:{q}:{total - e - q}" for e in range(1, total - 1) for q in range(1, total - e)}
    assert got == want - {doc["peak"]["split"]} and total >= 4
