"""The model block: path / hf: sources, the shared cache, node-local staging; bad input named
with its YAML path and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from epdctl.errors import TopologyError
from epdctl.topology import topology_from_text
from epdctl.topology.model_source import parse_hub, snapshot_path
from epdctl.topology.model import HubRef

BODY = """\
name: t
engine: embedded
launcher: local
model:
{model}
roles:
  colocated: {{nodes: [n0], count: 1}}
nodes:
  - {{name: n0, host: 127.0.0.1}}
"""


def load(model: str, source: Path | None = None):  # type: ignore[no-untyped-def]
    return topology_from_text(BODY.format(model=model), source)


@pytest.mark.parametrize("text,repo,rev", [
    ("Qwen/Qwen2-VL-2B-Instruct", "Qwen/Qwen2-VL-2B-Instruct", "main"),
    ("org/name@v1.0", "org/name", "v1.0"),
    ("a/b@" + "0" * 40, "a/b", "0" * 40),
    ("a/b@refs/pr/3", "a/b", "refs/pr/3"),
])
def test_hub_references(text: str, repo: str, rev: str) -> None:
    assert parse_hub(text) == HubRef(repo, rev)


@pytest.mark.parametrize("text", ["name-only", "a/b/c", "a--b/c", "a/b@", "-a/b", "a/b@x y", "a/../b"])
def test_not_hub_references(text: str) -> None:
    assert parse_hub(text) is None


def test_hf_model_reads_the_snapshot_its_ref_names(tmp_path: Path) -> None:
    commit = "1" * 40
    refs = tmp_path / "hub" / "models--org--tiny" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text(commit)
    topo = load(f"  hf: org/tiny\n  cache: {tmp_path}")
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / commit
    assert topo.model.hub == HubRef("org/tiny", "main")
    assert topo.model.path == topo.model.origin == str(snap)
    assert topo.model.served_name == "org/tiny"
    assert topo.model.source == "hf:org/tiny@main"
    assert snapshot_path(str(tmp_path), HubRef("org/tiny", "v2")).name == "v2"  # not downloaded yet


def test_staged_model_is_read_from_the_stage_folder(tmp_path: Path) -> None:
    topo = load(f"  hf: org/tiny@{'2' * 40}\n  cache: {tmp_path}\n  stage: /local/nvme/tiny")
    assert topo.model.path == "/local/nvme/tiny"
    assert topo.model.origin.endswith("/snapshots/" + "2" * 40)
    topo = load("  path: ./w\n  stage: /local/w", tmp_path / "t.yaml")
    assert (topo.model.path, topo.model.origin) == ("/local/w", str(tmp_path / "w"))
    assert topo.model.served_name == "/local/w"  # the path the engines get names it


@pytest.mark.parametrize("model,path,line,words", [
    ("  hf: org/tiny", "model", 4, "model.cache"),
    ("  hf: not a repo\n  cache: /c", "model.hf", 5, "ORG/NAME"),
    ("  path: /m\n  hf: org/tiny", "model.hf", 6, "both path and hf"),
    ("  served_name: x", "model", 4, "path (a folder of weights) or hf"),
    ("  path: /m\n  cache: /c", "model.cache", 6, "hf: model"),
    ("  path: /m\n  stage: local/nvme", "model.stage", 6, "absolute"),
    ("  path: /m\n  stagee: /x", "model.stagee", 6, "did you mean 'stage'"),
])
def test_bad_model_blocks_are_named_with_their_line(model: str, path: str, line: int, words: str) -> None:
    with pytest.raises(TopologyError) as e:
        load(model)
    found = [p for p in e.value.problems if p.path == path]
    assert found, e.value.problems
    assert found[0].line == line and words in found[0].message, found[0]
