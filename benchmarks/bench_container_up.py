"""`epdctl up` to serving, bare vs in containers, side by side in one run.

Default: topologies/local-container.yaml (2 encoders, 1 prefill, 1 decode, the smg router;
embedded engine, the same venv and model): "bare" with ``container: false``, "podman" as
committed (every worker in the Debian image scripts/build_container_image.sh builds).
``--slurm``: topologies/slurm-oci.yaml on the real local SLURM (scripts/slurm_local.sh; 1 encoder,
1 prefill, 1 decode on three nodes): "bare" steps vs "slurm-oci" steps (``srun --container=``
the bundle scripts/build_oci_bundle.py exports from that image, run by runc through oci.conf).
Each round runs both, alternating which goes first, through the real CLI (`up --skip-preflight`,
which ends after the canary answered; on SLURM it also submits the allocation), then `down`.
Prints per-run seconds (the CLI's wall time and `up`'s own "is up in" figure) and the
container/bare ratio of the medians; writes benchmarks/results/container_up.json
(container_up_slurm.json with --slurm).

    flock /tmp/epd-heavy.lock .venv/bin/python benchmarks/bench_container_up.py --repeat 2
    flock /tmp/epd-slurm.lock .venv/bin/python benchmarks/bench_container_up.py --slurm --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / "topologies" / "local-container.yaml"
SLURM = ROOT / "topologies" / "slurm-oci.yaml"


def variant(src: Path, tmp: Path, bare: bool, label: str) -> Path:
    """``src`` with absolute paths (the copy lives elsewhere); bare: ``container: false``."""
    doc = yaml.safe_load(src.read_text())
    doc["python"] = str(ROOT / ".venv" / "bin" / "python")
    doc["model"]["path"] = str(ROOT / "models" / "tiny-qwen2vl")
    c = doc["container"]
    if c.get("mounts"):
        c["mounts"] = [{"source": str(ROOT), "readonly": True}]
    if str(c["image"]).startswith("../"):
        c["image"] = str((src.parent / c["image"]).resolve())
    doc["container"] = False if bare else c
    path = tmp / f"{label}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def one(topo: Path, name: str, state: Path) -> dict[str, float]:
    env = dict(os.environ, EPDCTL_STATE_DIR=str(state))
    env.pop("SLURM_JOB_ID", None)  # on SLURM, `up` submits its own allocation each run
    cli = [sys.executable, "-m", "epdctl"]
    t0 = time.monotonic()
    up = subprocess.run([*cli, "up", str(topo), "--skip-preflight", "--timeout", "600"], env=env,
                        capture_output=True, text=True)
    wall = time.monotonic() - t0
    subprocess.run([*cli, "down", name], env=env, capture_output=True, text=True)
    if up.returncode != 0:
        raise SystemExit(f"up failed for {topo.name}:\n{up.stdout}\n{up.stderr}")
    m = re.search(r"is up in ([0-9.]+)s", up.stdout)
    return {"cli_s": round(wall, 2), "up_s": float(m.group(1)) if m else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--slurm", action="store_true",
                    help="topologies/slurm-oci.yaml on the local SLURM: bare steps vs SLURM OCI containers")
    args = ap.parse_args()
    subprocess.run(["bash", str(ROOT / "scripts" / "build_container_image.sh")], check=True)
    src, ctr, result = (SLURM, "slurm-oci", "container_up_slurm.json") if args.slurm else \
        (LOCAL, "podman", "container_up.json")
    if args.slurm:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "build_oci_bundle.py")], check=True)
        subprocess.run(["bash", str(ROOT / "scripts" / "slurm_local.sh"), "up"], check=True)
        os.environ.update(SLURM_CONF=os.environ.get("EPD_SLURM_DIR", "/tmp/epd-slurm") + "/slurm.conf")
    name = str(yaml.safe_load(src.read_text())["name"])
    runs: dict[str, list[dict[str, float]]] = {"bare": [], ctr: []}
    with tempfile.TemporaryDirectory(prefix="bench-container-up-") as d:
        tmp = Path(d)
        topos = {"bare": variant(src, tmp, True, "bare"), ctr: variant(src, tmp, False, ctr)}
        for r in range(args.repeat):
            order = ["bare", ctr] if r % 2 == 0 else [ctr, "bare"]
            for label in order:
                runs[label].append(one(topos[label], name, tmp / f"state-{label}-{r}"))
                print(f"round {r} {label}: {runs[label][-1]}", flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("cli_s", "up_s")} for k, v in runs.items()}
    out = {"topology": str(src.relative_to(ROOT)), "runs": runs, "median": med,
           f"{ctr}_over_bare": {m: round(med[ctr][m] / med["bare"][m], 3) for m in ("cli_s", "up_s")}}
    print(f"{'up to serving (s)':<20}{'bare':>10}{ctr:>12}")
    for m in ("cli_s", "up_s"):
        print(f"{'median ' + m:<20}{med['bare'][m]:>10.1f}{med[ctr][m]:>12.1f}")
    print(json.dumps(out, indent=2))
    res = ROOT / "benchmarks" / "results"
    res.mkdir(exist_ok=True)
    (res / result).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
