"""The reference and the fast runtime paths give the same tokens on the held-out drawings
(scripts/heldout_shapes.py's drawing functions), decoded as a batch, through the same prefill;
and ``--fast`` selects the fast path's pieces while the reference imports none of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
from heldout_shapes import draws

from epdctl.runtime.decode_engine import DecodeEngine
from epdctl.runtime.encoder_engine import VisionEncoder
from epdctl.runtime.model import load_bundle
from epdctl.runtime.prefill_engine import LanguagePrefill
from epdctl.runtime.prompt import build_prompt
from epdctl.runtime.sampling import SamplingParams
from epdctl.shapes import QUESTION

MODEL = ROOT / "models" / "tiny-qwen2vl"


def messages(n: int, at: int) -> list[dict]:
    parts: list[dict] = [{"type": "image"} for _ in range(n)]
    parts.insert(at, {"type": "text", "text": QUESTION})
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def heldout_prefills():
    """One held-out request per (question position, image count), prefilled once for both paths."""
    bundle = load_bundle(str(MODEL), role="colocated")
    enc, pre = VisionEncoder(bundle), LanguagePrefill(bundle)
    params = SamplingParams(max_tokens=40)
    results = []
    for position, n, drawn, at in draws(1, 777):
        encoded = enc.encode([d.png for d in drawn])
        prompt = build_prompt(bundle, messages(n, at), [e.grid_thw for e in encoded])
        results.append(pre.prefill(prompt, encoded, params))
    return bundle, results, params


def decode_batch(engine, results, params) -> dict[str, list[int]]:
    for i, r in enumerate(results):
        engine.add(f"r{i}", r, params)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(results))}
    while engine.num_running:
        for sid, tok, _ in engine.step():
            tokens[sid].append(tok)
    return tokens


def test_the_fast_path_gives_the_reference_tokens_on_the_heldout_drawings(heldout_prefills):
    from epdctl.runtime.fast.decode import FastDecodeEngine

    bundle, results, params = heldout_prefills
    assert len(results) == 23  # 3 positions x 1..8 images, 'between' from 2
    fast = FastDecodeEngine(bundle)
    assert fast.fast, "the fast step fell back to the reference on this host"
    reference = decode_batch(DecodeEngine(bundle), results, params)
    assert decode_batch(fast, results, params) == reference
    assert all(reference.values())


def test_the_fast_copy_and_hash_gives_the_reference_checksums(heldout_prefills):
    """The KV of a held-out request copied and hashed for the wire: the same part checksum either way."""
    import numpy as np

    from epdctl.runtime import wire
    from epdctl.runtime.fast.native_copy import NativeCopyHash, library
    from epdctl.runtime.transports import spans

    if library() is None:
        pytest.skip("the native copy does not build here")
    _, results, _ = heldout_prefills
    tensors = {f"{kind}{i}": t for i, kv in enumerate(results[-1].kv) for kind, t in zip("kv", kv)}
    header, bufs = wire.describe({}, tensors)
    offsets, total = wire.layout(header["tensors"])

    def digest() -> int:
        return spans.write_span(bufs, offsets, np.zeros(total, np.uint8), 0, len(bufs))[0]
    plain = digest()
    wire.use_accelerator(NativeCopyHash())
    try:
        fast = digest()
    finally:
        wire.use_accelerator(None)
    assert plain == fast


def test_the_reference_path_imports_nothing_of_the_fast_one():
    code = ("import sys; from epdctl.runtime import __main__ as m, paths; "
            "from epdctl.runtime.servers import colocated, decode, encoder, prefill; "
            "a = m.build_parser().parse_args(['decode', '--model-path', 'x', '--port', '1']); "
            "paths.select(a.fast); "
            "print(a.fast, paths.active().name, sorted(n for n in sys.modules if '.fast' in n))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "EPD_RUNTIME_FAST": ""})
    assert out.stdout.split() == ["False", "reference", "[]"], out.stderr[-2000:]


def test_fast_is_a_flag_with_an_environment_default():
    from epdctl.runtime.__main__ import build_parser
    from epdctl.runtime.config import RuntimeConfig

    base = ["prefill", "--model-path", "x", "--port", "1", "--bootstrap-port", "2", "--encoder-bootstrap-port", "3"]
    assert build_parser(RuntimeConfig()).parse_args(base).fast is False
    assert build_parser(RuntimeConfig()).parse_args([*base, "--fast"]).fast is True
    assert build_parser(RuntimeConfig(fast=True)).parse_args(base).fast is True
    args = build_parser(RuntimeConfig()).parse_args(base)
    assert (args.max_running_requests, args.kv_timeout, args.transport) == (64, 30.0, "zmq")


def test_a_fast_step_that_differs_falls_back_to_the_reference_with_a_log_line(bundle, monkeypatch, caplog):
    import logging

    from epdctl.runtime.fast import decode

    logits = decode.FastDecodeEngine._logits

    def off(self, ids, pos, cache):
        out = logits(self, ids, pos, cache)
        return out + 1e-2 * out.abs().max() if self.fast else out  # a fast step off by more than rounding
    monkeypatch.setattr(decode.FastDecodeEngine, "_logits", off)
    with caplog.at_level(logging.INFO, logger=decode.__name__):
        engine = decode.FastDecodeEngine(bundle)
    assert not engine.fast
    assert any("take the reference path" in r.getMessage() and "differ by" in r.getMessage() for r in caplog.records)
