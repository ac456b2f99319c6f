"""Hypothesis fuzzing of `epdctl validate`: mutated example topologies (deleted keys, changed
types, random scalars) and random bytes always give exit 0 or 1 with a message, never a crash."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epdctl.cli import cli

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [p.read_bytes() for p in sorted((ROOT / "topologies").glob("*.yaml"))]
EXAMPLES = [yaml.safe_load(t) for t in TEXTS]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
                    st.text(max_size=12), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5),
                                                                                             st.integers(), max_size=2))


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> str:
    doc = copy.deepcopy(draw(st.sampled_from(EXAMPLES)))
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["delete", "replace", "rename"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "rename" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = parent.pop(path[-1])
        else:
            parent[path[-1]] = draw(SCALARS)
    return yaml.safe_dump(doc, allow_unicode=True)


def _check(tmp: Path, data: bytes) -> None:
    target = tmp / "t.yaml"
    target.write_bytes(data)
    result = CliRunner().invoke(cli, ["validate", str(target)])
    assert result.exit_code in (0, 1), (result.exit_code, result.output, data[:300])
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.output.strip(), "validate printed nothing"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(text=mutated())
def test_mutated_examples_never_crash(tmp_path: Path, text: str) -> None:
    _check(tmp_path, text.encode("utf-8", "surrogatepass"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda s: s.encode("utf-8", "replace"))))
def test_random_bytes_never_crash(tmp_path: Path, data: bytes) -> None:
    _check(tmp_path, data)


@st.composite
def corrupted(draw: st.DrawFn) -> bytes:
    """Byte-level edits of an example file: cut a span, insert random bytes, duplicate a line."""
    data = bytearray(draw(st.sampled_from(TEXTS)))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["cut", "insert", "dup"]))
        if action == "cut":
            del data[i:i + draw(st.integers(1, 40))]
        elif action == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            lines = data.split(b"\n")
            j = draw(st.integers(0, len(lines) - 1))
            lines.insert(j, lines[j])
            data = bytearray(b"\n".join(lines))
    return bytes(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=corrupted())
def test_corrupted_examples_never_crash(tmp_path: Path, data: bytes) -> None:
    _check(tmp_path, data)


def test_alias_bomb_is_rejected(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}]"
              for i in range(1, 9)]
    (tmp_path / "t.yaml").write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "t.yaml")])
    assert result.exit_code == 1 and "too large" in result.output
