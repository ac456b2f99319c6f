"""The answers file (JSONL): what it accepts (prompt or OpenAI messages with image URLs or data
URLs; expect or expect_regex) and how a bad line is named (file:line, what to write)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epdctl.answers.ask import AnswerReport, Outcome, render
from epdctl.answers.questions import load
from epdctl.errors import EpdctlError
from epdctl.shapes import plain_png
from epdctl.canary import build_messages


def _file(tmp_path: Path, *lines: object) -> Path:
    p = tmp_path / "answers.jsonl"
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return p


def test_prompts_messages_and_rules(tmp_path: Path) -> None:
    image = build_messages([plain_png("circle", "red")], "What is in each image?")
    qs = load(_file(tmp_path, "# a comment", "",
                    {"prompt": "Capital of France?", "expect": "Paris"},
                    {"id": "img", "messages": image, "expect_regex": r"red\s+circle", "max_tokens": 8},
                    {"messages": [{"role": "user", "content": [
                        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                        {"type": "text", "text": "What animal?"}]}], "expect": "cat"}))
    assert [q.name for q in qs] == ["line 3", "img", "line 5"]
    assert qs[0].messages == ({"role": "user", "content": "Capital of France?"},)
    assert qs[1].max_tokens == 8 and qs[1].judge("Picture 1: red  circle") and not qs[1].judge("blue circle")
    assert qs[0].judge("It is Paris.") and not qs[0].judge("paris")


@pytest.mark.parametrize("line, says", [
    ("{not json", "not valid JSON"),
    ({"expect": "x"}, "exactly one of `prompt`"),
    ({"prompt": "a", "messages": [], "expect": "x"}, "exactly one of `prompt`"),
    ({"prompt": "a"}, "exactly one of `expect`"),
    ({"prompt": "a", "expect": "x", "expect_regex": "y"}, "exactly one of `expect`"),
    ({"prompt": "a", "expect_regex": "("}, "not a valid regular expression"),
    ({"prompt": "a", "expect": "x", "answer": "y"}, "unknown key(s) answer"),
    ({"messages": [{"role": "robot", "content": "hi"}], "expect": "x"}, "messages[0] must be"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}],
      "expect": "x"}, "http(s) URL or a data:image/"),
    ({"prompt": "a", "expect": "x", "max_tokens": 0}, "max_tokens must be"),
])
def test_bad_lines_are_named(tmp_path: Path, line: object, says: str) -> None:
    p = _file(tmp_path, {"prompt": "ok", "expect": "ok"}, line)
    with pytest.raises(EpdctlError) as e:
        load(p)
    assert f"{p}:2:" in str(e.value) and says in str(e.value), str(e.value)


def test_empty_file_and_report(tmp_path: Path) -> None:
    with pytest.raises(EpdctlError, match="holds no question"):
        load(_file(tmp_path, "# only a comment"))
    qs = load(_file(tmp_path, {"prompt": "a", "expect": "b"}, {"prompt": "c", "expect": "d"}))
    rep = AnswerReport([Outcome(qs[0], True, "b"), Outcome(qs[1], False, "", "0 tokens generated (...)", 0)], 0.9)
    assert not rep.passed and rep.share == 0.5 and len(rep.zero_token) == 1
    lines = render(rep, "f.jsonl")
    assert lines[0].endswith("1/2 correct (50%; at least 90% needed): FAILED")
    assert lines[1] == "  miss [line 2]: 0 tokens generated (...); expected 'd'"
    assert AnswerReport([Outcome(qs[0], True, "b")] * 9 + [Outcome(qs[1], False)], 0.9).passed


def test_topology_check_block(tmp_path: Path) -> None:
    import yaml

    from epdctl.errors import TopologyError
    from epdctl.topology import load_topology

    root = Path(__file__).resolve().parents[1]
    doc = yaml.safe_load((root / "topologies" / "local.yaml").read_text())
    doc["model"]["path"] = str(root / "models" / "tiny-qwen2vl")
    doc["check"] = {"answers": "qa.jsonl", "min_correct": 0.9}
    topo_path = tmp_path / "t.yaml"
    topo_path.write_text(yaml.safe_dump(doc))
    chk = load_topology(topo_path).check
    assert chk is not None and chk.answers == str(tmp_path / "qa.jsonl") and chk.min_correct == 0.9
    for bad, where in (({"answers": "qa.jsonl", "min_correct": 1.5}, "check.min_correct"),
                       ({"min_correct": 0.5}, "check"), ({"answers": "q", "least": 1}, "check")):
        doc["check"] = bad
        topo_path.write_text(yaml.safe_dump(doc))
        with pytest.raises(TopologyError) as e:
            load_topology(topo_path)
        assert where in str(e.value), str(e.value)
