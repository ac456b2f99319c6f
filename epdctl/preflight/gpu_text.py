"""Read and judge ``nvidia-smi`` in its four shapes: the default table, ``--query-gpu`` CSV (any
column order, with or without header/units), ``-L``, and ``-q``; plus its error messages.

GPU health is more than a count: ``ERR!`` in a field, uncorrectable ECC errors, a pending row
remap, a reset required, or a GPU whose handle cannot be read ("fell off the bus") all fail.
"""

from __future__ import annotations

import re
from typing import Any

from epdctl.preflight.judgement import FAIL, PASS, WARN, Judgement, digits

FATAL = (
    ("Unable to determine the device handle", "the driver lost a GPU (fallen off the bus / Xid 79)",
     "drain the node; check `dmesg | grep -i xid`, reseat or replace the GPU, then reboot"),
    ("has fallen off the bus", "a GPU has fallen off the bus",
     "drain the node; reseat or replace the GPU, then reboot"),
    ("communicate with the NVIDIA driver",      # pastes change the apostrophe of "couldn't"
     "nvidia-smi cannot talk to the driver", "load the NVIDIA kernel driver matching the "
     "userspace (`modprobe nvidia`, reinstall after a kernel update)"),
    ("No devices were found", "the driver sees no GPU",
     "check `lspci | grep -i nvidia`, the driver and, in a container, --gpus / device plugin"),
    ("Driver/library version mismatch", "driver/library version mismatch",
     "reboot (or reload the nvidia modules) after a driver upgrade"),
)
_BAD_VALUE = ("[GPU requires reset]", "[Unknown Error]", "[GPU is lost]", "ERR!")
CSV_HEALTH_FIELDS = ("index", "name", "uuid", "memory.total", "pstate",
                     "ecc.errors.uncorrected.volatile.total", "remapped_rows.pending",
                     "remapped_rows.failure")


