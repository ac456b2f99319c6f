"""Turn one node's raw tool outputs plus what the topology expects into pass/fail items.

Why raw outputs in, items out: the node side (``agent facts``) only runs tools and returns their
text, so what a check means lives here, in one place, testable against recorded outputs of real
machines. Each failing item says what is wrong and what to do about it.
"""

from __future__ import annotations

import logging
import re
from typing import Callable

from epdctl.preflight import gpu_text, host_judge, parsers
from epdctl.preflight.diagnose import recognise, unrecognised
from epdctl.preflight.nic_checks import check_nics
from epdctl.preflight.records import (RDMA_KINDS, CheckItem, Facts, NicExpect, NodeExpect,
                                      item as _item, leveled)
from epdctl.preflight.textprep import prepare

log = logging.getLogger(__name__)

__all__ = ["CheckItem", "Facts", "NicExpect", "NodeExpect", "RDMA_KINDS", "check_node",
           "check_versions", "dmabuf_capable"]


def check_node(expect: NodeExpect, facts: Facts) -> list[CheckItem]:
    """Every check the node's role needs, in a stable order. An unexpected error while reading
    one tool's output becomes one failed item naming the tool and the line; the rest still run."""
    items: list[CheckItem] = []
    items += _guard(expect, facts, ("ibv_devinfo", "ibstat", "ibstatus", "gid_table",
                                    "ibdev2netdev", "ip_addr"), lambda: check_nics(expect, facts))
    if any(n.kind in RDMA_KINDS for n in expect.nics) or expect.rdma_transport:
        items += _guard(expect, facts, ("ulimit_l",), lambda: [_check_ulimit(expect, facts)])
        if expect.gpus:
            items += _guard(expect, facts, ("lsmod",), lambda: [_check_gpudirect(expect, facts)])
    if expect.gpus:
        items += _guard(expect, facts, ("nvidia_smi_health", "nvidia_smi", "nvidia_smi_L"),
                        lambda: _check_gpus(expect, facts))
    if expect.model_path:
        items += _guard(expect, facts, ("df",), lambda: _check_model(expect, facts))
    if expect.ports:
        items += _guard(expect, facts, ("ss",), lambda: [_check_ports(expect, facts)])
    return items


def _guard(expect: NodeExpect, facts: Facts, probes: tuple[str, ...],
           run: Callable[[], list[CheckItem]]) -> list[CheckItem]:
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - one probe's surprise must not hide the others
        log.debug("[%s] reading %s raised", expect.node, probes, exc_info=True)
        line = offending_line(e)
        texts = {p: facts.text(p) or "" for p in probes}
        probe = next((p for p, t in texts.items() if line and line in t), probes[0])
        if not line:
            line = next((ln.strip() for ln in texts[probe].splitlines() if ln.strip()), "")
        return [_item(expect, f"{probe} read", False,
                      f"unexpected error reading {probe} output ({type(e).__name__}: {e}); "
                      f"offending line: {line[:160]!r}; run `epdctl diagnose` on that output "
                      f"and report it")]


def offending_line(e: BaseException) -> str | None:
    """The text line a reader was on when it raised: the innermost frame's ``line``/``raw``/``ln``."""
    tb = e.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for name in ("line", "raw", "ln", "row"):
            value = frame.f_locals.get(name)
            if isinstance(value, str) and value.strip():
                return value.strip()
    return None


def _check_ulimit(expect: NodeExpect, facts: Facts) -> CheckItem:
    text = facts.text("ulimit_l")
    if text is None:
        return _item(expect, "ulimit -l", False, f"could not read ({facts.why_missing('ulimit_l')})")
    odd = unrecognised(text, ("ulimit -l",))
    if odd:
        return _item(expect, "ulimit -l", False, f"{odd}; run `ulimit -l` on the node by hand")
    j = host_judge.judge_ulimit(text)
    f = j.findings[0]
    if j.verdict == "pass":
        return _item(expect, "ulimit -l", True, "unlimited")
    kib = j.facts.get("memlock_kib")
    head = f"{kib} KiB" if isinstance(kib, int) else f.message
    return _item(expect, "ulimit -l", False, f"{head}; {f.advice}")


def _check_gpudirect(expect: NodeExpect, facts: Facts) -> CheckItem:
    text = facts.text("lsmod")
    odd = unrecognised(text, ("lsmod",))
    if odd:
        return _item(expect, "gpudirect", False, f"{odd}; run `lsmod` on the node by hand")
    mods = host_judge.read_lsmod(text) if text is not None else {}
    for name in host_judge.PEERMEM:
        if name in mods:
            return _item(expect, "gpudirect", True, f"{name} loaded")
    if dmabuf_capable(facts.out("uname_r"), facts.out("nvidia_driver")):
        return _item(expect, "gpudirect", True, "dma-buf (open kernel module, kernel >= 5.12)")
    where = "" if text is not None else f" (lsmod {facts.why_missing('lsmod')})"
    return _item(expect, "gpudirect", False,
                 f"neither nvidia_peermem nor dma-buf support{where}; without GPUDirect RDMA the "
                 f"transfer engine silently falls back to staging through host memory: "
                 f"`modprobe nvidia_peermem`")


