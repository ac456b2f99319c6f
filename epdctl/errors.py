"""One error hierarchy for the control plane.

Every message says what went wrong, where (a YAML path such as ``roles.prefill.workers[0].tp``
or a ``[node/worker]`` prefix) and what to do next. ``cli.main`` turns any ``EpdctlError`` into
a clean message and its ``exit_code`` (1); nothing else should reach the user as a traceback.
"""

from __future__ import annotations


class EpdctlError(Exception):
    """Base of every error epdctl reports to a user."""

    exit_code = 1


class Reported(EpdctlError):
    """The command has already shown what failed (a report whose verdict is a failure, a list of
    problems): the boundary adds no message and exits with ``exit_code``."""

    def __init__(self, exit_code: int = 1):
        super().__init__("")
        self.exit_code = exit_code


class TopologyError(EpdctlError):
    """The topology file is malformed or inconsistent.

    ``problems`` holds every problem found (validation reports all of them, not the first).
    """

    def __init__(self, problems: list["Problem"] | str):
        if isinstance(problems, str):
            problems = [Problem(path="", line=None, message=problems)]
        self.problems = problems
        super().__init__("\n".join(p.format() for p in problems))


class Problem:
    """One validation problem: YAML path, source line (1-based, if known) and a message."""

    __slots__ = ("path", "line", "message")

    def __init__(self, path: str, line: int | None, message: str):
        self.path = path
        self.line = line
        self.message = message

    def format(self, filename: str | None = None) -> str:
        where = filename or ""
        if self.line is not None:
            where = f"{where}:{self.line}" if where else f"line {self.line}"
        loc = ", ".join(x for x in (where, self.path) if x)
        return f"{loc}: {self.message}" if loc else self.message

    def __repr__(self) -> str:
        return f"Problem({self.path!r}, {self.line!r}, {self.message!r})"


class RenderError(EpdctlError):
    """A valid topology cannot be turned into commands (e.g. an unsupported engine feature)."""


class LaunchError(EpdctlError):
    """Starting, stopping or reaching workers failed."""


class StateError(EpdctlError):
    """The recorded cluster state is missing, locked or corrupt."""


class ProbeError(EpdctlError):
    """A health, status or link probe failed in a way the user must act on."""


class StageError(EpdctlError):
    """Downloading the weights or copying them to the nodes failed (the message names the nodes)."""