def judge_nvidia_smi(text: str, shape: str) -> Judgement:
    j = Judgement({"table": "nvidia-smi", "csv": "nvidia-smi --query-gpu", "list": "nvidia-smi -L",
                   "q": "nvidia-smi -q", "error": "nvidia-smi"}[shape])
    for needle, msg, advice in FATAL:
        for ln in text.splitlines():
            if needle in ln:
                j.add(FAIL, f"{msg}: {ln.strip()}", advice)
                break
    gpus: list[dict[str, Any]] = []
    if shape == "table":
        gpus = _table(text, j)
    elif shape == "csv":
        gpus = _csv(text, j)
    elif shape == "list":
        gpus = [{"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3)}
                for m in re.finditer(r"GPU (\d+): (.+?) \(UUID: ([^)]+)\)", text)]
    elif shape == "q":
        gpus = _query(text, j)
    j.facts["gpus"] = gpus
    j.facts["count"] = len(gpus)
    if shape != "error" and not gpus and not j.findings:
        j.add(FAIL, "no GPU in the text", "save the complete nvidia-smi output")
    elif gpus and all(f.level == PASS for f in j.findings):
        j.add(PASS, f"{len(gpus)} GPU(s): {', '.join(sorted({str(g.get('name', '?')) for g in gpus}))}")
    return j


def _table(text: str, j: Judgement) -> list[dict[str, Any]]:
    lines = text.splitlines()
    m = re.search(r"Driver Version:\s*(\S+)", text)
    if m:
        j.facts["driver"] = m.group(1)
    gpus: list[dict[str, Any]] = []
    for i, ln in enumerate(lines):
        m = re.match(r"\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+(\S+)\s+(\S+)\s+\|\s+(\S+)\s+\|", ln)
        if not m:
            continue
        gpu = {"index": int(m.group(1)), "name": m.group(2), "bus_id": m.group(4),
               "ecc_uncorrected": m.group(6)}
        second = lines[i + 1] if i + 1 < len(lines) else ""
        pm = re.search(r"\bP(\d{1,2})\b", second)
        if pm:
            gpu["pstate"] = f"P{pm.group(1)}"
        gpus.append(gpu)
        where = f"GPU {gpu['index']} ({gpu['bus_id']})"
        if "ERR!" in ln or "ERR!" in second:
            j.add(FAIL, f"{where}: a field reads ERR!: {second.strip() if 'ERR!' in second else ln.strip()}",
                  "the driver cannot read that sensor: check `nvidia-smi -q -i <n>` and `dmesg` "
                  "for Xid errors; drain the node if it persists")
        if digits(str(gpu["ecc_uncorrected"])) and int(gpu["ecc_uncorrected"]) > 0:
            j.add(FAIL, f"{where}: {gpu['ecc_uncorrected']} volatile uncorrectable ECC error(s)",
                  "reset the GPU (or reboot) to retire/remap the memory; replace it if they recur")
    return gpus


def _csv(text: str, j: Judgement) -> list[dict[str, Any]]:
    rows = [ln.strip() for ln in text.splitlines() if ln.strip() and "," in ln]
    if not rows:
        return []
    first = [c.strip() for c in rows[0].split(",")]
    if not any(c and digits(c[0]) for c in first) and any(c.split(" [")[0] in
                                                           KNOWN_COLS for c in first):
        cols = [c.split(" [")[0] for c in first]
        rows = rows[1:]
    else:
        cols = list(CSV_HEALTH_FIELDS[:len(first)]) if len(first) <= 4 else list(CSV_HEALTH_FIELDS)
    j.facts["columns"] = cols
    gpus: list[dict[str, Any]] = []
    for n, row in enumerate(rows):
        vals = [v.strip() for v in row.split(",")]
        gpu = dict(zip(cols, vals))
        if len(vals) != len(cols):
            j.add(WARN, f"row {n + 1} has {len(vals)} fields for {len(cols)} columns: {row!r}",
                  "save the output again (a name containing ',' or a cut line)")
        idx = gpu.get("index", str(n))
        where = f"GPU {idx}"
        for col, val in gpu.items():
            if any(b in val for b in _BAD_VALUE):
                j.add(FAIL, f"{where}: {col} = {val}",
                      "reset the GPU (`nvidia-smi -r -i <n>` when idle) or reboot; check dmesg for Xid")
        ecc = gpu.get("ecc.errors.uncorrected.volatile.total", "")
        if digits(ecc) and int(ecc) > 0:
            j.add(FAIL, f"{where}: {ecc} volatile uncorrectable ECC error(s)",
                  "reset the GPU (or reboot) so the memory is remapped; replace it if they recur")
        if gpu.get("remapped_rows.pending", "").lower() in ("yes", "1"):
            j.add(FAIL, f"{where}: a row remap is pending", "reset the GPU (or reboot) before use")
        if gpu.get("remapped_rows.failure", "").lower() in ("yes", "1"):
            j.add(FAIL, f"{where}: row remapping failed", "the GPU needs replacement (RMA)")
        gpus.append(gpu)
    return gpus


KNOWN_COLS = {"index", "name", "uuid", "memory.total", "pci.bus_id", "pci.bus", "pstate",
               "driver_version", "memory.used", "memory.free", "temperature.gpu", "serial",
               "ecc.errors.uncorrected.volatile.total", "remapped_rows.pending",
               "remapped_rows.failure", "utilization.gpu", "power.draw", "gpu_uuid", "gpu_name",
               "gpu_bus_id", "count", "compute_cap", "ecc.mode.current"}


def _query(text: str, j: Judgement) -> list[dict[str, Any]]:
    m = re.search(r"Attached GPUs\s*:\s*(\d+)", text)
    attached = int(m.group(1)) if m else None
    m = re.search(r"Driver Version\s*:\s*(\S+)", text)
    if m:
        j.facts["driver"] = m.group(1)
    gpus: list[dict[str, Any]] = []
    section = ""
    for ln in text.splitlines():
        mg = re.match(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", ln)
        if mg:
            gpus.append({"bus_id": mg.group(1)})
            continue
        if ln.strip() and ":" not in ln:
            section = ln.strip()
            continue
        key, _, val = ln.partition(":")
        key, val = key.strip(), val.strip()
        where = f"GPU {gpus[-1]['bus_id']}" if gpus else "a GPU"
        if gpus and key == "Product Name":
            gpus[-1]["name"] = val
        elif gpus and key == "Performance State":
            gpus[-1]["pstate"] = val
        if section == "Remapped Rows" and key == "Pending" and val == "Yes":
            j.add(FAIL, f"{where}: row remapping pending", "reset the GPU (or reboot) before use")
        elif section == "Remapped Rows" and key == "Remapping Failure Occurred" and val == "Yes":
            j.add(FAIL, f"{where}: row remapping failed", "the GPU needs replacement (RMA)")
        elif section == "Volatile" and "Uncorrectable" in key and digits(val) and int(val) > 0:
            j.add(FAIL, f"{where}: {val} volatile {key} ECC error(s)",
                  "reset the GPU (or reboot) so the memory is retired/remapped")
        elif section == "Retired Pages" and key.startswith("Pending Page") and val == "Yes":
            j.add(FAIL, f"{where}: retired pages pending", "reset the GPU (or reboot) to retire them")
        elif key == "Reset Required" and val == "Yes":
            j.add(FAIL, f"{where}: the driver asks for a GPU reset", "reset the GPU or reboot")
        elif "ERR!" in val or any(b in val for b in _BAD_VALUE[:3]):
            j.add(FAIL, f"{where}: {key} = {val}", "check dmesg for Xid errors; reset or drain")
    if not gpus and any(f.level == FAIL for f in j.findings):
        gpus = [{"bus_id": "?"}]      # a -q fragment: the findings are about some GPU
    if attached is not None:
        j.facts["attached"] = attached
        if len(gpus) < attached:
            j.add(WARN, f"the text describes {len(gpus)} of {attached} attached GPUs (output cut?)",
                  "save the complete `nvidia-smi -q` output")
    return gpus
