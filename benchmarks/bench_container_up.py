"""`epdctl up` to serving, bare vs in containers, side by side in one run: on this machine
(launcher local), over the 3 real sshd test nodes (launcher ssh) and in the real local SLURM
(launcher slurm).

local and ssh run topologies/local-container.yaml's workers (2 encoders, 1 prefill, 1 decode, the
smg router; embedded engine, the same venv and model): "bare" with ``container: false``, "podman"
with its container block (the Debian image scripts/build_container_image.sh builds). The ssh
variants put them on topologies/ssh-3node.yaml's nodes, each node a real sshd on 127.0.0.2-4
(tests/sshd_nodes.py) whose podman runs that node's containers. slurm runs
topologies/slurm-oci.yaml (1 encoder, 1 prefill, 1 decode on three nodes of scripts/slurm_local.sh):
"bare" steps vs "slurm-oci" steps (``srun --container=`` the bundle scripts/build_oci_bundle.py
exports from the same image, run by runc through oci.conf). Each round runs every variant,
alternating the bare/container order, through the real CLI (`up --skip-preflight`, which ends after
the canary answered; on SLURM it also submits the allocation), then `down`. Prints per-run seconds
(the CLI's wall time and `up`'s own "is up in" figure) and, per launcher, the container/bare ratio
of the medians; writes benchmarks/results/container_up.json (container_up_slurm.json for
``--launchers slurm``).

    flock /tmp/epd-heavy.lock .venv/bin/python benchmarks/bench_container_up.py --repeat 2 \\
        --port-base 32310 --sshd-port 32300
    flock /tmp/epd-slurm.lock .venv/bin/python benchmarks/bench_container_up.py --launchers slurm --repeat 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from sshd_nodes import SshdNodes  # noqa: E402

TOPOLOGY = ROOT / "topologies" / "local-container.yaml"
SLURM = ROOT / "topologies" / "slurm-oci.yaml"
SSH_NODES = ROOT / "topologies" / "ssh-3node.yaml"
NAME = "bench-container"
CONTAINER = {"local": "podman", "ssh": "podman", "slurm": "slurm-oci"}


def variant(tmp: Path, launcher: str, bare: bool, ports: tuple[int, int], sshd: SshdNodes | None) -> Path:
    src = SLURM if launcher == "slurm" else TOPOLOGY
    doc = yaml.safe_load(src.read_text())
    doc.update(name=NAME, python=str(ROOT / ".venv" / "bin" / "python"),
               ports={"base": ports[0], "limit": ports[1]})
    doc["model"]["path"] = str(ROOT / "models" / "tiny-qwen2vl")
    c = dict(doc["container"])
    if c.get("mounts") or launcher != "slurm":
        c["mounts"] = [{"source": str(ROOT), "readonly": True}]
    if str(c["image"]).startswith("../"):  # a bundle path, relative to the topology's folder
        c["image"] = str((src.parent / c["image"]).resolve())
    doc["container"] = False if bare else c
    if launcher == "ssh":
        assert sshd is not None
        nodes = yaml.safe_load(SSH_NODES.read_text())
        for node in nodes["nodes"]:
            node["ssh"].update(user=sshd.user, port=sshd.port, key=str(sshd.client_key))
            node["setup"] = [f"export PATH={ROOT / '.venv' / 'bin'}:$PATH"]
        doc.update(launcher="ssh", nodes=nodes["nodes"], defaults=nodes["defaults"], router=nodes["router"])
        doc["roles"] = {role: {**spec, "nodes": nodes["roles"][role]["nodes"]} for role, spec in doc["roles"].items()}
    path = tmp / f"{launcher}-{'bare' if bare else CONTAINER[launcher]}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def one(topo: Path, env: dict[str, str]) -> dict[str, float]:
    cli = [sys.executable, "-m", "epdctl"]
    t0 = time.monotonic()
    up = subprocess.run([*cli, "up", str(topo), "--skip-preflight", "--timeout", "600"], env=env,
                        capture_output=True, text=True)
    wall = time.monotonic() - t0
    subprocess.run([*cli, "down", NAME], env=env, capture_output=True, text=True)
    if up.returncode != 0:
        raise SystemExit(f"up failed for {topo.name}:\n{up.stdout}\n{up.stderr}")
    m = re.search(r"is up in ([0-9.]+)s", up.stdout)
    return {"cli_s": round(wall, 2), "up_s": float(m.group(1)) if m else float("nan")}


@contextlib.contextmanager
def nodes(tmp: Path, wanted: bool, port: int) -> Iterator[SshdNodes | None]:
    if not wanted:
        yield None
        return
    sshd = SshdNodes(tmp / "sshd", 3, port=port)
    sshd.start()
    try:
        yield sshd
    finally:
        sshd.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--launchers", default="local,ssh", help="comma-separated: local, ssh, slurm")
    ap.add_argument("--port-base", type=int, default=31500, help="the clusters' ports: BASE..BASE+59")
    ap.add_argument("--sshd-port", type=int, default=35024, help="the test sshd daemons' port")
    args = ap.parse_args()
    launchers = [x for x in args.launchers.split(",") if x]
    subprocess.run(["bash", str(ROOT / "scripts" / "build_container_image.sh")], check=True)
    env = dict(os.environ)
    env.pop("SLURM_JOB_ID", None)  # on SLURM, `up` submits its own allocation each run
    if "slurm" in launchers:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "build_oci_bundle.py")], check=True)
        subprocess.run(["bash", str(ROOT / "scripts" / "slurm_local.sh"), "up"], check=True)
        env["SLURM_CONF"] = os.environ.get("EPD_SLURM_DIR", "/tmp/epd-slurm") + "/slurm.conf"
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        la: {"bare": [], CONTAINER[la]: []} for la in launchers}
    with tempfile.TemporaryDirectory(prefix="bench-container-up-") as d, \
            nodes(Path(d), "ssh" in launchers, args.sshd_port) as sshd:
        tmp = Path(d)
        env.update(EPDCTL_STATE_DIR=str(tmp / "state"), EPDCTL_SSH_RUN_ROOT=str(tmp / "nodes"))
        if sshd is not None:
            env.update(EPDCTL_KNOWN_HOSTS=str(sshd.known_hosts), EPDCTL_SSH_CONFIG="")
        ports = (args.port_base, args.port_base + 59)
        topos = {(la, kind): variant(tmp, la, kind == "bare", ports, sshd) for la in launchers
                 for kind in runs[la]}
        for r in range(args.repeat):
            for la in launchers:
                order = ["bare", CONTAINER[la]] if r % 2 == 0 else [CONTAINER[la], "bare"]
                for kind in order:
                    runs[la][kind].append(one(topos[(la, kind)], env))
                    print(f"round {r} {la} {kind}: {runs[la][kind][-1]}", flush=True)
    out: dict[str, Any] = {"runs": runs, "median": {}, "container_over_bare": {}}
    for la, by_kind in runs.items():
        med = {k: {m: statistics.median(x[m] for x in v) for m in ("cli_s", "up_s")} for k, v in by_kind.items()}
        out["median"][la] = med
        out["container_over_bare"][la] = {m: round(med[CONTAINER[la]][m] / med["bare"][m], 3)
                                          for m in ("cli_s", "up_s")}
    print(json.dumps(out, indent=2))
    print("\nup to serving, median s (cli / up's own):")
    print(f"{'launcher':<9} {'container':<10} {'bare':>13} {'container':>13} {'ratio':>12}")
    for la in launchers:
        b, p = out["median"][la]["bare"], out["median"][la][CONTAINER[la]]
        ratio = out["container_over_bare"][la]
        print(f"{la:<9} {CONTAINER[la]:<10} {b['cli_s']:>6.1f}/{b['up_s']:<6.1f} {p['cli_s']:>6.1f}/{p['up_s']:<6.1f} "
              f"{ratio['cli_s']:>5.2f}/{ratio['up_s']:<5.2f}")
    res = ROOT / "benchmarks" / "results"
    res.mkdir(exist_ok=True)
    name = "container_up_slurm.json" if launchers == ["slurm"] else "container_up.json"
    (res / name).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
