"""Validation of SGLang's native /generate and /tokenize bodies in the embedded engine: every
bad field is a 400 that names it; the prefill-only marker is SGLang's FAKE_BOOTSTRAP_HOST."""

from __future__ import annotations

import pytest

from epdctl.runtime.native_api import (
    FAKE_BOOTSTRAP_HOST, generate_response, parse_generate, tokenize_response,
)
from epdctl.runtime.openai_api import ApiError

LIM = {"vocab_size": 1000, "context_length": 256}


def parse(body: dict, room: bool = True):
    return parse_generate(body, require_room=room, **LIM)


def test_fake_bootstrap_host_matches_sglang() -> None:
    """Read from SGLang's source (importing sglang.srt needs torchvision, which the parser-only
    install leaves out); CI installs SGLang 0.5.23, so the source is there."""
    import importlib.util
    import re
    from pathlib import Path

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:  # a dev venv without the engine parsers
        assert FAKE_BOOTSTRAP_HOST == "2.2.2.2"  # sglang 0.5.23, srt/disaggregation/utils.py
        return
    src = (Path(spec.origin).parent / "srt" / "disaggregation" / "utils.py").read_text()
    m = re.search(r'^FAKE_BOOTSTRAP_HOST\s*=\s*"([^"]+)"', src, re.M)
    assert m and m.group(1) == FAKE_BOOTSTRAP_HOST


def test_a_router_style_body_parses() -> None:
    r = parse({"input_ids": [1, 2, 3], "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998,
               "bootstrap_room": 7, "return_logprob": True, "top_logprobs_num": 2,
               "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}})
    assert r.input_ids == [1, 2, 3] and r.max_new_tokens == 8 and r.temperature == 0.0
    assert r.ignore_eos and r.top_logprobs_num == 2 and not r.prefill_only
    assert parse({"text": "hi", "bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_room": 0}).prefill_only


@pytest.mark.parametrize("body, words", [
    ({"input_ids": [1], "text": "x", "bootstrap_room": 1}, "exactly one of 'text'"),
    ({"bootstrap_room": 1}, "exactly one of 'text'"),
    ({"text": ["a", "b"], "bootstrap_room": 1}, "'text' must be a non-empty string"),
    ({"input_ids": [], "bootstrap_room": 1}, "'input_ids' must be a non-empty list"),
    ({"input_ids": [1, True], "bootstrap_room": 1}, "'input_ids' must be a non-empty list"),
    ({"input_ids": [1, 5000], "bootstrap_room": 1}, "outside the vocabulary"),
    ({"text": "x", "image_data": ["data:..."], "bootstrap_room": 1}, "/v1/chat/completions"),
    ({"text": "x"}, "missing 'bootstrap_room'"),
    ({"text": "x", "bootstrap_room": -1}, "bootstrap_room"),
    ({"text": "x", "bootstrap_room": 1, "bootstrap_port": 70000}, "bootstrap_port"),
    ({"text": "x", "bootstrap_room": 1, "sampling_params": []}, "'sampling_params' must be"),
    ({"text": "x", "bootstrap_room": 1, "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
    ({"text": "x", "bootstrap_room": 1, "sampling_params": {"temperature": 9}}, "temperature"),
    ({"text": "x", "bootstrap_room": 1, "top_logprobs_num": 99}, "top_logprobs_num"),
    ({"input_ids": [1] * 200, "bootstrap_room": 1, "sampling_params": {"max_new_tokens": 100}},
     "context"),
])
def test_bad_bodies_get_a_400_naming_the_field(body: dict, words: str) -> None:
    with pytest.raises(ApiError) as e:
        parse(body)
    assert e.value.status == 400 and words in e.value.message, e.value.message


def test_response_shapes_are_sglangs() -> None:
    doc = generate_response("r1", "ab", [5, 6], 3, "length", top=[[[-0.1, 5, "a"]]])
    assert set(doc) == {"text", "output_ids", "meta_info"}
    assert doc["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    assert doc["meta_info"]["completion_tokens"] == 2 and doc["meta_info"]["prompt_tokens"] == 3
    assert doc["meta_info"]["output_top_logprobs"] == [[[-0.1, 5, "a"]]]

    class Tok:
        def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
            return {"input_ids": [ord(c) for c in text] + ([0] if add_special_tokens else [])}

    assert tokenize_response({"prompt": "ab", "add_special_tokens": False}, Tok(), 256) == {
        "tokens": [97, 98], "count": 2, "max_model_len": 256}
    with pytest.raises(ApiError, match="'prompt' must be a string"):
        tokenize_response({"messages": []}, Tok(), 256)
