"""How long each process may take to start, and what it is doing meanwhile.

Timeouts: a 700 GB checkpoint read from a shared filesystem by every node at once takes tens of
minutes, a 9 MB one a second, so one fixed number is either too short for the first or makes
a hung start of the second wait half an hour. Each process gets its own budget:

- an explicit ``startup: {timeout: S}`` (worker < node defaults < role < ``defaults`` <
  top-level ``startup``, the usual layering) wins;
- else ``BASE_S`` (engine start-up, memory profiling, CUDA graph capture) plus the bytes of
  the weights that process reads at ``LOAD_RATE`` (a shared filesystem's share per node): the
  sum of the model folder's weight files, the vision tower's alone for an encoder when the
  safetensors headers split them;
- weights not readable here (a path only the nodes have): ``UNKNOWN_S``;
- the router: the slowest worker's budget plus ``ROUTER_EXTRA_S`` (it is ready only once its
  workers are).

What a worker is doing: the last meaningful line of its log, cleaned of timestamps, process
prefixes, colour codes and progress-bar decoration ("Loading safetensors checkpoint shards:
12/163", "Capture cuda graph begin. ..."), so `up` can show it beside how long it has waited.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from epdctl.render.plan import Plan
from epdctl.topology.model import Role, Topology
from epdctl.topology.weights import read_split

BASE_S = 300.0
LOAD_RATE = 200e6          # bytes/s
UNKNOWN_S = 1800.0
ROUTER_EXTRA_S = 60.0
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def weight_bytes(model_path: str) -> int | None:
    """Sum of the weight files directly in the model folder; None when it is not readable here."""
    folder = Path(model_path)
    try:
        files = [f for f in folder.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES)]
        return sum(f.stat().st_size for f in files) if files else None
    except OSError:
        return None


def default_budget(nbytes: int | None) -> float:
    return UNKNOWN_S if nbytes is None else BASE_S + nbytes / LOAD_RATE


def budgets(topo: Topology, plan: Plan) -> dict[str, float]:
    """Seconds each planned process (by process name) may take to become ready."""
    total = weight_bytes(topo.model.path)
    split = read_split(topo.model.path) if total is not None else None
    by_worker = {w.name: w for w in topo.workers}
    out: dict[str, float] = {}
    for spec in plan.workers:
        w = by_worker.get(spec.worker)
        explicit = w.settings.startup_timeout if w is not None else None
        if explicit is not None:
            out[spec.name] = float(explicit)
            continue
        nbytes = total
        if split is not None and spec.role is Role.ENCODER and split.vision:
            nbytes = split.vision
        out[spec.name] = default_budget(nbytes)
    if plan.router is not None:
        out[plan.router.name] = max(out.values(), default=BASE_S) + ROUTER_EXTRA_S
    return out


def describe(topo: Topology, per_process: Mapping[str, float]) -> str:
    """One line: the budgets by role and where they come from."""
    total = weight_bytes(topo.model.path)
    size = "weights not readable here" if total is None else f"weights {total / 1e9:.2f} GB"
    by_role: dict[str, set[int]] = {}
    for name, s in per_process.items():
        by_role.setdefault(name.split("-")[0].split(".")[0], set()).add(round(s))
    roles = ", ".join(f"{r} {'/'.join(f'{v}s' for v in sorted(vals))}" for r, vals in by_role.items())
    return f"start-up timeouts: {roles} ({size}; `startup: {{timeout: S}}` or --timeout to change)"


# ---- what a worker is doing --------------------------------------------------------------

_ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;]*[A-Za-z]")
# (Worker_TP0_EP0 pid=2090) / (VllmWorker rank=0 pid=227) / (EngineCore_DP0 pid=185)
_PROC_PREFIX = re.compile(r"^\s*\([A-Za-z_][\w-]*(?: [\w]+=[\w.-]+)*\)\s*")
# INFO 06-15 13:58:43 [weight_utils.py:292]  /  INFO 04-03 14:16:19 model_runner.py:1311]
_VLLM_PREFIX = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
                          r"\[?[\w./-]+:\d+\]\s*")
# [2025-10-16 09:06:10 TP0]  /  [23:03:43 TP3]  /  [2025-10-16 09:06:10]
_SGLANG_PREFIX = re.compile(r"^\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?(?: [A-Z]{1,3}\d+)*\]\s*")
# [2024-09-19 17:39:43,201] [INFO] [real_accelerator.py:203:get_accelerator]
_BRACKETED = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d+\] \[[A-Z]+\] (?:\[[^\]]*\] )?")
_ISO_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?\s+(?:[A-Z]+\s+)?")
# tqdm: "Desc:  12% Completed | 12/163 [00:05<...]"  or  "Desc:  40%|████ | 14/35 [00:01<...]"
_TQDM = re.compile(r"^(?P<desc>.*?):\s+\d+%\s*(?:Completed\s*)?\|[^|]*?\|?\s*(?P<n>\d+)/(?P<of>\d+)\b")
_TQDM_BARE = re.compile(r"^(?P<desc>.*?):\s+\d+%\s*\|[^|]*\|\s*(?P<n>\d+)/(?P<of>\d+)\b")
# what says nothing about progress: access logs of health probes, separators
_NOISE = re.compile(r'"(?:GET|POST|HEAD) /[^"]*HTTP/1\.[01]"|^[-=*#~ ]+$')
MAX_LINE = 120


def clean(line: str) -> str:
    """A log line without colour codes, process prefixes, timestamps or progress-bar drawing."""
    text = _ANSI.sub("", line).strip()
    for pat in (_PROC_PREFIX, _BRACKETED, _VLLM_PREFIX, _SGLANG_PREFIX, _ISO_PREFIX, _PROC_PREFIX):
        text = pat.sub("", text, count=1).strip()
    m = _TQDM_BARE.match(text) or _TQDM.match(text)
    if m and m.group("desc").strip():
        text = f"{m.group('desc').strip()}: {m.group('n')}/{m.group('of')}"
    if len(text) > MAX_LINE:
        text = text[:MAX_LINE - 1] + "…"
    return text


def meaningful_line(text: str) -> str:
    """The last line of a log tail that says what the process is doing ('' when none does).
    Progress bars rewrite their line with carriage returns: every segment counts as a line."""
    for raw in reversed(re.split(r"[\r\n]+", text)):
        line = clean(raw)
        if line and not _NOISE.search(line):
            return line
    return ""
