"""SGLang's native API, text only: ``POST /generate`` and ``POST /tokenize``.

Why the embedded engine speaks it: SGLang's PD router and tools (``bench_serving
--fake-prefill``, epdctl's P->D canary) drive workers through ``/generate`` with token ids and
the bootstrap fields, and a prefill asked with ``bootstrap_host = "2.2.2.2"`` (SGLang's
``FAKE_BOOTSTRAP_HOST``, srt/disaggregation/utils.py) runs the prefill alone and sends its KV
nowhere. Same request and response shapes as SGLang 0.5.23 (``tokenizer_manager``:
``{"text", "output_ids", "meta_info"}``; ``/tokenize``: ``{"tokens", "count",
"max_model_len"}``). Images go through ``/v1/chat/completions``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from epdctl.runtime.openai_api import ApiError, _bool, _int, _num, check_context, parse_bootstrap

FAKE_BOOTSTRAP_HOST = "2.2.2.2"
MAX_TOP_LOGPROBS = 20


@dataclass
class GenerateRequest:
    """A validated ``/generate`` body (one prompt; text or token ids)."""

    text: str | None
    input_ids: list[int] | None
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None

    @property
    def prefill_only(self) -> bool:
        """SGLang's fake transfer: prefill, answer the first token, send the KV nowhere."""
        return self.bootstrap_host == FAKE_BOOTSTRAP_HOST


def parse_generate(body: dict[str, Any], *, vocab_size: int, context_length: int,
                   require_room: bool) -> GenerateRequest:
    """Validate a ``/generate`` body; ApiError(400) names the field that is wrong."""
    if body.get("image_data") or body.get("video_data") or body.get("audio_data"):
        raise ApiError(400, "image_data is not supported on /generate by the embedded engine; send "
                            "images through /v1/chat/completions", "unsupported")
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise ApiError(400, "give exactly one of 'text' (string) or 'input_ids' (list of ints)",
                       "missing_field")
    if text is not None and (not isinstance(text, str) or not text):
        raise ApiError(400, "'text' must be a non-empty string (one prompt; batches are not "
                            "supported)", "invalid_value")
    if ids is not None:
        if (not isinstance(ids, list) or not ids
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
            raise ApiError(400, "'input_ids' must be a non-empty list of token ids (one prompt)",
                           "invalid_value")
        bad = next((i for i in ids if not 0 <= i < vocab_size), None)
        if bad is not None:
            raise ApiError(400, f"'input_ids' holds {bad}, outside the vocabulary [0, {vocab_size})",
                           "invalid_value")
    sp = body.get("sampling_params")
    sp = {} if sp is None else sp
    if not isinstance(sp, dict):
        raise ApiError(400, "'sampling_params' must be an object", "invalid_value")
    req = GenerateRequest(text=text, input_ids=ids)
    req.max_new_tokens = _int(sp.get("max_new_tokens", 128), "sampling_params.max_new_tokens",
                              1, 1 << 20)
    check_context(len(ids or []), req.max_new_tokens, context_length)
    req.temperature = _num(sp.get("temperature", 1.0), "temperature", 0.0, 2.0)
    req.top_p = _num(sp.get("top_p", 1.0), "top_p", 0.0, 1.0) or 1.0
    seed = sp.get("sampling_seed", body.get("seed"))
    req.seed = None if seed is None else _int(seed, "sampling_seed", -(1 << 63), (1 << 64) - 1)
    req.ignore_eos = _bool(sp, "ignore_eos", False)
    req.return_logprob = _bool(body, "return_logprob", False)
    top = body.get("top_logprobs_num", 0)
    req.top_logprobs_num = _int(top or 0, "top_logprobs_num", 0, MAX_TOP_LOGPROBS)
    req.bootstrap_room, req.bootstrap_host, req.bootstrap_port = parse_bootstrap(
        body, require_room, "a disaggregated worker is called through a PD router, or with "
        f"bootstrap_host/bootstrap_port/bootstrap_room (bootstrap_host {FAKE_BOOTSTRAP_HOST!r}: "
        "prefill only)")
    return req


def top_logprobs(logits: Any, k: int, decode: Any) -> list[list[Any]]:
    """SGLang's ``output_top_logprobs`` entry for one position: [[logprob, id, text], ...]."""
    import torch

    lp = torch.log_softmax(logits.float(), dim=-1)
    vals, idx = torch.topk(lp, k)
    return [[float(v), int(i), decode([int(i)])] for v, i in zip(vals.tolist(), idx.tolist())]


def generate_response(rid: str, text: str, output_ids: list[int], prompt_tokens: int,
                      finish: str, *, top: list[list[list[Any]]] | None = None,
                      extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The non-streamed ``/generate`` answer, shaped as SGLang's."""
    reason: dict[str, Any] = {"type": finish}
    if finish == "length":
        reason["length"] = len(output_ids)
    meta: dict[str, Any] = {"id": rid, "finish_reason": reason, "prompt_tokens": prompt_tokens,
                            "completion_tokens": len(output_ids), "cached_tokens": 0}
    if top is not None:
        meta["output_top_logprobs"] = top
    meta.update(extra or {})
    return {"text": text, "output_ids": output_ids, "meta_info": meta}


def tokenize_response(body: dict[str, Any], tokenizer: Any, context_length: int) -> dict[str, Any]:
    """``POST /tokenize`` {"prompt": str, "add_special_tokens": bool}."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' must be a string (one prompt; messages are not supported "
                            "here)", "invalid_value")
    special = _bool(body, "add_special_tokens", True)
    ids = tokenizer(prompt, add_special_tokens=special)["input_ids"]
    return {"tokens": ids, "count": len(ids), "max_model_len": context_length}
