"""Flag tables of the real engines (dumped from SGLang 0.5.23 / vLLM 0.33.0 parsers) and a checker.

Used for user ``args:`` at validate time and by the tests on every rendered command. Flags are
read as the engine's own launcher reads them (argparse ``allow_abbrev``): ``--tp 8`` means
``--tp-size 8``, an ambiguous prefix such as ``--pp`` is refused; epdctl renders canonical names.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from epdctl.topology.migration_table import migration_table

# The embedded runtime's command line per role (docs/architecture.md, epdctl/runtime/__main__.py);
# the control plane may not import the runtime, so it is mirrored here and a test keeps them equal.
_COMMON = {"--model-path": None, "--host": None, "--port": None, "--log-level": None, "--cpus": None,
           "--threads": None, "--fast": 0}
_SERVED = {"--served-model-name": None}
_TRANSPORT = {"--transport": ["zmq", "zmq-ipc", "mooncake"], "--ib-device": None, "--transfer-port": None}
_SWITCH = {"--switchable": 0}
_PIXELS = {"--max-body-bytes": None, "--max-images-per-request": None, "--max-image-pixels": None,
           "--max-request-pixels": None}
_IMAGES = {**_PIXELS, "--max-prompt-tokens": None, "--max-image-bytes": None, "--allow-local-files": 0,
           "--image-fetch-timeout": None, "--image-fetch-hosts": "*"}
_KEY = {"--api-key-env": None}
EMBEDDED_ROLES: dict[str, dict[str, object]] = {
    "encoder": {**_COMMON, **_TRANSPORT, "--cache-mb": None, "--max-batch-size": None, "--batch-wait-ms": None,
                "--register-urls": "+", **_PIXELS, **_KEY, **_SWITCH},
    "prefill": {**_COMMON, **_SERVED, **_TRANSPORT, **_IMAGES, "--bootstrap-port": None,
                "--encoder-bootstrap-port": None, "--encoder-urls": "*", "--max-running-requests": None,
                "--kv-timeout": None, "--encoder-timeout": None, "--encoder-probe-interval": None, **_KEY, **_SWITCH},
    "decode": {**_COMMON, **_SERVED, **_TRANSPORT, "--max-running-requests": None, "--kv-timeout": None,
               "--max-images-per-request": None, "--max-body-bytes": None, **_KEY, **_SWITCH},
    "colocated": {**_COMMON, **_SERVED, **_IMAGES, **_KEY, "--max-running-requests": None, "--cache-mb": None},
}
RUNTIME_TABLES = {"embedded": EMBEDDED_ROLES}  # tables written here, by role, not dumped from a parser


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    dest: str
    takes_value: bool
    nargs: object
    choices: tuple[str, ...] | None
    default: object = None  # the engine's value when the flag is absent (None: unknown or none)


@dataclass(frozen=True)
class FlagTable:
    engine: str
    version: str
    options: dict[str, Option]  # every spelling -> option
    abbrev: bool = True  # a unique prefix means its option (argparse allow_abbrev)
    dotted: bool = False  # ``--json-option.key value`` sets one key of a JSON option (vLLM)
    removed: dict[str, str] = field(default_factory=dict)  # flag -> what replaced it (the migration table)
    owners: dict[str, str] = field(default_factory=dict)  # a wrapper's own flag -> "Dynamo (dynamo.sglang)"

    def owner(self, flag: str) -> str | None:
        """The wrapper that reads ``flag`` (None: the engine's own, or unknown)."""
        opt = self.resolve(flag)
        return next((self.owners[f] for f in opt.flags if f in self.owners), None) if opt is not None else None

    def check(self, tokens: tuple[str, ...] | list[str]) -> list[str]:
        """Problems with ``tokens`` (unknown flags, bad choices, missing values); empty if fine.

        Reads flags as the engine's launcher does: exact names, aliases and unique prefixes are
        accepted (render writes the canonical name). One problem per cause: the values that follow
        an unknown flag are not reported again.
        """
        problems: list[str] = []
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            i += 1
            if not tok.startswith("-") or tok in ("-", "--"):
                problems.append(f"{tok!r} is not a flag (values must follow their flag)")
                continue
            name, eq, inline = tok.partition("=")
            opt = self.resolve(name)
            if opt is None and self.dotted and "." in name:
                opt = self.options.get(name.split(".", 1)[0])  # --kv-transfer-config.kv_role X
            if opt is None:
                problems.append(self.unknown(name))
                while i < len(tokens) and not tokens[i].startswith("--"):
                    i += 1  # its values belong to the same mistake
                continue
            values: list[str] = [inline] if eq else []
            if opt.takes_value and not eq:
                while i < len(tokens) and not (tokens[i].startswith("--") or
                                               (tokens[i].startswith("-") and not _is_number(tokens[i]))):
                    values.append(tokens[i])
                    i += 1
                    if opt.nargs in (None, 1, "?"):
                        break
                if not values and opt.nargs not in ("?", "*"):
                    problems.append(f"{name} needs a value")
            elif not opt.takes_value and eq:
                problems.append(f"{name} takes no value")
            if opt.choices is not None:
                for v in values:
                    if v not in opt.choices and not v.startswith("$"):
                        problems.append(f"{name} {v!r} is not one of: {', '.join(opt.choices)}")
        return problems

    def resolve(self, name: str) -> Option | None:
        """The option ``name`` means to the engine's launcher: exact/alias, or a unique prefix."""
        opt = self.options.get(name)
        if opt is not None or not self.abbrev or not name.startswith("--"):
            return opt
        hits = [n for n in self.options if n.startswith(name)]
        return self.options[hits[0]] if len(hits) == 1 else None

    def unknown(self, name: str) -> str:
        """The message for a flag the engine does not know: its migration if it was removed, the
        options an ambiguous prefix could mean, or a near spelling (typos only, never another concept)."""
        moved = self.removed.get(name)
        if moved is not None:
            return (f"{name} was removed: {moved}; `epdctl validate --fix` rewrites it")
        hits = sorted(n for n in self.options if n.startswith(name)) if name.startswith("--") else []
        if len(hits) > 1:
            return (f"{name} is ambiguous for {self.engine} {self.version} (a prefix of {', '.join(hits[:4])}"
                    f"{', ...' if len(hits) > 4 else ''}); write the full flag")
        near = difflib.get_close_matches(name, list(self.options), n=1, cutoff=0.85)
        dym = f"; did you mean {near[0]}?" if near else ""
        wrappers = sorted(set(self.owners.values()))
        also = f" nor a {' or '.join(wrappers)} flag" if wrappers else ""
        return f"{name} is not a {self.engine} {self.version} flag{also}{dym}"

    def dest(self, flag: str) -> str | None:
        opt = self.resolve(flag)
        return opt.dest if opt else None


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


@lru_cache(maxsize=None)
def flag_table(name: str, role: str | None = None) -> FlagTable:
    """The flag table ``name`` (``flags/<name>.json``: sglang, vllm, smg; or a runtime's table, by ``role``)."""
    roles = RUNTIME_TABLES.get(name)
    if roles is not None:
        opts = {}
        for flag, spec in roles[role or "colocated"].items():
            choices = tuple(spec) if isinstance(spec, list) else None
            nargs = spec if isinstance(spec, (int, str)) else None
            opts[flag] = Option((flag,), flag[2:].replace("-", "_"), nargs != 0, nargs, choices)
        return FlagTable(name, f"runtime {role or 'colocated'}", opts, abbrev=False)
    text = resources.files("epdctl.topology").joinpath("flags", f"{name}.json").read_text(encoding="utf-8")
    doc = json.loads(text)
    options: dict[str, Option] = {}
    for o in doc["options"]:
        opt = Option(tuple(o["flags"]), o["dest"], bool(o["takes_value"]), o["nargs"],
                     tuple(o["choices"]) if o["choices"] is not None else None, o.get("default"))
        for flag in opt.flags:
            options[flag] = opt
    removed = {flag: m.summary() for flag, m in migration_table(name).items()}
    return FlagTable(doc["engine"], doc["version"], options, dotted=bool(doc.get("dotted_options")), removed=removed)
