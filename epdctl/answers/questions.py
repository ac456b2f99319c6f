"""The answers file: JSONL, one question a line.

Each object has ``prompt`` (text) or ``messages`` (OpenAI chat messages, images as ``image_url``
parts with http(s) or ``data:`` URLs), and ``expect`` (a substring of the answer) or
``expect_regex`` (a Python regular expression searched in it). Optional: ``id`` (a name for
reports), ``max_tokens`` (default 64). Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epdctl.errors import EpdctlError

KEYS = ("id", "prompt", "messages", "expect", "expect_regex", "max_tokens")
ROLES = ("system", "user", "assistant", "tool", "developer")


@dataclass(frozen=True)
class Question:
    name: str
    messages: tuple[dict[str, Any], ...]
    expect: str | None = None
    expect_regex: re.Pattern[str] | None = None
    max_tokens: int = 64
    line: int = 0

    def judge(self, answer: str) -> bool:
        if self.expect is not None:
            return self.expect in answer
        assert self.expect_regex is not None
        return self.expect_regex.search(answer) is not None

    @property
    def wanted(self) -> str:
        return repr(self.expect) if self.expect is not None else f"/{self.expect_regex.pattern}/" \
            if self.expect_regex is not None else ""


def _messages(doc: dict[str, Any], where: str) -> tuple[dict[str, Any], ...]:
    if ("prompt" in doc) == ("messages" in doc):
        raise EpdctlError(f"{where}: give exactly one of `prompt` (text) or `messages` (OpenAI chat "
                          "messages)")
    if "prompt" in doc:
        if not isinstance(doc["prompt"], str) or not doc["prompt"].strip():
            raise EpdctlError(f"{where}: `prompt` must be non-empty text")
        return ({"role": "user", "content": doc["prompt"]},)
    msgs = doc["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise EpdctlError(f"{where}: `messages` must be a non-empty list of {{role, content}} objects")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES or "content" not in m:
            raise EpdctlError(f"{where}: messages[{i}] must be an object with `role` (one of "
                              f"{', '.join(ROLES)}) and `content`")
        content = m["content"]
        parts = content if isinstance(content, list) else [] if isinstance(content, str) else None
        if parts is None:
            raise EpdctlError(f"{where}: messages[{i}].content must be text or a list of parts")
        for j, p in enumerate(parts):
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "image_url":
                url = (p.get("image_url") or {}).get("url") if isinstance(p.get("image_url"), dict) else None
                if not isinstance(url, str) or not url.startswith(("http://", "https://", "data:image/")):
                    raise EpdctlError(f"{where}: messages[{i}].content[{j}].image_url.url must be an "
                                      "http(s) URL or a data:image/... URL")
            elif kind != "text" or not isinstance(p.get("text"), str):
                raise EpdctlError(f"{where}: messages[{i}].content[{j}] must be {{type: text, text}} "
                                  "or {type: image_url, image_url: {url}}")
    return tuple(msgs)


def _question(doc: Any, where: str, n: int, line: int) -> Question:
    if not isinstance(doc, dict):
        raise EpdctlError(f"{where}: each line must be a JSON object")
    unknown = sorted(set(doc) - set(KEYS))
    if unknown:
        raise EpdctlError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}")
    msgs = _messages(doc, where)
    if ("expect" in doc) == ("expect_regex" in doc):
        raise EpdctlError(f"{where}: give exactly one of `expect` (a substring of the answer) or "
                          "`expect_regex`")
    expect, regex = doc.get("expect"), None
    if expect is not None and (not isinstance(expect, str) or not expect):
        raise EpdctlError(f"{where}: `expect` must be non-empty text")
    if "expect_regex" in doc:
        try:
            regex = re.compile(str(doc["expect_regex"]))
        except re.error as e:
            raise EpdctlError(f"{where}: expect_regex is not a valid regular expression: {e}") from e
    mt = doc.get("max_tokens", 64)
    if not isinstance(mt, int) or isinstance(mt, bool) or not 1 <= mt <= 65536:
        raise EpdctlError(f"{where}: max_tokens must be an integer from 1 to 65536")
    return Question(str(doc.get("id") or f"line {line}"), msgs, expect, regex, mt, line)


def load(path: str | Path) -> list[Question]:
    """Every question of the file; EpdctlError naming the file and line of the first bad one."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise EpdctlError(f"cannot read the answers file {p}: {e.strerror or e}") from e
    out: list[Question] = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        where = f"{p}:{line}"
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise EpdctlError(f"{where}: not valid JSON ({e})") from e
        out.append(_question(doc, where, len(out), line))
    if not out:
        raise EpdctlError(f"the answers file {p} holds no question (one JSON object a line)")
    return out
