"""`epdctl check` on three nodes whose RDMA/GPU tools print recorded real outputs, except one
node whose tools print garbage: the healthy nodes are still judged, the bad node is reported per
probe, and an unexpected reader error is one failed item naming node, tool and line.

The nodes are local processes (the real link agent, real subprocesses) with fake tool binaries
first on PATH; each fake prints a real output from tests/fixtures/preflight/real/ (prompt lines
of the paste removed). There is no RDMA or GPU here, so this is as close as the machine allows.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from epdctl.preflight import rdma_text
from epdctl.preflight.run import run_check
from epdctl.preflight.runners import LocalRunner
from epdctl.preflight.textprep import prepare
from epdctl.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "fixtures" / "preflight" / "real"
MODEL = str(ROOT / "models" / "tiny-qwen2vl")
GARBAGE = "Segmentation fault (core dumped)\n@@@ 0xdeadbeef \x1b[31m???\n"

TOPOLOGY = """\
name: real3
engine: embedded
launcher: local
model: {{path: {model}}}
defaults: {{host: 0.0.0.0}}
nodes:
  - {{name: n1, host: loop1, gpus: 2, nics: [{{name: mlx4_2, kind: ib, ip: 127.0.0.1}}]}}
  - {{name: n2, host: loop2, gpus: 2, nics: [{{name: mlx4_2, kind: ib, ip: 127.0.0.2}}]}}
  - {{name: n3, host: loop3, gpus: 2, nics: [{{name: mlx4_2, kind: ib, ip: 127.0.0.3}}]}}
roles:
  encoder: {{nodes: [n1], count: 1}}
  prefill: {{nodes: [n2], count: 1}}
  decode: {{nodes: [n3], count: 1}}
