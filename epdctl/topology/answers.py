"""``check: {answers: FILE, min_correct: 0.9}``: the answer check `up` runs before it reports
ready (epdctl/answers/ runs it). ``answers`` is the user's JSONL file, relative to the topology."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epdctl.topology.model import AnswerCheck
from epdctl.topology.reader import Reader

CHECK_KEYS = ("answers", "min_correct")


def read_check(r: Reader, top: dict[str, Any], source: Path | None) -> AnswerCheck | None:
    m = r.section(top, "check", CHECK_KEYS)
    if m is None:
        return None
    answers = r.get(m, "check", "answers", "str", required=True)
    least = r.get(m, "check", "min_correct", "float", default=1.0)
    if least is not None and not 0 < least <= 1:
        r.problem("check.min_correct", f"min_correct is the share of answers that must be right, in "
                                       f"(0, 1] (e.g. 0.9); got {least}")
        least = 1.0
    if answers is None:
        return None
    path = Path(answers).expanduser()
    if not path.is_absolute() and source is not None:
        path = source.resolve().parent / path
    return AnswerCheck(answers=str(path), min_correct=float(least))
