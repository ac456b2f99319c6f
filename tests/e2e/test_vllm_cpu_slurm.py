"""topologies/vllm-cpu-epd.yaml inside the real local SLURM cluster (`launcher: slurm`): `up`
submits the holder job, then vLLM's own encoder, prefill and decode servers and epdctl's
E->P->D router each run as a job step of it on their own node (n0, n1, n2). One cluster for the
module; run under `flock /tmp/epd-slurm.lock`.

The fake SLURM nodes share this host (NodeAddr 127.0.0.1), so each node has its own port range
(32200+, 32230+, 32260+) and the nodes are marked ``shared: true``: the store is one directory
all steps see. Its life goes through the allocation too: `up` empties it and `down` removes it
with a short step on each node (before the allocation is given back), never with an rm here.
`up`'s canary proves the transfers; an OpenAI client's 3-image request is answered right;
`status` shows the three vLLM workers with figures from their own /metrics; `down` leaves no
process, no step, no job and no store. About 6.3 GiB.
"""

from __future__ import annotations

import os
import re
from typing import Iterator

import pytest
import yaml

from slurm_cluster import SLURM_DIR, SlurmCluster, slurm_cluster
from vllm_cluster import (VllmCluster, ask_three_images, check_canary, check_down, check_status,
                          require_engine, topology_doc)

from epdctl.launchers.slurm import allocation, jobs, steps

require_engine()

NAME = "vllm-cpu-slurm"
NODE_OF = {"encoder-0": "n0", "prefill-0": "n1", "decode-0": "n2"}


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    yield from slurm_cluster()


@pytest.fixture(scope="module")
def cluster(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmCluster]:
    tmp = tmp_path_factory.mktemp("vllm-slurm")
    doc = topology_doc(NAME, tmp / "store")
    doc["launcher"] = "slurm"
    doc["slurm"] = {"partition": slurm.partition, "time": "00:30:00"}
    doc["ports"] = {"base": 32200, "limit": 32299}
    doc.setdefault("defaults", {})["host"] = "node"  # bind to the allocated node's address
    doc["nodes"] = [{"name": f"n{i}", "host": f"n{i}.slurm", "port_base": 32200 + 30 * i, "shared": True}
                    for i in range(3)]
    doc["roles"] = {role: {"nodes": [node], "count": 1} for role, node in
                    (("encoder", "n0"), ("prefill", "n1"), ("decode", "n2"))}
    doc["router"] = {"node": "n0", "host": "node", "implementation": "epdctl-epd"}
    topo = tmp / f"{NAME}.yaml"
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_JOB")}  # submit our own job
    env.update(EPDCTL_STATE_DIR=str(tmp / "state"))
    c = VllmCluster(NAME, topo, tmp / "store", env)
    c.extra["log_from"] = {p: p.stat().st_size for p in SLURM_DIR.glob("log/slurmd-*.log")}
    try:
        c.bring_up()
        print(f"up to serving inside SLURM: {c.seconds_to_up:.1f}s")
        rec = allocation.recorded(tmp / "state" / "clusters" / NAME)
        assert rec is not None and rec.owned, "up submitted no allocation"
        c.extra["job"], c.extra["alloc"] = rec.job, rec
        yield c
    finally:
        c.stop()
        if "job" in c.extra:
            jobs.cancel([c.extra["job"]])


def test_up_canary_proves_embeddings_and_kv_moved(cluster: VllmCluster) -> None:
    assert cluster.up is not None
    print(cluster.up.stdout)
    check_canary(cluster.up.stdout)
    job = cluster.extra["job"]
    assert f"  SLURM job: {job}  (squeue -j {job}; sacct -j {job})" in cluster.up.stdout.splitlines()


def _launched_steps(c: VllmCluster) -> dict[int, str]:
    """step number -> the SLURM node whose slurmd launched it, for this module's job (each
    slurmd's own log, read from where it stood when the module began)."""
    out = {}
    for log in sorted(SLURM_DIR.glob("log/slurmd-*.log")):
        with open(log, "rb") as f:
            f.seek(c.extra["log_from"].get(log, 0))
            text = f.read().decode(errors="replace")
        for m in re.finditer(rf"launch task StepId={c.extra['job']}\.(\d+) ", text):
            out[int(m.group(1))] = log.stem.removeprefix("slurmd-")
    return out


def test_workers_are_steps_of_the_allocation(cluster: VllmCluster) -> None:
    live = steps.by_name(steps.list_steps(cluster.extra["job"]))
    workers = {n: int(live[n].split(".")[1]) for n in ("encoder-0", "prefill-0", "decode-0", "router")}
    cluster.extra["worker_steps"] = workers
    # before them, `up` made the store with one short step on each node, which ended
    made = {s: node for s, node in _launched_steps(cluster).items() if s < min(workers.values())}
    assert sorted(made.values()) == sorted(n for n, _ in cluster.extra["alloc"].nodes.values()), made
    assert not [n for n in live if n.startswith("epdctl-job-")], live


def test_openai_client_three_images_answered_right(cluster: VllmCluster) -> None:
    assert re.match(r"http://127\.0\.0\.1:322\d\d$", cluster.router_url), cluster.router_url
    ask_three_images(cluster.router_url, seed=2812)


def test_status_shows_three_vllm_workers_with_their_metrics(cluster: VllmCluster) -> None:
    doc = check_status(cluster, NODE_OF, "slurm")
    assert doc["allocation"]["job"] == cluster.extra["job"] and doc["allocation"]["state"] == "RUNNING"


def test_down_leaves_no_process_step_job_or_store(cluster: VllmCluster) -> None:
    check_down(cluster, ["n0", "n1", "n2"])
    job = cluster.extra["job"]
    assert not jobs.poll([job])[job].active  # epdctl submitted it, so `down` ended it
    # the store went with one step on each allocated node, after the workers' steps
    last = max(cluster.extra["worker_steps"].values())
    removed = {s: node for s, node in _launched_steps(cluster).items() if s > last}
    assert sorted(removed.values()) == sorted(n for n, _ in cluster.extra["alloc"].nodes.values()), removed
