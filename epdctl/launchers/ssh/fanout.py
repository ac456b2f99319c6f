"""Run one function on many nodes at once and keep every node's outcome.

Why a map and not an exception: with ten nodes, one unreachable node must not hide what the
other nine did (started processes that `down` has to stop, or errors of their own). Every call
lands in ``Results.ok`` or ``Results.failed`` under its key, in the order the keys were given.
``parallel=False`` runs the same calls one after another (for comparison and debugging).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping, TypeVar

from epdctl.errors import LaunchError
from epdctl.launchers.base import Results

log = logging.getLogger(__name__)
K = TypeVar("K")
T = TypeVar("T")

MAX_WORKERS = 64   # threads mostly wait on the network; bounded so a 1000-node list cannot fork-bomb


def fanout(items: Mapping[str, K], fn: Callable[[str, K], T], *, parallel: bool = True,
           max_workers: int = MAX_WORKERS) -> Results[T]:
    """Call ``fn(key, item)`` for every item; exceptions become ``Results.failed[key]``."""
    outcomes: dict[str, tuple[bool, object]] = {}

    def one(key: str, item: K) -> None:
        try:
            outcomes[key] = (True, fn(key, item))
        except Exception as e:  # noqa: BLE001 - the map reports it, per key
            log.debug("%s failed: %s", key, e)
            outcomes[key] = (False, e)

    if parallel and len(items) > 1:
        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(items))),
                                thread_name_prefix="epdctl-fanout") as pool:
            for f in [pool.submit(one, k, v) for k, v in items.items()]:
                f.result()
    else:
        for k, v in items.items():
            one(k, v)
    res: Results[T] = Results()
    for key in items:
        good, value = outcomes[key]
        if good:
            res.ok[key] = value  # type: ignore[assignment]
        else:
            res.failed[key] = value  # type: ignore[assignment]
    return res


def describe_failures(res: Results[T]) -> str:
    """One ``[key] reason`` line per failure (no double prefix when the error has one)."""
    lines = []
    for key, e in res.failed.items():
        text = str(e) or type(e).__name__
        lines.append(text if text.startswith(f"[{key}") else f"[{key}] {text}")
    return "\n".join(lines)


def raise_if_failed(res: Results[T], what: str) -> None:
    """LaunchError naming every failed key, with ``results`` attached for the caller."""
    if res.failed:
        fine = f"\nfine: {', '.join(res.ok)}" if res.ok else ""
        err = LaunchError(f"{what} failed on {len(res.failed)} of "
                          f"{len(res.failed) + len(res.ok)}:\n{describe_failures(res)}{fine}")
        err.results = res  # type: ignore[attr-defined]
        raise err
