"""JSON Schema of the topology, derived from the readers that validate it (``epdctl schema``).

Why trace instead of writing the schema by hand: the readers in ``schema.py`` (and the few in
``placement.py`` / ``allocation.py``) are the single source of truth. A ``TracingReader`` runs
them over a probe document in which every allowed key is present; each ``mapping()`` call tells
which keys a section allows, each ``get()`` the key's kind, choices and bounds. A key added to a
key tuple and read with ``r.get`` therefore appears in the schema after ``epdctl schema -o``.

The schema is deliberately no stricter than ``validate``: optional keys may be null (the readers
treat null as absent), and cross-field rules (GPU budgets, node references) stay in ``validate``.
A key the tracer cannot reach gets an entry from ``_HAND`` or, failing that, accepts any value.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from epdctl.engines.registry import ENGINE_NAMES
from epdctl.errors import TopologyError
from epdctl.topology import _build
from epdctl.topology.allocation import _read_template
from epdctl.topology.loader import Document, join
from epdctl.topology.model import ROLE_ORDER, Node
from epdctl.topology.placement import read_roles
from epdctl.topology.reader import ENV_NAME, Reader
from epdctl.topology.schema import ROLE_KEYS, TOP_KEYS, WORKER_KEYS
from epdctl.topology.sections import ENGINE_DEVICES

SCHEMA_ID = "https://epdctl.dev/topology.schema.json"
_INDEX = re.compile(r"\[\d+\]")
_STRLIST = {"type": "array", "items": {"type": "string", "minLength": 1}}
# Keys the tracer cannot reach with one probe (mutually exclusive in the readers): typed here.
_HAND: dict[str, dict[str, Any]] = {
    "roles.*.nodes": {"anyOf": [_STRLIST, {"type": "integer", "minimum": 1}],
                      "description": "node names, or (launcher: slurm) a number of allocation nodes"},
    "roles.*.workers[].nodes": {"type": ["array", "null"], "items": {"type": "string", "minLength": 1}},
    # YAML 1.1 reads an unquoted 04:00:00 as an integer, which read_slurm rejects (floats pass as text)
    "slurm.time": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "number", "not": {"type": "integer"}},
                             {"type": "null"}], "description": "sbatch --time; quote it: \"04:00:00\""},
    "engine": {"anyOf": [{"enum": list(ENGINE_NAMES)}, {
        "type": "object", "additionalProperties": False, "required": ["name"], "properties": {
            "name": {"enum": list(ENGINE_NAMES)},
            "version": {"type": ["string", "number", "null"], "minLength": 1,
                        "description": "the engine release (0.32 for 0.32.0); default: the engine's default record"},
            "venv": {"type": ["string", "null"], "minLength": 1,
                     "description": "absolute path of the engine's virtual environment on every node"},
            "python": {"type": ["string", "null"], "minLength": 1,
                       "description": "absolute path of the engine's interpreter on every node"},
            "device": {"enum": [*ENGINE_DEVICES, None],
                       "description": "the engine's device form: sglang takes cuda (the default) or cpu"}}}]},
    "slurm.extra": {"type": ["object", "null"], "additionalProperties": {"type": ["string", "number", "boolean"]}},
}

# Blocks that ``false`` turns off below the layer that says it (the reader's ``{"off": True}``).
OFF_WITH_FALSE = {"container": "false: the workers below this layer run bare, outside any container"}


class _Probe(list):  # type: ignore[type-arg]
    """A placeholder value: not None, a list of itself, and expanded to every allowed key by mapping()."""

    def __init__(self) -> None:
        super().__init__()
        self.append(self)


_P = _Probe()


class TracingReader(Reader):
    """A Reader that records what the readers ask for instead of judging values."""

    def __init__(self) -> None:
        super().__init__(Document(data=None))
        self.mappings: dict[str, list[str]] = {}
        self.leaves: dict[str, dict[str, Any]] = {}

    def mapping(self, value: Any, path: str, allowed: Iterable[str], what: str, **_: Any) -> dict[str, Any] | None:
        keys = list(allowed)
        self.mappings.setdefault(_norm(path), keys)
        if value is _P:
            return {k: _P for k in keys}
        return value if isinstance(value, dict) else None

    def get(self, m: dict[str, Any], path: str, key: str, kind: str, **kw: Any) -> Any:
        """Record the key's kind, choices and bounds (keyword arguments of Reader.get)."""
        choices = kw.get("choices")
        self.leaves.setdefault(_norm(join(path, key)), {
            "kind": kind, "required": bool(kw.get("required")), "choices": list(choices) if choices is not None else None,
            "minimum": kw.get("minimum"), "maximum": kw.get("maximum")})
        if m.get(key) is None:
            return kw.get("default")
        value = m[key]
        return value if isinstance(value, str) else "probe" if kind == "str" else kw.get("default")

    def env(self, m: dict[str, Any], path: str, key: str = "env", **_: Any) -> dict[str, str]:
        self.leaves.setdefault(_norm(join(path, key)), {"kind": "env", "required": False})
        return {}

    def args(self, m: dict[str, Any], path: str, key: str = "args", **_: Any) -> tuple[str, ...]:
        self.leaves.setdefault(_norm(join(path, key)), {"kind": "args", "required": False})
        return ()


