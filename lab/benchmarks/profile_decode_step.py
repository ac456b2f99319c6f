"""Where a batched decode step's time goes: fixed per-step cost vs cost per running stream.

Answers "how far can batching go on this model and machine" with measurements, not estimates.
One DecodeEngine (the one bench_decode_batch.py drives) runs steps at 1, 2, 4, 8 and 16 streams,
rounds alternating between the batch sizes so a change in the host's load hits all of them:

* step time t(n), least squares ``t(n) = a + b*n``: ``a`` the fixed cost of a step (Python,
  dispatch, the framework), ``b`` the marginal cost of one more stream. The ratio of 16 streams'
  tokens/s to one stream's is 16 t(1) / t(16) = 16 (a + b) / (a + 16 b): it reaches 10 only when
  b <= 0.04 (a + b), i.e. a stream's own work is at most 4 % of a one-stream step.
* the split of t(n) into the language model's GEMMs (every nn.Linear incl. lm_head), attention
  (slot_attention), the KV write (SlotCache.update), the engine around the model (step minus
  forward: batch assembly, sampling, bookkeeping) and the rest of the forward (norms, RoPE,
  activations, embeddings, transformers' module calls), measured with timers around each part
  (separate passes, alternating 1 and 16 streams, each part's least of ``--rounds``: the timers
  add ~0.3 us per call, so the split is reported apart from the fit).
* with ``--ops``, torch.profiler's per-op table at 1 and 16 streams (self CPU time and calls per
  step) and what each op adds per stream: which ops grow with the batch. The native attention
  and KV write (native_attention.py) are no torch ops: the split's attention row times them.
* the floor of ``b`` on this core: the per-stream FLOPs of the GEMMs at the GEMM rate measured
  at 16 rows, and the bytes of KV attention reads per stream at the rate of a plain read.

    .venv/bin/python lab/benchmarks/profile_decode_step.py [--steps 64] [--rounds 5] [--threads 1]
Writes lab/benchmarks/results/decode_profile.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "lab" / "benchmarks"))

from bench_decode_batch import prefills  # noqa: E402
from bench_stages import model_dir  # noqa: E402
from epdctl.runtime import kv_slots  # noqa: E402
from epdctl.runtime.fast import decode as fast_decode  # noqa: E402
from epdctl.runtime.fast import decode_forward, packed_gemm, slot_attention  # noqa: E402
from epdctl.runtime.fast.decode import FastDecodeEngine as DecodeEngine  # noqa: E402
from epdctl.runtime.model import load_bundle  # noqa: E402
from epdctl.runtime.sampling import SamplingParams  # noqa: E402

SIZES = (1, 2, 4, 8, 16)
PARTS = ("gemm", "attention", "kv_write", "rest_of_forward", "engine")


def engine_with(bundle: Any, results: list, n: int, steps: int) -> DecodeEngine:
    """An engine running ``n`` streams with room for ``steps`` more tokens each, past its join step."""
    engine = DecodeEngine(bundle, max_running=n)
    params = SamplingParams(max_tokens=steps * 4 + 8, ignore_eos=True)
    for i in range(n):
        engine.add(f"s{i}", results[i], params)
    engine.step()  # emits the prefills' tokens; the streams join the batch
    engine.step()
    return engine


def time_steps(engine: DecodeEngine, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - t0) / steps


class Split:
    """Timers around the parts of a step (installed only for the split pass)."""

    def __init__(self) -> None:
        self.t: dict[str, float] = defaultdict(float)

    def wrap(self, key: str, fn: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.t[key] += time.perf_counter() - t0
        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed

    @contextlib.contextmanager
    def installed(self, engine: DecodeEngine) -> Iterator[None]:
        F = torch.nn.functional
        linear, update, attn = F.linear, kv_slots.SlotCache.update, slot_attention.slot_attention
        native_update = fast_decode.NativeSlotCache.update
        packed_linear = packed_gemm._linear
        lm_call, lean, lean_attend = engine.lm.forward, engine.lean, decode_forward.attend
        F.linear = self.wrap("gemm", linear)  # type: ignore[assignment]
        packed_gemm._linear = self.wrap("gemm", packed_linear)  # the oneDNN path of wide steps
        kv_slots.SlotCache.update = self.wrap("kv_write", update)  # type: ignore[method-assign]
        fast_decode.NativeSlotCache.update = self.wrap("kv_write", native_update)  # type: ignore[method-assign]
        slot_attention.AttentionInterface.register(slot_attention.NAME, self.wrap("attention", attn))
        engine.lm.forward = self.wrap("forward", lm_call)  # type: ignore[method-assign]
        if lean is not None:  # the plain-torch forward (decode_forward.py): lm_head runs inside it
            engine.lean = self.wrap("forward", lean)  # type: ignore[assignment]
            decode_forward.attend = self.wrap("attention", lean_attend)  # type: ignore[assignment]
        try:
            yield
        finally:
            F.linear = linear  # type: ignore[assignment]
            packed_gemm._linear = packed_linear
            kv_slots.SlotCache.update = update  # type: ignore[method-assign]
            fast_decode.NativeSlotCache.update = native_update  # type: ignore[method-assign]
            slot_attention.AttentionInterface.register(slot_attention.NAME, attn)
            del engine.lm.forward
            engine.lean = lean
            decode_forward.attend = lean_attend  # type: ignore[assignment]

    def parts(self, total: float, steps: int) -> dict[str, float]:
        """Per-step milliseconds of each part (``total``: the steps' wall seconds)."""
        t = defaultdict(float, {k: v / steps * 1e3 for k, v in self.t.items()})  # lean steps: no lm_head of its own
        out = {"gemm": t["gemm"], "attention": t["attention"], "kv_write": t["kv_write"]}
        gemm_inside = t["gemm"] - t["lm_head"]  # the engine calls lm_head after the forward
        out["rest_of_forward"] = t["forward"] - gemm_inside - t["attention"] - t["kv_write"]
        out["engine"] = total / steps * 1e3 - t["forward"] - t["lm_head"]
        return out


def split_pass(bundle: Any, results: list, n: int, steps: int) -> dict[str, float]:
    engine = engine_with(bundle, results, n, steps)
    split = Split()
    head = engine.lm_head
    packed = engine.packed if engine.lean is None else None  # the lean forward calls the head inside
    with split.installed(engine):
        head.forward = split.wrap("lm_head", head.forward)  # type: ignore[method-assign]
        if packed is not None:
            packed.lm_head = split.wrap("lm_head", packed.lm_head)  # type: ignore[assignment]
        try:
            t0 = time.perf_counter()
            for _ in range(steps):
                engine.step()
            total = time.perf_counter() - t0
        finally:
            del head.forward
            if packed is not None:
                packed.lm_head = packed.lm_head.__wrapped__  # type: ignore[attr-defined]
    return split.parts(total, steps)


def op_table(bundle: Any, results: list, steps: int, rounds: int) -> list[dict[str, Any]]:
    """Per op: self CPU us and calls per step at 1 and 16 streams (least of ``rounds``), largest growth first."""
    from torch.profiler import ProfilerActivity, profile

    per: dict[int, dict[str, tuple[float, float]]] = {1: {}, 16: {}}
    for _ in range(rounds):
        for n in per:
            engine = engine_with(bundle, results, n, steps)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                time_steps(engine, steps)
            for ev in prof.key_averages():
                us, calls = ev.self_cpu_time_total / steps, ev.count / steps
                per[n][ev.key] = (min(us, per[n].get(ev.key, (us, 0))[0]), calls)
    rows = [{"op": k, "us_1": per[1].get(k, (0, 0))[0], "calls_1": per[1].get(k, (0, 0))[1],
             "us_16": per[16].get(k, (0, 0))[0], "calls_16": per[16].get(k, (0, 0))[1]} for k in set(per[1]) | set(per[16])]
    for r in rows:
        r["us_per_stream"] = (r["us_16"] - r["us_1"]) / 15
    return sorted(rows, key=lambda r: -r["us_per_stream"])


def fit(ns: list[int], ts: list[float]) -> tuple[float, float]:
    """Least squares t = a + b n."""
    k = len(ns)
    mx, my = sum(ns) / k, sum(ts) / k
    b = sum((x - mx) * (y - my) for x, y in zip(ns, ts)) / sum((x - mx) ** 2 for x in ns)
    return my - b * mx, b


def floors(bundle: Any, results: list, steps: int) -> dict[str, float]:
    """Per-stream floor of the GEMMs (FLOPs at the 16-row GEMM rate) and of attention's KV reads."""
    tc = bundle.config.text_config
    lin = [m for m in bundle.model.model.language_model.modules() if isinstance(m, torch.nn.Linear)]
    lin.append(bundle.model.lm_head)
    flops = sum(2 * m.in_features * m.out_features for m in lin)
    x = {m.in_features: torch.randn(16, 1, m.in_features) for m in lin}
    gemm_s = []
    for _ in range(7):  # the least disturbed of 7 passes
        t0 = time.perf_counter()
        for _ in range(20):
            for m in lin:
                torch.nn.functional.linear(x[m.in_features], m.weight, m.bias)
        gemm_s.append(time.perf_counter() - t0)
    gemm_rate = 16 * flops * 20 / min(gemm_s)
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    mean_len = sum(int(r.prompt_len) for r in results[:16]) / 16 + steps
    kv_bytes = 2 * tc.num_hidden_layers * tc.num_key_value_heads * head_dim * mean_len * 4
    big = torch.randn(int(kv_bytes * 16 // 4))
    big.sum()
    read_s = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(20):
            big.sum()
        read_s.append(time.perf_counter() - t0)
    read_rate = kv_bytes * 16 * 20 / min(read_s)
    return {"gemm_flops_per_stream": flops, "gemm_gflops_at_16_rows": gemm_rate / 1e9,
            "gemm_floor_us": flops / gemm_rate * 1e6, "kv_bytes_per_stream": kv_bytes,
            "kv_read_gb_s": read_rate / 1e9, "kv_read_floor_us": kv_bytes / read_rate * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint folder (default: models/tiny-qwen2vl, else a random tiny one)")
    ap.add_argument("--steps", type=int, default=64, help="steps timed per batch size and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ops", action="store_true", help="also torch.profiler's per-op table at 1 and 16 streams")
    ap.add_argument("--out", default=str(ROOT / "lab" / "benchmarks" / "results" / "decode_profile.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path, source = model_dir(args.model)
    bundle = load_bundle(path, role="colocated")
    results = prefills(bundle, max(SIZES), SamplingParams(max_tokens=args.steps, ignore_eos=True))
    best: dict[int, float] = {}
    for _ in range(args.rounds):
        for n in SIZES:  # alternate: each round times every batch size
            t = time_steps(engine_with(bundle, results, n, args.steps), args.steps)
            best[n] = min(best.get(n, t), t)
    ms = {n: best[n] * 1e3 for n in SIZES}
    a, b = fit(list(SIZES), [ms[n] for n in SIZES])
    split: dict[int, dict[str, float]] = {}
    for _ in range(args.rounds):  # each part's least disturbed pass
        for n in (1, 16):
            parts = split_pass(bundle, results, n, args.steps)
            split[n] = {k: min(v, split.get(n, parts)[k]) for k, v in parts.items()}
    per_stream = {k: (split[16][k] - split[1][k]) / 15 * 1e3 for k in PARTS}
    floor = floors(bundle, results, args.steps)
    measured = 16 * ms[1] / ms[16]
    print(f"threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}, best of {args.rounds} rounds")
    print(f"{'streams':>7} {'ms/step':>8} {'tokens/s':>9} {'x one':>6}")
    for n in SIZES:
        print(f"{n:7d} {ms[n]:8.3f} {n / ms[n] * 1e3:9.0f} {n * ms[1] / ms[n]:6.2f}")
    print(f"fit t(n) = {a:.3f} ms + {b * 1e3:.1f} us x n;  16 streams / 1 stream: measured {measured:.2f}x, "
          f"fit {16 * (a + b) / (a + 16 * b):.2f}x; 10x needs b <= {0.04 * (a + b) * 1e3:.1f} us")
    print(f"{'part':>16} {'1 stream ms':>12} {'16 streams ms':>14} {'us per stream':>14}")
    for k in PARTS:
        print(f"{k:>16} {split[1][k]:12.3f} {split[16][k]:14.3f} {per_stream[k]:14.1f}")
    print(f"floor per stream: GEMMs {floor['gemm_flops_per_stream'] / 1e6:.2f} MFLOP at "
          f"{floor['gemm_gflops_at_16_rows']:.0f} GFLOP/s = {floor['gemm_floor_us']:.1f} us; KV read "
          f"{floor['kv_bytes_per_stream'] / 1024:.0f} KiB at {floor['kv_read_gb_s']:.0f} GB/s = "
          f"{floor['kv_read_floor_us']:.1f} us")
    floor_b = (floor["gemm_floor_us"] + floor["kv_read_floor_us"]) / 1e3
    print(f"with b at that floor and a = {a:.3f} ms: 16 streams / 1 stream <= "
          f"{16 * (a + floor_b) / (a + 16 * floor_b):.2f}x")
    ops = op_table(bundle, results, args.steps, args.rounds) if args.ops else []
    if ops:
        print(f"{'op (torch.profiler, self CPU)':>32} {'1: us':>7} {'calls':>6} {'16: us':>7} {'calls':>6} {'us/stream':>9}")
        for r in ops[:15]:
            print(f"{r['op'][:32]:>32} {r['us_1']:7.1f} {r['calls_1']:6.0f} {r['us_16']:7.1f} {r['calls_16']:6.0f} "
                  f"{r['us_per_stream']:9.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "model": source, "threads": torch.get_num_threads(), "load_avg_1m": os.getloadavg()[0],
        "steps": args.steps, "rounds": args.rounds, "ms_per_step": ms, "fit_ms": {"a": a, "b": b},
        "ratio_16_over_1": {"measured": measured, "fit": 16 * (a + b) / (a + 16 * b),
                            "at_floor": 16 * (a + floor_b) / (a + 16 * floor_b)},
        "split_ms": split, "per_stream_us": per_stream, "floor": floor, "ops": ops[:25]}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
