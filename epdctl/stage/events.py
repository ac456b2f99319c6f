"""What staging reports as it goes; `epdctl stage` and `up` print them (only commands print)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Downloading:
    source: str        # hf:ORG/NAME@REV
    cache: str         # HF_HOME


@dataclass(frozen=True)
class Downloaded:
    source: str
    snapshot: str      # the snapshot folder in the cache
    commit: str
    files: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class Manifested:
    path: str          # where the manifest was written (or found, unchanged)
    files: int
    bytes: int
    digest: str        # SHA-256 of the manifest's canonical JSON
    reused: bool


@dataclass(frozen=True)
class SpaceChecked:
    node: str
    free: int
    need: int


@dataclass(frozen=True)
class NodeProgress:
    node: str
    phase: str         # verify (hashing what is there) | copy
    done: int
    total: int
    rate: float        # bytes per second since the phase began


@dataclass(frozen=True)
class NodeStaged:
    node: str
    copied: tuple[str, ...]
    recopied: tuple[str, ...]   # present but differing from the manifest
    kept: int                   # files already there and verified
    bytes: int
    seconds: float


Event = Downloading | Downloaded | Manifested | SpaceChecked | NodeProgress | NodeStaged
