"""Flags older SGLang releases accepted that the installed release (flags/sglang.json) no longer
knows, read from the releases' own parsers.

    pip download --no-deps sglang==0.4.0 sglang==0.5.9 ... -d wheels/
    .venv/bin/python scripts/sglang_removed_flags.py wheels/ > tests/fixtures/sglang/flags_by_release.json

Releases up to 0.5.13 declare every flag as ``parser.add_argument("--flag", ...)`` in
``sglang/srt/server_args.py``: read from the wheel's text. Later releases build the parser from
dataclass fields; give their ``ServerArgs.add_cli_args`` dump (``name.json``, flag -> {help,
action}, e.g. from scripts/dump_engine_flags.py run against that release) beside the wheels.
The output lists, per release, every flag and, for the flags 0.5.23 lacks, what the last release
that had it said about it (help text, action): the evidence `sglang_migrations.json` names.
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

ARG = re.compile(r'add_argument\(\s*((?:["\']--?[A-Za-z0-9][A-Za-z0-9_.-]*["\']\s*,\s*)+)', re.S)
FLAG = re.compile(r'["\'](--[A-Za-z0-9][A-Za-z0-9_.-]*)["\']')
HELP = re.compile(r'help=\s*((?:[rf]?"[^"]*"\s*)+|(?:[rf]?\'[^\']*\'\s*)+)', re.S)


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def from_wheel(path: Path) -> dict[str, dict[str, str]]:
    text = zipfile.ZipFile(path).read("sglang/srt/server_args.py").decode()
    out: dict[str, dict[str, str]] = {}
    for m in ARG.finditer(text):
        body = text[m.end():m.end() + 1500]
        call = body[:body.find("add_argument(")] if "add_argument(" in body else body
        h = HELP.search(call)
        help_text = " ".join("".join(re.findall(r'"([^"]*)"|\'([^\']*)\'', h.group(1))[i][0] or
                                     re.findall(r'"([^"]*)"|\'([^\']*)\'', h.group(1))[i][1]
                                     for i in range(len(re.findall(r'"([^"]*)"|\'([^\']*)\'', h.group(1)))))
                             .split()) if h else ""
        act = re.search(r"action=[\"']?([\w.]+)", call)
        new = re.search(r'new_flag="(--[\w-]+)"', call)
        takes = not (act and ("store_true" in act.group(1) or "store_false" in act.group(1)
                              or act.group(1) in ("DeprecatedAction", "DeprecatedStoreTrueAction")))
        for f in FLAG.findall(m.group(1)):
            out[f] = {"help": help_text, "action": act.group(1) if act else "store",
                      "takes_value": takes, **({"new_flag": new.group(1)} if new else {})}
    return out


def main(folder: str) -> None:
    releases: dict[str, dict[str, dict[str, str]]] = {}
    for w in Path(folder).glob("sglang-*.whl"):
        try:
            flags = from_wheel(w)
        except KeyError:
            continue
        if len(flags) >= 60:  # fewer: the release builds its parser from dataclass fields (give a dump)
            releases[w.name.split("-")[1]] = flags
    for d in Path(folder).glob("*.json"):
        releases[d.stem] = {f: {"help": x["help"], "action": x["action"],
                                "takes_value": x["action"] not in ("_StoreTrueAction", "_StoreFalseAction",
                                                                   "DeprecatedAction")}
                            for f, x in json.loads(d.read_text()).items() if f.startswith("--")}
    order = sorted(releases, key=version_key)
    print(json.dumps({"source": "pip download --no-deps sglang==<release> (PyPI wheels); "
                                "scripts/sglang_removed_flags.py",
                      "releases": {v: sorted(releases[v]) for v in order},
                      "evidence": {f: {"last": v, **releases[v][f]} for v in order for f in releases[v]}},
                     indent=1, sort_keys=False))


if __name__ == "__main__":
    main(sys.argv[1])
