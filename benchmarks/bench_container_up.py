"""`epdctl up` to serving, bare vs in podman containers, side by side in one run.

Both variants are topologies/local-container.yaml (2 encoders, 1 prefill, 1 decode, the smg
router; embedded engine, the same venv and model): "bare" with ``container: false``, "podman"
as committed (every worker in the Debian image scripts/build_container_image.sh builds). Each
round runs both, alternating which goes first, through the real CLI (`up --skip-preflight`, which
ends after the canary answered), then `down`. Prints per-run seconds (the CLI's wall time and
`up`'s own "is up in" figure) and the podman/bare ratio of the medians; writes
benchmarks/results/container_up.json.

    flock /tmp/epd-heavy.lock .venv/bin/python benchmarks/bench_container_up.py --repeat 2
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
TOPOLOGY = ROOT / "topologies" / "local-container.yaml"


def variant(tmp: Path, bare: bool) -> Path:
    doc = yaml.safe_load(TOPOLOGY.read_text())
    doc["python"] = str(ROOT / ".venv" / "bin" / "python")
    doc["model"]["path"] = str(ROOT / "models" / "tiny-qwen2vl")
    doc["container"] = False if bare else {**doc["container"], "mounts": [{"source": str(ROOT), "readonly": True}]}
    path = tmp / ("bare.yaml" if bare else "podman.yaml")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def one(topo: Path, state: Path) -> dict[str, float]:
    env = dict(os.environ, EPDCTL_STATE_DIR=str(state))
    cli = [sys.executable, "-m", "epdctl"]
    t0 = time.monotonic()
    up = subprocess.run([*cli, "up", str(topo), "--skip-preflight", "--timeout", "600"], env=env,
                        capture_output=True, text=True)
    wall = time.monotonic() - t0
    subprocess.run([*cli, "down", "local-container"], env=env, capture_output=True, text=True)
    if up.returncode != 0:
        raise SystemExit(f"up failed for {topo.name}:\n{up.stdout}\n{up.stderr}")
    m = re.search(r"is up in ([0-9.]+)s", up.stdout)
    return {"cli_s": round(wall, 2), "up_s": float(m.group(1)) if m else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    subprocess.run(["bash", str(ROOT / "scripts" / "build_container_image.sh")], check=True)
    runs: dict[str, list[dict[str, float]]] = {"bare": [], "podman": []}
    with tempfile.TemporaryDirectory(prefix="bench-container-up-") as d:
        tmp = Path(d)
        topos = {"bare": variant(tmp, True), "podman": variant(tmp, False)}
        for r in range(args.repeat):
            order = ["bare", "podman"] if r % 2 == 0 else ["podman", "bare"]
            for name in order:
                runs[name].append(one(topos[name], tmp / f"state-{name}-{r}"))
                print(f"round {r} {name}: {runs[name][-1]}", flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("cli_s", "up_s")} for k, v in runs.items()}
    out = {"runs": runs, "median": med,
           "podman_over_bare": {m: round(med["podman"][m] / med["bare"][m], 3) for m in ("cli_s", "up_s")}}
    print(json.dumps(out, indent=2))
    res = ROOT / "benchmarks" / "results"
    res.mkdir(exist_ok=True)
    (res / "container_up.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
