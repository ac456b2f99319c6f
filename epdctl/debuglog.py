"""Where unexpected errors go: one line on the terminal, the traceback in a debug log.

The log is ``debug.log`` in the state directory (``$EPDCTL_STATE_DIR``, default ``~/.epdctl``),
or in the system temp directory when that cannot be written. It is appended to (mode 0600),
rotated once at 5 MB, and holds the time, the epdctl version, the command line and the traceback.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

MAX_BYTES = 5 * 1024 * 1024


def _candidates() -> list[Path]:
    env = os.environ.get("EPDCTL_STATE_DIR")
    root = Path(env).expanduser() if env else Path.home() / ".epdctl"
    return [root / "debug.log", Path(tempfile.gettempdir()) / f"epdctl-debug-{os.getuid()}.log"]


def printable(text: str, limit: int = 300) -> str:
    """One terminal-safe line: first line only, control characters and lone surrogates escaped."""
    line = (text.strip().splitlines() or [""])[0][:limit]
    return "".join(ch if ch.isprintable() and not 0xD800 <= ord(ch) <= 0xDFFF else ascii(ch)[1:-1] for ch in line)


def write_debug_log(exc: BaseException, argv: list[str]) -> Path | None:
    """Append ``exc``'s traceback to the first writable debug log; its path, or None if none is."""
    from epdctl import __version__

    record = (f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} epdctl {__version__} (python {sys.version.split()[0]})\n"
              f"argv: {[printable(a, 200) for a in argv]!r}\n"
              + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) + "\n")
    for path in _candidates():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() and path.stat().st_size > MAX_BYTES:
                path.replace(path.with_suffix(".log.1"))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace") as fh:
                fh.write(record)
            return path
        except OSError:
            continue
    return None
