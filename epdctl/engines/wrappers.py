"""Launchers that wrap an engine's server and take flags of their own beside the engine's
(``python -m dynamo.sglang``: Dynamo's runtime and SGLang-wrapper flags, then SGLang's).

A wrapper is a record: the module a worker names in ``module:``, who owns its flags (for
messages and import reports) and its flag table (``flags/<table>.json``, copied from the wrapper's
own argparse groups; sources in the table). A worker that runs through a wrapper has its ``args``
checked against the engine's table and the wrapper's together, as the wrapper's launcher reads
them; the wrapper's own flags are reported as the wrapper's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from epdctl.topology.engine_flags import FlagTable, flag_table


@dataclass(frozen=True)
class Wrapper:
    module: str  # python -m MODULE
    label: str  # who owns the extra flags, as messages name it: "Dynamo"
    flag_table: str  # flags/<flag_table>.json
    engine: str  # the engine it wraps


WRAPPERS: dict[str, Wrapper] = {
    "dynamo.sglang": Wrapper("dynamo.sglang", "Dynamo", "dynamo_sglang", "sglang"),
}


def wrapper_for(module: str | None) -> Wrapper | None:
    return WRAPPERS.get(module or "")


@lru_cache(maxsize=None)
def wrapped_table(table: str, module: str) -> FlagTable:
    """The flag table ``table`` with the wrapper's own flags added (the engine's win where both
    define one) and those flags' owner recorded; the table itself when ``module`` wraps nothing known."""
    base = flag_table(table)
    w = wrapper_for(module)
    if w is None:
        return base
    own = flag_table(w.flag_table)
    extra = {f: o for f, o in own.options.items() if f not in base.options}
    owners = {**base.owners, **{f: f"{w.label} ({w.module})" for f in extra}}
    return replace(base, options={**extra, **base.options}, owners=owners)