def _norm(path: str) -> str:
    return _INDEX.sub("[]", path)


def trace() -> TracingReader:
    """Run every reader over probe documents; the returned reader holds what they asked for."""
    r = TracingReader()
    try:
        _build(Document(data={k: _P for k in TOP_KEYS}), reader=r)
    except TopologyError:
        pass
    top = {"node_defaults": _P, "roles": {role.value: _role_probe() for role in ROLE_ORDER}}
    _read_template(r, top, None)
    read_roles(r, top, {"n0": Node(name="n0", host="probe")}, {}, {}, False)
    return r


def _role_probe() -> dict[str, Any]:
    """A role whose workers list is read (count would exclude it), its one worker on node n0."""
    return {k: _P for k in ROLE_KEYS if k not in ("count", "nodes")} | {
        "workers": [{k: _P for k in WORKER_KEYS if k != "nodes"} | {"node": "n0"}]}


def _leaf(spec: dict[str, Any]) -> dict[str, Any]:
    kind = spec["kind"]
    if kind == "env":
        return {"type": ["object", "null"], "propertyNames": {"pattern": ENV_NAME.pattern},
                "additionalProperties": {"type": ["string", "number", "boolean"]}}
    if kind == "args":
        scalar = ["string", "number", "boolean"]
        return {"anyOf": [{"type": "array", "items": {"type": scalar}},
                          {"type": "object", "additionalProperties": {
                              "anyOf": [{"type": scalar + ["null"]}, {"type": "array", "items": {"type": scalar}}]}},
                          {"type": "null"}]}
    nullable = not spec["required"]
    if spec.get("choices") is not None:
        return {"enum": spec["choices"] + ([None] if nullable else [])}
    base: dict[str, dict[str, Any]] = {
        "str": {"type": ["string", "number"], "minLength": 1},
        "int": {"type": "integer"}, "float": {"type": "number"}, "bool": {"type": "boolean"},
        "strlist": _STRLIST}
    out = dict(base[kind])
    for bound in ("minimum", "maximum"):
        if spec.get(bound) is not None:
            out[bound] = spec[bound]
    if nullable:
        out["type"] = ([out["type"]] if isinstance(out["type"], str) else list(out["type"])) + ["null"]
    return out


def _hand(path: str) -> dict[str, Any] | None:
    for pattern, schema in _HAND.items():
        if re.fullmatch(re.escape(pattern).replace(r"\*", r"[^.\[]+"), path):
            return schema
    return None


def _section(r: TracingReader, path: str) -> dict[str, Any]:
    keys = r.mappings[path]
    props: dict[str, Any] = {}
    required: list[str] = []
    for key in keys:
        child = join(path, key)
        if _hand(child) is not None:
            props[key] = _hand(child)
        elif child in r.mappings:
            props[key] = _section(r, child)
            props[key]["type"] = ["object", "null"]
            if key in OFF_WITH_FALSE:
                props[key] = {"anyOf": [props[key], {"const": False, "description": OFF_WITH_FALSE[key]}]}
        elif f"{child}[]" in r.mappings:
            props[key] = {"type": ["array", "null"], "items": _section(r, f"{child}[]")}
        elif child in r.leaves:
            props[key] = _leaf(r.leaves[child])
            if r.leaves[child]["required"]:
                required.append(key)
        else:
            props[key] = _hand(child) or {"description": "not typed by the schema generator; see validate"}
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def generate() -> dict[str, Any]:
    """The topology JSON Schema (draft 2020-12) as a dict."""
    r = trace()
    schema = _section(r, "")
    schema["type"] = "object"
    for key in ("model", "roles"):
        if key in schema["properties"]:
            schema["properties"][key]["type"] = [t for t in schema["properties"][key]["type"] if t != "null"]
    schema["required"] = sorted(set(schema.get("required", [])) | {"model", "roles"})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "epdctl topology",
            "description": "Generated by `epdctl schema` from epdctl/topology; do not edit by hand.", **schema}


def dumps() -> str:
    """The schema as committed: sorted keys, two-space indent, trailing newline."""
    return json.dumps(generate(), indent=2, sort_keys=True) + "\n"


__all__ = ["generate", "dumps", "trace", "TracingReader"]