def dmabuf_capable(uname_r: str | None, driver_version: str | None) -> bool:
    """NVIDIA's dma-buf path needs the open kernel modules and Linux 5.12 or newer."""
    if not uname_r or not driver_version or "Open Kernel Module" not in driver_version:
        return False
    m = re.match(r"(\d+)\.(\d+)", uname_r.strip())
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (5, 12)


def _check_gpus(expect: NodeExpect, facts: Facts) -> list[CheckItem]:
    """GPU count against the plan, and GPU health (ERR!, ECC, pending remap, lost GPU) from
    whichever nvidia-smi output the node gave: health CSV, plain CSV, or -L."""
    j = None
    for probe, shape in (("nvidia_smi_health", "csv"), ("nvidia_smi", "csv"),
                         ("nvidia_smi_L", "list")):
        text = facts.text(probe)
        if text is None or not text.strip():
            continue
        found = recognise(prepare(text))       # content decides the shape, not the probe
        if found is not None and found[0] == "nvidia-smi":
            shape = found[1]
        got = gpu_text.judge_nvidia_smi(text, shape)
        errs = [f for f in got.findings if f.level == "fail" and "no GPU" not in f.message]
        if got.facts.get("count"):
            j = got
            break
        if errs:       # nvidia-smi's own error (lost GPU, no driver): the reason to report
            return [_item(expect, "gpus", False, f"{errs[0].message}; {errs[0].advice}")]
    if j is None:
        why = unrecognised(facts.text("nvidia_smi"), ("nvidia-smi",)) or \
            f"nvidia-smi failed ({facts.why_missing('nvidia_smi')})"
        return [_item(expect, "gpus", False, f"{why}; {expect.gpus} GPU(s) expected")]
    gpus = j.facts.get("gpus", [])
    ok = len(gpus) >= expect.gpus
    names = sorted({str(g.get("name", "")) for g in gpus})
    items = [_item(expect, "gpus", ok, f"{len(gpus)} GPU(s) {', '.join(names)}".strip() + (
        "" if ok else f"; the plan needs {expect.gpus} on this node (check CUDA_VISIBLE_DEVICES, "
        f"Xid errors in dmesg, or the topology's gpus)"))]
    for f in j.findings:
        if f.level != "pass" and "no GPU" not in f.message:
            items.append(leveled(expect, "gpu health", f.level, f"{f.message}; {f.advice}"))
    return items


def _check_model(expect: NodeExpect, facts: Facts) -> list[CheckItem]:
    path = expect.model_path or ""
    exists = facts.path_exists.get(path)
    items = [_item(expect, "model path", bool(exists),
                   path if exists else f"{path} does not exist on this node; copy the model or "
                   f"fix model_path")]
    out = facts.out("df")
    disks = parsers.parse_df(out) if out is not None else []
    if disks:
        free_gb = disks[-1].avail_kib / 1024 / 1024
        ok = free_gb >= expect.min_disk_gb
        items.append(_item(expect, "disk", ok, f"{free_gb:.1f} GiB free on {disks[-1].mount}" + (
            "" if ok else f", below {expect.min_disk_gb:g} GiB")))
    return items


def _check_ports(expect: NodeExpect, facts: Facts) -> CheckItem:
    out = facts.out("ss")
    if out is None:
        return _item(expect, "ports", False, f"could not list sockets ({facts.why_missing('ss')})")
    listening = parsers.parse_ss_ltn(out)
    busy = [f"{h}:{p}" for h, p in expect.ports
            if ("*", p) in listening or (h, p) in listening
            or (h in ("0.0.0.0", "::", "*") and any(lp == p for _, lp in listening))]
    return _item(expect, "ports", not busy,
                 f"{len(expect.ports)} free" if not busy else
                 f"already in use: {', '.join(busy)}; stop what holds them (`epdctl down`?) or "
                 f"change the ports")


def check_versions(all_facts: list[Facts], keys: tuple[str, ...] | None = None
                   ) -> list[CheckItem]:
    """python, epdctl and engine versions must be equal on every node (a mismatch breaks
    pickled/bootstrapped transfers in ways that show up only under load). Only nodes that
    answered are compared: with none, there is nothing to compare (never "differs")."""
    items: list[CheckItem] = []
    if not all_facts:
        return items
    for key in keys if keys is not None else sorted({k for f in all_facts for k in f.versions}):
        seen: dict[str, list[str]] = {}
        for f in all_facts:
            seen.setdefault(str(f.versions.get(key) or "missing"), []).append(f.node)
        if keys is not None and set(seen) == {"missing"}:
            items.append(CheckItem("*", f"version {key}", False,
                                   f"{key} is not installed on any node; the topology needs it"))
            continue
        ok = len(seen) == 1
        detail = next(iter(seen)) if ok else "; ".join(
            f"{v} on {', '.join(nodes)}" for v, nodes in sorted(seen.items()))
        items.append(CheckItem("*", f"version {key}", ok, detail if ok else
                               f"differs: {detail}; install the same version everywhere"))
    return items
