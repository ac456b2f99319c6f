"""`epdctl import`: existing launch scripts -> a topology (see docs/topology.md, "Importing")."""

from __future__ import annotations

import re
from pathlib import Path

from epdctl.importer.compose import draft
from epdctl.importer.build import Draft
from epdctl.importer.emit import to_yaml
from epdctl.importer.launches import Launch, classify
from epdctl.importer.kube import parse_manifests
from epdctl.importer.shell import Command, ScriptError, looks_like_manifest, parse_script, read_text

__all__ = ["import_scripts", "Draft", "ScriptError"]
QUIET = {"set", "echo", "sleep", "wait", "mkdir", "rm", "trap", "kill", "pkill", "unset", "if", "fi", "then",
         "else", "done", "for", "while", "do", "exit", "true", "false", "printf", "[", "[[", "}", "{"}
REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def substitute(cmd_tokens: list[str], variables: dict[str, str]) -> list[str]:
    """``$NAME`` / ``${NAME}`` replaced where the user gave NAME=VALUE; other references stay."""
    def one(tok: str) -> str:
        return REF.sub(lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), tok)
    return [one(t) for t in cmd_tokens]


def read_sources(paths: list[str]) -> list[Command]:
    """Commands of every file, in the order given: shell scripts line by line, Kubernetes
    manifests pod by pod."""
    out: list[Command] = []
    for p in paths:
        text = read_text(p)
        name = Path(p).name
        manifest = Path(p).suffix in (".yaml", ".yml") or looks_like_manifest(text)
        out.extend(parse_manifests(text, name) if manifest else parse_script(text, name))
    return out


def import_scripts(paths: list[str], name: str | None = None, variables: dict[str, str] | None = None,
                   migrate: bool = True) -> tuple[Draft, str, list[str]]:
    """(the draft, its YAML text, the skipped command lines) for launch scripts ``paths``;
    ``variables`` fill ``${NAME}`` placeholders the scripts leave open; ``migrate=False`` keeps
    flags older SGLang releases used (``epdctl validate`` then names each one's replacement)."""
    commands = read_sources(paths)
    for cmd in commands if variables else ():
        cmd.argv = substitute(cmd.argv, variables or {})
        cmd.env = dict(zip(cmd.env, substitute(list(cmd.env.values()), variables or {})))
    launches: list[Launch] = []
    skipped: list[str] = []
    for cmd in commands:
        launch = classify(cmd, migrate)
        if launch is None and cmd.argv[0] in QUIET:
            continue
        if launch is None:
            skipped.append(f"{cmd.where}: {' '.join(cmd.argv[:3])} (not an engine server or router command)")
        else:
            launches.append(launch)
    d = draft(launches, name or Path(paths[0]).stem.replace("_", "-"))
    d.notes.extend(f"skipped {s}" for s in skipped)
    return d, to_yaml(d, [Path(p).name for p in paths]), skipped
