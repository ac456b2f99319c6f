"""Small C libraries built on this host at first use: the shared build-and-cache step of the
runtime's native code (native_attention.py, native_copy.py).

A library's C source is compiled with the host's ``cc`` (``$CC`` if set) into a per-user cache
(``$XDG_CACHE_HOME/epdctl`` or ``~/.cache/epdctl``, mode 0700: a library loaded from there runs
in this process, so a folder others may write is refused), named by a hash of the source,
compiler, flags and the CPU (-march=native code must not be loaded on another model of CPU
sharing the home folder). It is compiled and linked in two steps (linking a shared library with
-ffast-math adds crtfastmath.o, whose constructor would switch the whole process, torch too, to
flush-to-zero), written under a temporary name and renamed, so concurrent workers never load half
a file; older builds beyond the newest few are removed. Callers decide what a failure means (their pure-Python or torch path runs instead).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Sequence


def cache_dir() -> Path:
    """The private folder built libraries live in (created 0700; OSError if others may write it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folder = Path(base) / "epdctl"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.stat()  # a library loaded from here runs in this process: only we may write it
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(f"{folder} is not private (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}); "
                      "chmod 700 it or set XDG_CACHE_HOME")
    return folder


def cpu_id() -> str:
    """The CPU's model and feature flags (what -march=native compiles for), as /proc/cpuinfo has them."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    keys = ("model name", "flags", "features", "cpu part", "cpu implementer")
    return "\n".join(sorted({line.strip() for line in lines if line.split(":")[0].strip().lower() in keys}))


def build(name: str, source: str, flags: Sequence[str], libs: Sequence[str], cpu: str) -> ctypes.CDLL:
    """``source`` built as ``<name>-<hash>.so`` in ``cache_dir()`` (once per source, flags and
    ``cpu``), loaded. OSError (or SubprocessError) when there is no compiler or the build fails."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        raise OSError("no C compiler (cc) on PATH")
    tag = hashlib.sha256("\0".join((source, cc, *flags, *libs, cpu)).encode()).hexdigest()[:16]
    lib = cache_dir() / f"{name}-{tag}.so"
    if not lib.is_file():
        with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
            src, obj, out = (Path(tmp) / f"{name}.{ext}" for ext in ("c", "o", "so"))
            src.write_text(source)
            for argv in ([cc, *flags, "-c", str(src), "-o", str(obj)], [cc, "-shared", str(obj), "-o", str(out), *libs]):
                done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
                if done.returncode:
                    raise OSError(f"{cc} failed: {done.stderr.strip()[-500:]}")
            os.replace(out, lib)
        prune(lib)
    return ctypes.CDLL(str(lib))


KEEP = 4  # builds of one library kept: a few checkouts or CPU models may share the cache


def prune(lib: Path) -> None:
    """Remove all but the ``KEEP`` newest builds of ``lib``'s library (other sources, flags or
    CPUs), so the cache does not grow with every change of the source. A process that loaded
    one of them keeps its mapping; a checkout that needs it again builds it again."""
    name = lib.name.rsplit("-", 1)[0]
    builds = sorted(lib.parent.glob(f"{name}-*.so"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in builds[KEEP:]:
        if old != lib:
            old.unlink(missing_ok=True)


def load_once(state: dict[str, object], switch: str, make: Callable[[], ctypes.CDLL],
              log: logging.Logger, instead: str) -> ctypes.CDLL | None:
    """``make()``'s library, built once per process and kept in ``state``; None when the
    environment variable ``switch`` is "0" or the build fails (logged once on ``log``, saying
    that ``instead`` runs)."""
    if "dll" not in state:
        dll = None
        if os.environ.get(switch, "1") != "0":
            try:
                dll = make()
            except (OSError, subprocess.SubprocessError) as exc:
                log.info("%s unavailable (%s); using %s", log.name.rsplit(".", 1)[-1], exc, instead)
        state["dll"] = dll
    return state["dll"]  # type: ignore[return-value]
