"""OpenAI chat-completions request parsing and errors (the answers: ``openai_out``).

Prefill and decode receive the *same* body from the router, so both parse it with the same
function and reject the same bad requests the same way. Errors are ``ApiError`` with an
OpenAI-shaped body; the servers' middleware turns them into responses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
               413: "invalid_request_error", 429: "rate_limit_error", 502: "server_error",
               503: "service_unavailable", 504: "timeout"}

ROLES = {"system", "user", "assistant", "developer", "tool"}
MAX_STOP_STRINGS = 4
MAX_JSON_DEPTH = 32
DEFAULT_MAX_TOKENS = 64


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body ``{"error": {"message", "type", "code"}}``."""

    def __init__(self, status: int, message: str, code: str | None = None, type_: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or _default_code(status)
        self.type = type_ or ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code)


def _default_code(status: int) -> str:
    return {400: "invalid_request", 404: "not_found", 413: "request_too_large", 502: "upstream_error",
            503: "unavailable", 504: "timeout"}.get(status, "internal_error")


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


@dataclass
class ChatRequest:
    """A validated chat request; image parts are replaced by ``{"type": "image"}``."""

    model: str
    messages: list[dict[str, Any]]
    image_refs: list[str]
    stream: bool = False
    include_usage: bool = False
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    return_token_ids: bool = False  # vLLM's extension: generated token ids in the answer
    ignore_eos: bool = False        # SGLang's and vLLM's extension: run to max_tokens
    force_transport: bool = False   # epdctl's: embeddings over the E->P transport even when small
    request_id: str = ""


def decode_json(raw: bytes) -> dict[str, Any]:
    """Body bytes → JSON object, or 400 that says what is wrong with it."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
    except RecursionError:  # the parser's own nesting limit
        raise ApiError(400, f"request body is nested more than {MAX_JSON_DEPTH} levels deep",
                       "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", "invalid_json")
    _check_depth(body)
    return body


def _check_depth(obj: Any) -> None:
    """400 for JSON nested deeper than MAX_JSON_DEPTH (no request needs more than a handful of levels)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ApiError(400, f"request body is nested more than {MAX_JSON_DEPTH} levels deep", "invalid_json")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((v, depth + 1) for v in children if isinstance(v, (dict, list)))


def parse_chat_request(body: dict[str, Any], served_name: str, *, max_images: int,
                       require_room: bool, context_length: int = 1 << 20) -> ChatRequest:
    """Validate an OpenAI chat request (plus the router's bootstrap fields)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "missing required field 'model' (string)", "missing_field")
    if model != served_name:
        raise ApiError(404, f"The model `{model}` does not exist; this worker serves `{served_name}`.",
                       "model_not_found")
    messages, refs = _parse_messages(body.get("messages"))
    if len(refs) > max_images:
        raise ApiError(400, f"too many images: {len(refs)} in the request, the limit is {max_images} "
                            "(limits.max_images_per_request)", "too_many_images")
    req = ChatRequest(model=model, messages=messages, image_refs=refs)
    req.stream = _bool(body, "stream", False)
    req.return_token_ids = _bool(body, "return_token_ids", False)
    req.ignore_eos = _bool(body, "ignore_eos", False)
    req.force_transport = _bool(body, "epd_force_transport", False)
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object", "invalid_value")
    req.include_usage = bool(opts.get("include_usage", False))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    req.max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else _int(max_tokens, "max_tokens", 1, 1 << 20)
    check_context(0, req.max_tokens, context_length)
    req.temperature = _num(body.get("temperature", 0.0), "temperature", 0.0, 2.0)
    req.top_p = _num(body.get("top_p", 1.0), "top_p", 0.0, 1.0)
    if req.top_p == 0.0:
        raise ApiError(400, "'top_p' must be > 0", "invalid_value")
    seed = body.get("seed")
    req.seed = None if seed is None else _int(seed, "seed", -(1 << 63), (1 << 64) - 1)
    n = body.get("n", 1)
    if n != 1:
        raise ApiError(400, "only n=1 is supported", "invalid_value")
    req.stop = _parse_stop(body.get("stop"))
    _parse_bootstrap(body, req, require_room)
    return req


def check_context(prompt_tokens: int, max_tokens: int, context_length: int) -> None:
    """Refuse what cannot fit, before any KV cache is sized for it."""
    if prompt_tokens + max_tokens > context_length:
        raise ApiError(400, f"This model's maximum context length is {context_length} tokens; the prompt has "
                            f"{prompt_tokens} and max_tokens asks for {max_tokens} more. Reduce max_tokens "
                            "or the prompt.", "context_length_exceeded")


def _parse_messages(messages: Any) -> tuple[list[dict[str, Any]], list[str]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "missing required field 'messages' (a non-empty list)", "missing_field")
    out: list[dict[str, Any]] = []
    refs: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ApiError(400, f"messages[{i}] must be an object", "invalid_value")
        role = msg.get("role")
        if role not in ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {sorted(ROLES)}", "invalid_value")
        content = msg.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise ApiError(400, f"messages[{i}].content must be a string or a list of parts", "invalid_value")
        parts = []
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                if not isinstance(url, str) or not url:
                    raise ApiError(400, f"{where}.image_url.url must be a non-empty string", "invalid_value")
                refs.append(url)
                parts.append({"type": "image"})
            else:
                raise ApiError(400, f"{where}: unsupported part (expected type 'text' with 'text' or "
                                    "'image_url' with 'image_url.url')", "invalid_value")
        out.append({"role": role, "content": parts})
    return out, refs


def _parse_stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "'stop' must be a non-empty string or a list of non-empty strings", "invalid_value")
    if len(stop) > MAX_STOP_STRINGS:
        raise ApiError(400, f"'stop' takes at most {MAX_STOP_STRINGS} strings", "invalid_value")
    return stop


def _parse_bootstrap(body: dict[str, Any], req: ChatRequest, require_room: bool) -> None:
    req.bootstrap_room, req.bootstrap_host, req.bootstrap_port = parse_bootstrap(
        body, require_room, "a disaggregated worker must be called through a PD router (or with "
        "bootstrap_host/bootstrap_port/bootstrap_room)")


def parse_bootstrap(body: dict[str, Any], require_room: bool,
                    hint: str) -> tuple[int | None, str | None, int | None]:
    """The PD router's (bootstrap_room, bootstrap_host, bootstrap_port), validated."""
    room = body.get("bootstrap_room")
    if room is None:
        if require_room:
            raise ApiError(400, f"missing 'bootstrap_room': {hint}", "missing_field")
        return None, None, None
    room = _int(room, "bootstrap_room", 0, (1 << 64) - 1)
    host = body.get("bootstrap_host")
    if host is not None and not isinstance(host, str):
        raise ApiError(400, "'bootstrap_host' must be a string", "invalid_value")
    port = body.get("bootstrap_port")
    return room, host, None if port is None else _int(port, "bootstrap_port", 1, 65535)


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be a boolean", "invalid_value")
    return value


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer", "invalid_value")
    if not lo <= value <= hi:
        raise ApiError(400, f"'{name}' must be between {lo} and {hi}", "invalid_value")
    return value


def _num(value: Any, name: str, lo: float, hi: float) -> float:
    if value is None:
        return lo if name == "temperature" else hi
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"'{name}' must be a number", "invalid_value")
    if not lo <= value <= hi:
        raise ApiError(400, f"'{name}' must be between {lo} and {hi}", "invalid_value")
    return float(value)
