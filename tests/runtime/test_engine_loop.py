"""The decode's engine thread beside its event loop (servers/engine_loop.py), and the timeline that
shows where token gaps come from (servers/loop_trace.py, benchmarks/burst_gaps.py).

A real DecodeEngine on the tiny checkpoint, driven through EngineLoop from a real asyncio loop:
on one core each step's tokens are taken by their handlers before the next step starts, and the
tokens are exactly those of the engine alone, one core or many.
"""

from __future__ import annotations

import asyncio
import logging
import json
import sys

import pytest

from test_engine import prefill_request, run_alone

from epdctl.runtime.decode_engine import DecodeEngine
from epdctl.runtime.encoder_engine import VisionEncoder
from epdctl.runtime.sampling import SamplingParams
from epdctl.runtime.servers import loop_trace
from epdctl.runtime.servers.engine_loop import SWITCH_INTERVAL_S, EngineLoop

from burst_gaps import analyse

TOKENS = 12


@pytest.fixture(scope="module")
def prefilled(bundle, images):
    enc = VisionEncoder(bundle, cache_mb=0)
    params = [SamplingParams(max_tokens=TOKENS, stop_token_ids=[], ignore_eos=True),
              SamplingParams(max_tokens=TOKENS - 3, temperature=0.8, seed=7, stop_token_ids=[], ignore_eos=True)]
    results = [prefill_request(bundle, enc, images[i:i + 2], "what is in the picture?", p)
               for i, p in enumerate(params)]
    want = [run_alone(bundle, prefill_request(bundle, enc, images[i:i + 2], "what is in the picture?", p), p)[0]
            for i, p in enumerate(params)]
    return results, params, want


def decode_through_loop(bundle, results, params, one_core: bool, trace=None) -> tuple[list[list[int]], dict]:
    """Both sequences decoded by one EngineLoop; (tokens per sequence, each token's take time)."""
    taken: dict[str, list[float]] = {}

    async def main() -> list[list[int]]:
        loop = EngineLoop(DecodeEngine(bundle), asyncio.get_running_loop())
        loop.one_core, loop.trace = one_core, trace
        switch = sys.getswitchinterval()
        loop.start()
        try:
            async def one(seq: str, result, p) -> list[int]:
                q = await loop.add(seq, result, p)
                out = []
                while True:
                    token, done = await q.get()
                    taken.setdefault(seq, []).append(asyncio.get_running_loop().time())
                    if trace is not None:
                        trace.token(seq)
                    out.append(token)
                    if done:
                        return out

            return list(await asyncio.gather(*(one(f"s{i}", r, p) for i, (r, p) in enumerate(zip(results, params)))))
        finally:
            await asyncio.to_thread(loop.stop)
            sys.setswitchinterval(switch)

    return asyncio.run(main()), taken


def test_one_core_tokens_are_exact_and_written_before_the_next_step(bundle, prefilled, tmp_path):
    results, params, want = prefilled
    trace = loop_trace.LoopTrace(str(tmp_path / "decode.json"))
    got, _ = decode_through_loop(bundle, [r for r in results], params, one_core=True, trace=trace)
    assert got == want
    # every step after the first starts only once the previous step's tokens were taken
    written = sorted(t for stamps in trace.written.values() for t in stamps)
    steps = sorted(trace.steps)
    assert len(steps) >= TOKENS - 1
    for (_, prev_end, _, _), (start, _, _, _) in zip(steps, steps[1:]):
        taken_between = [t for t in written if prev_end <= t <= start]
        assert taken_between, f"a step started at {start} before the tokens of the step ending {prev_end} were taken"
    assert all(rows >= 1 and cpu >= 0 for _, _, rows, cpu in steps)
    assert all(d1 >= d0 for d0, d1 in trace.delivered)


def test_one_core_lowers_the_gil_switch_interval_only_while_running(bundle, prefilled):
    results, params, _ = prefilled
    before = sys.getswitchinterval()
    seen = []

    class Engine(DecodeEngine):
        def step(self):  # type: ignore[override]
            seen.append(sys.getswitchinterval())
            return super().step()

    async def main() -> None:
        loop = EngineLoop(Engine(bundle), asyncio.get_running_loop())
        loop.one_core = True
        loop.start()
        try:
            q = await loop.add("s", results[0], params[0])
            while not (await q.get())[1]:
                pass
        finally:
            await asyncio.to_thread(loop.stop)

    try:
        asyncio.run(main())
    finally:
        sys.setswitchinterval(before)
    assert seen and all(s <= SWITCH_INTERVAL_S + 1e-9 for s in seen)


def test_many_cores_do_not_wait_and_give_the_same_tokens(bundle, prefilled):
    results, params, want = prefilled
    got, _ = decode_through_loop(bundle, results, params, one_core=False)
    assert got == want


def test_the_trace_is_written_and_read_back_by_the_gap_analysis(bundle, prefilled, tmp_path, monkeypatch):
    results, params, _ = prefilled
    path = tmp_path / "epd-decode.json"
    monkeypatch.setattr(loop_trace, "_TRACE", None)
    monkeypatch.setenv(loop_trace.ENV, str(path))
    original = asyncio.events.Handle._run
    try:
        trace = loop_trace.from_env()
        assert trace is not None and loop_trace.from_env() is trace  # installed once

        async def slow() -> None:
            sum(range(300_000))  # a callback well over SLOW_S: recorded with its coroutine's name

        asyncio.run(slow())
        decode_through_loop(bundle, results, params, one_core=True, trace=trace)
        trace.dump()
    finally:
        asyncio.events.Handle._run = original  # type: ignore[method-assign]
        import gc

        gc.callbacks.remove(trace._on_gc)
    doc = json.loads(path.read_text())
    assert any("slow" in label for _, _, _, label in doc["loop"])
    assert doc["steps"] and doc["written"]
    # the client saw each sequence's tokens 1 ms after they were taken; gaps of 0 ms or more
    client = {"stamps": [[t + 0.001 for t in stamps] for stamps in doc["written"].values()], "bursts_at": []}
    out = analyse(client, doc, over_s=0.0)
    assert out["gaps"] == sum(len(s) - 1 for s in client["stamps"])
    assert out["long_gaps"] >= out["gaps"] - len(client["stamps"])  # all but each answer's very first
    assert out["step end -> tokens on their queues, ms p50/p99/max"]


def test_a_trace_that_cannot_be_written_is_logged_not_raised(tmp_path, caplog):
    """on_stop dumps the trace: a path that cannot be written must not fail the worker's shutdown."""
    trace = loop_trace.LoopTrace(str(tmp_path / "no-such-dir" / "trace.json"))
    trace.step(0.0, 0.001, 1, 0.001)
    with caplog.at_level(logging.ERROR, logger=loop_trace.__name__):
        trace.dump()
    assert "cannot write the loop trace" in caplog.text and loop_trace.ENV in caplog.text
