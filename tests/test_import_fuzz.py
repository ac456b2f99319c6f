"""Hypothesis fuzzing of `epdctl import`: the published launch sets with lines dropped, tokens
removed or replaced, and random text give a topology or one clear error, never a traceback."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epdctl.cli import cli
from epdctl.errors import EpdctlError

SETS = [p.read_text(encoding="utf-8") for p in sorted((Path(__file__).parent / "fixtures" / "launch_sets")
                                                      .glob("*.sh"))]
MANIFESTS = [p.read_text(encoding="utf-8") for p in sorted((Path(__file__).parent / "fixtures" / "launch_sets")
                                                           .glob("*/*.yaml"))]
TOKENS = st.sampled_from(["--nnodes", "--node-rank", "2", "x", "--dist-init-addr", "a:1", "--tp", "${X}", '"',
                          "\\", "--disaggregation-mode", "decode", "--encoder-only", "--port", "-1", "=", "--host"])


@st.composite
def mutated(draw: st.DrawFn, sets: list[str] = SETS) -> str:
    lines = draw(st.sampled_from(sets)).splitlines()
    for _ in range(draw(st.integers(1, 5))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "dup", "token", "cut"]))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        else:
            words = lines[i].split(" ")
            j = draw(st.integers(0, len(words)))
            words.insert(j, draw(TOKENS))
            lines[i] = " ".join(words)
    return "\n".join(lines) + "\n"


def _run(tmp: Path, text: str, name: str = "in.sh") -> None:
    src = tmp / name
    src.write_text(text, encoding="utf-8")
    res = CliRunner().invoke(cli, ["import", str(src), "-o", str(tmp / "out.yaml"), "--force"])
    # EpdctlError is what `epdctl`'s error boundary (cli.main) prints as one line; anything else would be
    # a traceback
    exc = res.exception
    assert exc is None or isinstance(exc, (SystemExit, EpdctlError)), repr(exc)
    if isinstance(exc, SystemExit):
        assert exc.code in (0, 1), res.output


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mutated())
def test_mutated_launch_sets_never_crash(tmp_path: Path, text: str) -> None:
    _run(tmp_path, text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=300))
def test_random_text_never_crashes(tmp_path: Path, text: str) -> None:
    _run(tmp_path, text)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mutated(MANIFESTS))
def test_mutated_manifests_never_crash(tmp_path: Path, text: str) -> None:
    _run(tmp_path, text, "in.yaml")
