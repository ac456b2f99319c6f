"""The embedded runtime's transfer endpoints get ports from the topology's range, checked like the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from epdctl.errors import TopologyError
from epdctl.render import build_plan
from epdctl.topology import topology_from_text

ROOT = Path(__file__).resolve().parents[1]
LOCAL = (ROOT / "topologies" / "local.yaml").read_text()


def _topo(text: str):
    return topology_from_text(text, ROOT / "topologies" / "t.yaml")


def _flag(argv: tuple[str, ...], flag: str) -> int:
    return int(argv[argv.index(flag) + 1])


def test_every_transfer_endpoint_is_rendered_inside_the_range_and_unique() -> None:
    plan = build_plan(_topo(LOCAL))
    transfer = {w.name: _flag(w.argv, "--transfer-port") for w in plan.workers}
    assert set(transfer) == {"encoder-0", "encoder-1", "prefill-0", "decode-0"}
    used = [w.port for w in plan.workers] + [p for w in plan.workers for p in (w.bootstrap_port,
                                                                                w.encoder_bootstrap_port) if p]
    assert plan.router is not None
    used += [plan.router.port, plan.router.prometheus_port]
    assert all(31000 <= p <= 31099 for p in transfer.values())
    assert len(set(transfer.values()) | set(used)) == len(transfer) + len(used)  # no port twice
    assert [w.port for w in plan.workers] == [31000, 31001, 31002, 31005]  # earlier ports did not move


def test_colocated_workers_get_no_transfer_port() -> None:
    text = LOCAL.split("roles:")[0] + "roles:\n  colocated:\n    nodes: [local]\n    count: 1\n" + \
        "router:\n  node: local\n  host: 127.0.0.1\n  implementation: smg\n"
    plan = build_plan(_topo(text))
    assert all("--transfer-port" not in w.argv for w in plan.workers)


def test_explicit_transfer_port_collision_is_reported_with_its_path() -> None:
    text = LOCAL.replace("  decode:\n    nodes: [local]\n    count: 1",
                         "  decode:\n    workers:\n      - {node: local, port: 31050, transfer_port: 31050}")
    with pytest.raises(TopologyError, match=r"roles\.decode\.workers\[0\]: port 31050 .* used twice: by "
                                            r"decode-0 http and by decode-0 transfer"):
        _topo(text)


def test_a_range_too_small_for_the_transfer_ports_is_an_error() -> None:
    with pytest.raises(TopologyError, match="ran out of ports"):
        build_plan(_topo(LOCAL.replace("limit: 31099", "limit: 31009")))


def test_runtime_refuses_a_busy_transfer_port_at_once() -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as s, socket.socket() as free:
        s.bind(("127.0.0.1", 0))
        s.listen()
        free.bind(("127.0.0.1", 0))
        busy, http = s.getsockname()[1], free.getsockname()[1]
        free.close()
        out = subprocess.run([sys.executable, "-m", "epdctl.runtime", "decode", "--model-path",
                              str(ROOT / "models" / "tiny-qwen2vl"), "--port", str(http), "--transfer-port", str(busy)],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"epdctl.runtime decode: error: cannot listen on 127.0.0.1:{busy}")
    assert "Traceback" not in out.stderr
