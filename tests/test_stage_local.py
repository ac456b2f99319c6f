"""Staging logic with the node agent run as real local processes (no servers): the manifest, the
room check, the copy, the verification of what a node already holds, and the errors."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hub_server import HubServer

from epdctl.errors import StageError
from epdctl.stage import require_staged_here
from epdctl.launchers.streams import ProcessJobs
from epdctl.stage import manifest as manifests
from epdctl.stage import nodes as staging
from epdctl.stage.events import NodeProgress, NodeStaged, SpaceChecked
from epdctl.topology import topology_from_text

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny-qwen2vl"


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    src = tmp_path / "shared" / "w"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a" * 5000)
    (src / "sub" / "b.bin").write_bytes(bytes(range(256)) * 40)
    (src / "big.safetensors").write_bytes(TINY.joinpath("model.safetensors").read_bytes())
    return src


def jobs(*names: str) -> dict[str, ProcessJobs]:
    return {n: ProcessJobs(n, sys.executable) for n in names}


def test_manifest_is_reused_until_a_file_changes(origin: Path, tmp_path: Path) -> None:
    man, reused = manifests.build(str(origin))
    assert not reused and [f[0] for f in man.files] == ["a.bin", "big.safetensors", "sub/b.bin"]
    manifests.write(man, tmp_path / "m.json")
    again, reused = manifests.build(str(origin), manifests.load(tmp_path / "m.json"))
    assert reused and again.digest == man.digest
    (origin / "a.bin").write_bytes(b"b" * 5000)
    changed, reused = manifests.build(str(origin), again)
    assert not reused and changed.digest != man.digest


def test_copy_verify_and_recopy(origin: Path, tmp_path: Path) -> None:
    man, _ = manifests.build(str(origin))
    dest = tmp_path / "node-disk" / "w"
    events = list(staging.check_space(jobs("n0"), man, str(dest)))
    assert isinstance(events[0], SpaceChecked) and events[0].need == man.bytes and events[0].free > man.bytes
    events = list(staging.copy(jobs("n0"), man, str(dest)))
    done = [e for e in events if isinstance(e, NodeStaged)]
    assert done[0].copied == ("a.bin", "big.safetensors", "sub/b.bin") and done[0].bytes == man.bytes
    assert any(isinstance(e, NodeProgress) and e.done == e.total == man.bytes for e in events)
    assert (dest / "sub" / "b.bin").read_bytes() == (origin / "sub" / "b.bin").read_bytes()
    assert json.loads((dest / ".epdctl-manifest.json").read_text())["files"] == [list(f) for f in man.files]
    data = bytearray((dest / "big.safetensors").read_bytes())
    data[1000] ^= 0xFF  # same size, other bytes
    (dest / "big.safetensors").write_bytes(bytes(data))
    done = [e for e in staging.copy(jobs("n0"), man, str(dest)) if isinstance(e, NodeStaged)]
    assert done[0].recopied == ("big.safetensors",) and done[0].copied == () and done[0].kept == 2
    assert (dest / "big.safetensors").read_bytes() == (origin / "big.safetensors").read_bytes()


def test_no_stage_needs_a_finished_copy_here(origin: Path, tmp_path: Path) -> None:
    """`up --no-stage`: a stage folder without the copy's manifest (never staged, or a copy cut
    short) is refused with the fix; a finished copy passes."""
    dest = tmp_path / "node-disk" / "w"
    topo = topology_from_text(f"""
name: t
engine: embedded
model: {{path: {origin}, served_name: m, stage: {dest}}}
nodes: [{{name: a, host: 127.0.0.1}}]
roles: {{colocated: {{nodes: [a], count: 1}}}}
""")
    with pytest.raises(StageError, match=rf"model.stage {dest} holds no staged copy of {origin} .*"
                                         rf"run `epdctl stage t.yaml` first, or drop --no-stage"):
        require_staged_here(topo, Path("t.yaml"))
    man, _ = manifests.build(str(origin))
    list(staging.copy(jobs("n0"), man, str(dest)))
    require_staged_here(topo, Path("t.yaml"))
    require_staged_here(dataclasses.replace(topo, model=dataclasses.replace(topo.model, stage=None)),
                        Path("t.yaml"))  # nothing staged: nothing to check


def test_an_origin_changed_since_the_manifest_fails_that_node(origin: Path, tmp_path: Path) -> None:
    man, _ = manifests.build(str(origin))
    (origin / "a.bin").write_bytes(b"c" * 5000)
    with pytest.raises(StageError) as e:
        list(staging.copy(jobs("n0"), man, str(tmp_path / "d")))
    assert "[n0] a.bin" in str(e.value) and "the origin changed since the manifest" in str(e.value)


def test_every_node_that_cannot_stage_is_named_before_copying(origin: Path, tmp_path: Path) -> None:
    man, _ = manifests.build(str(origin))
    bad = {**jobs("ok"), "gone": ProcessJobs("gone", "/nonexistent/python3")}
    with pytest.raises(StageError) as e:
        list(staging.check_space(bad, man, str(tmp_path / "d")))
    assert "[gone] cannot check" in str(e.value) and "[ok]" not in str(e.value)
    missing = manifests.Manifest(str(tmp_path / "nowhere"), man.files)
    with pytest.raises(StageError) as e:
        list(staging.check_space(jobs("n0", "n1"), missing, str(tmp_path / "d")))
    assert "[n0] cannot read 3 file(s)" in str(e.value) and "[n1] cannot read" in str(e.value)
    assert not (tmp_path / "d").exists()


def test_an_empty_or_missing_origin_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="does not exist here"):
        manifests.build(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(StageError, match="holds no file"):
        manifests.build(str(tmp_path / "empty"))


def _cli(tmp_path: Path, hub: HubServer, model: str) -> "subprocess.CompletedProcess[str]":
    topo = tmp_path / "t.yaml"
    topo.write_text(f"name: t\nengine: embedded\nlauncher: local\nmodel:\n{model}\n"
                    "roles:\n  colocated: {nodes: [n0], count: 1}\nnodes:\n  - {name: n0, host: 127.0.0.1}\n")
    env = {**os.environ, "HF_ENDPOINT": hub.url, "EPDCTL_STATE_DIR": str(tmp_path / "state"),
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)  # set by the runtime's import in this process; it means offline too
    return subprocess.run([sys.executable, "-m", "epdctl", "stage", str(topo)], env=env, text=True,
                          capture_output=True, timeout=120)


def test_hf_download_once_and_its_errors(tmp_path: Path) -> None:
    """The real huggingface_hub client against a local hub (an ephemeral port)."""
    with HubServer({"org/tiny": TINY}) as hub:
        cache = tmp_path / "hf"
        ok = _cli(tmp_path, hub, f"  hf: org/tiny\n  cache: {cache}")
        assert ok.returncode == 0, ok.stderr
        commit = hub.repos["org/tiny"].commit
        assert f"is commit {commit}: 8 files" in ok.stdout
        assert (cache / "hub" / "models--org--tiny" / "refs" / "main").read_text() == commit
        again = _cli(tmp_path, hub, f"  hf: org/tiny\n  cache: {cache}")
        assert again.returncode == 0 and set(hub.fetched("org/tiny").values()) == {1}
        for model, words in [
            (f"  hf: org/other\n  cache: {cache}", "the hub has no repository org/other"),
            (f"  hf: org/tiny@v9\n  cache: {cache}", "the hub has no revision 'v9' of org/tiny"),
        ]:
            bad = _cli(tmp_path, hub, model)
            assert bad.returncode == 1 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
