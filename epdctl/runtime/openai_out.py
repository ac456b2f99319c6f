"""What the OpenAI chat-completions API answers: text streamed with stop strings held back,
completion bodies, SSE chunks and usage."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable


class TextStream:
    """Incremental detokenization with stop strings.

    Text that could still turn into a stop string is held back, so a streamed client never
    sees part of a stop string; ``stopped`` becomes True once one is found.
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]):
        self._decode = decode
        self._stop = stop
        self.ids: list[int] = []
        self.text = ""
        self._emitted = 0
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now safe to show."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        text = self._decode(self.ids)
        stable = len(text.rstrip("\ufffd"))  # an incomplete UTF-8 sequence decodes to U+FFFD
        for s in self._stop:
            idx = text.find(s, self._emitted)
            if idx != -1 and (not self.stopped or idx < len(self.text)):
                self.stopped = True
                self.text = text[:idx]
        if self.stopped:
            return self._take(len(self.text))
        self.text = text
        return self._take(stable - self._holdback(text[:stable]))

    def finish(self) -> str:
        """The rest of the text once the sequence ended without a stop string."""
        return self._take(len(self.text))

    def _holdback(self, text: str) -> int:
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _take(self, end: int) -> str:
        if end <= self._emitted:
            return ""
        out = self.text[self._emitted:end]
        self._emitted = end
        return out


def new_completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_completion(cid: str, model: str, text: str, finish_reason: str, use: dict[str, int],
                    timings: dict[str, float] | None, token_ids: list[int] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": use,
    }
    if token_ids is not None:
        body["choices"][0]["token_ids"] = token_ids
    if timings is not None:
        body["timings"] = timings
    return body


def chunk(cid: str, model: str, created: int, delta: dict[str, Any], finish_reason: str | None = None,
          use: dict[str, int] | None = None, timings: dict[str, float] | None = None,
          token_ids: list[int] | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    body: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                            "choices": [choice]}
    if use is not None:
        body["usage"] = use
    if timings is not None:
        body["timings"] = timings
    return body


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
