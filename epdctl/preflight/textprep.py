"""Make pasted tool output readable: drop fixture headers, markdown quote marks and shell prompt
lines, and remember which command a prompt line named.

Why: what people paste (support tickets, issue threads, chat) carries quoting and prompts around
the tool's own text; the readers should see the tool's text, and recognition may use the prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEADER_MARK = "#%"   # lines our fixture files start with (source URL, what they show)

# `$ cmd`, `# cmd`, `root@host:/dir# cmd`, `[root@gpu3 ~]# cmd`, `(env) [u@h ~]$ cmd`, `+ cmd`
_PROMPT = re.compile(
    r"^\s*(?:\([^)]*\)\s*)?(?P<who>\[[^\]]*\]|[\w.-]+@[\w.\\-]+(?::\S*)?)?\s*[#$+]\s*"
    r"(?P<cmd>\S+)?")
TOOLS = ("ibv_devinfo", "ibv_devices", "ibstatus", "ibstat", "ibdev2netdev", "show_gids",
         "show_gid", "nvidia-smi", "lsmod", "ulimit", "transfer_engine_bench", "rdma")


@dataclass(frozen=True)
class Prepared:
    text: str                  # the tool's text, prompts and quote marks removed
    commands: tuple[str, ...]  # commands named by prompt lines, in order
    args: tuple[str, ...]      # their full command lines


def prepare(raw: str) -> Prepared:
    lines = raw.replace("\r\n", "\n").split("\n")
    lines = [ln for ln in lines if not ln.startswith(HEADER_MARK)]
    body = [ln for ln in lines if ln.strip()]
    if body and all(re.match(r"^\s*>", ln) for ln in body):
        lines = [re.sub(r"^\s*> ?", "", ln) for ln in lines]
    commands: list[str] = []
    args: list[str] = []
    kept: list[str] = []
    for ln in lines:
        cmd = _prompt_command(ln)
        if cmd is not None:
            if cmd:
                commands.append(cmd)
                args.append(ln.strip())
            continue
        kept.append(ln)
    return Prepared("\n".join(kept), tuple(commands), tuple(args))


def _prompt_command(line: str) -> str | None:
    """The command a shell prompt line runs ('' for a bare prompt); None when not a prompt line.
    A bare `$ x` / `# x` / `+ x` counts only for the tools read here (else it may be a comment);
    a `user@host$ x` or `[user@host dir]# x` prompt counts whatever x is."""
    m = _PROMPT.match(line)
    if not m:
        return None
    cmd = (m.group("cmd") or "").rsplit("/", 1)[-1]
    if not cmd:
        stripped = line.strip()
        return "" if stripped and stripped[-1] in "#$" and len(stripped) < 80 else None
    if cmd == "sudo":
        rest = line[m.end("cmd"):].split()
        cmd = rest[0].rsplit("/", 1)[-1] if rest else cmd
    if any(cmd.startswith(tool) for tool in TOOLS) or re.fullmatch(r"ib_\w+", cmd):
        return cmd
    return cmd if m.group("who") else None


def sections(raw: str) -> list[str]:
    """The text split at shell prompt lines: one section per command of a pasted transcript
    (the prompt line starts its section)."""
    out: list[list[str]] = [[]]
    for ln in raw.replace("\r\n", "\n").split("\n"):
        if ln.startswith(HEADER_MARK):
            continue
        if _prompt_command(re.sub(r"^\s*> ?", "", ln)):
            out.append([])
        out[-1].append(ln)
    return ["\n".join(sec) for sec in out if any(x.strip() for x in sec)]
