"""`down` and the transfer store (epdctl/orchestrate/stores.py through the launcher's node jobs):
removed on each node after the processes stopped; a store that cannot be removed is said, with
its node and directory, without keeping a cluster whose processes are all gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from epdctl.state.store import ClusterDir, ClusterState


def _down(name: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epdctl", "down", name], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "EPDCTL_STATE_DIR": str(tmp_path / "state")})


def test_down_removes_the_store_on_its_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    store = tmp_path / "store"
    (store / "kv").mkdir(parents=True)
    (store / "kv" / "block.safetensors").write_bytes(b"x" * 64)
    ClusterDir("st").save(ClusterState(name="st", topology="t.yaml", launcher="local",
                                       stores={"local": [str(store)]}))
    proc = _down("st", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"removed the transfer store on local: {store}" in proc.stdout
    assert not store.exists() and ClusterDir("st").load() is None


def test_a_store_that_cannot_be_removed_is_named_and_the_cluster_forgotten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    ClusterDir("st").save(ClusterState(name="st", topology="t.yaml", launcher="local",
                                       stores={"local": ["relative/store"]}))
    proc = _down("st", tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert ("cluster st stopped, but its transfer store is still on 1 node(s):\n"
            "  [local] store relative/store: refusing to touch 'relative/store'\n"
            "remove it there by hand") in proc.stderr, proc.stderr
    assert ClusterDir("st").load() is None
