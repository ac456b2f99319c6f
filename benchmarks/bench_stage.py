"""Staging weights to node-local disks: seconds to stage N GiB to 1, 3 and 6 nodes at once, against
a plain copy of the same files to one node.

The nodes are real sshd daemons (tests/sshd_nodes.py), each in its own mount namespace with its
own tmpfs as "local disk" at the same stage folder, as machines of a cluster each have their own
NVMe. The weights are a generated file set (random shards) in a folder every node sees (the
"shared filesystem"). Staging is what `epdctl stage` runs: every node's room checked, then
every node copying and hashing against the manifest at once (epdctl/stage/nodes.py over SSH,
epdctl/node/stage_agent.py on the node). The baseline is `cp -r` of the same folder into one
node's disk (no hashing, no SSH). The manifest is built once beforehand and timed on its own.

Goal: staging 6 nodes in parallel takes at most 2x staging one node. All nodes share this
machine's CPUs and memory bandwidth, so the ratio measured here is an upper bound on what
separate machines (each with its own CPU and disk, reading one shared filesystem) would show.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sshd_nodes import SshdNodes  # noqa: E402

from epdctl.launchers.ssh.conn import ConnectionPool, SSHOptions, SSHTarget  # noqa: E402
from epdctl.launchers.ssh.nodes import NodeAccess  # noqa: E402
from epdctl.launchers.ssh.streams import SSHJobs  # noqa: E402
from epdctl.stage import manifest as manifests  # noqa: E402
from epdctl.stage import nodes as staging  # noqa: E402

PORT = 31823
STAGE = Path("/tmp/epd-bench-stage-31800/nvme")
SHARD = 256 << 20


def generate(folder: Path, total: int) -> None:
    """``total`` bytes of random shards (model-00001-of-000NN.safetensors ...) plus a config."""
    folder.mkdir(parents=True, exist_ok=True)
    count = max(1, -(-total // SHARD))
    block = os.urandom(1 << 20)
    for i in range(count):
        size = min(SHARD, total - i * SHARD)
        with open(folder / f"model-{i + 1:05d}-of-{count:05d}.safetensors", "wb") as f:
            for j in range(size >> 20):
                f.write(j.to_bytes(8, "little") + block[8:])
            f.write(block[: size & ((1 << 20) - 1)])
    (folder / "config.json").write_text(json.dumps({"architectures": ["Bench"], "bytes": total}))


def clear(sshd: SshdNodes) -> None:
    for n in sshd.nodes:
        sshd.on_node(n.name, "sh", "-c", f"rm -rf {STAGE}/* && sync")


def stage(pool: ConnectionPool, access: dict[str, NodeAccess], names: list[str],
          man: manifests.Manifest, threads: int) -> float:
    jobs = {n: SSHJobs(n, pool, access[n]) for n in names}
    t0 = time.perf_counter()
    list(staging.check_space(jobs, man, str(STAGE / "w")))
    done = [ev for ev in staging.copy(jobs, man, str(STAGE / "w"), threads) if type(ev).__name__ == "NodeStaged"]
    took = time.perf_counter() - t0
    assert len(done) == len(names), done
    return took


def copy_one(sshd: SshdNodes, origin: Path) -> float:
    t0 = time.perf_counter()
    proc = sshd.on_node(sshd.nodes[0].name, "cp", "-r", str(origin), str(STAGE / "w"))
    took = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=0.25, help="GiB of weights (each node's tmpfs holds one copy)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="files each node hashes and copies at once (1: each node is one CPU's work)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "stage.json")
    args = ap.parse_args()
    total = int(args.gb * 2**30)
    tmp = Path(tempfile.mkdtemp(prefix="epd-bench-stage-"))
    try:
        origin = tmp / "shared" / "weights"
        generate(origin, total)
        t0 = time.perf_counter()
        man, _ = manifests.build(str(origin))
        t_manifest = time.perf_counter() - t0
        size = f"{(total >> 20) + 128}m"
        disks = {f"node{i}": {str(STAGE): size} for i in range(6)}
        with SshdNodes(tmp / "sshd", 6, port=PORT, disks=disks) as sshd:
            pool = ConnectionPool(SSHOptions(known_hosts=(str(sshd.known_hosts),), ssh_config=None))
            access = {n.name: NodeAccess(n.name, SSHTarget(n.name, n.host, sshd.user, n.port, str(sshd.client_key)),
                                         (), sys.executable) for n in sshd.nodes}
            names = list(access)
            runs: dict[str, list[float]] = {"cp -r to 1 node": [], "stage 1 node": [], "stage 3 nodes": [],
                                            "stage 6 nodes": []}
            try:
                for _ in range(args.repeat):
                    clear(sshd)
                    runs["cp -r to 1 node"].append(copy_one(sshd, origin))
                    for k in (1, 3, 6):
                        clear(sshd)
                        runs[f"stage {k} node{'s' if k > 1 else ''}"].append(stage(pool, access, names[:k], man, args.threads))
                clear(sshd)
            finally:
                pool.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(STAGE.parent, ignore_errors=True)  # the nodes' mount points (their disks ended with them)
    med = {case: statistics.median(v) for case, v in runs.items()}
    gib = total / 2**30
    print(f"staging {gib:.2f} GiB ({len(man.files)} files) from a shared folder to node-local tmpfs over SSH, "
          f"{os.cpu_count()} CPUs, {args.threads} file(s) at a time per node, median of {args.repeat}; "
          f"manifest (sha256 once): {t_manifest:.2f}s")
    print(f"{'case':<18}{'seconds':>10}{'GiB/s per node':>16}")
    for case, s in med.items():
        print(f"{case:<18}{s:>10.2f}{gib / s:>16.2f}")
    r6 = med["stage 6 nodes"] / med["stage 1 node"]
    cpus = os.cpu_count() or 1
    # each node's copy is CPU work (SHA-256 of every byte, the copy itself) on up to --threads
    # CPUs: 6 of them on this machine's CPUs cannot take less than this floor x one node;
    # separate machines each have their own CPUs
    per_node = min(args.threads, cpus, len(man.files))
    bound = max(1.0, 6 * per_node / cpus)
    print(f"6 nodes / 1 node: {r6:.2f}x (goal <= 2x; the floor on {cpus} shared CPUs is {bound:.1f}x, "
          f"so {bound / r6:.0%} of ideal parallel); stage 1 node / cp -r: "
          f"{med['stage 1 node'] / med['cp -r to 1 node']:.2f}x; 6 nodes / cp -r to 1 node: "
          f"{med['stage 6 nodes'] / med['cp -r to 1 node']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "gib": gib, "files": len(man.files), "repeat": args.repeat, "cpus": os.cpu_count(),
        "threads_per_node": args.threads,
        "load_avg_at_end": os.getloadavg(), "python": platform.python_version(),
        "manifest_s": t_manifest, "median_s": med, "runs_s": runs,
        "ratio_6_over_1": r6, "cpu_floor_6_over_1": bound, "parallel_efficiency": bound / r6,
        "what": "seconds from the room check to every node's verified copy (epdctl/stage/nodes.py over "
                "SSH), against `cp -r` into one node's disk; each node's disk is its own tmpfs"},
        indent=2) + "\n")
    print(f"wrote {args.out}")
    subprocess.run(["sync"], check=False)


if __name__ == "__main__":
    main()
