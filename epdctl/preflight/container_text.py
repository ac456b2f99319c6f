"""Read what a probe container prints, and the runtime's own error when it does not start.

The probe (``probe_command``) runs inside the worker's container, with the worker's own run
options: ``ulimit -l`` (RDMA registers memory: it must be unlimited), ``ls -1 /dev/infiniband``
(where the worker uses ib/roce NICs) and ``nvidia-smi -L`` (where it has GPUs), each output after
a ``== `` header line. A probe that did not start left the runtime's error instead; ``why_not_started``
names the cause and the anchors' fix (tests/fixtures/containers/probe/: real podman outputs)."""

from __future__ import annotations

import re

from epdctl.preflight.gpu_text import judge_nvidia_smi
from epdctl.preflight.host_judge import judge_ulimit
from epdctl.preflight.judgement import FAIL, PASS, Judgement

HEAD = "== "
MEMLOCK, INFINIBAND, GPUS, EXIT = "ulimit -l", "ls /dev/infiniband", "nvidia-smi -L", "exit"
MEMLOCK_ADVICE = ("give the container unlimited locked memory: `--ulimit memlock=-1` (epdctl adds it unless "
                  "container.ulimits.memlock says otherwise); pyxis/enroot and apptainer inherit the node's "
                  "limit: `* - memlock unlimited` in limits.conf, LimitMEMLOCK=infinity for slurmd")
IB_ADVICE = ("pass the RDMA devices: `--device /dev/infiniband --cap-add IPC_LOCK` (or --privileged) for "
             "docker/podman; pyxis/enroot: MELLANOX_VISIBLE_DEVICES=all (enroot's mellanox hook); without "
             "them Mooncake/NCCL fall back to TCP")
GPU_ADVICE = ("make the GPUs reach the container: docker `--gpus` (NVIDIA Container Toolkit), podman CDI "
              "(`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`, then --device nvidia.com/gpu=N), "
              "apptainer `--nv`, enroot NVIDIA_VISIBLE_DEVICES (its nvidia hook) with "
              "NVIDIA_DRIVER_CAPABILITIES including utility")

# (pattern in the runtime's error, what it means, what to do): docker/podman/runc texts
NOT_STARTED: tuple[tuple[str, str, str], ...] = (
    (r"error setting rlimit type 8|setrlimit.*MEMLOCK|RLIMIT_MEMLOCK",
     "the runtime could not set memlock inside (above the node's hard limit, without CAP_SYS_RESOURCE)",
     "raise the hard limit the runtime runs under (limits.conf `* - memlock unlimited`, LimitMEMLOCK=infinity "
     "in the docker/podman service), or set container.ulimits.memlock to the node's hard limit where no RDMA "
     "is used"),
    (r"error setting rlimit type 7|RLIMIT_NOFILE",
     "the runtime could not set the open-files limit inside (above the node's hard limit)",
     "set container.ulimits.nofile to at most the node's hard limit (`ulimit -Hn`), e.g. nofile: 20000:20000"),
    (r"unresolvable CDI devices|could not select device driver .* capabilities: \[\[gpu\]\]",
     "the runtime cannot hand the GPUs to the container", GPU_ADVICE),
    (r"/dev/infiniband: no such file or directory|adding custom device \"/dev/infiniband\"",
     "the node has no /dev/infiniband to pass",
     "load the RDMA drivers on the node (ib_uverbs and mlx5_ib; `ibv_devices` lists the HCAs), or declare "
     "no ib/roce NICs for it"),
    (r"image not known|manifest unknown|pull access denied|Unable to find image|initializing source|"
     r"repository does not exist|no such image",
     "the image is not on the node and cannot be pulled",
     "check the reference, then pull it on the node (`docker pull` / `podman pull`), or load it "
     "(`podman load -i`, `docker load -i`, `podman import`)"),
    (r"(?:statfs|stat|bind source path does not exist:?) (/\S+?):? no such file or directory|"
     r"bind source path does not exist: (/\S+)",
     "a mount source does not exist on the node",
     "create it on the node or fix container.mounts (the model, HF cache and venv are mounted at their own paths)"),
)