ports: {{base: 36300}}
"""


def _body(name: str) -> str:
    return prepare((REAL / name).read_text()).text.strip("\n") + "\n"


def _fake(bindir: Path, tool: str, script: str) -> None:
    path = bindir / tool
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _healthy_bin(tmp: Path) -> Path:
    """Tools printing real outputs; ibv_devinfo exits 1 as it did there (a VF failed to open)."""
    b = tmp / "healthy"
    b.mkdir()
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    for name in ("ibv_devinfo_failed_open_vfs_k8s.txt", "nvidia_smi_query_name_first.csv",
                 "nvidia_smi_L_quadro.txt", "lsmod_peermem_yaml_indented.txt"):
        (data / name).write_text(_body(name))
    _fake(b, "ibv_devinfo", f"cat {data}/ibv_devinfo_failed_open_vfs_k8s.txt\nexit 1\n")
    _fake(b, "ibstat", "exit 127\n")
    _fake(b, "nvidia-smi", f'case "$*" in *query-gpu*) cat {data}/nvidia_smi_query_name_first.csv;;'
                           f' *) cat {data}/nvidia_smi_L_quadro.txt;; esac\n')
    _fake(b, "lsmod", f"cat {data}/lsmod_peermem_yaml_indented.txt\n")
    _fake(b, "sh", 'if [ "$2" = "ulimit -l" ]; then echo unlimited; else exec /bin/sh "$@"; fi\n')
    return b


def _garbage_bin(tmp: Path) -> Path:
    b = tmp / "garbage"
    b.mkdir()
    (tmp / "garbage.txt").write_text(GARBAGE)
    for tool in ("ibv_devinfo", "ibstat", "nvidia-smi", "lsmod"):
        _fake(b, tool, f"cat {tmp}/garbage.txt\nexit 0\n")
    _fake(b, "sh", f'if [ "$2" = "ulimit -l" ]; then cat {tmp}/garbage.txt; '
                   f'else exec /bin/sh "$@"; fi\n')
    return b


def _runner(node: str, bindir: Path) -> LocalRunner:
    env = ("env", f"PATH={bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           f"PYTHONPATH={ROOT}")
    return LocalRunner(node, prefix=env, python=sys.executable)


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "real3.yaml"
    path.write_text(TOPOLOGY.format(model=MODEL))
    topo = load_topology(path)
    good, bad = _healthy_bin(tmp_path), _garbage_bin(tmp_path)
    return topo, {"n1": _runner("n1", good), "n2": _runner("n2", good), "n3": _runner("n3", bad)}


def _by_node(report) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for i in report.items:
        out.setdefault(i.node, {})[i.check] = i
    return out


def test_garbage_on_one_node_leaves_the_others_judged(cluster):
    topo, runners = cluster
    report = run_check(topo, runners)
    nodes = _by_node(report)
    for n in ("n1", "n2"):
        items = nodes[n]
        assert all(i.ok for i in items.values()), {c: i.detail for c, i in items.items() if not i.ok}
        # ibv_devinfo exited 1 (VFs failed to open) but printed the declared, healthy NIC
        assert items["nic mlx4_2 device"].ok and items["nic mlx4_2 state"].detail.startswith(
            "port 1 ACTIVE")
        assert items["gpus"].detail.startswith("5 GPU(s)")           # CSV read by column name
        assert items["ulimit -l"].detail == "unlimited" and items["gpudirect"].ok
    bad = nodes["n3"]
    for check in ("nic mlx4_2 device", "gpus", "ulimit -l", "gpudirect"):
        assert not bad[check].ok, check
        assert "not recognised: 'Segmentation fault (core dumped)'" in bad[check].detail, check
    assert not report.ok


def test_a_reader_crash_is_one_item_naming_node_tool_and_line(cluster, monkeypatch):
    topo, runners = cluster
    real = rdma_text.read_ibv_devinfo

    def brittle(text: str):
        for line in text.splitlines():
            if "0xdeadbeef" in line:
                raise ValueError("unexpected token")
        return real(text)

    monkeypatch.setattr(rdma_text, "read_ibv_devinfo", brittle)
    report = run_check(topo, runners)
    nodes = _by_node(report)
    crash = nodes["n3"]["ibv_devinfo read"]
    assert not crash.ok and "ValueError: unexpected token" in crash.detail
    assert "0xdeadbeef" in crash.detail                              # the offending line
    assert "nic mlx4_2 device" not in nodes["n3"]                   # that probe: one item
    assert {"gpus", "ulimit -l", "gpudirect"} <= set(nodes["n3"])   # other probes still judged
    for n in ("n1", "n2"):
        assert all(i.ok for i in nodes[n].values())


def test_cli_warns_and_strict_fails_on_a_real_roce_warning(tmp_path):
    """Every node's ibstat prints a real H100 RoCE node (gpud testdata) whose 100 Gb/s ports
    have an all-zero port GUID: a warning, so `check` passes and `check --strict` fails."""
    import subprocess

    b = _healthy_bin(tmp_path)
    (tmp_path / "data" / "ibstat.txt").write_text(_body("gpud_ibstat_h100_some_down_eth.txt"))
    _fake(b, "ibstat", f"cat {tmp_path}/data/ibstat.txt\n")
    _fake(b, "ibv_devinfo", "echo 'Failed to get IB devices list: Function not implemented' >&2\n"
                            "exit 255\n")
    path = tmp_path / "roce.yaml"
    path.write_text(TOPOLOGY.format(model=MODEL).replace("mlx4_2, kind: ib", "mlx5_1, kind: roce"))
    env = {**os.environ, "PATH": f"{b}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "epdctl", "check", str(path), *args],
                              capture_output=True, text=True, timeout=180, env=env)

    relaxed = cli()
    assert relaxed.returncode == 0, relaxed.stdout + relaxed.stderr
    assert "WARN" in relaxed.stdout and "all-zero port GUID" in relaxed.stdout
    assert "warning(s)" in relaxed.stdout
    strict = cli("--strict", "--json")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    import json

    doc = json.loads(strict.stdout)
    assert doc["ok"] is False and doc["strict"] is True and doc["warnings"] >= 3
    guid = [c for c in doc["checks"] if c["check"] == "nic mlx5_1 guid"]
    assert len(guid) == 3 and all(c["level"] == "warn" and c["ok"] for c in guid)
    assert "Traceback" not in relaxed.stderr + strict.stderr


def _perftest_bin(tmp: Path, name: str, client_fixture: str, code: int) -> Path:
    """ib_write_bw that answers --version, acts as server (real banner) without an address, and
    as client prints a real recorded client output."""
    b = tmp / name
    b.mkdir()
    banner = "\n".join(_body("ib_write_bw_server_waiting_cut.txt").splitlines()[:5]) + "\n"
    (b / "banner.txt").write_text(banner)
    (b / "client.txt").write_text(_body(client_fixture))
    _fake(b, "ib_write_bw",
          'case "$*" in *--version*) echo "Version: 6.22"; exit 0;; esac\n'
          'for a in "$@"; do last="$a"; done\n'
          'case "$last" in *.*.*.*) cat ' + f"{b}/client.txt; exit {code};; esac\n"
          f"cat {b}/banner.txt; sleep 1\n")
    return b


def test_links_run_ib_write_bw_between_rdma_nics_and_quote_its_errors(tmp_path):
    path = tmp_path / "pt.yaml"
    path.write_text(TOPOLOGY.format(model=MODEL).replace(
        "mlx4_2, kind: ib", "mlx5_0, kind: roce, speed_gbps: 0.5"))
    topo = load_topology(path)
    good = _perftest_bin(tmp_path, "good", "ib_write_bw_post_list_gbits.txt", 0)
    bad = _perftest_bin(tmp_path, "bad", "ib_write_bw_client_rts.txt", 1)
    runners = {"n1": _runner("n1", good), "n2": _runner("n2", bad), "n3": _runner("n3", good)}
    report = run_check(topo, runners, links=True, seconds=0.2, agent_port=36960)
    pt = {i.node: i for i in report.items if i.check.startswith("ib_write_bw")}
    assert set(pt) == {"n1->n2", "n2->n3"}
    assert pt["n1->n2"].ok and "0.48 Gb/s ib_write_bw average (Ethernet)" in pt["n1->n2"].detail
    assert "96% of 0.5 Gb/s" in pt["n1->n2"].detail
    fail = pt["n2->n3"]
    assert not fail.ok and "Failed to modify QP to RTS" in fail.detail and "GID index" in fail.detail


def test_a_failed_mooncake_pair_carries_the_engine_error_and_its_cause():
    from epdctl.preflight.links import Endpoint, LinkPair, _Server, _send
    from epdctl.preflight.runners import Completed

    log = _body("mooncake_bench_rtr_timeout.txt")

    class Sender:
        node, python = "n1", sys.executable

        def run(self, argv, timeout):
            doc = '{"ok": false, "reason": "stalled: 10.0.0.2:36900 stopped acknowledging data"}'
            return Completed(0, doc + "\n", log)

    a = Endpoint("n1", "mlx5_0", "roce", "10.0.0.1", 200.0)
    b = Endpoint("n2", "mlx5_0", "roce", "10.0.0.2", 200.0)
    pair = LinkPair(a, b, ("kv",))
    servers = {("n2", "mlx5_0", "10.0.0.2"): _Server(b, 36900, None, None)}
    r = _send(pair, Sender(), servers, "mooncake", 0.5, 0.8, 3.0)
    assert not r.ok and r.reason.startswith("stalled")
    assert "Failed to modify QP to RTR" in r.reason and "MC_GID_INDEX" in r.reason
