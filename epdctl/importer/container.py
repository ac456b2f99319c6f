"""The container around an imported server command: ``docker|podman run OPTIONS IMAGE python
-m ...`` (SGLang's multi-node docs) or ``srun --container-image=IMAGE --container-mounts=...``
(srtctl, pyxis) read into a ``container:`` block; epdctl renders the rest (name, labels, host
network and IPC, the worker's GPUs) itself."""

from __future__ import annotations

import re
from typing import Any

# docker/podman run options that take a value (docs.docker.com container run); others are flags
VALUED = {"-v", "--volume", "-e", "--env", "--name", "--shm-size", "--network", "--net", "--ipc", "--gpus",
          "--device", "--ulimit", "--cap-add", "-w", "--workdir", "--entrypoint", "--runtime", "-p", "--publish",
          "-u", "--user", "--label", "-l", "--env-file", "--mount", "--pid", "--hostname", "-h", "--platform"}
ENGINE_START = re.compile(r"^(python[0-9.]*|vllm|sglang|smg)$")  # the program the container runs
# srun options that take a value (the pyxis ones from its spank_opts, and srun's own in srtctl's lines)
SRUN_VALUED = {"--container-image", "--container-mounts", "--container-workdir", "--container-name",
               "--container-save", "--container-env", "--container-unshare", "--nodes", "-N", "--ntasks", "-n",
               "--nodelist", "-w", "--output", "-o", "--jobid", "--job-name", "-J", "--partition", "-p"}


def _split(prefix: list[str], valued: set[str] = VALUED) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(prefix):
        tok = prefix[i]
        name, eq, value = tok.partition("=")
        if eq and name.startswith("-"):
            out.append((name, value))
        elif tok in valued and i + 1 < len(prefix):
            out.append((tok, prefix[i + 1]))
            i += 1
        else:
            out.append((tok, None))
        i += 1
    return out


def _mount(spec: str, flags_sep: str = ",") -> str:
    src = spec.replace("~", "/root", 1) if spec.startswith("~") else spec
    parts = src.split(":")
    ro = len(parts) > 2 and "ro" in parts[2].replace("+", ",").split(",")
    return ":".join(parts[:2]) + (":ro" if ro else "")


def container_of(argv: list[str]) -> dict[str, Any] | None:
    """The container block of one command line, or None when it runs bare."""
    cut = next((i for i, t in enumerate(argv) if ENGINE_START.match(t.rsplit("/", 1)[-1])), len(argv))
    prefix = argv[:cut]
    if len(prefix) >= 3 and prefix[0].rsplit("/", 1)[-1] in ("docker", "podman") and prefix[1] == "run":
        return _oci(prefix[0].rsplit("/", 1)[-1], prefix[2:])
    opts = dict(_split(prefix, SRUN_VALUED))
    if "--container-image" in opts:
        block: dict[str, Any] = {"runtime": "pyxis", "image": opts["--container-image"]}
        if opts.get("--container-mounts"):
            block["mounts"] = [_mount(m) for m in str(opts["--container-mounts"]).split(",") if m]
        if opts.get("--container-workdir"):
            block["workdir"] = opts["--container-workdir"]
        return block
    return None


def _oci(runtime: str, rest: list[str]) -> dict[str, Any] | None:
    items = _split(rest)
    if not items or items[-1][1] is not None:
        return None
    image = items[-1][0]
    block: dict[str, Any] = {"runtime": runtime, "image": image}
    mounts: list[str] = []
    devices: list[str] = []
    caps: list[str] = []
    env: dict[str, str] = {}
    ulimits: dict[str, str] = {}
    for name, value in items[:-1]:
        if name in ("-v", "--volume") and value:
            mounts.append(_mount(value))
        elif name in ("-e", "--env") and value:
            key, eq, val = value.partition("=")
            env[key] = val if eq else "${%s}" % key  # `-e NAME`: from the launching environment
        elif name == "--device" and value:
            devices.append(value.split(":", 1)[0])
        elif name == "--cap-add" and value:
            caps.append(value)
        elif name == "--ulimit" and value:
            key, _, val = value.partition("=")
            ulimits[key] = val
        elif name == "--shm-size" and value:
            block["shm_size"] = value
        elif name == "--privileged":
            block["privileged"] = True
        elif name in ("-w", "--workdir") and value:
            block["workdir"] = value
    extra: dict[str, Any] = {"mounts": mounts, "env": env, "devices": devices, "cap_add": caps, "ulimits": ulimits}
    block.update({k: v for k, v in extra.items() if v})
    return block
