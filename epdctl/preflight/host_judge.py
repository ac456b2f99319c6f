"""Judge host settings RDMA transfers depend on: ``lsmod`` (GPUDirect peer memory module) and
the locked-memory limit (``ulimit -l``, or the ``max locked memory`` line of ``ulimit -a``)."""

from __future__ import annotations

import re

from epdctl.preflight.judgement import FAIL, PASS, WARN, Judgement, digits

PEERMEM = ("nvidia_peermem", "nv_peer_mem")
# modules whose presence makes a `name size count` table an lsmod listing (not `ps`, not `ss`)
KNOWN_MODULES = {*PEERMEM, "nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "ib_core",
                 "ib_uverbs", "ib_umad", "ib_ipoib", "mlx5_core", "mlx5_ib", "mlx4_core", "mlx4_ib",
                 "rdma_cm", "rdma_ucm", "irdma", "rdma_rxe", "iw_cm", "ib_cm", "mlxfw", "efa"}
MEMLOCK_ADVICE = ("RDMA registers the whole KV/embedding buffers: make locked memory unlimited — "
                  "bare metal: `* - memlock unlimited` in /etc/security/limits.conf (or "
                  "LimitMEMLOCK=infinity for a systemd unit, then log in again); containers: "
                  "`docker run --ulimit memlock=-1:-1` (Kubernetes: the runtime's default "
                  "LimitMEMLOCK, or a privileged/IPC_LOCK pod)")


def read_lsmod(text: str) -> dict[str, tuple[int, int, tuple[str, ...]]]:
    """Module -> (size, use count, used by); ``lsmod`` or ``/proc/modules`` lines, any indent."""
    mods: dict[str, tuple[int, int, tuple[str, ...]]] = {}
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) < 3 or not digits(parts[1]) or not re.fullmatch(r"-?[0-9]+", parts[2]):
            continue
        # module names are lower-case identifiers, sizes whole pages; users carry no addresses
        if not re.fullmatch(r"[a-z0-9_]+", parts[0]) or int(parts[1]) < 1024:
            continue
        if len(parts) > 3 and not re.fullmatch(r"[\w,\-\[\]]+", parts[3]):
            continue
        users = parts[3] if len(parts) > 3 else ""
        used_by = tuple(u for u in users.replace(",", " ").split() if u not in ("-", "[permanent]"))
        mods[parts[0]] = (int(parts[1]), int(parts[2]), used_by)
    return mods


def judge_lsmod(text: str, grep_for: tuple[str, ...] = ()) -> Judgement:
    mods = read_lsmod(text)
    j = Judgement("lsmod", {"modules": sorted(mods), "count": len(mods)})
    loaded = [m for m in PEERMEM if m in mods]
    rdma = [m for m in ("ib_core", "mlx5_ib", "irdma", "rdma_rxe", "nvidia") if m in mods]
    j.facts["rdma_gpu_modules"] = rdma
    if loaded:
        j.add(PASS, f"{loaded[0]} loaded: GPUDirect RDMA can register GPU memory")
    elif mods or any(g in PEERMEM for g in grep_for):
        j.add(WARN, "no GPU peer-memory module (nvidia_peermem / nv_peer_mem) loaded",
              "`modprobe nvidia_peermem` (and add it to /etc/modules-load.d); without it, or the "
              "dma-buf path of the open kernel module on Linux >= 5.12, GPU buffers are staged "
              "through host memory")
    else:
        j.add(FAIL, "no module line in the text", "save the complete `lsmod` output")
    return j


def read_memlock(text: str) -> tuple[str, int | None] | None:
    """('unlimited', None) or ('kib', value); None when the text has no limit in it."""
    m = re.search(r"max locked memory\s+\(kbytes, -l\)\s+(\S+)", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    value = m.group(1) if m else (lines[-1] if len(lines) == 1 or (lines and len(lines) <= 3
                                                                   and digits(lines[-1])) else "")
    if value == "unlimited":
        return ("unlimited", None)
    if digits(value):
        return ("kib", int(value))
    return None


def judge_ulimit(text: str) -> Judgement:
    got = read_memlock(text)
    j = Judgement("ulimit -l")
    if got is None:
        j.add(FAIL, "no locked-memory limit in the text", "save the output of `ulimit -l`")
        return j
    kind, kib = got
    j.facts["memlock_kib"] = kib if kind == "kib" else "unlimited"
    if kind == "unlimited":
        j.add(PASS, "locked memory unlimited")
    else:
        j.add(FAIL, f"locked memory limited to {kib} KiB ({(kib or 0) / 1024:g} MiB)", MEMLOCK_ADVICE)
    return j
