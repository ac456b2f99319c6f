"""Ask every question through the router; judge each answer; never count an empty one.

A response with 0 generated tokens (``usage.completion_tokens`` 0, or no text) is a failure of
its own kind: a pipeline that returns nothing (a decode whose KV never arrived, a missing
``nvidia_peermem``) answers instantly, and must never read as a fast success.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from epdctl.answers.questions import Question
from epdctl.http.probes import http

ZERO_TOKENS = "0 tokens generated"


@dataclass
class Outcome:
    question: Question
    ok: bool
    answer: str = ""
    problem: str = ""          # '' | 'wrong answer' | ZERO_TOKENS ... | 'HTTP 503: ...'
    tokens: int | None = None
    seconds: float = 0.0


@dataclass
class AnswerReport:
    outcomes: list[Outcome] = field(default_factory=list)
    min_correct: float = 1.0

    @property
    def correct(self) -> int:
        return sum(o.ok for o in self.outcomes)

    @property
    def share(self) -> float:
        return self.correct / len(self.outcomes) if self.outcomes else 0.0

    @property
    def passed(self) -> bool:
        return bool(self.outcomes) and self.share + 1e-9 >= self.min_correct

    @property
    def zero_token(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.problem.startswith(ZERO_TOKENS)]


def _ask(url: str, model: str, headers: dict[str, str], q: Question, timeout: float) -> Outcome:
    body = {"model": model, "messages": list(q.messages), "max_tokens": q.max_tokens,
            "temperature": 0.0, "stream": False}
    t0 = time.monotonic()
    r = http("POST", url.rstrip("/") + "/v1/chat/completions", body, timeout=timeout, headers=headers)
    took = time.monotonic() - t0
    doc = r.json()
    if not r.ok or not isinstance(doc, dict):
        detail = r.body[:200].decode(errors="replace").strip() or r.error
        return Outcome(q, False, problem=f"HTTP {r.status}: {detail}", seconds=took)
    try:
        answer = str(doc["choices"][0]["message"]["content"] or "")
    except (KeyError, IndexError, TypeError):
        return Outcome(q, False, problem=f"malformed completion: {str(doc)[:200]}", seconds=took)
    usage = doc.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    tokens = int(tokens) if isinstance(tokens, int) and not isinstance(tokens, bool) else None
    if tokens == 0 or not answer.strip():
        return Outcome(q, False, answer, f"{ZERO_TOKENS} (the response came back empty in "
                       f"{took * 1000:.0f} ms)", tokens, took)
    ok = q.judge(answer)
    return Outcome(q, ok, answer, "" if ok else "wrong answer", tokens, took)


def ask_all(router_url: str, questions: list[Question], *, model: str | None = None,
            api_key_env: str | None = None, min_correct: float = 1.0, timeout: float = 120.0,
            parallel: int = 4) -> AnswerReport:
    """Every question, ``parallel`` at a time, in the file's order in the report."""
    from epdctl.canary.request import model_id

    headers: dict[str, str] = {}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    model = model or model_id(router_url, headers)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        outcomes = list(pool.map(lambda q: _ask(router_url, str(model), headers, q, timeout),
                                 questions))
    return AnswerReport(outcomes, min_correct)


def render(report: AnswerReport, source: Any) -> list[str]:
    """The verdict line, then one line per question that failed."""
    verdict = "passed" if report.passed else "FAILED"
    out = [f"answer check ({source}): {report.correct}/{len(report.outcomes)} correct "
           f"({report.share:.0%}; at least {report.min_correct:.0%} needed): {verdict}"]
    for o in report.outcomes:
        if o.ok:
            continue
        got = " ".join(o.answer.split())[:160]
        out.append(f"  miss [{o.question.name}]: {o.problem}; expected {o.question.wanted}"
                   + (f", got {got!r}" if got else ""))
    return out
