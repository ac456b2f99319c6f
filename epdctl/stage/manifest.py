"""The weights' manifest: every file with its size and SHA-256, written once where the weights
are read from and checked by every node that holds a copy.

Why hashes and not sizes: a truncated or bit-flipped shard has the right size more often than
not (a copy killed mid-way leaves a ``.part``; a failing disk does not). Hashing hundreds of GB
is slow, so the manifest records each file's size and mtime beside it and is reused, not
recomputed, while they match.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from epdctl.errors import StageError

CHUNK = 8 << 20
SKIP = {".epdctl-manifest.json"}


@dataclass(frozen=True)
class Manifest:
    origin: str
    files: tuple[tuple[str, int, str], ...]   # (relative path, size, sha256), sorted
    stamps: tuple[tuple[str, int], ...] = ()  # (relative path, mtime_ns) when it was hashed

    @property
    def bytes(self) -> int:
        return sum(size for _, size, _ in self.files)

    @property
    def digest(self) -> str:
        """SHA-256 of the file list (what a lock of the run records)."""
        text = json.dumps([list(f) for f in self.files], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> str:
        return json.dumps({"origin": self.origin, "digest": self.digest, "files": [list(f) for f in self.files],
                           "stamps": dict(self.stamps)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        doc = json.loads(text)
        return cls(origin=doc["origin"], files=tuple((str(p), int(s), str(h)) for p, s, h in doc["files"]),
                   stamps=tuple(sorted((str(k), int(v)) for k, v in doc.get("stamps", {}).items())))


def _walk(origin: Path) -> list[tuple[str, os.stat_result]]:
    """Every file under ``origin`` (symlinks followed: a hub snapshot links into blobs/)."""
    out = []
    for root, dirs, names in os.walk(origin, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".cache"))
        for name in sorted(names):
            if name in SKIP or name.endswith(".part"):
                continue
            path = Path(root) / name
            out.append((path.relative_to(origin).as_posix(), path.stat()))
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def build(origin: str, previous: Manifest | None = None) -> tuple[Manifest, bool]:
    """The manifest of folder ``origin``; ``previous`` is reused when every file's size and
    mtime still match it. Returns (manifest, reused)."""
    root = Path(origin)
    if not root.is_dir():
        raise StageError(f"the weights folder {origin} does not exist here; staging reads it on this "
                         f"machine to write the manifest (run `epdctl stage` where it is mounted)")
    try:
        listing = _walk(root)
    except OSError as e:
        raise StageError(f"cannot read the weights folder {origin}: {e}") from None
    if not listing:
        raise StageError(f"the weights folder {origin} holds no file")
    stamps = tuple((rel, st.st_mtime_ns) for rel, st in listing)
    if previous is not None and previous.origin == origin and previous.stamps == stamps \
            and [(p, s) for p, s, _ in previous.files] == [(rel, st.st_size) for rel, st in listing]:
        return previous, True
    files = tuple((rel, st.st_size, sha256_file(root / rel)) for rel, st in listing)
    return Manifest(origin, files, stamps), False


def load(path: Path) -> Manifest | None:
    try:
        return Manifest.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(manifest: Manifest, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(manifest.to_json())
    os.replace(tmp, path)
