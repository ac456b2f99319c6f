"""`check` for workers in containers, per node: the runtime is installed, the image is there (or
is pulled now, as `up` would), and a probe container started with the worker's own run options
shows unlimited locked memory, /dev/infiniband where the worker uses ib/roce NICs and working
``nvidia-smi`` where it has GPUs. Each finding carries the anchors' fix (container_text.py).

The commands are the runtime records' (epdctl/containers/), written by ``targets.container_probes``
exactly as render writes the worker's; this module runs them through the node's runner and
judges what came back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from epdctl.containers.base import short_id
from epdctl.preflight import container_text as text
from epdctl.preflight.judgement import FAIL, PASS, WARN, Judgement
from epdctl.preflight.records import CheckItem
from epdctl.preflight.runners import NodeRunner

VERSION_TIMEOUT, INSPECT_TIMEOUT, PULL_TIMEOUT, PROBE_TIMEOUT = 30.0, 60.0, 1800.0, 300.0


@dataclass(frozen=True)
class ContainerProbe:
    """One distinct container a node runs, with the commands that check it there."""

    node: str
    runtime: str
    image: str
    workers: tuple[str, ...]
    version: tuple[str, ...]              # succeeds where the runtime is installed
    inspect: tuple[str, ...] | None       # prints the image's id (None: the runtime cannot say)
    pull: tuple[str, ...] | None          # fetches a missing image (None: the image is a file/bundle)
    probe: tuple[str, ...] | None         # the probe container (None: a SLURM step runtime)
    rdma: bool                            # the workers use ib/roce NICs here
    gpus: bool                            # the workers have GPUs here


def _item(p: ContainerProbe, check: str, level: str, detail: str) -> CheckItem:
    status = {"pass": "ok"}.get(level, level)
    return CheckItem(p.node, f"container {check}", status != "fail", detail, status)


def _last(out: str) -> str:
    lines = [ln.strip() for ln in out.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _judged(p: ContainerProbe, check: str, j: Judgement, fail_as: str = FAIL) -> CheckItem:
    worst = next((f for f in j.findings if f.level == j.verdict), None)
    if worst is None:
        return _item(p, check, FAIL, "nothing to judge in the probe's output")
    level = fail_as if worst.level == FAIL else worst.level
    return _item(p, check, level, worst.message + (f"; {worst.advice}" if worst.advice and level != PASS else ""))


def check_probe(p: ContainerProbe, runner: NodeRunner) -> tuple[list[CheckItem], str | None]:
    """The items for one container on its node, and the image's id there (None: unknown)."""
    who = f"{p.image} ({', '.join(p.workers)})"
    got = runner.run(list(p.version), timeout=VERSION_TIMEOUT)
    if got.rc != 0:
        why = _last(got.stderr or got.stdout)
        return [_item(p, "runtime", FAIL, f"{p.version[0]} does not run on the node ({why}); install {p.runtime} "
                                            f"there, or make the node's setup lines put it on PATH")], None
    items = [_item(p, "runtime", PASS, f"{p.runtime}: {_last(got.stdout)}")]
    image_id = None
    if p.inspect is not None:
        got = runner.run(list(p.inspect), timeout=INSPECT_TIMEOUT)
        if got.rc != 0 and p.pull is not None:
            pulled = runner.run(list(p.pull), timeout=PULL_TIMEOUT)
            if pulled.rc != 0:
                what, advice = text.why_not_started(pulled.stderr + pulled.stdout)
                items.append(_item(p, "image", FAIL, f"{who} is not on the node and `{' '.join(p.pull)}` "
                                                     f"failed: {what}; {advice}"))
                return items, None
            got = runner.run(list(p.inspect), timeout=INSPECT_TIMEOUT)
            items.append(_item(p, "image", PASS, f"{who} pulled"))
        if got.rc == 0 and got.stdout.strip():
            image_id = _last(got.stdout)
            if not any(i.check == "container image" for i in items):
                items.append(_item(p, "image", PASS, f"{who} present, id {short_id(image_id)}"))
        elif got.rc != 0:
            what, advice = text.why_not_started(got.stderr + got.stdout)
            items.append(_item(p, "image", FAIL, f"{who}: {what}; {advice}"))
            return items, None
    if p.probe is None:
        return items, image_id
    got = runner.run(list(p.probe), timeout=PROBE_TIMEOUT)
    sections = text.read_sections(got.stdout)
    if text.MEMLOCK not in sections:
        what, advice = text.why_not_started(got.stderr + "\n" + got.stdout)
        items.append(_item(p, "probe", FAIL, f"a probe container with {', '.join(p.workers)}'s run options did "
                                             f"not start (exit {got.rc}): {what}; {advice}"))
        return items, image_id
    memlock = _judged(p, "memlock", text.judge_memlock(sections[text.MEMLOCK]), fail_as=FAIL if p.rdma else WARN)
    if memlock.status == WARN:  # only RDMA transfers need it: a warning where no ib/roce NIC is used
        memlock = CheckItem(p.node, memlock.check, True, memlock.detail + " (only RDMA transfers need it; "
                                                                          "these workers use no ib/roce NIC)", WARN)
    items.append(memlock)
    if p.rdma:
        items.append(_judged(p, "/dev/infiniband", text.judge_infiniband(sections.get(text.INFINIBAND, ""))))
    if p.gpus:
        items.append(_judged(p, "GPUs", text.judge_gpus(sections.get(text.GPUS, ""), sections.get(text.EXIT))))
    return items, image_id


def check_containers(probes: Sequence[ContainerProbe], runner: NodeRunner
                     ) -> tuple[list[CheckItem], dict[str, str]]:
    """Every container of one node: the items and image -> id."""
    items: list[CheckItem] = []
    ids: dict[str, str] = {}
    for p in probes:
        try:
            got, image_id = check_probe(p, runner)
        except Exception as e:  # noqa: BLE001 - one node's surprise never hides the others
            got, image_id = [_item(p, "runtime", FAIL, f"could not run the container checks: {e}")], None
        items += got
        if image_id:
            ids[p.image] = image_id
    return items, ids
