"""What separates launch commands onto machines in a script: ``# node N`` blocks and ``docker run``.

``docker run [OPTIONS] IMAGE COMMAND...`` is read as Docker's own CLI reads it (``docker run
--help``): options before the image, the image, then the command the container runs. The
container's ``-e/--env`` become the server's environment, ``--name`` names its place, and a
``bash -c "..."`` command is read as the line it runs.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from epdctl.errors import EpdctlError

# "# node 2", "# Node 1:", "# on node 0", "# node-1 (prefill)": the commands below run on that machine
NODE_BLOCK = re.compile(r"^(?:on\s+)?(?:node|host|machine|server)[\s#_-]*(\d+)\b", re.I)

# `docker run` options without a value (docker/cli cli/command/container/opts.go: bool flags)
DOCKER_SWITCHES = {"-d", "--detach", "-i", "--interactive", "-t", "--tty", "--rm", "--privileged", "--init",
                   "-P", "--publish-all", "--read-only", "--oom-kill-disable", "--no-healthcheck", "--disable-content-trust",
                   "-q", "--quiet", "--help"}
SHELLS = {"bash", "sh", "/bin/bash", "/bin/sh", "/usr/bin/bash", "zsh"}


def place_ref(place: str) -> str:
    """``${NAME_HOST}`` for the machine of a place: "pod p-0-1" -> ${P_0_1_HOST}, "node 2" -> ${NODE_2_HOST}."""
    kind, _, name = place.partition(" ")
    label = name if kind in ("pod", "container") else place
    return "${" + re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_").upper() + "_HOST}"


class ContainerError(EpdctlError):
    """A container launch cannot be read."""


@dataclass
class ContainerRun:
    """The command a container runs, with the container's env, image and name."""

    argv: list[str]
    env: dict[str, str]
    image: str
    place: str
    wrapper: list[str]  # ``docker run OPTIONS IMAGE``: what the import keeps as the container: block


def _is_switch(tok: str) -> bool:
    if tok in DOCKER_SWITCHES:
        return True
    # combined short switches: -it, -itd, -dit
    return bool(re.fullmatch(r"-[ditP]{2,}", tok))


def docker_run(toks: list[str], where: str) -> ContainerRun | None:
    """The container launch ``toks`` is (``docker run ...`` / ``podman run ...``), or None."""
    if len(toks) < 3 or toks[0].rsplit("/", 1)[-1] not in ("docker", "podman", "nerdctl") or toks[1] != "run":
        return None
    env: dict[str, str] = {}
    name: str | None = None
    i = 2
    while i < len(toks) and toks[i].startswith("-"):
        tok = toks[i]
        i += 1
        if _is_switch(tok):
            continue
        opt, eq, value = tok.partition("=")
        if not eq:
            if i >= len(toks):
                raise ContainerError(f"{where}: docker run option {tok} has no value and no image follows")
            value = toks[i]
            i += 1
        if opt in ("-e", "--env"):
            k, has, v = value.partition("=")
            if has:
                env[k] = v
            else:
                env[k] = "${" + k + "}"  # `-e NAME`: passed through from the launching shell
        elif opt == "--name":
            name = value
    if i >= len(toks):
        raise ContainerError(f"{where}: docker run without an image")
    image, argv = toks[i], toks[i + 1:]
    if len(argv) >= 3 and argv[0] in SHELLS and argv[1] in ("-c", "-lc"):
        argv = shell_c(argv[2], env, where)
    return ContainerRun(argv, env, image, f"container {name}" if name else f"container at {where}", toks[:i + 1])


ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


def shell_c(line: str, env: dict[str, str], where: str) -> list[str]:
    """The server command of a ``sh -c LINE`` (``cd /x && NAME=v python3 -m ...``); its inline
    assignments join ``env``."""
    lex = shlex.shlex(line, posix=True, punctuation_chars="|&;")
    lex.whitespace_split = True
    try:
        toks = list(lex)
    except ValueError as e:
        raise ContainerError(f"{where}: cannot split the container's `sh -c` command ({e})") from None
    segments: list[list[str]] = [[]]
    for tok in toks:
        if tok and set(tok) <= set("|&;"):
            segments.append([])
        else:
            segments[-1].append(tok)
    chosen = next((s for s in segments if "-m" in s or "serve" in s), segments[0])
    while chosen and ASSIGN.match(chosen[0]):
        k, _, v = chosen.pop(0).partition("=")
        env[k] = v
    return chosen
