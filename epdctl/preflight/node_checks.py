"""Turn one node's raw tool outputs plus what the topology expects into pass/fail items.

Why raw outputs in, items out: the node side (``agent facts``) only runs tools and returns their
text, so what a check means lives here, in one place, testable against recorded outputs of real
machines. Each failing item says what is wrong and what to do about it.
"""

from __future__ import annotations

import re

from epdctl.preflight import parsers
from epdctl.preflight.nic_checks import check_nics
from epdctl.preflight.records import (RDMA_KINDS, CheckItem, Facts, NicExpect, NodeExpect,
                                      item as _item)

__all__ = ["CheckItem", "Facts", "NicExpect", "NodeExpect", "RDMA_KINDS", "check_node",
           "check_versions", "dmabuf_capable"]


def check_node(expect: NodeExpect, facts: Facts) -> list[CheckItem]:
    """Every check the node's role needs, in a stable order."""
    items: list[CheckItem] = []
    items += check_nics(expect, facts)
    if any(n.kind in RDMA_KINDS for n in expect.nics) or expect.rdma_transport:
        items.append(_check_ulimit(expect, facts))
        if expect.gpus:
            items.append(_check_gpudirect(expect, facts))
    if expect.gpus:
        items.append(_check_gpus(expect, facts))
    if expect.model_path:
        items += _check_model(expect, facts)
    if expect.ports:
        items.append(_check_ports(expect, facts))
    return items


def _check_ulimit(expect: NodeExpect, facts: Facts) -> CheckItem:
    out = facts.out("ulimit_l")
    if out is None:
        return _item(expect, "ulimit -l", False, f"could not read ({facts.why_missing('ulimit_l')})")
    try:
        kib = parsers.parse_ulimit_l(out)
    except ValueError as e:
        return _item(expect, "ulimit -l", False, str(e))
    if kib is None:
        return _item(expect, "ulimit -l", True, "unlimited")
    return _item(expect, "ulimit -l", False,
                 f"{kib} KiB; RDMA memory registration needs unlimited locked memory: set "
                 f"`* - memlock unlimited` in /etc/security/limits.conf (or LimitMEMLOCK=infinity)")


def _check_gpudirect(expect: NodeExpect, facts: Facts) -> CheckItem:
    out = facts.out("lsmod")
    mods = parsers.parse_lsmod(out) if out is not None else {}
    for name in ("nvidia_peermem", "nv_peer_mem"):
        if name in mods:
            return _item(expect, "gpudirect", True, f"{name} loaded")
    if dmabuf_capable(facts.out("uname_r"), facts.out("nvidia_driver")):
        return _item(expect, "gpudirect", True, "dma-buf (open kernel module, kernel >= 5.12)")
    where = "" if out is not None else f" (lsmod {facts.why_missing('lsmod')})"
    return _item(expect, "gpudirect", False,
                 f"neither nvidia_peermem nor dma-buf support{where}; without GPUDirect RDMA the "
                 f"transfer engine silently falls back to staging through host memory: "
                 f"`modprobe nvidia_peermem`")


def dmabuf_capable(uname_r: str | None, driver_version: str | None) -> bool:
    """NVIDIA's dma-buf path needs the open kernel modules and Linux 5.12 or newer."""
    if not uname_r or not driver_version or "Open Kernel Module" not in driver_version:
        return False
    m = re.match(r"(\d+)\.(\d+)", uname_r.strip())
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (5, 12)


def _check_gpus(expect: NodeExpect, facts: Facts) -> CheckItem:
    csv, listing = facts.out("nvidia_smi"), facts.out("nvidia_smi_L")
    if csv is None and listing is None:
        return _item(expect, "gpus", False, f"nvidia-smi failed ({facts.why_missing('nvidia_smi')}); "
                     f"{expect.gpus} GPU(s) expected")
    gpus = parsers.parse_nvidia_smi_csv(csv) if csv is not None else \
        parsers.parse_nvidia_smi_list(listing or "")
    ok = len(gpus) >= expect.gpus
    names = sorted({g.name for g in gpus})
    return _item(expect, "gpus", ok, f"{len(gpus)} GPU(s) {', '.join(names)}".strip() + (
        "" if ok else f"; the plan needs {expect.gpus} on this node (check CUDA_VISIBLE_DEVICES, "
        f"Xid errors in dmesg, or the topology's gpus)"))


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
    pickled/bootstrapped transfers in ways that show up only under load)."""
    items: list[CheckItem] = []
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