def probe_command(rdma: bool, gpus: bool) -> tuple[str, ...]:
    """The command the probe container runs (``sh``: every image has it)."""
    parts = [f"echo '{HEAD}{MEMLOCK}'; ulimit -l"]
    if rdma:
        parts.append(f"echo '{HEAD}{INFINIBAND}'; ls -1 /dev/infiniband 2>&1")
    if gpus:
        parts.append(f"echo '{HEAD}{GPUS}'; nvidia-smi -L 2>&1; echo \"{HEAD}{EXIT} $?\"")
    return ("sh", "-c", "; ".join(parts))


def read_sections(text: str) -> dict[str, str]:
    """Header -> the lines after it; the ``exit N`` header keeps N as its text."""
    out: dict[str, str] = {}
    key: str | None = None
    for line in text.splitlines():
        if line.startswith(HEAD):
            head = line[len(HEAD):].strip()
            if head.startswith(EXIT + " "):
                out[EXIT] = head[len(EXIT) + 1:]
                key = None
                continue
            key = head
            out[key] = ""
        elif key is not None:
            out[key] += line + "\n"
    return out


def judge_memlock(text: str) -> Judgement:
    """``ulimit -l`` inside: unlimited passes; a number fails with the container advice."""
    j = judge_ulimit(text)
    j.tool = "ulimit -l (in the container)"
    j.findings = [f if f.level == PASS or not f.advice else type(f)(f.level, f.message, MEMLOCK_ADVICE)
                  for f in j.findings]
    return j


def judge_infiniband(text: str) -> Judgement:
    """``ls -1 /dev/infiniband`` inside: verbs devices (uverbsN) must be there to open an HCA."""
    j = Judgement("ls /dev/infiniband (in the container)")
    names = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if any("No such file or directory" in n or "cannot access" in n for n in names):
        j.facts["devices"] = []
        j.add(FAIL, "/dev/infiniband is not in the container", IB_ADVICE)
        return j
    j.facts["devices"] = names
    verbs = [n for n in names if re.fullmatch(r"uverbs\d+", n)]
    if verbs:
        j.add(PASS, f"{len(verbs)} verbs device(s) inside: {', '.join(verbs)}")
    else:
        j.add(FAIL, f"/dev/infiniband has no uverbs device inside ({', '.join(names) or 'empty'})", IB_ADVICE)
    return j


def judge_gpus(text: str, status: str | None) -> Judgement:
    """``nvidia-smi -L`` inside (``status``: its exit status as printed)."""
    if status == "127" or re.search(r"nvidia-smi: (command )?not found", text):
        j = Judgement("nvidia-smi -L (in the container)")
        j.add(FAIL, "nvidia-smi is not in the container: the NVIDIA runtime did not inject the driver's "
                    "utilities", GPU_ADVICE)
        return j
    j = judge_nvidia_smi(text, "list")
    j.tool = "nvidia-smi -L (in the container)"
    if j.verdict == FAIL:
        j.findings = [type(f)(f.level, f.message, f.advice or GPU_ADVICE) for f in j.findings]
    return j


def why_not_started(text: str) -> tuple[str, str]:
    """(what went wrong, what to do) from the runtime's error when a container did not start;
    the last ``Error:`` line (or the last line) is quoted."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    quoted = next((ln for ln in reversed(lines) if ln.lower().startswith(("error", "docker:"))), lines[-1] if lines
                  else "no output")
    for pattern, what, advice in NOT_STARTED:
        if re.search(pattern, text, re.I):
            return f"{what}: {quoted}", advice
    return f"the container did not start: {quoted}", "run the probe by hand on the node and read the runtime's error"
