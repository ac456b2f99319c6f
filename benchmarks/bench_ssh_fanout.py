"""How long SSH fan-out takes: one node, N nodes in parallel, N nodes one after another.

Starts N real sshd daemons on 127.0.0.2.. (tests/sshd_nodes.py) and times, with the real ssh
launcher, what `up` does per node before any model loads (connect + host-key check + setup
lines + epdctl version check + run folder, then a detached start of a trivial process), and
what `status` does (one poll per node over warm connections, and over fresh ones), then stops
everything. Measured, not asserted: the figures depend on the machine (handshakes are CPU-bound,
so a 2-core machine caps the parallel speed-up).

    .venv/bin/python benchmarks/bench_ssh_fanout.py [--nodes 24] [--repeat 3]

Prints a table and writes benchmarks/results/ssh_fanout.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sshd_nodes import SshdNodes  # noqa: E402

from epdctl.launchers.ssh.fanout import fanout, raise_if_failed  # noqa: E402
from epdctl.state.store import ProcessRecord  # noqa: E402
from epdctl.launchers.ssh import SSHLauncher  # noqa: E402
from epdctl.launchers.ssh.nodes import NodeAccess  # noqa: E402
from epdctl.launchers.ssh.conn import SSHOptions, SSHTarget  # noqa: E402

PORT = 35024
TRIVIAL = ("sleep", "600")


def launcher(nodes: dict[str, NodeAccess], opts: SSHOptions, run_root: Path,
             parallel: bool) -> SSHLauncher:
    return SSHLauncher(nodes=nodes, cluster="bench", options=opts, run_root=str(run_root),
                       parallel=parallel, settle=0.0)


def up_like(lau: SSHLauncher, names: list[str]) -> list[ProcessRecord]:
    """Per node: prepare (setup, version check, run folder) then start one detached process."""
    def one(node: str) -> ProcessRecord:
        lau.prepare_node(node)
        rec = ProcessRecord(f"w-{node}", "encoder", node, list(TRIVIAL))
        got = lau.start_on_node(node, [rec])[rec.name]
        if isinstance(got, Exception):
            raise got
        rec.handle = got
        return rec

    res = fanout({n: n for n in names}, lambda n, _: one(n), parallel=lau.parallel)
    raise_if_failed(res, "bench up")
    return list(res.ok.values())


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(case: str, names: list[str], nodes: dict[str, NodeAccess], opts: SSHOptions,
            run_root: Path, parallel: bool) -> dict[str, float]:
    lau = launcher(nodes, opts, run_root, parallel)
    t_up, handles = timed(lambda: up_like(lau, names))
    t_warm, polled = timed(lambda: lau.poll(handles))  # type: ignore[arg-type]
    assert polled.all_ok and all(s.alive for s in polled.ok.values()), polled.failed  # type: ignore[union-attr]
    lau.close()
    cold = launcher(nodes, opts, run_root, parallel)
    t_cold, polled = timed(lambda: cold.poll(handles))  # type: ignore[arg-type]
    assert polled.all_ok, polled.failed  # type: ignore[union-attr]
    t_stop, stopped = timed(lambda: cold.stop(handles, grace=5))  # type: ignore[arg-type]
    assert stopped.all_ok, stopped.failed  # type: ignore[union-attr]
    cold.close()
    return {"up_s": t_up, "poll_warm_s": t_warm, "poll_cold_s": t_cold, "stop_warm_s": t_stop}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=24, help="sshd daemons (16-32 meaningful)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-serial", action="store_true", help="skip the one-after-another case")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ssh_fanout.json")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="epd-bench-ssh-"))
    with SshdNodes(tmp / "sshd", args.nodes, port=PORT) as sshd:
        opts = SSHOptions(known_hosts=(str(sshd.known_hosts),), ssh_config=None)
        nodes = {n.name: NodeAccess(n.name, SSHTarget(n.name, n.host, sshd.user, n.port,
                                                      str(sshd.client_key)),
                                    ("export EPD_BENCH=1",), sys.executable)
                 for n in sshd.nodes}
        names = list(nodes)
        cases = [("1 node", names[:1], True), (f"{args.nodes} nodes parallel", names, True),
                 (f"{args.nodes} nodes serial", names, False)][:2 if args.no_serial else 3]
        runs: dict[str, list[dict[str, float]]] = {c[0]: [] for c in cases}
        for _ in range(args.repeat):
            for case, subset, parallel in cases:
                runs[case].append(measure(case, subset, nodes, opts, tmp / "runs", parallel))

    keys = ["up_s", "poll_warm_s", "poll_cold_s", "stop_warm_s"]
    summary = {case: {k: statistics.median(r[k] for r in rs) for k in keys}
               for case, rs in runs.items()}
    print(f"SSH fan-out, {args.nodes} sshd on 127.0.0.2-{args.nodes + 1}, median of "
          f"{args.repeat} (seconds)")
    print(f"{'case':<22}" + "".join(f"{k:>13}" for k in keys))
    for case, row in summary.items():
        print(f"{case:<22}" + "".join(f"{row[k]:>13.2f}" for k in keys))
    one, par = summary[cases[0][0]], summary[cases[1][0]]
    print(f"{args.nodes} nodes parallel / 1 node: " + ", ".join(
        f"{k} x{par[k] / one[k]:.1f}" for k in keys) + "  (goal: up, cold poll, stop each <= x2)")
    if not args.no_serial:
        ser = summary[cases[2][0]]
        print(f"parallel speed-up: up x{ser['up_s'] / par['up_s']:.1f}, "
              f"cold poll x{ser['poll_cold_s'] / par['poll_cold_s']:.1f}, "
              f"warm poll x{ser['poll_warm_s'] / par['poll_warm_s']:.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "nodes": args.nodes, "repeat": args.repeat, "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(), "python": platform.python_version(),
        "what": {"up_s": "prepare (connect, setup, version check, run folder) + detached start "
                         "of `sleep` on every node, fresh connections",
                 "poll_warm_s": "one status poll of every node over the open connections",
                 "poll_cold_s": "the same with fresh connections (a new `epdctl status`)",
                 "stop_warm_s": "TERM the recorded groups and confirm, after the cold poll"},
        "median": summary, "ratio_to_one_node": {k: par[k] / one[k] for k in keys},
        "runs": runs}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
