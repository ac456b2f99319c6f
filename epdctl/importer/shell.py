"""Read launch scripts the way a shell would read their command lines: ``\\`` continuations,
comments, ``$ `` prompts copied from docs, ``export NAME=value`` (kept for later commands of the
same file), inline ``NAME=value cmd`` assignments, wrappers (nohup, env, numactl, a custom
``run.sh``), and trailing redirections, pipes and ``&``. Variables the script sets itself are
expanded as the shell would; other ``${VAR}`` / ``$VAR`` stay as written, so the topology keeps the
placeholders the script leaves to whoever runs it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from epdctl.errors import EpdctlError
from epdctl.importer.containers import NODE_BLOCK, docker_run

ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
PROMPT = re.compile(r"^\s*(\$|#|>)\s+(?=\S)")
OPERATORS = {"|", "||", "&", "&&", ";", ">", ">>", "<", "2>", "2>>", ">&", "2>&1", "&>"}
SETUP = {"source", ".", "cd", "conda", "module", "ulimit"}  # node setup lines, not launches
WRAPPERS = {"nohup", "env", "exec", "time", "sudo", "stdbuf", "taskset", "numactl", "srun"}


class ScriptError(EpdctlError):
    """A launch script cannot be read or holds nothing epdctl can import."""


@dataclass
class Command:
    """One command line: where it was, the env it sets, its program and arguments."""

    source: str
    line: int
    env: dict[str, str]
    argv: list[str]
    comment: str | None = None  # the comment line right above it, e.g. "# prefill 0"
    exported: dict[str, str] = field(default_factory=dict)  # `export`s seen earlier in the file
    setup: list[str] = field(default_factory=list)  # `source venv/bin/activate`, `cd DIR` seen earlier
    place: str | None = None  # what runs it apart from the other commands: "node 2", "container x", "pod p-0-1"
    image: str | None = None  # the container image it runs in (docker run IMAGE, a pod's image)
    wrapper: list[str] = field(default_factory=list)  # the `docker run OPTIONS IMAGE` around it

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join backslash continuations; return (first physical line number, joined text)."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf:
            start = n
        if line.endswith("\\") and not line.endswith("\\\\"):
            buf.append(line[:-1])
            continue
        buf.append(line)
        out.append((start, " ".join(part.strip() for part in buf)))
        buf = []
    if buf:
        out.append((start, " ".join(part.strip() for part in buf)))
    return out


FD_REDIRECT = re.compile(r"(^|\s)\d+(?=>|<)")  # the "2" of "2>&1" / "2> log": not an argument


def _tokens(line: str, where: str) -> list[str]:
    lex = shlex.shlex(FD_REDIRECT.sub(r"\1", line), posix=True, punctuation_chars="|&;<>")
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        return list(lex)
    except ValueError as e:
        raise ScriptError(f"{where}: cannot split this line like a shell ({e}); check its quotes") from None


REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand(tok: str, known: dict[str, str]) -> str:
    """What the shell would pass for ``tok``: variables the script itself set are expanded, the
    others (set by whoever runs the script) stay as written."""
    return REF.sub(lambda m: known.get(m.group(1) or m.group(2), m.group(0)), tok)


def parse_script(text: str, source: str) -> list[Command]:
    """Every command line of one script, in order (comments and blank lines dropped)."""
    commands: list[Command] = []
    exported: dict[str, str] = {}
    shell_vars: dict[str, str] = {}
    setup: list[str] = []
    last_comment: str | None = None
    place: str | None = None
    for lineno, line in _logical_lines(text):
        stripped = line.strip()
        m = PROMPT.match(stripped)
        if m and m.group(1) == "$":
            stripped = stripped[m.end():]  # "$ python -m ..." copied from a doc
        if not stripped:
            continue
        if stripped.startswith("#"):
            last_comment = stripped.lstrip("#").strip() or last_comment
            block = NODE_BLOCK.match(last_comment or "")
            if block:
                place = f"node {block.group(1)}"  # "# node 2": what follows runs on another machine
            continue
        toks = _tokens(stripped, f"{source}:{lineno}")
        cut = next((i for i, t in enumerate(toks) if t in OPERATORS or set(t) <= set("|&;<>")), len(toks))
        toks = toks[:cut]
        if toks and toks[0] in SETUP:
            setup.append(shlex.join(toks))
            continue
        if toks and toks[0] == "export":
            for tok in toks[1:]:
                a = ASSIGN.match(tok)
                if a:
                    exported[a.group(1)] = expand(a.group(2), {**shell_vars, **exported})
            continue
        env: dict[str, str] = {}
        while toks and (ASSIGN.match(toks[0]) or toks[0] in WRAPPERS):
            a = ASSIGN.match(toks.pop(0))
            if a:
                env[a.group(1)] = a.group(2)
        known = {**shell_vars, **exported}
        run = docker_run(toks, f"{source}:{lineno}")
        if run is not None:  # the server runs in its own container: its env is the container's
            toks = run.argv
            env.update(run.env)
        if toks:
            commands.append(Command(source, lineno, {k: expand(v, known) for k, v in env.items()},
                                    [expand(x, known) for x in toks], last_comment, dict(exported), list(setup),
                                    run.place if run is not None else place,
                                    expand(run.image, known) if run is not None else None,
                                    [expand(x, known) for x in run.wrapper] if run is not None else []))
        elif env:
            shell_vars.update({k: expand(v, known) for k, v in env.items()})  # NAME=value alone: a shell
            # variable for later lines, not exported to the servers' environment
        last_comment = None
    return commands


def read_text(p: str) -> str:
    try:
        return Path(p).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScriptError(f"no such file: {p}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScriptError(f"cannot read {p} ({e}); pass shell scripts or manifests as UTF-8 text") from None


def looks_like_manifest(text: str) -> bool:
    return bool(re.search(r"^apiVersion:\s*\S", text, re.M)) and bool(re.search(r"^kind:\s*\S", text, re.M))
