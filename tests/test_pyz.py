"""The one-file install: scripts/build_pyz.sh builds epdctl.pyz (shiv, dependencies from PyPI, no
torch), and the bare system Python (no venv, a scrubbed environment) runs it for validate, render,
render --launcher slurm, and up / status / down --launcher ssh against the real sshd nodes (the
workers on the nodes are the runtime of the nodes' own environment, as on a real cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from conftest_ssh import sshd  # noqa: F401
from sshd_nodes import SshdNodes

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path("/usr/bin/python3")
PORT_BASE = 35300

pytestmark = pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="no system /usr/bin/python3")


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/build_pyz.sh's output for the system Python: the one scripts/test.sh built during its
    set-up (EPDCTL_TEST_PYZ, built from this tree after .venv), else built here."""
    built = os.environ.get("EPDCTL_TEST_PYZ")
    if built and Path(built).is_file():
        return Path(built)
    out = tmp_path_factory.mktemp("pyz") / "epdctl.pyz"
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_pyz.sh")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "EPDCTL_PYZ": str(out), "PYTHON": str(SYSTEM_PYTHON)})
    assert proc.returncode == 0 and out.exists(), proc.stdout + proc.stderr
    print(f"\nbuilt {out.stat().st_size / 2**20:.1f} MiB in {time.monotonic() - t0:.1f} s")
    return out


@pytest.fixture(scope="module")
def sshd_port() -> int:
    return 35222


def _run(pyz: Path, home: Path, *args: str, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess:
    """The pyz under the system Python with nothing of this venv: no PYTHONPATH, a bare PATH."""
    base = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run([str(SYSTEM_PYTHON), str(pyz), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**base, **(env or {})})


def test_pyz_holds_the_control_plane_without_torch(pyz: Path) -> None:
    names = zipfile.ZipFile(pyz).namelist()
    tops = {n.split("/")[1] for n in names if n.startswith("site-packages/") and n.count("/") > 1}
    assert {"epdctl", "click", "yaml", "jinja2", "paramiko", "psutil", "bcrypt", "cryptography", "nacl",
            "prometheus_client"} <= tops
    assert not tops & {"torch", "PIL", "transformers", "numpy"}, tops
    assert "site-packages/epdctl/topology/topology.schema.json" in names


def test_validate_render_and_sbatch_with_the_bare_system_python(pyz: Path, tmp_path: Path) -> None:
    assert _run(pyz, tmp_path, "--version").stdout.startswith("epdctl, version")
    v = _run(pyz, tmp_path, "validate", "topologies/qwen2vl-epd.yaml")
    assert v.returncode == 0 and v.stdout.startswith("OK: qwen2vl-epd"), v.stdout + v.stderr
    r = _run(pyz, tmp_path, "render", "topologies/qwen2vl-epd.yaml", "--node", "p0")
    assert r.returncode == 0 and "sglang.launch_server" in r.stdout, r.stderr
    s = _run(pyz, tmp_path, "render", "topologies/slurm-local.yaml", "--launcher", "slurm")
    assert s.returncode == 0 and "#SBATCH --nodes=3" in s.stdout, s.stderr
    same = subprocess.run([sys.executable, "-m", "epdctl", "render", "topologies/slurm-local.yaml", "--launcher",
                           "slurm"], cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert s.stdout == same.stdout  # the pyz renders exactly what the source tree does
    bad = _run(pyz, tmp_path, "validate", "tests/topologies_bad/unknown_key.yaml")
    assert bad.returncode == 1 and "did you mean 'chunked_prefill_size'" in bad.stderr and "Traceback" not in bad.stderr


def _topology(tmp: Path, nodes: SshdNodes) -> Path:
    """topologies/ssh-3node.yaml on the test daemons; the nodes' python3 is this venv's."""
    src = ROOT / "topologies" / "ssh-3node.yaml"
    doc = yaml.safe_load(src.read_text())
    doc["name"] = "pyz-ssh"
    doc["model"]["path"] = str((src.parent / doc["model"]["path"]).resolve())
    doc["ports"] = {"base": PORT_BASE, "limit": PORT_BASE + 99}
    for node in doc["nodes"]:
        node["ssh"].update(user=nodes.user, port=nodes.port, key=str(nodes.client_key))
        node["setup"] = [f"export PATH={Path(sys.executable).parent}:$PATH"]
    out = tmp / "pyz-ssh.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@pytest.fixture()
def ssh_env(sshd: SshdNodes, tmp_path: Path) -> Iterator[dict[str, str]]:  # noqa: F811
    env = {"EPDCTL_STATE_DIR": str(tmp_path / "state"), "EPDCTL_KNOWN_HOSTS": str(sshd.known_hosts),
           "EPDCTL_SSH_CONFIG": "", "EPDCTL_SSH_RUN_ROOT": str(tmp_path / "nodes")}
    yield env


def test_up_status_down_over_ssh_from_the_pyz(pyz: Path, sshd: SshdNodes, ssh_env: dict[str, str],  # noqa: F811
                                              tmp_path: Path) -> None:
    topo = _topology(tmp_path, sshd)
    sd = tmp_path / "sd" / "targets.json"
    up = _run(pyz, tmp_path, "up", str(topo), "--launcher", "ssh", "--timeout", "600", "--prometheus-sd", str(sd),
              env=ssh_env, timeout=900)
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "is up in" in up.stdout and "canary" in (up.stdout + up.stderr).lower()
        targets = json.loads(sd.read_text())  # written by up, kept current on every state write
        assert sorted(t["labels"]["worker"] for t in targets) == ["decode-0", "encoder-0", "prefill-0", "router"]
        assert {t["labels"]["node"] for t in targets} == {"node-a", "node-b", "node-c"}
        st = _run(pyz, tmp_path, "status", "pyz-ssh", "--json", env=ssh_env)
        assert st.returncode == 0, st.stdout[-2000:] + st.stderr
        doc = json.loads(st.stdout)
        assert doc["healthy"] and {w["role"] for w in doc["workers"]} == {"encoder", "prefill", "decode", "router"}
        assert {w["node"] for w in doc["workers"]} == {"node-a", "node-b", "node-c"}
    finally:
        down = _run(pyz, tmp_path, "down", "pyz-ssh", env=ssh_env)
    assert down.returncode == 0 and "no recorded process remains" in down.stdout, down.stdout + down.stderr
    assert json.loads(sd.read_text()) == []  # down empties the targets
