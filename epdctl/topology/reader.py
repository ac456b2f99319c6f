"""Typed getters over a parsed Document that collect problems (path + line + what to do)."""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterable

from epdctl.errors import Problem
from epdctl.topology.loader import Document, join
from epdctl.topology.secrets import looks_secret

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Keys that would hold a secret inline; each gets a specific message instead of "unknown key".
INLINE_SECRET_KEYS = {"api_key", "apikey", "token", "password", "secret", "hf_token", "admin_api_key"}
_MISSING = object()


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"string {value!r}" if len(value) < 40 else "a string"
    return f"{type(value).__name__} {value!r}"


class Reader:
    """Collects problems while reading values; never raises for bad input."""

    def __init__(self, doc: Document):
        self.doc = doc
        self.problems: list[Problem] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, self.doc.line(path), message))

    def section(self, top: dict[str, Any], key: str, allowed: Iterable[str]) -> dict[str, Any] | None:
        """A top-level block such as ``router:``: its mapping, or None when absent (a default applies) or
        not a mapping of ``allowed`` keys (a problem is recorded)."""
        if top.get(key) is None:
            return None
        return self.mapping(top[key], key, allowed, key)

    def mapping(self, value: Any, path: str, allowed: Iterable[str], what: str) -> dict[str, Any] | None:
        """Check ``value`` is a mapping with only ``allowed`` keys; return it (or None)."""
        if not isinstance(value, dict):
            self.problem(path, f"{what} must be a mapping (key: value lines), got {_kind(value)}")
            return None
        allowed = list(allowed)
        for key in value:
            if key in allowed:
                continue
            kpath = join(path, str(key))
            if isinstance(key, str) and key.lower() in INLINE_SECRET_KEYS:
                hint = f" set {key}_env: NAME" if f"{key}_env" in allowed else " reference it as ${NAME} in env"
                if path.endswith("ssh"):
                    hint = " log in with ssh.key or an ssh agent instead of a password"
                self.problem(kpath, f"inline secret {key!r} is not allowed (it would be written to plans, logs "
                                    f"and shell history); put it in an environment variable and{hint}")
                continue
            near = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            dym = f"did you mean {near[0]!r}? " if near else ""
            self.problem(kpath, f"unknown key {key!r} in {what}; {dym}valid keys: {', '.join(sorted(allowed))}")
        return value

    def get(self, m: dict[str, Any], path: str, key: str, kind: str, *, required: bool = False,
            default: Any = None, choices: Iterable[str] | None = None, minimum: int | None = None,
            maximum: int | None = None) -> Any:
        """Read ``m[key]`` as ``kind`` (str, int, float, bool, strlist); a problem and ``default`` if wrong."""
        kpath = join(path, key)
        value = m.get(key, _MISSING)
        if value is _MISSING or value is None:
            if required:
                self.problem(path if value is _MISSING else kpath, f"missing required key {key!r}")
            return default
        ok = {
            "str": isinstance(value, str) and value != "",
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "strlist": isinstance(value, list) and all(isinstance(v, str) and v for v in value),
        }[kind]
        if kind == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
            value, ok = str(value), True  # e.g. an address or a version typed without quotes
        if not ok:
            expect = {"str": "a non-empty string", "int": "an integer", "float": "a number",
                      "bool": "true or false", "strlist": "a list of strings"}[kind]
            self.problem(kpath, f"expected {expect}, got {_kind(value)}")
            return default
        if choices is not None and value not in choices:
            near = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.5)
            dym = f"did you mean {near[0]!r}? " if near else ""
            self.problem(kpath, f"{value!r} is not a valid {key}; {dym}choose one of: {', '.join(choices)}")
            return default
        if minimum is not None and value < minimum:
            self.problem(kpath, f"{key} must be at least {minimum}, got {value}")
            return default
        if maximum is not None and value > maximum:
            self.problem(kpath, f"{key} must be at most {maximum}, got {value}")
            return default
        return tuple(value) if kind == "strlist" else value

    def env(self, m: dict[str, Any], path: str, key: str = "env") -> dict[str, str]:
        """Environment mapping; values become strings; inline secrets are rejected."""
        raw = m.get(key)
        if raw is None:
            return {}
        epath = join(path, key)
        if not isinstance(raw, dict):
            self.problem(epath, f"env must be a mapping NAME: value, got {_kind(raw)}")
            return {}
        out: dict[str, str] = {}
        for name, value in raw.items():
            vpath = join(epath, str(name))
            if not isinstance(name, str) or not ENV_NAME.match(name):
                self.problem(vpath, f"{name!r} is not a valid environment variable name (letters, digits, _)")
                continue
            if isinstance(value, (dict, list)) or value is None:
                self.problem(vpath, f"env value must be a string or number, got {_kind(value)}")
                continue
            text = str(value).lower() if isinstance(value, bool) else str(value)
            if not isinstance(value, (int, float)) and looks_secret(text):
                self.problem(vpath, f"inline secret in env {name}: the value looks like a key or token and would "
                                    f"be written to plans and logs; write `{name}: ${{{name}}}` to pass it from "
                                    f"the launching environment")
                continue
            out[name] = text
        return out

    def args(self, m: dict[str, Any], path: str, key: str = "args") -> tuple[str, ...]:
        """Extra engine args: a list of tokens, or a mapping flag -> value/true/list."""
        raw = m.get(key)
        if raw is None:
            return ()
        apath = join(path, key)
        tokens: list[str] = []
        if isinstance(raw, list):
            for i, item in enumerate(raw):
                if isinstance(item, (dict, list)) or item is None:
                    self.problem(join(apath, i), f"args items must be strings or numbers, got {_kind(item)}")
                else:
                    tokens.append(str(item).lower() if isinstance(item, bool) else str(item))
            return tuple(tokens)
        if not isinstance(raw, dict):
            self.problem(apath, f"args must be a list of tokens or a mapping flag: value, got {_kind(raw)}")
            return ()
        for flag, value in raw.items():
            fpath = join(apath, str(flag))
            name = str(flag) if str(flag).startswith("-") else f"--{flag}"
            if value is True or value is None:
                tokens.append(name)
            elif value is False:
                continue
            elif isinstance(value, list):
                tokens.append(name)
                tokens.extend(str(v) for v in value)
            elif isinstance(value, dict):
                self.problem(fpath, f"args value must be a scalar or list, got {_kind(value)}")
            else:
                tokens.extend([name, str(value)])
        return tuple(tokens)
