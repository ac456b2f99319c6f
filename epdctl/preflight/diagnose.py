"""Recognise which tool printed a text, by its content, and judge it. Never raises.

Used by `epdctl diagnose FILE...` (saved outputs pasted from nodes or tickets) and by
`epdctl check` (the probes' outputs), so both say the same thing about the same text. The exit
status of the tool never decides: a tool exiting 1 may have printed healthy devices, and error
text can arrive with exit 0.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from epdctl.preflight import gpu_text, host_judge, mooncake_log, perftest_judge, rdma_judge
from epdctl.preflight import rdma_netdev, rdma_text
from epdctl.preflight.judgement import FAIL, UNKNOWN, Judgement, not_recognised
from epdctl.preflight.textprep import Prepared, prepare, sections

log = logging.getLogger(__name__)
_PERFTEST = re.compile(r"BW (?:peak|average)\[|#bytes\s+#iterations|\b\w+ BW Test\b|Lat(?:ency)? Test"
                       r"|Waiting for client to connect|Couldn't get context for the device|"
                       r"Unable to create QP|Couldn't create IB resources|RDMA CM event error|"
                       r"ethernet_read_keys|Unable to Connect the HCA|Failed to modify QP to RT[RS]$|"
                       r"Couldn't connect to|state is Down|Did not detect devices", re.M)
_DEVINFO = re.compile(r"hca_id:|PORT_(?:ACTIVE|DOWN|INIT|ARMED)|phys_port_cnt|Failed to open device|"
                      r"No IB devices found|Failed to get IB devices list|^\s*link_layer:\s",
                      re.M)
_NVSMI_ERR = tuple(n for n, _, _ in gpu_text.FATAL)
# a GPU row of the nvidia-smi table: "|   1  Tesla V100-PCIE...  On   | 00008ED0:00:00.0 Off |"
_NVSMI_ROW = re.compile(r"^\|\s+\d+\s+.+?\s+(?:On|Off)\s+\|\s+[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d",
                        re.M)
# the ibstatus script when /sys/class/infiniband holds no device: its glob stays '*'
_IBSTATUS_NONE = re.compile(r"Fatal error:\s+device '[^']*': sys files not found")


def recognise(prep: Prepared) -> tuple[str, str] | None:
    """(tool, shape) or None. Shapes: nvidia-smi table/csv/list/q/error."""
    text, cmds = prep.text, prep.commands
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if any(mooncake_log.is_mooncake_line(ln) for ln in lines) or "transfer_engine_bench" in cmds:
        return "mooncake", ""
    if re.search(r"NVSMI LOG|Attached GPUs\s*:|^\s*Product Name\s*:|^\s*Remapped Rows\s*$", text, re.M):
        return "nvidia-smi", "q"
    if "NVIDIA-SMI" in text and "Driver Version" in text or _NVSMI_ROW.search(text):
        return "nvidia-smi", "table"  # the whole table, or its GPU rows pasted without the header
    if re.search(r"^\s*GPU \d+: .+\(UUID: ", text, re.M):
        return "nvidia-smi", "list"
    if any(n in text for n in _NVSMI_ERR):
        return "nvidia-smi", "error"
    if _looks_csv(lines, prep):
        return "nvidia-smi", "csv"
    if _PERFTEST.search(text) or any(re.fullmatch(r"ib_\w+_(?:bw|lat)", c.rsplit("/", 1)[-1])
                                     for c in cmds):
        return "perftest", ""
    if rdma_netdev.read_show_gids(text) or re.search(r"^\s*DEV\s+PORT\s+INDEX\s+GID", text, re.M):
        return "show_gids", ""
    if rdma_netdev.read_ibdev2netdev(text):
        return "ibdev2netdev", ""
    if "Infiniband device '" in text or _IBSTATUS_NONE.search(text):
        return "ibstatus", ""
    if re.search(r"^\s*CA '[^']+'", text, re.M) or "ibpanic:" in text:
        return "ibstat", ""
    if re.search(r"^\s*link \S+/\d+\s", text, re.M):
        return "rdma link", ""
    if re.search(r"^\s*device\s+node GUID\s*$|^\s*\d+ HCAs? found:", text, re.M):
        return "ibv_devices", ""
    if _DEVINFO.search(text) or "ibv_devinfo" in cmds:
        return "ibv_devinfo", ""
    if "max locked memory" in text or (any(c.startswith("ulimit") for c in cmds)
                                       and host_judge.read_memlock(text)):
        return "ulimit -l", ""
    if any(c == "lsmod" for c in cmds) or re.search(r"^Module\s+Size\s+Used by", text, re.M) \
            or set(host_judge.read_lsmod(text)) & host_judge.KNOWN_MODULES:
        return "lsmod", ""
    if len(lines) == 1 and re.fullmatch(r"unlimited|\d+", lines[0].strip()):
        return "ulimit -l", ""
    return None


def unrecognised(text: str | None, tools: tuple[str, ...]) -> str | None:
    """A reason when ``text`` (a probe's output) is not output of one of ``tools``; else None."""
    if text is None or not text.strip():
        return None
    try:
        found = recognise(prepare(text))
    except Exception:  # noqa: BLE001 - unreadable is exactly what we report
        found = None
    if found is not None and found[0] in tools:
        return None
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    what = f"looks like {found[0]} output" if found else "not recognised"
    return f"{' / '.join(tools)} printed text that is {what}: {first[:100]!r}"


def _looks_csv(lines: list[str], prep: Prepared) -> bool:
    if any("--query-gpu" in a for a in prep.args):
        return True
    comma = [ln for ln in lines if "," in ln]
    if not comma or len(comma) != len(lines):
        return False
    head = {c.strip().split(" [")[0] for c in comma[0].split(",")}
    if head & gpu_text.KNOWN_COLS and len(head & gpu_text.KNOWN_COLS) >= 2:
        return True
    return all(re.match(r"\s*\d+\s*,", ln) for ln in comma) and any("GPU-" in ln or "NVIDIA" in ln
                                                                   for ln in comma)


def judge_text(raw: str) -> Judgement:
    """The judgement of one tool's output; text no reader claims is 'unknown' (fail). A pasted
    transcript of several commands is judged command by command, the findings merged."""
    try:
        parts = sections(raw)
    except Exception as e:  # noqa: BLE001 - a reader bug must not hide the file
        return _crashed("?", raw, e)
    if len(parts) > 1:
        judged = [j for j in (_judge_one(p) for p in parts) if j.tool != UNKNOWN]
        if len(judged) == 1:
            return judged[0]
        if judged:
            return _merged(judged)
    return _judge_one(raw)


def _merged(judged: list[Judgement]) -> Judgement:
    j = Judgement(" + ".join(dict.fromkeys(x.tool for x in judged)),
                  {"commands": [{"tool": x.tool, "family": x.kind, "verdict": x.verdict, "facts": x.facts}
                                for x in judged]})
    for x in judged:
        for f in x.findings:
            j.add(f.level, f"[{x.tool}] {f.message}", f.advice)
    return j


def _judge_one(raw: str) -> Judgement:
    try:
        prep = prepare(raw)
    except Exception as e:  # noqa: BLE001 - a reader bug must not hide the file
        return _crashed("?", raw, e)
    if not prep.text.strip():
        what = f" (only the command line: {prep.args[-1]})" if prep.args else ""
        if prep.args and any(c == "lsmod" for c in prep.commands):
            return host_judge.judge_lsmod("", _grepped(prep))
        return not_recognised(f"the text is empty{what}")
    try:
        found = recognise(prep)
        if found is None:
            first = next((ln.strip() for ln in prep.text.splitlines() if ln.strip()), "")
            return not_recognised(f"no supported tool prints text like {first[:80]!r}")
        j = _dispatch(found, prep)
    except Exception as e:  # noqa: BLE001 - never a traceback; say where it broke
        return _crashed(found[0] if "found" in locals() and found else "?", prep.text, e)
    if prep.args:
        j.facts.setdefault("command", prep.args[0])
    return j


def _grepped(prep: Prepared) -> tuple[str, ...]:
    return tuple(w for a in prep.args for w in a.split() if w in host_judge.PEERMEM)


def _dispatch(found: tuple[str, str], prep: Prepared) -> Judgement:
    tool, shape = found
    text = prep.text
    if tool == "mooncake":
        if mooncake_log.is_bench(text, prep.commands) and "transfer_engine_bench" not in text:
            text = "transfer_engine_bench\n" + text  # the command line named it
        return mooncake_log.judge_mooncake(text)
    if tool == "nvidia-smi":
        return gpu_text.judge_nvidia_smi(text, shape)
    if tool == "perftest":
        return perftest_judge.judge_perftest(text, prep.commands)
    if tool == "show_gids":
        return rdma_netdev.judge_show_gids(rdma_netdev.read_show_gids(text), text)
    if tool == "ibdev2netdev":
        return rdma_netdev.judge_ibdev2netdev(rdma_netdev.read_ibdev2netdev(text))
    if tool == "ibstatus":
        return rdma_judge.judge_ports(tool, rdma_text.read_ibstatus(text))
    if tool == "ibstat":
        return rdma_judge.judge_ports(tool, rdma_text.read_ibstat(text))
    if tool == "ibv_devinfo":
        return rdma_judge.judge_ports(tool, rdma_text.read_ibv_devinfo(text))
    if tool == "rdma link":
        return rdma_judge.judge_ports(tool, rdma_text.read_rdma_link(text))
    if tool == "ibv_devices":
        return rdma_judge.judge_device_list(rdma_text.read_device_list(text))
    if tool == "lsmod":
        return host_judge.judge_lsmod(text, _grepped(prep))
    return host_judge.judge_ulimit(text)


def _crashed(tool: str, text: str, e: Exception) -> Judgement:
    log.debug("reading %s output raised", tool, exc_info=e)
    line = getattr(e, "line", None) or next(
        (ln.strip() for ln in text.splitlines() if ln.strip()), "")
    j = Judgement(tool)
    j.add(FAIL, f"could not read this {tool} output ({type(e).__name__}: {e}); near line {line[:120]!r}",
          "report this output to the epdctl developers; meanwhile judge it by hand")
    return j


def judge_file(path: Path) -> Judgement:
    try:
        raw = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        j = Judgement("?")
        j.add(FAIL, f"cannot read {path}: {e.strerror}", "check the path and permissions")
        return j
    return judge_text(raw)
