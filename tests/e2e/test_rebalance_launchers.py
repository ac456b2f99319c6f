"""Live role reassignment on the remote launchers, while a client keeps sending image requests.

The same scenario on the real local SLURM cluster (workers as job steps in one allocation,
`rebalance` stops a step with scancel and starts a new one in the same allocation) and on three
real sshd nodes: `epdctl up` (1 encoder, 1 prefill, 2 decodes, smg router, over 3 nodes),
`rebalance --encoder +1 --from decode --yes`, then `rebalance --decode +1 --from encoder --yes`,
all through the CLI; no request may fail and most answers must be right; `down` leaves no
worker process (and, on SLURM, no job).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest
import yaml

from conftest_ssh import sshd  # noqa: F401  (fixture)
from slurm_cluster import slurm_cluster
from test_rebalance_live import Client

from epdctl.http.probes import http
from epdctl.launchers.slurm import jobs

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "models" / "tiny-qwen2vl")


@dataclass
class Remote:
    name: str
    kind: str
    env: dict[str, str]
    state_file: Path

    def epdctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT,
                              text=True, capture_output=True, timeout=900)

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())


def _doc(name: str, launcher: str, nodes: list[dict[str, Any]], base: int) -> dict[str, Any]:
    a, b, c = (n["name"] for n in nodes)
    for n in nodes:
        n["shared"] = True  # a moved worker changes role on its node (CPU only)
    return {"name": name, "engine": "embedded", "launcher": launcher,
            "model": {"path": MODEL, "served_name": "tiny-qwen2vl",
                      "architecture": "Qwen2VLForConditionalGeneration"},
            "ports": {"base": base, "limit": base + 399}, "transfer": {"backend": "zmq"},
            "nodes": nodes,
            "roles": {"encoder": {"nodes": [a], "count": 1}, "prefill": {"nodes": [b], "count": 1},
                      "decode": {"nodes": [c], "count": 2}},
            "router": {"node": a, "host": "node", "implementation": "smg"}}


def _slurm_topology(tmp: Path) -> dict[str, Any]:
    nodes = [{"name": f"n{i}", "host": f"n{i}.slurm", "port_base": 37500 + 100 * i} for i in range(3)]
    doc = _doc("rb-slurm", "slurm", nodes, 37500)
    doc["slurm"] = {"partition": "debug", "time": "00:30:00"}
    doc["defaults"] = {"host": "node"}
    return doc


def _ssh_topology(tmp: Path, daemons: Any) -> dict[str, Any]:
    nodes = [{"name": n.name, "host": n.host,
              "ssh": {"user": daemons.user, "port": daemons.port, "key": str(daemons.client_key)},
              "setup": [f"export PATH={Path(sys.executable).parent}:$PATH"]}
             for n in daemons.nodes]
    doc = _doc("rb-ssh", "ssh", nodes, 36500)
    doc["defaults"] = {"host": "node"}
    return doc


@pytest.fixture(scope="module")
def sshd_port() -> int:
    return 35025  # not the other ssh suites' ports: they may run at once


@pytest.fixture(params=["slurm", "ssh"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Remote]:
    env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp_path / "state"))
    if request.param == "slurm":
        gen = slurm_cluster()
        next(gen)
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        env.pop("SLURM_JOB_ID", None)
        doc = _slurm_topology(tmp_path)
    else:
        gen = None
        daemons = request.getfixturevalue("sshd")
        env.update(EPDCTL_KNOWN_HOSTS=str(daemons.known_hosts), EPDCTL_SSH_CONFIG="",
                   EPDCTL_SSH_RUN_ROOT=str(tmp_path / "nodes"))
        doc = _ssh_topology(tmp_path, daemons)
    path = tmp_path / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = Remote(doc["name"], request.param, env,
               tmp_path / "state" / "clusters" / doc["name"] / "state.json")
    up = r.epdctl("up", str(path), "--timeout", "600", "--no-canary")
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{up.stdout}\n{up.stderr}"
        yield r
    finally:
        if r.state_file.exists():
            r.epdctl("down", r.name)
        if gen is not None:
            next(gen, None)


def _expect(r: Remote, enc: int, dec: int, settle: float = 30.0) -> None:
    """The counts seen three ways; the router's own health view may lag a new worker by a few
    of its 1 s health checks, so the check is retried for ``settle`` seconds."""
    deadline = time.monotonic() + settle
    while True:
        try:
            return _expect_once(r, enc, dec)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def _expect_once(r: Remote, enc: int, dec: int) -> None:
    st = r.state()
    router = next(p for p in st["processes"] if p["role"] == "router")
    routed = http("GET", router["url"] + "/workers", timeout=10).json()["workers"]
    pre = next(p for p in st["processes"] if p["role"] == "prefill")
    registry = f"http://{pre['host']}:{pre['encoder_bootstrap_port']}/list_encoder_urls"
    encoders = http("GET", registry, timeout=10).json()["encoder_urls"]
    view = json.loads(r.epdctl("status", r.name, "--json").stdout)
    summary = {k: (v["ready"], v["total"]) for k, v in view["summary"].items()}
    assert sum(w["worker_type"] == "decode" and w.get("is_healthy") for w in routed) == dec, routed
    assert len(encoders) == enc, encoders
    assert summary["encoder"] == (enc, enc) and summary["decode"] == (dec, dec), summary
    assert view["healthy"], view


def _ours(ports: set[int]) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if p.info["status"] == psutil.STATUS_ZOMBIE or not any("epdctl.runtime" in c or "smg" in c
                                                               for c in cmd):
            continue
        if any(cmd[i] == "--port" and cmd[i + 1].isdigit() and int(cmd[i + 1]) in ports
               for i in range(len(cmd) - 1)):
            out.append(p.pid)
    return out


def test_rebalance_back_and_forth_under_load_then_down(remote: Remote) -> None:
    st = remote.state()
    router = next(p for p in st["processes"] if p["role"] == "router")
    if remote.kind == "slurm":  # every worker is a step of one allocation
        assert {p["handle"]["job"] for p in st["processes"]} == {st["processes"][0]["handle"]["job"]}
        assert all(p["handle"]["step"] is not None for p in st["processes"])
    client = Client(router["url"])
    thread = threading.Thread(target=client.run, daemon=True)
    thread.start()
    try:
        _expect(remote, 1, 2)
        r1 = remote.epdctl("rebalance", remote.name, "--encoder", "+1", "--from", "decode", "--yes")
        assert r1.returncode == 0, r1.stdout + r1.stderr
        assert "decode-1 (decode) -> encoder-1 (encoder)" in r1.stdout
        _expect(remote, 2, 1)
        served = len(client.results)
        r2 = remote.epdctl("rebalance", remote.name, "--decode", "+1", "--from", "encoder", "--yes")
        assert r2.returncode == 0, r2.stdout + r2.stderr
        _expect(remote, 1, 2)
        deadline = time.monotonic() + 120
        while len(client.results) <= served and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        client.stop.set()
        thread.join(timeout=300)
    failures = [r for r in client.results if not r["ok"]]
    assert not failures, failures
    assert served > 0 and len(client.results) > served
    correct = sum(r["correct"] for r in client.results)
    assert correct >= len(client.results) // 2, (correct, len(client.results))

    st = remote.state()
    ports = {p["port"] for p in st["processes"]}
    job = st["processes"][0]["handle"].get("job")
    down = remote.epdctl("down", remote.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not remote.state_file.exists()
    if job:
        assert not jobs.poll([job])[job].active  # the allocation epdctl submitted is gone
    deadline = time.monotonic() + 60  # slurmstepd reaps its tasks after the step ended
    while _ours(ports) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ours(ports) == []
